"""``RewardWorker``: scores prompt groups with the math verifier as they stream by.

Each rank decodes the responses of a group (special tokens skipped), scores
them against the group's reference answers in a
:class:`~rlinf.reasoning.reward.MathRewardScorer` process pool (hard
per-sample timeout), fills in ``rewards`` and forwards the group. A rank stops
after its share of the step's groups ("consumers count until their share is
reached").

Adding a reward: subclass :class:`RewardWorker` and override :meth:`score`
(decoded responses and references in, one float per response out), then
launch the subclass in place of this one; see ``docs/reasoning.md``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from itertools import accumulate, pairwise
from typing import Any

from rlinf.core.channel import Channel
from rlinf.core.protocols.reasoning import RolloutResult
from rlinf.reasoning.agent.rewards import final_answer_ids, trajectory_penalty
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.reward import MathRewardScorer
from rlinf.reasoning.workers.common import load_tokenizer, setup_torch_threads
from rlinf.sched import Worker

__all__ = ["RewardWorker"]

_INTEGER = re.compile(r"^\s*-?\d{1,30}\s*$")


def _integer_verdict(response: str, references: Sequence[str]) -> bool | None:
    """Exact verdict when the response and every reference are bare integers, else None."""
    if not references or not _INTEGER.match(response):
        return None
    if not all(_INTEGER.match(ref) for ref in references):
        return None
    value = int(response)
    return any(int(ref) == value for ref in references)


class RewardWorker(Worker):
    """Rule-based (math) reward for prompt groups.

    Args:
        cfg: The validated run config.
    """

    def __init__(self, cfg: ReasoningConfig) -> None:
        super().__init__()
        setup_torch_threads(cfg.cluster.torch_threads)
        self.cfg = cfg
        self.scorer: MathRewardScorer | None = None
        # score_stream (async mode) and evaluate run on two threads of this worker;
        # the scorer and tokenizer are used by one at a time.
        self._score_lock = threading.Lock()

    def init_worker(self) -> dict[str, Any]:
        """Loads the tokenizer and starts the scoring pool.

        Returns:
            ``{"num_workers"}``: scoring processes of this rank.
        """
        self.tokenizer = load_tokenizer(self.cfg.actor.tokenizer_dir)
        if self.scorer is not None:  # a second runner on the same group
            self.scorer.close()
        self.scorer = MathRewardScorer.from_config(self.cfg.reward)
        self.scorer.start()
        return {"num_workers": self.scorer.num_workers}

    def _scorer(self) -> MathRewardScorer:
        if self.scorer is None:
            raise RuntimeError("call init_worker() before scoring")
        return self.scorer

    def decode(self, result: RolloutResult) -> list[str]:
        """Decoded responses of a group (special tokens skipped).

        A multi-turn response decodes to its final answer: what the model
        generated after its last tool answer.

        Args:
            result: The group.

        Returns:
            One text per response.
        """
        responses = result.response_ids
        if result.generated_masks is not None:  # multi-turn: grade the final answer only
            responses = [
                final_answer_ids(ids, mask)
                for ids, mask in zip(responses, result.generated_masks, strict=True)
            ]
        texts: Any = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return [str(t) for t in texts]

    def judge(self, responses: Sequence[str], references: Sequence[Sequence[str]]) -> list[bool]:
        """Whether each response is correct (override together with :meth:`score`).

        A response that is a bare integer, checked against bare-integer references,
        is decided here (the verifier compares two integers exactly, so this is
        its verdict); everything else goes to the verifier's process pool.

        Args:
            responses: Decoded responses.
            references: The references of each response.

        Returns:
            One flag per response.
        """
        flags: list[bool | None] = [
            _integer_verdict(r, refs) for r, refs in zip(responses, references, strict=True)
        ]
        slow = [i for i, f in enumerate(flags) if f is None]
        if slow:
            judged = self._scorer().judge(
                [responses[i] for i in slow], [references[i] for i in slow]
            )
            for i, ok in zip(slow, judged, strict=True):
                flags[i] = ok
        return [bool(f) for f in flags]

    def score(self, responses: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
        """The reward of each response (override this to add a reward).

        Args:
            responses: Decoded responses.
            references: The references of each response.

        Returns:
            One reward per response: ``reward_scale`` times the scorer's correct
            (1) or incorrect (0) value.
        """
        return self._rewards_of(self.judge(responses, references))

    def _rewards_of(self, flags: Sequence[bool]) -> list[float]:
        """The default rewards of judged responses (``reward_scale`` times correct/incorrect)."""
        scorer = self._scorer()
        good, bad = scorer.correct * scorer.reward_scale, scorer.incorrect * scorer.reward_scale
        return [good if ok else bad for ok in flags]

    def compute_rewards(self, inputs: Channel, outputs: Channel) -> dict[str, Any]:
        """Scores this rank's share of the step's groups from ``inputs`` into ``outputs``.

        Args:
            inputs: Channel of generated :class:`RolloutResult` groups.
            outputs: Channel for the rewarded groups.

        Returns:
            ``{"groups", "busy_s"}``.
        """
        cfg = self.cfg
        share = cfg.algorithm.rollout_batch_size // self.world_size
        timeout = cfg.runner.channel_timeout_s
        busy = 0.0
        for _ in range(share):
            result: RolloutResult = inputs.get(timeout=timeout)
            busy += self._reward_group(result)
            outputs.put(result, timeout=timeout)
        return {"groups": share, "busy_s": busy}

    def score_stream(self, inputs: Channel, outputs: Channel) -> dict[str, Any]:
        """Async mode: scores groups from ``inputs`` into ``outputs`` until a ``None`` arrives.

        Args:
            inputs: Channel of generated :class:`RolloutResult` groups (``None`` ends it).
            outputs: Channel for the rewarded groups.

        Returns:
            ``{"groups", "busy_s"}``.
        """
        timeout = self.cfg.runner.channel_timeout_s
        busy = 0.0
        groups = 0
        while True:
            try:
                result: RolloutResult | None = inputs.get(timeout=timeout)
            except TimeoutError:
                continue  # the rollout is waiting for the actor (a slow step, eval, a save)
            if result is None:
                return {"groups": groups, "busy_s": busy}
            busy += self._reward_group(result)
            outputs.put(result, timeout=timeout)
            groups += 1

    def _reward_group(self, result: RolloutResult) -> float:
        """Decodes and scores ``result`` in place; returns the seconds it took."""
        t0 = time.perf_counter()
        with self._score_lock:
            texts = self.decode(result)
            result.rewards = self.score(texts, [result.answers] * len(texts))
        agent = self.cfg.agent
        if agent is not None and result.trajectory_stats is not None:
            result.rewards = [
                reward + trajectory_penalty(stats, agent.penalties)
                for reward, stats in zip(result.rewards, result.trajectory_stats, strict=True)
            ]
        result.response_texts = texts
        return time.perf_counter() - t0

    def evaluate(self, results: list[RolloutResult]) -> list[tuple[list[float], list[bool]]]:
        """Rewards and correctness of held-out groups.

        Args:
            results: Generated groups.

        Returns:
            Per group: its rewards and whether each response is correct.
        """
        with self._score_lock:
            texts = [self.decode(r) for r in results]
            flat = [t for group in texts for t in group]
            refs = [r.answers for r, group in zip(results, texts, strict=True) for _ in group]
            flags = self.judge(flat, refs)
            if type(self).score is RewardWorker.score:  # default score: reuse the verdicts
                rewards = self._rewards_of(flags)
            else:  # a custom reward sees the eval responses too
                rewards = self.score(flat, refs)
        bounds = accumulate((len(group) for group in texts), initial=0)
        return [(rewards[a:b], flags[a:b]) for a, b in pairwise(bounds)]

    def teardown(self) -> None:
        """Stops the scoring processes, then releases channels and locks."""
        if self.scorer is not None:
            self.scorer.close()
        super().teardown()
