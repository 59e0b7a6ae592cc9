"""Test helpers: start conversations, script the model, read the event stream."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle

from client import Conversation, follow, start_conversation
from runtime.settings import Settings
from testbed.local_stack import DevServer
from testbed.scripted_model import ScriptedModelServer
from workflows.contract import SessionResult, SessionState
from workflows.models import AgentMessage, EventAdapter

_COOLDOWN_MS = 20


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

    async def start(self, *, start_signal: str | None = None, **input: Any) -> WorkflowHandle[Any, Any]:
        """Start a conversation with this stack's model; camelCase input,
        and ``start_signal`` sent with the start (signal-with-start)."""
        workflow_id = f"test-{uuid.uuid4().hex[:10]}"
        return await start_conversation(
            self.client,
            workflow_id,
            {"model": self.model, **input},
            task_queue=self.task_queue,
            start_signal=start_signal,
        )

    async def conversation(self, **options: Any) -> Conversation:
        """Start a ``Conversation`` with this stack's model; snake_case options."""
        settings = Settings.from_env(task_queue=self.task_queue)
        return await Conversation.start(
            self.client, settings, id=f"test-{uuid.uuid4().hex[:10]}", **{"model": self.model, **options}
        )

    async def run_bulky_tools(self, *sizes_kib: int) -> tuple[WorkflowHandle[Any, Any], list[str]]:
        """A finished conversation whose one turn called the test tool ``bulky``
        once per size (KiB of incompressible details each); returns it and the
        marker each tool output carries (only the output: the arguments hold a tag)."""
        tags = [uuid.uuid4().hex[:8] for _ in sizes_kib]
        calls = [
            {"id": f"bulky_{i}", "name": "bulky", "arguments": {"tag": tag, "kib": kib}}
            for i, (tag, kib) in enumerate(zip(tags, sizes_kib, strict=True))
        ]
        self.script({"tool_calls": calls}, {"text": "The tools answered."})
        handle = await self.start(prompt="Run the bulky tool.", closeWhenIdle=True)
        await handle.result()
        return handle, [f"output-{tag}" for tag in tags]

    async def state(self, handle: WorkflowHandle[Any, Any]) -> SessionState:
        return await handle.query("state", result_type=SessionState)

    async def messages(self, handle: WorkflowHandle[Any, Any]) -> list[AgentMessage]:
        return await handle.query("messages", result_type=list[AgentMessage])

    async def events(
        self, workflow_id: str, *, runs: int = 1, from_offset: int = 0, timeout: float = 30
    ) -> list[dict[str, Any]]:
        """Events from ``from_offset`` until ``runs`` ``agent_end`` events (or the workflow ends)."""
        return await asyncio.wait_for(read_events(self.client, workflow_id, runs, from_offset), timeout)


async def finished_on_own_worker(
    stack: Stack, settings: Settings, prompt: str
) -> tuple[WorkflowHandle[Any, Any], SessionResult, list[dict[str, Any]]]:
    """A ``closeWhenIdle`` conversation with ``prompt`` on a worker of its
    own, built from ``settings`` (on their task queue), run to its end: its
    handle, result and events (read while that worker can replay them)."""
    from worker import build_worker

    async with build_worker(stack.client, settings):
        handle = await start_conversation(
            stack.client,
            f"{settings.task_queue}-{uuid.uuid4().hex[:6]}",
            {"model": stack.model, "prompt": prompt, "closeWhenIdle": True},
            task_queue=settings.task_queue,
        )
        result = await asyncio.wait_for(handle.result(), 30)
        events = await read_events(stack.client, handle.id)
    return handle, result, events


async def read_events(
    client: Client, workflow_id: str, runs: int = 1, from_offset: int = 0
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    ends = 0
    async for offset, data in follow(client, workflow_id, from_offset, cooldown_ms=_COOLDOWN_MS):
        event = EventAdapter.validate_python(data).model_dump()
        event["offset"] = offset
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
        elif kind.startswith("tool_"):
            if kind == "tool_execution_update" and not updates:
                continue
            lines.append(f"{kind}:{e['toolCallId']}")
        elif kind == "message_update":
            if updates:
                lines.append(f"{kind}:{e['assistantMessageEvent']['type']}")
        else:
            lines.append(kind)
    return lines


class EventLog:
    """Collects a conversation's events in the background, so a test can
    wait for a moment (a tool started, a delta arrived) and act then."""

    def __init__(self, client: Client, workflow_id: str, from_offset: int = 0) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._collect(client, workflow_id, from_offset))

    async def _collect(self, client: Client, workflow_id: str, from_offset: int) -> None:
        try:
            async for offset, data in follow(client, workflow_id, from_offset, cooldown_ms=_COOLDOWN_MS):
                event = EventAdapter.validate_python(data).model_dump()
                event["offset"] = offset
                async with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        finally:
            async with self._changed:  # wake waiters: the stream has ended
                self._changed.notify_all()

    async def wait_until(self, condition: Any, timeout: float = 30) -> list[dict[str, Any]]:
        """Wait until ``condition(events)`` holds; returns the events so far."""

        async def check() -> list[dict[str, Any]]:
            async with self._changed:
                while not condition(self.events):
                    if self._task.done():
                        self._task.result()
                        raise AssertionError(f"the stream ended first: {outline(self.events)}")
                    await self._changed.wait()
                return list(self.events)

        return await asyncio.wait_for(check(), timeout)

    async def wait_for_type(self, kind: str, count: int = 1, timeout: float = 30) -> list[dict[str, Any]]:
        """Wait for the ``count``-th event of type ``kind``."""
        return await self.wait_until(lambda events: sum(e["type"] == kind for e in events) >= count, timeout)

    def close(self) -> None:
        self._task.cancel()


def accepted_updates(history: Any) -> list[str]:
    """The names of the updates a workflow history accepted, in order."""
    return [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        for e in history.events
        if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
