"""Whether ``rollout.pipeline_stage_num > 1`` pays, from measured rollouts.

With ``S`` stages an env rank steps one stage while the rollout acts on
another, so simulation and inference overlap; but every stage adds its own
hand-offs (channel messages, wake-ups, a policy call). When the env and the
policy are cheap (CartPole, a few state envs with an MLP) the extra hand-offs
cost more than the overlap saves. Two tools decide:

* :class:`StageChooser` (``rollout.adaptive_stages``, on by default) times
  :data:`TRIAL_ROLLOUTS` training rollouts pipelined (after a warm-up rollout)
  and as many with each env rank's stages merged into one stream (one
  hand-off per round), and keeps the stages merged for the rest of the run
  unless the pipelined trials were clearly faster (:data:`PIPELINED_MARGIN`);
  for the merged trials, and after them when merged wins, each env rank runs
  its stages as one env (one env call per round, as with one stage);
* :func:`pipeline_advice` (when adaptive stages are off) estimates one stage's
  time from one pipelined rollout and warns when it looks faster.

With one stage nothing overlaps, and :func:`in_env_process_advice` warns when
the hand-offs to a rollout group take a large share of the rollout: then the
policy in the env workers (``rollout.in_env_process``) is faster.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "HANDOFF_SHARE",
    "PIPELINED_MARGIN",
    "PIPELINE_MARGIN",
    "TRIAL_ROLLOUTS",
    "StageChooser",
    "in_env_process_advice",
    "pipeline_advice",
]


TRIAL_ROLLOUTS = 2
"""Timed training rollouts per mode (pipelined, merged) in :class:`StageChooser`'s trial.

Each mode counts with its best trial, so one rollout slowed by a load burst (or
by the merged env's first resets) does not decide; :data:`PIPELINED_MARGIN`
covers the rest of the noise. On the 2-vCPU VM the CartPole benchmark's trial
rates of the two modes overlapped (pipelined 8,104-14,123 env steps/s, merged
11,321-16,738), and a one-rollout trial kept the slower pipelined stages in one
of two blocks by hand.
"""


PIPELINED_MARGIN = 0.1
"""How much faster pipelined stages' best trial must be than the merged ones' to be kept.

Merged stages have one hand-off per round and run what one stage runs; where
pipelining pays, it pays far more than this (1.85x on the benchmark's synthetic
env and policy, 1.2-1.4x with the tiny token VLA), while on CartPole the two
modes' best trials came within 10% of each other in either order (the VM's
noise) although merged ran about 10% faster over the rollouts after the trial.
"""


class StageChooser:
    """Chooses pipelined or merged stages from timed training rollouts.

    Rollout 1 (first resets, warm-up) runs pipelined, the next
    :data:`TRIAL_ROLLOUTS` pipelined and the :data:`TRIAL_ROLLOUTS` after them
    merged; from then on merged runs, unless the best pipelined trial had more
    than :data:`PIPELINED_MARGIN` more env steps/s than the best merged one.
    Inactive (always pipelined) with one stage or when ``enabled`` is false.

    Args:
        stages: ``rollout.pipeline_stage_num``.
        enabled: ``rollout.adaptive_stages``.
    """

    def __init__(self, stages: int, enabled: bool) -> None:
        self.stages = stages
        self.active = enabled and stages > 1
        self.rollouts = 0
        self.merged: bool | None = None
        """The choice, once made (None before: pipelined, except the merged trials)."""
        self._pipelined_rate = 0.0  # the best pipelined trial so far
        self._merged_rate = 0.0  # the best merged trial so far

    def state(self) -> dict[str, Any]:
        """What :meth:`load_state` needs to go on where this chooser stands."""
        return {
            "rollouts": self.rollouts,
            "merged": self.merged,
            "pipelined_rate": self._pipelined_rate,
            "merged_rate": self._merged_rate,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state` (a resumed run repeats the trials' choice).

        A state without ``merged_rate`` (saved before trials had several
        rollouts per mode) starts the merged trials from nothing.
        """
        self.rollouts = int(state["rollouts"])
        self.merged = None if state["merged"] is None else bool(state["merged"])
        self._pipelined_rate = float(state["pipelined_rate"])
        self._merged_rate = float(state.get("merged_rate", 0.0))

    def next_merged(self) -> bool:
        """Whether the next training rollout runs with merged stages."""
        if not self.active:
            return False
        if self.merged is not None:
            return self.merged
        upcoming = self.rollouts + 1
        return upcoming > 1 + TRIAL_ROLLOUTS  # after the warm-up and the pipelined trials

    def record(self, env_steps_per_s: float) -> str | None:
        """Records the training rollout just run (in the mode :meth:`next_merged` gave).

        Args:
            env_steps_per_s: Its env steps per second.

        Returns:
            The choice, said once (after the last merged trial), else None.
        """
        self.rollouts += 1
        rollout = self.rollouts
        if not self.active or self.merged is not None or rollout == 1:  # (1: warm-up)
            return None
        if rollout <= 1 + TRIAL_ROLLOUTS:
            self._pipelined_rate = max(self._pipelined_rate, env_steps_per_s)
            return None
        self._merged_rate = max(self._merged_rate, env_steps_per_s)
        if rollout < 1 + 2 * TRIAL_ROLLOUTS:
            return None
        self.merged = self._pipelined_rate <= self._merged_rate * (1 + PIPELINED_MARGIN)
        choice = (
            "running the stages merged from now on (each env rank's stages become one env); "
            "rollout.pipeline_stage_num: 1 does the same without the trial, and with a cheap "
            "policy rollout.in_env_process: true is faster again (no hand-offs)"
            if self.merged
            else "keeping the stages pipelined"
        )
        return (
            f"rollout.pipeline_stage_num={self.stages}: the best of {TRIAL_ROLLOUTS} pipelined "
            f"trial rollouts ran {self._pipelined_rate:.0f} env steps/s, the best merged one "
            f"{self._merged_rate:.0f} (pipelined stays only when more than "
            f"{PIPELINED_MARGIN:.0%} faster); {choice} (rollout.adaptive_stages; docs/embodied.md, "
            "'When pipeline stages help')"
        )


