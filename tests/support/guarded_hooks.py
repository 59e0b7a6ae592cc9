"""Hooks for tests/test_hooks.py: handed to an in-process worker with
``build_worker(..., hooks=GuardedHooks())``, no workflow subclass."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow

from workflows.hooks import (
    AgentHooks,
    BlockToolCall,
    RequireApproval,
    ToolCallContext,
    ToolResultOverride,
    TurnContext,
)
from workflows.models import TextContent, ToolOutcome


class GuardedHooks(AgentHooks):
    """Blocks `explode`, rewrites echo results, stops after a `whoami` call,
    and fails on purpose where a test says so."""

    def before_tool_call(self, context: ToolCallContext) -> Any:
        if context.args.get("text") == "hang-before":
            return _forever()
        if context.args.get("text") == "exit-before-async":
            return _raising(SystemExit(5))
        if context.args.get("text") == "cancel-before-async":
            return _raising(asyncio.CancelledError("async before hook cancelled"))
        if context.args.get("text") == "clear-the-transcript":
            context.messages.clear()
            context.messages.append("junk")  # type: ignore[arg-type]
            return None
        if context.args.get("text") == "block-with-a-number":
            return BlockToolCall(reason=12345)  # type: ignore[arg-type]
        if context.args.get("text") == "approve-with-an-object":
            return RequireApproval(reason=object())  # type: ignore[arg-type]
        if context.tool_call.name == "explode":
            return BlockToolCall(reason="explode is not allowed here")
        if context.args.get("text") == "fail-with-a-lone-surrogate":
            raise FileNotFoundError("no file named caf\udce9")  # as os.listdir gives an undecodable name
        if context.args.get("text") == "approve-with-a-lone-surrogate":
            return RequireApproval(reason="asks for caf\udce9")
        if context.args.get("text") == "fail-unreadably-before":
            raise UnreadableError()
        if context.args.get("text") == "fail-before":
            raise RuntimeError("before hook failed")
        if context.args.get("text") == "cancel-before":
            raise asyncio.CancelledError("before hook cancelled")
        if context.args.get("text") == "exit-before":
            raise SystemExit(4)
        return None

    async def after_tool_call(
        self, context: ToolCallContext, outcome: ToolOutcome
    ) -> ToolResultOverride | None:
        if context.args.get("text") == "hang-after":
            await _forever()
        if context.args.get("text") == "clear-the-transcript":
            context.messages.clear()
            outcome.content.append(object())  # type: ignore[arg-type]
            outcome.content[0].text = "edited in place"  # type: ignore[union-attr]
            if isinstance(outcome.details, dict):
                outcome.details["edited"] = True
            return None
        if context.args.get("text") == "details-not-json":
            return ToolResultOverride(details={"marker": object()})
        if context.args.get("text") == "terminate-as-text":
            return ToolResultOverride(terminate="false")  # type: ignore[arg-type]
        if context.tool_call.name == "echo":
            return ToolResultOverride(content=[TextContent(text="redacted")], details={"redacted": True})
        if context.tool_call.name == "sequential_echo":
            raise ValueError("after hook failed")
        return None

    def should_stop_after_turn(self, context: TurnContext) -> Any:
        if context.message.text == "hang-stop":
            return _forever()
        if any(r.tool_name == "whoami" for r in context.tool_results):
            return True
        if context.message.text == "fail-stop":
            raise RuntimeError("stop hook failed")
        if context.message.text == "fail-stop-unreadably":
            raise UnreadableError()
        return False


class UnreadableError(Exception):
    """An exception whose message cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("str exploded")


async def _forever() -> None:
    """A hook's await that never ends (only an abort or close ends the run)."""
    await workflow.wait_condition(lambda: False)


async def _raising(err: BaseException) -> None:
    """An ``async`` hook that raises, after a first wait of its own."""
    await asyncio.sleep(0)
    raise err
