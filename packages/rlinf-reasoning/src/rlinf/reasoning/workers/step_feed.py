"""``StepFeed``: one training step's prompt groups, as they arrive, with their old logprobs.

:meth:`FSDPActor.run_training <rlinf.reasoning.workers.actor.FSDPActor.run_training>`
reads its data through a feed:

* :meth:`StepFeed.pull` takes groups from the channel until ``n`` are in; each
  gets its advantages on arrival when they are group-relative (streamed);
* :meth:`StepFeed.old_logprobs_upto` fills the old (and reference) logprobs of
  the first ``n`` samples with the step's starting weights, in fixed chunks, so
  every rank runs the same forward passes in the same order;
* :meth:`StepFeed.take_proximal` hands over the rollout's proximal logprobs of a
  previous-version sample (asynchronous GRPO), which replace the recomputation;
* :attr:`StepFeed.fused` lists the positions whose old logprobs come from the
  first minibatch's training forward instead (see
  :meth:`~rlinf.reasoning.workers.actor.FSDPActor._fuses_first_minibatch`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from rlinf.core.channel import Channel
from rlinf.core.protocols.reasoning import RolloutResult
from rlinf.reasoning.workers.batch import Sample, group_key

if TYPE_CHECKING:
    from rlinf.reasoning.workers.actor import FSDPActor

__all__ = ["StepFeed"]


class StepFeed:
    """This rank's share of one training step: groups, samples and their old logprobs.

    Attributes:
        samples: The arrived samples, in arrival order (whole groups).
        results: The arrived (not dropped) prompt groups.
        dropped: Dataset indices of the groups dropped as too stale.
        fused: Positions in :attr:`samples` whose old logprobs the first
            minibatch's training forward supplies (epoch 0, starting weights).
        busy: Seconds spent per phase (``wait``, ``prepare``, ``recompute``,
            ``wait_proximal``; the caller adds ``train`` and ``total``).
        from_rollout: Samples whose old logprobs came from the rollout's
            proximal scores.
    """

    def __init__(
        self,
        actor: FSDPActor,
        channel: Channel,
        step: int,
        requeue: Channel | None = None,
        proximal: Channel | None = None,
    ) -> None:
        cfg, alg = actor.cfg, actor.cfg.algorithm
        self.started = time.perf_counter()
        self.actor, self.channel, self.step = actor, channel, step
        self.requeue, self.proximal = requeue, proximal
        self.timeout = cfg.runner.channel_timeout_s
        self.group_size = alg.group_size
        self.share = alg.rollout_batch_size // actor.dp_size  # groups of this rank
        self.minibatch = self.share // alg.n_minibatches * alg.group_size  # samples
        self.streams = not (alg.normalize_advantages or alg.is_reinpp)
        self.shuffle = alg.shuffle_rollout
        self.recompute = cfg.actor.recompute_logprobs
        self.samples: list[Sample] = []
        self.results: list[RolloutResult] = []
        self.dropped: list[int] = []
        self.busy = {"train": 0.0, "recompute": 0.0, "wait": 0.0, "prepare": 0.0, "total": 0.0}
        self.busy["wait_proximal"] = 0.0
        self.from_rollout = 0
        self.fused = self._fused_positions()
        self._scored: dict[tuple[int, int], list[torch.Tensor]] | None = None  # by group_key
        self._done = 0  # samples[:_done] have their old (and ref) logprobs

    @property
    def _needs_forward(self) -> bool:
        """Whether old or reference logprobs come from a forward pass of the actor."""
        return self.recompute or self.actor.ref_model is not None

    def _fused_positions(self) -> set[int]:
        if not self.actor._fuses_first_minibatch():
            return set()
        if self.shuffle:
            perm = self.actor._epoch_perm(self.step, 0, self.share * self.group_size)
            return set(perm[: self.minibatch])
        return set(range(self.minibatch))

    def pull(self, groups: int) -> None:
        """Receives groups until ``groups`` are in (too stale ones are dropped and requeued).

        Raises:
            RuntimeError: A group arrived without rewards.
        """
        actor = self.actor
        while len(self.results) < groups:
            t0 = time.perf_counter()
            item = actor._receive_group(self.channel, self.timeout)
            t1 = time.perf_counter()
            self.busy["wait"] += t1 - t0
            if item.rewards is None:
                raise RuntimeError(
                    f"the group of prompt {item.index} reached the actor without rewards"
                )
            if actor._too_stale(item, self.step, self.requeue, self.timeout):
                self.dropped.append(item.index)
                continue
            self.results.append(item)
            fresh = actor._samples(item)
            if self.streams:
                actor._advantages(fresh, self.group_size)
            self.samples.extend(fresh)
            self.busy["prepare"] += time.perf_counter() - t1

    def pull_what_cannot_stream(self) -> None:
        """Before the first micro-batch: pulls and scores what the loop cannot stream.

        Batch-wide advantages (whitening, REINFORCE++) and a shuffled order need
        every group first; REINFORCE++'s KL needs the reference logprobs before
        the advantages; a shuffled order without a fused first minibatch
        computes every old logprob up front (stored per sample, so any order is
        safe).
        """
        if not self.streams or self.shuffle:
            self.pull(self.share)
        if not self.streams:
            if self.actor.ref_model is not None:
                self.old_logprobs_upto(len(self.samples))
            self.actor._advantages(self.samples, self.group_size)
        if self.shuffle and not self.fused:
            self.old_logprobs_upto(len(self.samples))

    def epoch_order(self, epoch: int) -> list[Sample]:
        """The samples in ``epoch``'s order: a fresh seeded order each epoch when shuffled.

        Unshuffled, this is :attr:`samples` itself, which grows as groups arrive.
        """
        if not self.shuffle:
            return self.samples
        perm = self.actor._epoch_perm(self.step, epoch, len(self.samples))
        return [self.samples[i] for i in perm]

    def before_micro_batch(self, end: int) -> None:
        """Makes ``order[:end]`` trainable: its groups in and (unshuffled) its old logprobs."""
        self.pull(-(-end // self.group_size))
        if not self.shuffle:  # shuffled: all computed up front or after the first minibatch
            self.old_logprobs_upto(end)

    def sets_old(self, epoch: int, minibatch: int) -> bool:
        """Whether this minibatch's training forward stores the samples' old logprobs."""
        return bool(self.fused) and epoch == minibatch == 0

    def before_first_update(self) -> None:
        """Old/ref logprobs must come from the starting weights: computes all that remain."""
        if self._needs_forward:
            self.pull(self.share)
            self.old_logprobs_upto(len(self.samples))

    def old_logprobs_upto(self, n: int) -> None:
        """Fills the old (and reference) logprobs of ``samples[:n]`` not yet filled.

        Old logprobs come from the rollout's proximal scores where it sent them,
        else from one no-grad forward of the rest; fused positions are skipped.
        """
        if n <= self._done or not self._needs_forward:
            self._done = max(self._done, n)
            return
        t0 = time.perf_counter()
        actor = self.actor
        positions = [i for i in range(self._done, n) if i not in self.fused]
        todo = [self.samples[i] for i in positions]
        if self.recompute:
            local = []
            for i, s in zip(positions, todo, strict=True):
                lp = self.take_proximal(i)
                if lp is None:
                    local.append(s)
                else:
                    s.old_logprobs = lp
                    self.from_rollout += 1
            for s, lp in zip(local, actor._no_grad_logprobs(actor.model, local), strict=True):
                s.old_logprobs = lp
        if actor.ref_model is not None:
            for s, lp in zip(todo, actor._no_grad_logprobs(actor.ref_model, todo), strict=True):
                s.ref_logprobs = lp
        self._done = n
        self.busy["recompute"] += time.perf_counter() - t0

    def take_proximal(self, position: int) -> torch.Tensor | None:
        """The rollout's proximal logprobs of the sample at ``position``, if it sent them.

        Only groups of the previous weight version have them; the first call
        waits for the rollout's scores of this step.
        """
        result = self.results[position // self.group_size]
        if self.proximal is None or result.version != self.step - 1:
            return None
        if self._scored is None:
            t0 = time.perf_counter()
            self._scored = self.actor._proximal_scores(self.proximal, self.step, self.timeout)
            self.busy["wait_proximal"] += time.perf_counter() - t0
        group = self._scored.get(group_key(result))
        return None if group is None else group[position % self.group_size]