PIPELINE_MARGIN = 0.05
"""How much faster one stage must look (as a share of the rollout) before the runner says so."""


def pipeline_advice(
    stages: int, *, env_seconds: float, policy_seconds: float, rollout_seconds: float
) -> str | None:
    """A warning when ``pipeline_stage_num > 1`` looks slower than one stage, else None.

    A rollout with ``S`` stages takes about ``max(env, policy) + overhead``: the
    env and the policy overlap, and the rest is hand-offs (channel messages,
    wake-ups, per-call work), ``S`` times as many as with one stage. One stage
    would take about ``env + policy + overhead / S``. When that estimate is
    more than :data:`PIPELINE_MARGIN` of the rollout below the measured time,
    stages cost more than they overlap (cheap envs and policies: CartPole, a few
    state envs with an MLP).

    Args:
        stages: ``rollout.pipeline_stage_num``.
        env_seconds: Time the busiest env rank spent stepping its envs.
        policy_seconds: Time the busiest rollout rank spent inside the policy.
        rollout_seconds: The rollout's wall time.

    Returns:
        The message, or None if stages look worth it (or there is one stage).
    """
    if stages <= 1 or rollout_seconds <= 0:
        return None
    overhead = max(0.0, rollout_seconds - max(env_seconds, policy_seconds))
    one_stage = env_seconds + policy_seconds + overhead / stages
    if one_stage > rollout_seconds * (1.0 - PIPELINE_MARGIN):
        return None
    return (
        f"rollout.pipeline_stage_num={stages} looks slower than one stage here: this "
        f"rollout took {rollout_seconds:.3f} s (envs {env_seconds:.3f} s, policy "
        f"{policy_seconds:.3f} s, the rest hand-offs), one stage would take about "
        f"{one_stage:.3f} s; set rollout.pipeline_stage_num: 1 (see docs/embodied.md, "
        "'When pipeline stages help')"
    )


HANDOFF_SHARE = 0.25
"""The share of a one-stage rollout the hand-offs must take before the runner suggests
running the policy in the env workers."""


def in_env_process_advice(
    *, env_seconds: float, policy_seconds: float, rollout_seconds: float
) -> str | None:
    """A warning when one stage's hand-offs to a rollout group cost much of the rollout.

    With one stage the env and the policy take turns, so a rollout takes about
    ``env + policy + hand-offs``; the policy in the env workers
    (``rollout.in_env_process``) removes the hand-offs and gives the same
    samples. Call it only for runs that could do that: a rollout group where
    :attr:`~rlinf.embodied.config.EmbodiedConfig.allows_policy_in_env_process`
    (one stage, the sync runner, no online scaling).

    Args:
        env_seconds: Time the busiest env rank spent stepping its envs.
        policy_seconds: Time the busiest rollout rank spent inside the policy.
        rollout_seconds: The rollout's wall time.

    Returns:
        The message when the rest (hand-offs, wake-ups, calls) is at least
        :data:`HANDOFF_SHARE` of the rollout, else None.
    """
    if rollout_seconds <= 0:
        return None
    handoffs = rollout_seconds - env_seconds - policy_seconds
    if handoffs < HANDOFF_SHARE * rollout_seconds:
        return None
    return (
        f"hand-offs between the env and rollout workers took {handoffs:.3f} s of this "
        f"{rollout_seconds:.3f} s rollout (envs {env_seconds:.3f} s, policy "
        f"{policy_seconds:.3f} s); rollout.in_env_process: true (auto, where the env ranks hold "
        "no GPU) runs the policy in the env workers without them and samples the same "
        "actions (docs/embodied.md, 'The policy in the env process')"
    )
