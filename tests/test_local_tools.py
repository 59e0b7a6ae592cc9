"""The fast path: tools named in AGENT_LOCAL_TOOLS (or declared
``local=True``) run as local activities, in the workflow task that
scheduled them: same results, no activity task on the server."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from temporalio.api.enums.v1 import EventType

import tests.support.tools  # noqa: F401  (registers the test tools in this process)
from runtime.settings import Settings
from tests.support.stack import Stack, finished_on_own_worker


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def test_local_tools_run_in_the_workflow_task(stack: Stack, worker_env: dict[str, str]) -> None:
    queue = f"local-{uuid.uuid4().hex[:6]}"
    settings = replace(Settings.from_env(worker_env, task_queue=queue), local_tools=frozenset({"calculator"}))
    stack.script(
        {"tool_calls": [call("l1", "calculator", expression="6*7"), call("r1", "echo", text="remote")]},
        {"text": "done"},
    )
    handle, result, events = await finished_on_own_worker(stack, settings, "go")
    results = {m.tool_call_id: m for m in result.messages if m.role == "toolResult"}
    assert results["l1"].content[0].text == "6*7 = 42" and results["r1"].content[0].text == "echo: remote"
    ends = [e["toolCallId"] for e in events if e["type"] == "tool_execution_end"]
    assert sorted(ends) == ["l1", "r1"]
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled.count("execute_tool") == 1, "only the remote tool is an activity task"
    markers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert len(markers) >= 2, "the session defaults and the local tool are recorded as markers"
