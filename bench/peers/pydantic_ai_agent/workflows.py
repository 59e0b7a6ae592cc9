"""pydantic-ai's Temporal integration (``pydantic_ai.durable_exec.temporal``):
an ``Agent`` with the ``TemporalDurability`` capability (``TemporalAgent``,
the older wrapper, is deprecated in 2.68 in its favour), its model an
``OpenAIChatModel`` on the scripted server (``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` in the worker's environment, as pydantic-ai's provider
reads them), the tool a function tool (an activity per call, the default).

Streamed: ``event_stream_topic`` publishes every event to a Workflow Stream
the workflow hosts (``AgentEventStream``); the client reads it with
``stream_agent_events`` and acknowledges the terminal event (a signal) so
the workflow may finish."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent, ModelResponse
    from pydantic_ai.durable_exec.temporal import AgentEventStream, PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.models.openai import OpenAIChatModel

    from bench.peers.pydantic_ai_agent.models import EVENTS_TOPIC, ConversationRequest, ConversationResult
    from bench.peers.scenario import calculate


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * /)."""
    return calculate(expression)


def _agent(name: str, durability: TemporalDurability) -> Agent[None, str]:
    # The model name here is a placeholder: each conversation names its own
    # scripted model at run time (registered below as "scripted").
    return Agent(
        OpenAIChatModel("scripted"),
        name=name,
        tools=[calculator],
        capabilities=[durability],
    )


streamed_agent = _agent("bench_streamed", TemporalDurability(event_stream_topic=EVENTS_TOPIC))
agent = _agent("bench", TemporalDurability())


def _result(messages: list, output: str) -> ConversationResult:
    return ConversationResult(turns=sum(isinstance(m, ModelResponse) for m in messages), answer=output)


@workflow.defn(name="PydanticAiConversation")
class PydanticAiConversation(PydanticAIWorkflow):
    __pydantic_ai_agents__ = (agent,)

    @workflow.run
    async def run(self, request: ConversationRequest) -> ConversationResult:
        result = await agent.run(request.prompt, model=f"openai-chat:{request.model}")
        return _result(result.all_messages(), result.output)


@workflow.defn(name="PydanticAiStreamedConversation")
class PydanticAiStreamedConversation(PydanticAIWorkflow):
    __pydantic_ai_agents__ = (streamed_agent,)

    @workflow.init
    def __init__(self, request: ConversationRequest) -> None:
        self.events = AgentEventStream()

    @workflow.run
    async def run(self, request: ConversationRequest) -> ConversationResult:
        async with self.events:
            result = await streamed_agent.run(request.prompt, model=f"openai-chat:{request.model}")
        return _result(result.all_messages(), result.output)
