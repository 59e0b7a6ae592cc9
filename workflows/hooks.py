"""The loop's hooks (pi's ``beforeToolCall``, ``afterToolCall``,
``shouldStopAfterTurn``) and what they receive and may return.

Subclass ``AgentHooks``, override what you need, and hand an instance to
the worker: ``build_worker(client, settings, hooks=MyHooks())``. Hooks are
workflow code: they run inside the conversation's workflow, on every
replay, so they must be deterministic (no I/O, clock, randomness or
environment) and changing what they decide for a running conversation is a
workflow change (guard it with ``workflow.patched``). They may be ``async``.

A hook that raises never wedges a conversation: a failing
``before_tool_call`` or ``after_tool_call`` becomes the call's error result
(carrying the exception's message), a failing ``should_stop_after_turn``
ends the run with an assistant message whose ``stopReason`` is ``error``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from workflows.models import (
    AgentMessage,
    AssistantMessage,
    ToolCall,
    ToolOutcome,
    ToolResultMessage,
    UserContent,
)


@dataclass(frozen=True)
class ToolCallContext:
    """A tool call about to run (or that just ran)."""

    assistant_message: AssistantMessage
    tool_call: ToolCall
    args: dict[str, Any]
    """The validated arguments (defaults filled in)."""
    messages: list[AgentMessage] = field(default_factory=list)
    """The transcript so far (read-only by contract)."""


@dataclass(frozen=True)
class BlockToolCall:
    """Returned by ``before_tool_call`` to stop a call from running."""

    reason: str = "Tool execution was blocked"


@dataclass(frozen=True)
class RequireApproval:
    """Returned by ``before_tool_call``: the call waits for a person's
    decision (update ``approve_tool``) before it runs."""

    reason: str = "This tool call needs approval"


@dataclass(frozen=True)
class ToolResultOverride:
    """Returned by ``after_tool_call``: each field that is not ``None``
    replaces the result's field (no deep merge). ``content`` may be a
    string (one text block)."""

    content: str | list[UserContent] | None = None
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


BeforeResult = BlockToolCall | RequireApproval | None
AfterResult = ToolResultOverride | None


class AgentHooks:
    """The default hooks: every call runs, results stay as they are, runs
    end when the model stops. Override any method (plain or ``async``)."""

    def before_tool_call(self, context: ToolCallContext) -> BeforeResult | Awaitable[BeforeResult]:
        """Return ``BlockToolCall(reason)`` to stop a call, or
        ``RequireApproval(reason)`` to make it wait for a person."""
        return None

    def after_tool_call(
        self, context: ToolCallContext, outcome: ToolOutcome
    ) -> AfterResult | Awaitable[AfterResult]:
        """Return a ``ToolResultOverride`` to replace fields of the result."""
        return None

    def should_stop_after_turn(self, context: TurnContext) -> bool | Awaitable[bool]:
        """Return True to end the run after this turn (queues are not polled)."""
        return False


__all__ = [
    "AgentHooks",
    "BlockToolCall",
    "RequireApproval",
    "ToolCallContext",
    "ToolResultOverride",
    "TurnContext",
]
