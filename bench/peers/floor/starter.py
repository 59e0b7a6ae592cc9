"""The floor's row: start its worker, run a conversation, wait for the result."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.peers.floor.models import ConversationRequest, ConversationResult
from bench.peers.rows import Conversation, Row, Stack, finish, start_worker
from bench.peers.scenario import PROMPT

TASK_QUEUE = "peers-floor"


@dataclass
class FloorRow(Row):
    name: str = "floor"

    async def start(self, stack: Stack) -> None:
        self.client = await Client.connect(stack.address, data_converter=pydantic_data_converter)
        args = [
            "--address",
            stack.address,
            "--task-queue",
            TASK_QUEUE,
            "--model-base-url",
            stack.model_base_url,
        ]
        self.workers = [start_worker("bench.peers.floor.worker", args, stack.data / "worker-floor.log")]

    async def converse(self, model: str) -> Conversation:
        assert self.client is not None
        started = time.monotonic()
        handle = await self.client.start_workflow(
            "FloorConversation",
            ConversationRequest(model=model, prompt=PROMPT),
            id=f"floor-{uuid.uuid4().hex[:8]}",
            task_queue=TASK_QUEUE,
            result_type=ConversationResult,
        )
        return await finish(handle, started, handle.id, lambda r: r.turns)
