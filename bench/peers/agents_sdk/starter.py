"""The OpenAI Agents SDK rows: streamed (a subscriber reads the Workflow
Stream until the run's end) and not (the client waits for the result)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, cast

from temporalio.client import Client
from temporalio.contrib.workflow_streams import WorkflowStreamClient, WorkflowStreamItem

from bench.peers.agents_sdk.models import EVENTS_TOPIC, RUN_END, ConversationRequest, ConversationResult
from bench.peers.agents_sdk.worker import plugin
from bench.peers.rows import Conversation, Row, Stack, finish, start_worker
from bench.peers.scenario import PROMPT

MAX_TURNS = 100  # the SDK stops at 10 model calls by default


@dataclass
class AgentsSdkRow(Row):
    name: str = "openai-agents, streamed"
    stream: bool = True

    @property
    def task_queue(self) -> str:
        return "peers-agents-sdk" + ("-streamed" if self.stream else "")

    async def start(self, stack: Stack) -> None:
        self.client = await Client.connect(stack.address, plugins=[plugin()])
        args = ["--address", stack.address, "--task-queue", self.task_queue]
        args += ["--model-base-url", stack.model_base_url]
        log = stack.data / f"worker-{self.task_queue}.log"
        self.workers = [start_worker("bench.peers.agents_sdk.worker", args, log)]

    async def converse(self, model: str) -> Conversation:
        assert self.client is not None
        client = self.client  # narrowed, for the reader below
        started = time.monotonic()
        handle = await self.client.start_workflow(
            "AgentsSdkConversation",
            ConversationRequest(model=model, prompt=PROMPT, stream=self.stream, max_turns=MAX_TURNS),
            id=f"agents-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
            result_type=ConversationResult,
        )

        async def read_to_end() -> None:
            # subscribe() is an async generator (typed as an iterator): close it when done.
            events = cast(
                AsyncGenerator[WorkflowStreamItem[Any], None],
                WorkflowStreamClient.create(client, handle.id).subscribe([EVENTS_TOPIC]),
            )
            async with aclosing(events):
                async for item in events:
                    if isinstance(item.data, dict) and item.data.get("type") == RUN_END:
                        break

        return await finish(
            handle, started, handle.id, lambda r: r.turns, read_to_end if self.stream else None
        )


@dataclass
class AgentsSdkUnstreamedRow(AgentsSdkRow):
    name: str = "openai-agents, Runner.run"
    stream: bool = False
