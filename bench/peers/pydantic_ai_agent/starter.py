"""The pydantic-ai rows: streamed (``stream_agent_events`` until the run's
result event) and not (the client waits for the result)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, stream_agent_events
from pydantic_ai.run import AgentRunResultEvent
from temporalio.client import Client

from bench.peers.pydantic_ai_agent.models import EVENTS_TOPIC, ConversationRequest, ConversationResult
from bench.peers.rows import Conversation, Row, Stack, finish, start_worker
from bench.peers.scenario import PROMPT


@dataclass
class PydanticAiRow(Row):
    name: str = "pydantic-ai, streamed"
    stream: bool = True

    @property
    def task_queue(self) -> str:
        return "peers-pydantic-ai" + ("-streamed" if self.stream else "")

    async def start(self, stack: Stack) -> None:
        self.client = await Client.connect(stack.address, plugins=[PydanticAIPlugin()])
        args = ["--address", stack.address, "--task-queue", self.task_queue]
        args += ["--model-base-url", stack.model_base_url]
        env = {"OPENAI_BASE_URL": stack.model_base_url, "OPENAI_API_KEY": "bench"}
        log = stack.data / f"worker-{self.task_queue}.log"
        self.workers = [start_worker("bench.peers.pydantic_ai_agent.worker", args, log, env)]

    async def converse(self, model: str) -> Conversation:
        assert self.client is not None
        client = self.client  # narrowed, for the reader below
        started = time.monotonic()
        handle = await self.client.start_workflow(
            "PydanticAiStreamedConversation" if self.stream else "PydanticAiConversation",
            ConversationRequest(model=model, prompt=PROMPT),
            id=f"pydantic-ai-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
            result_type=ConversationResult,
        )

        async def read_to_end() -> None:
            async with stream_agent_events(client, handle, EVENTS_TOPIC) as events:
                async for event in events:
                    if isinstance(event, AgentRunResultEvent):
                        break

        return await finish(
            handle, started, handle.id, lambda r: r.turns, read_to_end if self.stream else None
        )


@dataclass
class PydanticAiUnstreamedRow(PydanticAiRow):
    name: str = "pydantic-ai, run"
    stream: bool = False
