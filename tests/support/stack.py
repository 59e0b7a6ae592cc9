"""Test helpers: start conversations, script the model, read the event stream."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from local_stack import DevServer
from scripted_model import ScriptedModelServer
from workflows.models import EVENTS_TOPIC, EventAdapter

_COOLDOWN = timedelta(milliseconds=20)


@dataclass
class Stack:
    client: Client
    model_server: ScriptedModelServer
    task_queue: str
    model: str
    dev_server: DevServer

    def script(self, *steps: dict[str, Any]) -> None:
        self.model_server.script(self.model, list(steps))

    def requests(self) -> list[dict[str, Any]]:
        return self.model_server.requests(self.model)

    async def start(self, **input: Any) -> WorkflowHandle[Any, Any]:
        """Start a conversation with this stack's model; camelCase input."""
        workflow_id = f"test-{uuid.uuid4().hex[:10]}"
        return await self.client.start_workflow(
            "AgentWorkflow",
            {"model": self.model, **input},
            id=workflow_id,
            task_queue=self.task_queue,
        )

    async def events(
        self, workflow_id: str, *, runs: int = 1, from_offset: int = 0, timeout: float = 30
    ) -> list[dict[str, Any]]:
        """Events from ``from_offset`` until ``runs`` ``agent_end`` events (or the workflow ends)."""
        return await asyncio.wait_for(read_events(self.client, workflow_id, runs, from_offset), timeout)


async def read_events(
    client: Client, workflow_id: str, runs: int = 1, from_offset: int = 0
) -> list[dict[str, Any]]:
    stream = WorkflowStreamClient.create(client, workflow_id)
    out: list[dict[str, Any]] = []
    ends = 0
    async for item in stream.subscribe([EVENTS_TOPIC], from_offset=from_offset, poll_cooldown=_COOLDOWN):
        event = EventAdapter.validate_python(item.data).model_dump()
        event["offset"] = item.offset
        out.append(event)
        if event["type"] == "agent_end":
            ends += 1
            if ends >= runs:
                break
    return out


def outline(events: list[dict[str, Any]], *, updates: bool = False) -> list[str]:
    """A compact, comparable form of an event sequence."""
    lines = []
    for e in events:
        kind = e["type"]
        if kind in ("message_start", "message_end"):
            m = e["message"]
            label = m["role"]
            if m["role"] == "toolResult":
                label += f":{m['toolCallId']}"
            elif m["role"] == "assistant" and kind == "message_end":
                label += f":{m['stopReason']}"
            lines.append(f"{kind}:{label}")
        elif kind.startswith("tool_execution"):
            if kind == "tool_execution_update" and not updates:
                continue
            lines.append(f"{kind}:{e['toolCallId']}")
        elif kind == "message_update":
            if updates:
                lines.append(f"{kind}:{e['assistantMessageEvent']['type']}")
        else:
            lines.append(kind)
    return lines
