"""The OpenAI Agents SDK on Temporal (``temporalio.openai_agents``, which
``temporalio.contrib.openai_agents`` forwards to in temporalio 1.35): the
SDK's own runner in the workflow, each model call an activity through the
plugin, the tool an activity. Streamed: ``Runner.run_streamed`` with the
plugin's streaming activity publishing to a Workflow Stream the client
subscribes to; the workflow adds one last event so the subscriber knows the
run ended."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStream

with workflow.unsafe.imports_passed_through():
    from agents import Agent, RunConfig, Runner
    from temporalio.openai_agents.workflow import activity_as_tool

    from bench.peers.agents_sdk.activities import calculator
    from bench.peers.agents_sdk.models import EVENTS_TOPIC, RUN_END, ConversationRequest, ConversationResult


@workflow.defn(name="AgentsSdkConversation")
class AgentsSdkConversation:
    @workflow.init
    def __init__(self, request: ConversationRequest) -> None:
        self.stream = WorkflowStream()

    @workflow.run
    async def run(self, request: ConversationRequest) -> ConversationResult:
        agent = Agent(
            name="bench",
            model=request.model,
            tools=[activity_as_tool(calculator, start_to_close_timeout=timedelta(seconds=60))],
        )
        # Tracing would export to OpenAI's servers; this project has none to compare with.
        config = RunConfig(tracing_disabled=True)
        if request.stream:
            streamed = Runner.run_streamed(
                agent, request.prompt, max_turns=request.max_turns, run_config=config
            )
            async for _ in streamed.stream_events():
                pass
            turns, answer = len(streamed.raw_responses), str(streamed.final_output)
            self.stream.topic(EVENTS_TOPIC).publish({"type": RUN_END, "answer": answer})
            self.stream.detach_pollers()
            await workflow.wait_condition(workflow.all_handlers_finished)
        else:
            result = await Runner.run(agent, request.prompt, max_turns=request.max_turns, run_config=config)
            turns, answer = len(result.raw_responses), str(result.final_output)
        return ConversationResult(turns=turns, answer=answer)
