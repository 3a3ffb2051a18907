"""Reasoning (LLM RL) messages: one prompt group per channel item.

The prompt group is the unit of data movement in a GRPO step: the runner puts
one :class:`RolloutRequest` per prompt on the request channel, a rollout rank
answers it with one :class:`RolloutResult` holding all ``group_size`` samples
of that prompt (generated with one weight version), the reward stage fills in
``rewards``, and the actor consumes complete groups, so group-relative
advantages can be computed on arrival without a global barrier.

Plain Python types only (lists of ints and floats), so the messages need no
torch and pickle cheaply; token ids are unpadded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RolloutRequest", "RolloutResult"]


@dataclass
class RolloutRequest:
    """One prompt to sample ``group_size`` responses for.

    Attributes:
        prompt_ids: The prompt's token ids, unpadded.
        answers: Reference answers (any match is correct).
        group_size: G, responses to sample.
        index: The prompt's dataset index (for tracing and data-order checks).
        step: The global step the request belongs to.
    """

    prompt_ids: list[int]
    answers: list[str]
    group_size: int
    index: int = -1
    step: int = 0

    def __post_init__(self) -> None:
        """Checks the sizes; errors name the field."""
        if not self.prompt_ids:
            raise ValueError(f"RolloutRequest.prompt_ids is empty (dataset index {self.index})")
        if self.group_size < 1:
            raise ValueError(f"RolloutRequest.group_size must be >= 1, got {self.group_size}")


@dataclass
class RolloutResult:
    """All ``group_size`` responses to one prompt, from one weight version.

    Attributes:
        prompt_ids: The prompt's token ids, unpadded.
        answers: Reference answers of the prompt.
        response_ids: ``G`` lists of generated ids (the stop token included when
            ``is_end``).
        rollout_logprobs: ``G`` lists, one float32 logprob per response token,
            ``log_softmax(logits / T)`` of the sampling engine.
        is_end: ``G`` flags: the response ended on a stop token (not truncated).
        version: Weight version that generated every response of the group.
        index: The prompt's dataset index.
        step: The global step.
        rewards: ``G`` rewards, filled in by the reward stage (None before).
        response_texts: Decoded responses, filled in by the reward stage.
        generated_masks: Multi-turn (agent) responses only: ``G`` lists, one flag per
            response token, true where the model generated it and false on
            observation tokens (tool responses, chat-template scaffolding), which
            are context but never trained on. None: every token was generated.
        trajectory_stats: Multi-turn responses only: ``G`` dicts of per-trajectory
            counts (``turns``, ``tool_calls``, ``tool_errors``, ...), read by the
            reward's penalties and the step metrics.
    """

    prompt_ids: list[int]
    answers: list[str]
    response_ids: list[list[int]]
    rollout_logprobs: list[list[float]]
    is_end: list[bool]
    version: int
    index: int = -1
    step: int = 0
    rewards: list[float] | None = None
    response_texts: list[str] | None = field(default=None, repr=False)
    generated_masks: list[list[bool]] | None = field(default=None, repr=False)
    trajectory_stats: list[dict[str, float]] | None = None

    def __post_init__(self) -> None:
        """Checks that the per-response lists agree; errors name the field."""
        g = len(self.response_ids)
        for name in ("rollout_logprobs", "is_end"):
            if len(getattr(self, name)) != g:
                raise ValueError(
                    f"RolloutResult.{name} has {len(getattr(self, name))} entries, "
                    f"response_ids has {g}"
                )
        for i, (ids, lps) in enumerate(zip(self.response_ids, self.rollout_logprobs, strict=True)):
            if len(ids) != len(lps):
                raise ValueError(
                    f"RolloutResult response {i}: {len(ids)} ids but {len(lps)} logprobs"
                )
        if self.generated_masks is not None:
            masks = self.generated_masks
            if len(masks) != g or any(
                len(m) != len(ids) for m, ids in zip(masks, self.response_ids, strict=False)
            ):
                raise ValueError(
                    "RolloutResult.generated_masks must hold one flag per response token "
                    f"({[len(r) for r in self.response_ids]} tokens, masks of "
                    f"{[len(m) for m in masks]})"
                )
        if self.trajectory_stats is not None and len(self.trajectory_stats) != g:
            raise ValueError(
                f"RolloutResult.trajectory_stats has {len(self.trajectory_stats)} entries, "
                f"expected {g}"
            )
        if self.rewards is not None and len(self.rewards) != g:
            raise ValueError(f"RolloutResult.rewards has {len(self.rewards)} entries, expected {g}")

    @property
    def group_size(self) -> int:
        """Responses in the group (G)."""
        return len(self.response_ids)

    @property
    def prompt_length(self) -> int:
        """Prompt tokens."""
        return len(self.prompt_ids)

    @property
    def response_lengths(self) -> list[int]:
        """Tokens of each response."""
        return [len(r) for r in self.response_ids]

    @property
    def num_tokens(self) -> int:
        """Response tokens over the group (observation tokens included)."""
        return sum(len(r) for r in self.response_ids)

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the model generated over the group (observation tokens excluded)."""
        if self.generated_masks is None:
            return self.num_tokens
        return sum(sum(m) for m in self.generated_masks)
