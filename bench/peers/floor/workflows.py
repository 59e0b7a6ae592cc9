"""The floor: the in-process loop moved into a workflow as plainly as
possible. One activity per model call with the whole transcript, one per
tool call (in parallel); no stream, hooks, queues or continue-as-new, the
stock sandbox and the SDK's pydantic converter."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from bench.peers.floor.activities import FloorActivities
    from bench.peers.floor.models import (
        ConversationRequest,
        ConversationResult,
        ModelRequest,
        ToolCall,
        ToolResult,
    )
    from bench.peers.scenario import TOOL_DESCRIPTION, TOOL_NAME

TIMEOUT = timedelta(seconds=60)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


@workflow.defn(name="FloorConversation")
class FloorConversation:
    @workflow.run
    async def run(self, request: ConversationRequest) -> ConversationResult:
        messages: list[dict] = [{"role": "user", "content": request.prompt}]
        turns = 0
        while True:
            reply = await workflow.execute_activity_method(
                FloorActivities.call_model,
                ModelRequest(model=request.model, messages=messages, tools=TOOLS),
                start_to_close_timeout=TIMEOUT,
            )
            turns += 1
            messages.append(reply.message)
            if not reply.tool_calls:
                return ConversationResult(turns=turns, answer=reply.message.get("content") or "")
            results = await asyncio.gather(*(self._run_tool(call) for call in reply.tool_calls))
            messages += [
                {"role": "tool", "tool_call_id": result.tool_call_id, "content": result.content}
                for result in results
            ]

    async def _run_tool(self, call: ToolCall) -> ToolResult:
        return await workflow.execute_activity_method(
            FloorActivities.run_tool, call, start_to_close_timeout=TIMEOUT
        )
