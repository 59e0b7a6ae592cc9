"""Publishing events from inside an activity to its workflow's stream.

The workflow publishes the lifecycle events itself; activities add what only
they see (token deltas, tool progress). Both land on the same ``events``
topic, so a subscriber reads one ordered stream: an activity flushes before
it returns, so its events precede the workflow's reaction to its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from types import TracebackType

from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.service import RPCError

from workflows.models import EVENTS_TOPIC, WireModel

logger = logging.getLogger(__name__)


class ActivityEventPublisher:
    """Batches events to the parent workflow's ``events`` topic.

    Use as ``async with ActivityEventPublisher(batch_ms) as events:``; leaving
    the block flushes everything published. The flush loop is ours rather
    than the stream client's background flusher: on Python 3.11 cancelling
    that flusher can stall in ``asyncio.wait_for`` for seconds, long enough
    to miss heartbeats. Ours is stopped by a flag, never cancelled.
    """

    def __init__(self, batch_ms: int) -> None:
        self._client = WorkflowStreamClient.from_within_activity()
        self._topic = self._client.topic(EVENTS_TOPIC)
        self._interval = timedelta(milliseconds=max(batch_ms, 1)).total_seconds()
        self._wake = asyncio.Event()
        self._closing = False
        self._loop_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ActivityEventPublisher:
        self._loop_task = asyncio.create_task(self._flush_loop())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task
        await self._client.flush()

    def publish(self, event: WireModel, *, flush: bool = False) -> None:
        """Buffer ``event``; ``flush`` sends the batch now (first token, progress)."""
        self._topic.publish(event)
        if flush:
            self._wake.set()

    async def _flush_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval)
            self._wake.clear()
            if self._closing:
                return
            try:
                await self._client.flush()
            except RPCError as err:  # kept pending by the client; retried next round
                logger.warning("Publishing events failed, will retry: %s", err)
