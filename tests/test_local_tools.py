"""The fast path: tools named in AGENT_LOCAL_TOOLS (or declared
``local=True``) run as local activities, in the workflow task that
scheduled them: same results, no activity task on the server."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.common import RetryPolicy

import tests.support.tools  # noqa: F401  (registers the test tools in this process)
import workflows.calls as calls_module
from activities.tool_runner import ToolActivities
from runtime.settings import Settings
from tests.support.stack import Stack, finished_on_own_worker
from workflows.contract import ToolRequest


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


@contextlib.asynccontextmanager
async def local_conversation(
    stack: Stack, worker_env: dict[str, str], tools: set[str], name: str, **start: Any
) -> AsyncIterator[WorkflowHandle[Any, Any]]:
    """A conversation prompted "go" (``start``: more of its input) on a
    worker of its own, which runs ``tools`` as local activities."""
    from client import start_conversation
    from worker import build_worker

    queue = f"{name}-{uuid.uuid4().hex[:6]}"
    settings = replace(Settings.from_env(worker_env, task_queue=queue), local_tools=frozenset(tools))
    async with build_worker(stack.client, settings):
        yield await start_conversation(
            stack.client,
            f"{name}-{uuid.uuid4().hex[:8]}",
            {"model": stack.model, "prompt": "go", **start},
            task_queue=queue,
        )


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


async def test_local_tools_take_no_share_of_the_signals_the_others_are_granted(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """A local tool sends no signal (its events go with its result), so the
    tool calls running beside it are granted as if it were not there.
    Before, each local call running took a share: a remote call started
    after twelve local ones was granted a seventh of the budget it gets
    alone, and its progress was paced accordingly."""
    queue = f"local-{uuid.uuid4().hex[:6]}"
    settings = replace(Settings.from_env(worker_env, task_queue=queue), local_tools=frozenset({"calculator"}))
    locals_ = [call(f"l{i}", "calculator", expression=f"{i}+1") for i in range(12)]
    stack.script({"tool_calls": [*locals_, call("r1", "echo", text="remote")]}, {"text": "done"})
    handle, result, _ = await finished_on_own_worker(stack, settings, "go")
    assert result.messages[-1].text == "done"
    [request] = [
        request
        for event in (await handle.fetch_history()).events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == "execute_tool"
        for request in await stack.client.data_converter.decode(
            event.activity_task_scheduled_event_attributes.input.payloads, [ToolRequest]
        )
    ]
    # Alone it is given half of what is left, halved again for its retries
    # (less a batch or two the model call may have sent on a slow machine);
    # a seventh of that before.
    alone = (calls_module.SIGNAL_LIMIT - calls_module.SIGNAL_RESERVE) // 4
    assert request.tool_call.id == "r1" and request.max_batches is not None
    assert alone - 5 <= request.max_batches <= alone


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


async def test_a_local_tool_reporting_progress_runs_once_when_the_run_continues_as_new(
    stack: Stack, worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The run continued as new in the workflow task its local tool ended
    in; the tool's last progress, still arriving, made the server refuse
    the switch (UnhandledCommand), the task's local result went with it,
    and the tool ran again, sending more: round and round for minutes,
    every update refused (a crash audit). The result is saved first."""
    from client import Conversation

    ledger = tmp_path / "ledger"
    monkeypatch.setenv("AGENT_TEST_LEDGER", str(ledger))
    stack.script({"tool_calls": [call("p1", "slow", seconds=0.5, steps=2)]}, {"text": "done"})
    async with local_conversation(
        stack, worker_env, {"slow"}, "local-switch", continueAsNewAfterTurns=1
    ) as handle:
        conversation = Conversation.attach(stack.client, handle.id)
        for _ in range(100):  # as a user polls `state` (an update in flight changes the timing)
            await asyncio.sleep(0.2)
            state = await conversation.state()
            if state.status == "idle" and state.runs == 1:
                break
        first = stack.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        history = await first.fetch_history()
        await conversation.close()

    assert (state.status, state.runs, state.error_message) == ("idle", 1, None)
    assert len(ledger.read_text().splitlines()) == 1, "the local tool ran once"
    failed = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
    assert failed == [], failed
    assert any(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW for e in history.events
    )


async def test_an_abort_cancels_a_running_local_tool_within_a_workflow_task_heartbeat(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """A local tool runs inside a workflow task, which the worker keeps
    alive with heartbeats (a new task every few seconds): an abort is taken
    at the next one, and the tool is cancelled as an activity is."""
    from client import Conversation
    from tests.support.stack import EventLog

    stack.script({"tool_calls": [call("a1", "slow", seconds=30, steps=30)]}, {"text": "never"})
    async with local_conversation(stack, worker_env, {"slow"}, "local-abort") as handle:
        log = EventLog(stack.client, handle.id)
        await log.wait_for_type("tool_execution_start")
        loop = asyncio.get_running_loop()
        sent = loop.time()
        await handle.signal("abort")
        events = await asyncio.wait_for(log.wait_for_type("agent_end"), 20)
        took = loop.time() - sent
        log.close()
        await Conversation.attach(stack.client, handle.id).close()

    end = next(e for e in events if e["type"] == "tool_execution_end")
    assert end["isError"] and end["result"]["content"][0]["text"] == "Tool execution aborted"
    assert took < 15, f"the abort waited {took:.1f} s"  # the tool alone takes 30 s


async def test_the_local_results_are_saved_before_a_switch_that_calls_waiting_for_approval_make(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """A batch of a local tool and two calls waiting for approval, the
    switch due in the batch: both waiting calls woke for the switch when
    the local tool ended; the first waited for the result to be saved, the
    second went ahead and continued as new in the same workflow task (a
    review). The local result is in a task of its own before the switch."""
    from client import Conversation

    stack.script(
        {
            "tool_calls": [
                call("g1", "guarded_echo", text="yes"),
                call("g2", "guarded_echo", text="no"),
                call("e1", "echo", text="free"),
            ]
        },
        {"text": "done"},
    )
    async with local_conversation(
        stack, worker_env, {"echo"}, "local-waiters", continueAsNewAfterTurns=1
    ) as handle:
        for _ in range(100):
            runs = [e async for e in stack.client.list_workflows(f"WorkflowId = '{handle.id}'")]
            if len(runs) > 1:
                break
            await asyncio.sleep(0.1)
        first = stack.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        history = await first.fetch_history()
        await Conversation.attach(stack.client, handle.id).close()
        # Ended before the worker stops: evicted mid-wait, its coroutines were
        # closed outside the workflow's event loop (warnings, nothing else).
        await asyncio.wait_for(stack.client.get_workflow_handle(handle.id).result(), 20)

    events = list(history.events)
    switched = next(
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    )
    last_task = max(
        i
        for i, e in enumerate(events[:switched])
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    local_results = [
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
        and e.marker_recorded_event_attributes.details.get("data") is not None
    ]
    tool_result = local_results[-1]  # the first is the session defaults
    assert tool_result < last_task, "the local result and the switch in one workflow task"
