"""Follow a conversation's event stream (topic ``events`` of its Workflow Stream)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.service import RPCError, RPCStatusCode

from workflows.models import EVENTS_TOPIC

# Errors a poll can meet while the workflow is healthy, after which polling
# again from the same offset is right:
# - FAILED_PRECONDITION "...update due to unexpected workflow task failure":
#   the server failed the workflow task that carried the poll, most often
#   because a signal arrived while it was completing a continue-as-new
#   (cause UnhandledCommand); the task is retried and the workflow goes on.
# - UNAVAILABLE "workflow update was aborted" and other transport blips.
_TRANSIENT = (RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.UNAVAILABLE)
# Retries in a row without a new event before the error is the caller's:
# 0.1 s doubling to 2 s, about 25 s in all.
MAX_RETRIES = 15


class PollInterval(timedelta):
    """A poll cooldown counted from the start of the previous poll, not from
    its end: polls are still at most one per interval, but after a long poll
    that waited for events (an idle stream, a model thinking) the next poll
    goes out at once instead of a whole interval later. The stream client
    reads ``total_seconds()`` when a poll has returned, as the time to wait
    before the next one.
    """

    _next_poll_at: float

    def __new__(cls, milliseconds: float) -> PollInterval:
        interval = super().__new__(cls, milliseconds=milliseconds)
        interval._next_poll_at = time.monotonic()  # the first poll starts now
        return interval

    def total_seconds(self) -> float:
        now = time.monotonic()
        wait = max(0.0, super().total_seconds() - (now - self._next_poll_at))
        self._next_poll_at = now + wait
        return wait


async def follow(
    client: Client, workflow_id: str, from_offset: int = 0, *, cooldown_ms: int = 100
) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """Yield ``(offset, event)`` from ``from_offset`` on, across continue-as-new,
    until the workflow completes (then the retained events are drained first).

    Events are pi's camelCase dicts, as published. ``cooldown_ms`` is the
    least time from one poll's start to the next's (``PollInterval``); each
    poll is a long poll, so it only bounds how often a busy stream is read.
    100 ms matches the LLM activity's batch interval (``streamBatchMs``):
    polling faster shows tokens no sooner, and each poll costs the workflow
    an update and a workflow task (measured: 22 -> 18 history events and
    64 -> 60 ms per LLM turn, bench/README.md).
    An idle stream's first token is unaffected: the poll is already waiting.

    A poll that fails transiently (see ``_TRANSIENT``) is made again from the
    next offset not yet yielded, so no event is lost or repeated; after
    ``MAX_RETRIES`` failures in a row the error is raised.
    """
    stream = WorkflowStreamClient.create(client, workflow_id)
    offset = from_offset
    failures = 0
    while True:
        try:
            cooldown = PollInterval(cooldown_ms)
            async for item in stream.subscribe([EVENTS_TOPIC], from_offset=offset, poll_cooldown=cooldown):
                offset = item.offset + 1
                failures = 0
                yield item.offset, item.data
            return
        except RPCError as err:
            if err.status not in _TRANSIENT or failures >= MAX_RETRIES:
                raise
            await asyncio.sleep(min(2.0, 0.1 * 2**failures))
            failures += 1
