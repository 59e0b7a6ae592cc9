"""Hooks of the worker that records tests/histories/ and of the replayer
that replays them: they act only on a call whose ``text`` is
``hook-waits`` (a timer), ``hook-asks-approval`` (``RequireApproval``
without a reason), ``hook-terminates-as-text`` (an override whose
``terminate`` is text) or ``hook-sees-results`` (blocked when it is handed
a result of its own batch), which no other recorded scenario has, and return None
at once (not a coroutine) for every other call, so every other history
records and replays as with the default hooks."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta

from temporalio import workflow

from workflows.hooks import AgentHooks, BlockToolCall, RequireApproval, ToolCallContext, ToolResultOverride
from workflows.models import ToolOutcome, ToolResultMessage


class RecordingHooks(AgentHooks):
    def before_tool_call(
        self, context: ToolCallContext
    ) -> Awaitable[None] | RequireApproval | BlockToolCall | None:
        if context.args.get("text") == "hook-waits":
            return _wait()
        if context.args.get("text") == "hook-asks-approval":
            return RequireApproval(reason=None)  # type: ignore[arg-type]  # as a hook may, untyped
        if context.args.get("text") == "hook-sees-results" and isinstance(
            context.messages[-1], ToolResultMessage
        ):
            # Only before hooks-see-batch-start: the result of its batch's earlier call.
            return BlockToolCall(reason="the hook saw an earlier result of its batch")
        return None

    def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> ToolResultOverride | None:
        if context.args.get("text") == "hook-terminates-as-text":
            return ToolResultOverride(terminate="false")  # type: ignore[arg-type]  # as a hook may, untyped
        return None


async def _wait() -> None:
    # A timer: a command, so the history shows whether an abort ended the wait.
    await workflow.sleep(timedelta(seconds=2), summary="a hook waits")
