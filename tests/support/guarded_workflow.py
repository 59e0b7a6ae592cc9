"""A subclass of ``AgentWorkflow`` overriding every hook (for tests/test_hooks.py).

Kept in its own module: the workflow sandbox re-imports a workflow's module,
so it must import nothing but workflow-safe code.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.agent import AgentWorkflow
    from workflows.contract import SessionResult, ToolOutcome
    from workflows.hooks import BlockToolCall, ToolCallContext, ToolResultOverride, TurnContext
    from workflows.models import TextContent


@workflow.defn(name="GuardedAgentWorkflow")
class GuardedAgentWorkflow(AgentWorkflow):
    """Blocks `explode`, rewrites echo results, stops after a `whoami` call."""

    @workflow.init
    def __init__(self, input: dict[str, Any] | None = None) -> None:
        super().__init__(input)

    @workflow.run
    async def run(self, input: dict[str, Any] | None = None) -> SessionResult:
        return await super().run(input)

    def before_tool_call(self, context: ToolCallContext) -> BlockToolCall | None:
        if context.tool_call.name == "explode":
            return BlockToolCall(reason="explode is not allowed here")
        return None

    async def after_tool_call(
        self, context: ToolCallContext, outcome: ToolOutcome
    ) -> ToolResultOverride | None:
        if context.tool_call.name == "echo":
            return ToolResultOverride(content=[TextContent(text="redacted")], details={"redacted": True})
        if context.tool_call.name == "sequential_echo":
            raise ValueError("after hook failed")
        return None

    def should_stop_after_turn(self, context: TurnContext) -> bool:
        return any(r.tool_name == "whoami" for r in context.tool_results)
