"""Whether ``rollout.pipeline_stage_num > 1`` or a rollout group pays, from a measured rollout.

With ``S`` stages an env rank steps one stage while the rollout acts on
another, so simulation and inference overlap; but every stage adds its own
hand-offs (channel messages, wake-ups, a policy call). When the env and the
policy are cheap (CartPole, a few state envs with an MLP) the extra hand-offs
cost more than the overlap saves. Stages always run as configured; after the
first training rollout the runner checks once and warns:

* :func:`pipeline_advice`: with ``S > 1``, when one stage looks faster;
* :func:`in_env_process_advice`: with one stage and a rollout group, when the
  hand-offs take a large share of the rollout (then the policy in the env
  workers, ``rollout.in_env_process: true``, is faster).
"""

from __future__ import annotations

__all__ = ["in_env_process_advice", "pipeline_advice"]


_PIPELINE_MARGIN = 0.05
"""How much faster one stage must look (as a share of the rollout) before the runner says so."""


def pipeline_advice(
    stages: int, *, env_seconds: float, policy_seconds: float, rollout_seconds: float
) -> str | None:
    """A warning when ``pipeline_stage_num > 1`` looks slower than one stage, else None.

    A rollout with ``S`` stages takes about ``max(env, policy) + overhead``: the
    env and the policy overlap, and the rest is hand-offs (channel messages,
    wake-ups, per-call work), ``S`` times as many as with one stage. One stage
    would take about ``env + policy + overhead / S``. When that estimate is
    more than :data:`_PIPELINE_MARGIN` of the rollout below the measured time,
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
    if one_stage > rollout_seconds * (1.0 - _PIPELINE_MARGIN):
        return None
    return (
        f"rollout.pipeline_stage_num={stages} looks slower than one stage here: this "
        f"rollout took {rollout_seconds:.3f} s (envs {env_seconds:.3f} s, policy "
        f"{policy_seconds:.3f} s, the rest hand-offs), one stage would take about "
        f"{one_stage:.3f} s; set rollout.pipeline_stage_num: 1 (see docs/embodied.md, "
        "'When pipeline stages help')"
    )


_HANDOFF_SHARE = 0.25
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
        :data:`_HANDOFF_SHARE` of the rollout, else None.
    """
    if rollout_seconds <= 0:
        return None
    handoffs = rollout_seconds - env_seconds - policy_seconds
    if handoffs < _HANDOFF_SHARE * rollout_seconds:
        return None
    return (
        f"hand-offs between the env and rollout workers took {handoffs:.3f} s of this "
        f"{rollout_seconds:.3f} s rollout (envs {env_seconds:.3f} s, policy "
        f"{policy_seconds:.3f} s); rollout.in_env_process: true runs the policy in the env "
        "workers without them and samples the same actions (docs/embodied.md, 'The policy "
        "in the env process')"
    )
