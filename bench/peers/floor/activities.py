"""The floor's activities: one model call (non-streaming, the ``openai``
client) and one tool call."""

from __future__ import annotations

import json

import openai
from temporalio import activity

from bench.peers.floor.models import ModelReply, ModelRequest, ToolCall, ToolResult
from bench.peers.scenario import TOOL_NAME, calculate


class FloorActivities:
    def __init__(self, model_client: openai.AsyncOpenAI) -> None:
        self._model = model_client

    @activity.defn(name="floor.call_model")
    async def call_model(self, request: ModelRequest) -> ModelReply:
        completion = await self._model.chat.completions.create(
            model=request.model,
            messages=request.messages,  # type: ignore[arg-type]
            tools=request.tools,  # type: ignore[arg-type]
        )
        message = completion.choices[0].message
        calls = [
            ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
            for call in message.tool_calls or []
            if call.type == "function"
        ]
        return ModelReply(message=message.model_dump(exclude_none=True), tool_calls=calls)

    @activity.defn(name="floor.run_tool")
    async def run_tool(self, call: ToolCall) -> ToolResult:
        if call.name != TOOL_NAME:
            return ToolResult(tool_call_id=call.id, content=f"Unknown tool {call.name!r}.")
        expression = json.loads(call.arguments)["expression"]
        return ToolResult(tool_call_id=call.id, content=calculate(expression))
