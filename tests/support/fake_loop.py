"""In-memory fakes for running ``workflows/loop.py`` without a server: a
scripted model, tools as plain coroutines, queues, and an event log."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.stack import outline
from workflows.hooks import AgentHooks
from workflows.loop import (
    AgentContext,
    ApprovalDecision,
    LoopConfig,
    ModelAnswer,
    PreparedToolCall,
    error_outcome,
)
from workflows.models import (
    AgentMessage,
    AssistantMessage,
    RunState,
    TextContent,
    ToolCall,
    ToolDeclaration,
    ToolOutcome,
    UserMessage,
    WireModel,
    text_result,
)

ToolFunction = Callable[[dict[str, Any]], Awaitable[ToolOutcome | str]]


def say(text: str) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)], stop_reason="stop", model="fake")


def calls(*tool_calls: tuple[str, str, dict[str, Any]], stop_reason: str = "toolUse") -> AssistantMessage:
    return AssistantMessage.model_validate(
        {
            "content": [ToolCall(id=i, name=n, arguments=a).model_dump() for i, n, a in tool_calls],
            "stopReason": stop_reason,
            "model": "fake",
        }
    )


def user(text: str) -> UserMessage:
    return UserMessage(content=text, timestamp=1)


SCHEMA_TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "delay": {"type": "number", "default": 0}},
    "required": ["text"],
}


@dataclass
class FakeAgent:
    """A loop config over fakes; ``events`` records every emitted event."""

    answers: list[AssistantMessage | Exception] = field(default_factory=list)
    tools: dict[str, ToolFunction] = field(default_factory=dict)
    declarations: dict[str, ToolDeclaration] = field(default_factory=dict)
    steering: list[AgentMessage] = field(default_factory=list)
    follow_up: list[AgentMessage] = field(default_factory=list)
    hooks: AgentHooks = field(default_factory=AgentHooks)
    events: list[dict[str, Any]] = field(default_factory=list)
    model_contexts: list[list[AgentMessage]] = field(default_factory=list)
    aborted: bool = False
    stop_after: Callable[[], bool] = lambda: False
    approvals: dict[str, ApprovalDecision] = field(default_factory=dict)
    tool_execution: str = "parallel"
    clock: int = 1000

    def tool(self, name: str, function: ToolFunction, **declaration: Any) -> None:
        self.tools[name] = function
        self.declarations[name] = ToolDeclaration(name=name, parameters=SCHEMA_TEXT, **declaration)

    def config(self) -> LoopConfig:
        return LoopConfig(
            emit=self._emit,
            now_ms=self._now,
            stream_assistant_response=self._model,
            execute_tool=self._execute,
            get_steering_messages=lambda: [self.steering.pop(0)] if self.steering else [],
            get_follow_up_messages=lambda: [self.follow_up.pop(0)] if self.follow_up else [],
            is_aborted=lambda: self.aborted,
            model_name=lambda: "fake",
            tool_execution=lambda: self.tool_execution,  # type: ignore[return-value,arg-type]
            should_stop_after_turn=lambda _turn: self.stop_after(),
            hooks=self.hooks,
            request_approval=self._approve,
        )

    def context(self, messages: list[AgentMessage] | None = None) -> AgentContext:
        messages = list(messages or [])
        return AgentContext(messages, self.declarations, RunState(started_at_message=len(messages)))

    def outline(self) -> list[str]:
        return outline(self.events)

    def _emit(self, event: WireModel) -> None:
        self.events.append(event.model_dump(mode="json"))

    def _now(self) -> int:
        self.clock += 1
        return self.clock

    async def _model(self, context: AgentContext) -> ModelAnswer:
        self.model_contexts.append(list(context.messages))
        await asyncio.sleep(0)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            message = AssistantMessage(stop_reason="error", error_message=str(answer), model="fake")
            return ModelAnswer(message)
        return ModelAnswer(answer)

    async def _execute(self, prepared: PreparedToolCall) -> ToolOutcome:
        if self.aborted:
            return error_outcome("Tool execution aborted")
        try:
            result = await self.tools[prepared.call.name](prepared.args)
        except Exception as err:
            return error_outcome(str(err))
        return ToolOutcome(content=text_result(result)) if isinstance(result, str) else result

    async def _approve(self, prepared: PreparedToolCall) -> ApprovalDecision:
        self.events.append({"type": "approval_asked", "toolCallId": prepared.call.id})
        return self.approvals.get(prepared.call.id, ApprovalDecision(True))
