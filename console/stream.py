"""Follow a conversation's event stream (topic ``events`` of its Workflow Stream)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from workflows.models import EVENTS_TOPIC


async def follow(
    client: Client, workflow_id: str, from_offset: int = 0, *, cooldown_ms: int = 100
) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """Yield ``(offset, event)`` from ``from_offset`` on, across continue-as-new,
    until the workflow completes (then the retained events are drained first).

    Events are pi's camelCase dicts, as published. ``cooldown_ms`` is the pause
    between polls once caught up; each poll is a long poll, so it only bounds
    how often a busy stream is read. 100 ms matches the LLM activity's batch
    interval (``streamBatchMs``): polling faster shows tokens no sooner, and
    each poll costs the workflow an update and a workflow task (measured:
    22 -> 18 history events and 64 -> 60 ms per LLM turn, bench/README.md).
    An idle stream's first token is unaffected: the poll is already waiting.
    """
    stream = WorkflowStreamClient.create(client, workflow_id)
    async for item in stream.subscribe(
        [EVENTS_TOPIC], from_offset=from_offset, poll_cooldown=timedelta(milliseconds=cooldown_ms)
    ):
        yield item.offset, item.data
