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
    """``task_queue``: a second floor row on its own queue and worker (the
    ``floor-twin`` row) measures the floor against itself: the bench's own
    resolution, round by round."""

    name: str = "floor"
    task_queue: str = TASK_QUEUE

    async def start(self, stack: Stack) -> None:
        self.client = await Client.connect(stack.address, data_converter=pydantic_data_converter)
        args = [
            "--address",
            stack.address,
            "--task-queue",
            self.task_queue,
            "--model-base-url",
            stack.model_base_url,
        ]
        log = stack.data / f"worker-{self.task_queue}.log"
        self.workers = [start_worker("bench.peers.floor.worker", args, log)]

    async def converse(self, model: str) -> Conversation:
        assert self.client is not None
        started = time.monotonic()
        handle = await self.client.start_workflow(
            "FloorConversation",
            ConversationRequest(model=model, prompt=PROMPT),
            id=f"floor-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
            result_type=ConversationResult,
        )
        return await finish(handle, started, handle.id, lambda r: r.turns)
