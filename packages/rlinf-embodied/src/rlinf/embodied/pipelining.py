"""Whether ``rollout.pipeline_stage_num > 1`` pays, from measured rollouts.

With ``S`` stages an env rank steps one stage while the rollout acts on
another, so simulation and inference overlap; but every stage adds its own
hand-offs (channel messages, wake-ups, a policy call). When the env and the
policy are cheap (CartPole, a few state envs with an MLP) the extra hand-offs
cost more than the overlap saves. Two tools decide:

* :class:`StageChooser` (``rollout.adaptive_stages``, on by default) times the
  2nd training rollout pipelined and the 3rd with each env rank's stages merged
  into one stream (one hand-off per round), and keeps the faster for the rest
  of the run; for the merged trial and after it, when merged wins, each env
  rank runs its stages as one env (one env call per round, as with one stage);
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
    "PIPELINE_MARGIN",
    "StageChooser",
    "in_env_process_advice",
    "pipeline_advice",
]


class StageChooser:
    """Chooses pipelined or merged stages from two timed training rollouts.

    Rollout 1 (first resets, warm-up) and rollout 2 run pipelined, rollout 3
    merged; from rollout 4 on, the one with more env steps/s in its trial runs.
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
        """The choice, once made (None before: pipelined, except the merged trial)."""
        self._pipelined_rate = 0.0

    def state(self) -> dict[str, Any]:
        """What :meth:`load_state` needs to go on where this chooser stands."""
        return {
            "rollouts": self.rollouts,
            "merged": self.merged,
            "pipelined_rate": self._pipelined_rate,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state` (a resumed run repeats the trials' choice)."""
        self.rollouts = int(state["rollouts"])
        self.merged = None if state["merged"] is None else bool(state["merged"])
        self._pipelined_rate = float(state["pipelined_rate"])

    def next_merged(self) -> bool:
        """Whether the next training rollout runs with merged stages."""
        if not self.active:
            return False
        if self.merged is not None:
            return self.merged
        return self.rollouts == 2

    def record(self, env_steps_per_s: float) -> str | None:
        """Records the training rollout just run (in the mode :meth:`next_merged` gave).

        Args:
            env_steps_per_s: Its env steps per second.

        Returns:
            The choice, said once (after the merged trial), else None.
        """
        self.rollouts += 1
        if not self.active or self.merged is not None:
            return None
        if self.rollouts == 2:
            self._pipelined_rate = env_steps_per_s
            return None
        if self.rollouts < 3:
            return None
        self.merged = env_steps_per_s > self._pipelined_rate
        choice = (
            "running the stages merged from now on (each env rank's stages become one env); "
            "rollout.pipeline_stage_num: 1 does the same without the trial, and with a cheap "
            "policy rollout.in_env_process: true is faster again (no hand-offs)"
            if self.merged
            else "keeping the stages pipelined"
        )
        return (
            f"rollout.pipeline_stage_num={self.stages}: the pipelined trial ran "
            f"{self._pipelined_rate:.0f} env steps/s, the merged one {env_steps_per_s:.0f}; "
            f"{choice} (rollout.adaptive_stages; docs/embodied.md, 'When pipeline stages help')"
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
        f"{policy_seconds:.3f} s); rollout.in_env_process: auto (or true) runs the policy in "
        "the env workers without them and samples the same actions (docs/embodied.md, "
        "'The policy in the env process')"
    )
