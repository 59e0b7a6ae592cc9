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
That holds for anything a hook raises (``is_user_failure``), not only an
``Exception``: ``SystemExit`` or a ``BaseException`` of its own too. An
``abort`` ends a hook's wait (its task is cancelled): the call is aborted,
or the run ends with its aborted message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from workflows.arguments import clean_text
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
    """The transcript up to the call's assistant message, as pi's context
    holds it until the batch ends: a sequential batch's earlier results are
    not in it (a copy of the list; the messages are read-only by contract)."""


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


def is_user_failure(err: BaseException) -> bool:
    """Whether ``err``, raised out of user code (a hook, a shim, a tool, a
    context transform), is that code's own failure, to be contained, rather
    than control flow that must go on up. Any ``Exception`` is; so are
    ``SystemExit``, ``KeyboardInterrupt`` (going up, they stopped the worker
    process) and a ``BaseException`` of the user's own (it went past every
    handler and left the run hanging). Not:

    - an ``asyncio.CancelledError`` while this task is being cancelled (the
      workflow's cancellation, an activity's cancel): one a hook raises
      itself, or lets escape from its own awaits, is its failure;
    - a ``GeneratorExit`` outside a running task (a coroutine being closed);
    - the SDK's own control flow (continue-as-new, eviction, the deadlock
      check's interruption), all ``BaseException`` of ``temporalio``.
    """
    if isinstance(err, Exception):
        return True
    if isinstance(err, asyncio.CancelledError):
        task = asyncio.current_task()
        return task is not None and task.cancelling() == 0
    if type(err).__module__.partition(".")[0] == "temporalio":
        return False
    if isinstance(err, GeneratorExit):
        return asyncio.current_task() is not None
    return True


def failure_text(err: BaseException) -> str:
    """What a failure of user code says: the exception's message (pi's), or
    its type with it where the message alone says little (``SystemExit: 1``).
    A ``KeyError``'s message is its argument, not Python's quoted repr of it."""
    quoted = type(err) is KeyError and len(err.args) == 1 and isinstance(err.args[0], str)
    try:
        message = err.args[0] if quoted else str(err)
    except Exception as unreadable:
        # Its ``__str__`` raised (or returned no text): raised from here,
        # in a hook's or shim's except clause, that failed every workflow
        # task; in a tool, it failed the activity and ran the tool again
        # (a robustness audit).
        return f"{type(err).__name__} (its message could not be read: {type(unreadable).__name__})"
    # A lone surrogate (a file name read with surrogateescape) cannot be
    # written as UTF-8: let through, every workflow task failed on it.
    text = clean_text(message)
    if not isinstance(err, Exception | asyncio.CancelledError):
        return f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text or type(err).__name__
