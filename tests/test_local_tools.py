"""The fast path: tools named in AGENT_LOCAL_TOOLS (or declared
``local=True``) run as local activities, in the workflow task that
scheduled them: same results, no activity task on the server."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.common import RetryPolicy

import tests.support.tools  # noqa: F401  (registers the test tools in this process)
import workflows.calls as calls_module
from activities.tool_runner import ToolActivities
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


async def test_a_local_tool_failing_as_an_activity_is_the_calls_error_not_the_conversations(
    stack: Stack, worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool's own failures are results; what fails the activity itself (a
    fault in the runner, here made on purpose) reaches the workflow from a
    local activity as a bare ApplicationError, not an ActivityError as from
    an activity task, and it failed the whole conversation (a robustness
    audit). It is the call's error result, as on the default path."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the runner broke")

    monkeypatch.setattr(ToolActivities, "_scrubbed", broken)
    monkeypatch.setattr(calls_module, "TOOL_RETRY", RetryPolicy(maximum_attempts=1))
    queue = f"local-{uuid.uuid4().hex[:6]}"
    settings = replace(Settings.from_env(worker_env, task_queue=queue), local_tools=frozenset({"calculator"}))
    stack.script({"tool_calls": [call("l1", "calculator", expression="6*7")]}, {"text": "done"})

    _, result, _ = await finished_on_own_worker(stack, settings, "go")

    [failed] = [m for m in result.messages if m.role == "toolResult"]
    assert failed.is_error and "the runner broke" in failed.content[0].text
    assert result.messages[-1].text == "done"
