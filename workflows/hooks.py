"""What the overridable workflow hooks receive and may return.

Hooks are methods of ``AgentWorkflow`` that a subclass overrides. They run
in workflow code, so they must be deterministic (no I/O, clock or random);
they may be ``async`` and may themselves run activities or wait for signals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workflows.models import AssistantMessage, ToolCall, ToolResultMessage, UserContent


@dataclass(frozen=True)
class ToolCallContext:
    """A tool call about to run (or that just ran)."""

    assistant_message: AssistantMessage
    tool_call: ToolCall
    args: dict[str, Any]


@dataclass(frozen=True)
class BlockToolCall:
    """Returned by ``before_tool_call`` to stop a call from running."""

    reason: str = "Tool execution was blocked"


@dataclass(frozen=True)
class ToolResultOverride:
    """Returned by ``after_tool_call``: each field that is not ``None``
    replaces the result's field (no deep merge)."""

    content: list[UserContent] | None = None
    details: Any = None
    is_error: bool | None = None
    terminate: bool | None = None


@dataclass(frozen=True)
class TurnContext:
    """A finished turn, for ``should_stop_after_turn``."""

    message: AssistantMessage
    tool_results: list[ToolResultMessage]
    run_turns: int
    total_turns: int
