"""``agent``: the config section that turns a reasoning run into multi-turn agentic RL.

With an ``agent`` section the rollout generates trajectories instead of single
completions: the model generates until it closes a tool call, the tool's
answer is appended as an observation, and generation resumes, up to
``max_turns`` turns and ``max_response_tokens`` tokens (observations
included). See :mod:`rlinf.reasoning.agent.loop` and ``docs/agentic.md``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from rlinf.core.config import RLinfModel

__all__ = ["BUILTIN_TOOLS", "AgentConfig", "AgentPenalties"]

BUILTIN_TOOLS = ("python", "search")
"""Tools ``agent.tools`` can name directly; anything else is a ``module:function`` factory."""


class AgentPenalties(RLinfModel):
    """Reward added per event of a trajectory (``agent.penalties``; use values <= 0)."""

    invalid_tool_call: float = Field(
        0.0, description="Per malformed call, unknown tool or wrong arguments."
    )
    tool_error: float = Field(0.0, description="Per call that raised or timed out.")
    max_turns: float = Field(
        0.0, description="Once, when the trajectory was cut at agent.max_turns."
    )


class AgentConfig(RLinfModel):
    """Multi-turn rollouts with tool calls (``agent``)."""

    tools: list[str] = Field(
        default_factory=lambda: ["python"],
        description="Tools by name: python, search, or 'module:function' returning a Tool.",
    )
    search_corpus: Path | None = Field(
        None,
        description="The search tool's index directory (python -m rlinf.reasoning.tools.search).",
    )
    max_turns: int = Field(
        4, ge=1, description="Model turns per trajectory (a turn ends at a closed tool call)."
    )
    max_response_tokens: int = Field(
        512, ge=1, description="Tokens after the prompt per trajectory, observations included."
    )
    max_tokens_per_turn: int | None = Field(
        None, ge=1, description="Tokens per model turn; null: algorithm.sampling_params."
    )
    observation_max_chars: int = Field(
        1024, ge=1, description="A tool's answer is cut to this many characters."
    )
    observation_template: str | None = Field(
        None,
        description="Text around a tool's answer, with {content}; null: the chat template's "
        "tool message.",
    )
    tool_call_parser: str = Field(
        "hermes",
        description="hermes (<tool_call>{json}</tool_call>) or 'module:function' (text -> calls).",
    )
    turn_batch_size: int | None = Field(
        None,
        ge=1,
        description="Trajectories per engine call; null: every trajectory that is ready. "
        "Smaller batches let generation go on while others wait for tools.",
    )
    tool_timeout_s: float = Field(15.0, gt=0, description="Seconds before a tool call is killed.")
    tool_concurrency: int = Field(
        16, ge=1, description="Tool calls run at once per tool worker (or rollout rank)."
    )
    penalties: AgentPenalties = Field(default_factory=AgentPenalties)  # type: ignore[arg-type]

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("agent.tools is empty; name at least one tool (e.g. [python])")
        for name in value:
            if name not in BUILTIN_TOOLS and ":" not in name:
                raise ValueError(
                    f"agent.tools: unknown tool {name!r}; use one of {list(BUILTIN_TOOLS)} or "
                    "'module:function' (a function returning a rlinf.reasoning.tools.Tool)"
                )
        if len(set(value)) != len(value):
            raise ValueError(f"agent.tools names a tool twice: {value}")
        return value

    @field_validator("observation_template")
    @classmethod
    def _check_template(cls, value: str | None) -> str | None:
        if value is not None and "{content}" not in value:
            raise ValueError(
                f"agent.observation_template={value!r} has no {{content}} placeholder; "
                "write e.g. '<tool_response>{content}</tool_response>'"
            )
        return value
