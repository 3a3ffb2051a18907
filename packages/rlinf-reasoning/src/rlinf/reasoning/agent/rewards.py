"""What a trajectory answers, and the penalties its tool use earns (``agent.penalties``)."""

from __future__ import annotations

from collections.abc import Sequence

from rlinf.reasoning.agent.config import AgentPenalties

__all__ = ["final_answer_ids", "trajectory_penalty"]


def final_answer_ids(response_ids: Sequence[int], generated: Sequence[bool]) -> list[int]:
    """The tokens the model generated after the last observation: its final answer.

    Earlier turns (tool calls) and observations (tool answers, which may contain
    the right number) are not graded.
    """
    start = 0
    for i, flag in enumerate(generated):
        if not flag:
            start = i + 1
    return [int(t) for t in response_ids[start:]]


def trajectory_penalty(stats: dict[str, float], penalties: AgentPenalties) -> float:
    """The reward added to a trajectory for its invalid calls, tool errors and turn cut."""
    return (
        penalties.invalid_tool_call * stats.get("invalid_tool_calls", 0.0)
        + penalties.tool_error * stats.get("tool_errors", 0.0)
        + penalties.max_turns * stats.get("cut_at_max_turns", 0.0)
    )
