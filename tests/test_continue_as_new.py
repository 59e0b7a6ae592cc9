"""Continue-as-new: a long conversation crosses several workflow runs with
the same transcript and event sequence as one that never switches, and
nothing sent during a switch is lost."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowHistory
from temporalio.worker import Replayer

from client import WORKFLOW_TASK_TIMEOUT, follow, start_conversation
from runtime.payloads import data_converter_from_env
from runtime.sandbox import workflow_runner
from tests.support.stack import EventLog, Stack, outline
from workflows.agent import AgentWorkflow
from workflows.bindings import BindingsInterceptor, WorkflowBindings
from workflows.models import EventAdapter

TURNS = 300


def long_script(turns: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"tool_calls": [{"id": f"t{i}", "name": "echo", "arguments": {"text": str(i)}}], "chunk_chars": 50}
        for i in range(turns - 1)
    ]
    steps.append({"text": "All turns done."})
    return steps


async def run_conversation(stack: Stack, **settings: Any) -> tuple[list[dict[str, Any]], list[str], int]:
    stack.model_server.script(stack.model, long_script(TURNS))
    handle = await stack.start(prompt="count", closeWhenIdle=True, **settings)
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("agent_end", timeout=300)
    log.close()
    result = await handle.result()
    transcript = []
    for message in result.messages:
        data = message.model_dump()
        data.pop("timestamp", None)
        data.pop("model", None)
        transcript.append(data)
    offsets = [e["offset"] for e in log.events]
    assert offsets == list(range(len(offsets))), "the stream skipped or repeated an offset"
    runs = 0
    async for execution in stack.client.list_workflows(f"WorkflowId = '{handle.id}'"):
        runs += 1
        assert execution.status in (
            WorkflowExecutionStatus.CONTINUED_AS_NEW,
            WorkflowExecutionStatus.COMPLETED,
        )
    return transcript, outline(log.events, updates=True), runs


async def test_long_conversation_is_unchanged_by_continue_as_new(stack: Stack) -> None:
    # The server suggests continue-as-new by itself in a history this long:
    # the reference switches rarely, the other one every 40 turns.
    reference, reference_events, reference_runs = await run_conversation(stack)
    switched, switched_events, runs = await run_conversation(stack, continueAsNewAfterTurns=40)
    assert runs >= TURNS // 40 and runs > reference_runs
    assert len(switched) == 1 + 2 * (TURNS - 1) + 1
    assert switched == reference
    assert switched_events == reference_events


async def test_messages_sent_during_switches_are_not_lost(stack: Stack) -> None:
    turns = 60
    stack.model_server.script(stack.model, long_script(turns) + [{"text": "extra"}] * 30)
    handle = await stack.start(prompt="count", continueAsNewAfterTurns=5, steeringMode="all")
    log = EventLog(stack.client, handle.id)
    sent = []
    for i in range(20):
        await asyncio.sleep(0.05)
        text = f"steer {i}"
        await handle.signal("steer", text)
        sent.append(text)
    await log.wait_until(
        lambda es: sum(e["type"] == "agent_end" for e in es) >= 1 and (es[-1]["type"] == "agent_end"),
        timeout=120,
    )
    # Everything steered reached the transcript exactly once, in order.
    for _ in range(100):
        state = await stack.state(handle)
        if state.status == "idle" and state.steering_queue == 0:
            break
        await asyncio.sleep(0.2)
    messages = await stack.messages(handle)
    users = [m.content for m in messages if m.role == "user"]
    assert users[0] == "count"
    assert users[1:] == sent
    log.close()
    # A subscriber reconnecting at any offset gets the events after it, once.
    middle = len(log.events) // 2
    again = EventLog(stack.client, handle.id, from_offset=log.events[middle]["offset"])
    await again.wait_until(lambda es: len(es) >= len(log.events) - middle, timeout=30)
    again.close()
    assert [e["offset"] for e in again.events[: len(log.events) - middle]] == [
        e["offset"] for e in log.events[middle:]
    ]
    await handle.signal("close")
    EventAdapter.validate_python(log.events[0])


async def test_every_run_hands_a_dead_workers_task_over_within_4_seconds(stack: Stack) -> None:
    # A worker that dies holding a workflow task stalls the conversation for
    # the task timeout: 4 s for conversations started by this project
    # (the server's default is 10 s), kept by each continued run.
    stack.model_server.script(stack.model, long_script(4))
    handle = await stack.start(prompt="count", closeWhenIdle=True, continueAsNewAfterTurns=1)
    await handle.result()
    timeouts = []
    async for execution in stack.client.list_workflows(f"WorkflowId = '{handle.id}'"):
        description = await stack.client.get_workflow_handle(handle.id, run_id=execution.run_id).describe()
        timeouts.append(
            description.raw_description.execution_config.default_workflow_task_timeout.ToSeconds()
        )
    assert len(timeouts) >= 3
    assert set(timeouts) == {WORKFLOW_TASK_TIMEOUT.total_seconds()} == {4}


async def test_a_live_reader_behind_at_the_idle_switch_after_a_long_run_reads_on_without_a_gap(
    stack: Stack,
) -> None:
    """A run of 210 tool calls (over 500 history events) ends, and the
    idle conversation continues as new at once. It carried only the last
    200 events, as if every reader had read them: a live reader still
    behind was told events were skipped and missed up to 150 of the 210
    `tool_execution_end` (a mutation audit). With a reader behind, the
    switch carries as many as at a turn boundary."""
    calls = [{"id": f"s{i}", "name": "slow", "arguments": {"seconds": 2.0}} for i in range(210)]
    stack.script({"tool_calls": calls})
    handle = await stack.start(prompt="work")
    skipped: list[tuple[int, int]] = []
    seen: list[tuple[int, str]] = []

    async def read() -> None:
        async for offset, event in follow(
            stack.client, handle.id, 0, on_skipped=lambda a, b: skipped.append((a, b))
        ):
            seen.append((offset, event.get("type", "")))
            if event.get("type") == "agent_end":
                return

    reader = asyncio.create_task(read())
    try:
        while sum(kind == "tool_execution_start" for _, kind in seen) < 210:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        await handle.signal("abort")
        await asyncio.wait_for(reader, 60)
    finally:
        reader.cancel()
    runs = [run async for run in stack.client.list_workflows(f"WorkflowId = '{handle.id}'")]
    await handle.signal("close")

    assert WorkflowExecutionStatus.CONTINUED_AS_NEW in [run.status for run in runs]  # the idle switch came
    assert skipped == []
    offsets = [offset for offset, _ in seen]
    assert offsets == list(range(offsets[-1] + 1))
    assert sum(kind == "tool_execution_end" for _, kind in seen) == 210


async def test_every_model_call_of_every_run_has_the_workers_time_limit(stack: Stack) -> None:
    """A model call was cut at a fixed 10 minutes (a slow local model's
    long answer regenerated five times over): the limit is the worker's
    AGENT_MODEL_CALL_TIMEOUT (1500 s on the test worker), recorded when the
    conversation starts and carried across continue-as-new."""
    stack.model_server.script(stack.model, long_script(3))
    handle = await stack.start(prompt="count", closeWhenIdle=True, continueAsNewAfterTurns=1)
    await handle.result()
    assert await model_call_limits(stack, handle) == [1500.0] * 3


async def test_a_run_carrying_no_time_limit_reads_the_workers_again(
    stack: Stack, worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation whose first run recorded no limit (started before the
    setting, or continued as new by a worker of that release during a
    rollout: an upgrade audit) kept the workflow's 10 minutes in every later
    run. Its next run reads the worker's limit again, and records why."""
    from activities.session import SessionActivities
    from runtime.settings import Settings
    from worker import build_worker

    asked = 0

    @activity.defn(name="session_defaults")
    async def defaults_of_an_older_worker_first(self: Any) -> Any:
        nonlocal asked
        asked += 1
        return (
            self._defaults.model_copy(update={"model_call_timeout": None}) if asked == 1 else self._defaults
        )

    monkeypatch.setattr(SessionActivities, "session_defaults", defaults_of_an_older_worker_first)
    queue = f"limit-again-{uuid.uuid4().hex[:6]}"
    stack.model_server.script(stack.model, long_script(3))
    async with build_worker(stack.client, Settings.from_env(worker_env, task_queue=queue)):
        handle = await start_conversation(
            stack.client,
            f"limit-again-{uuid.uuid4().hex[:8]}",
            {"model": stack.model, "prompt": "count", "closeWhenIdle": True, "continueAsNewAfterTurns": 1},
            task_queue=queue,
        )
        await handle.result()
    assert await model_call_limits(stack, handle) == [600.0, 1500.0, 1500.0]
    assert asked == 2  # the second run read it again; the third carried it
    histories = await run_histories(stack, handle)
    patches = [
        [
            e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
            for e in history.events
            if e.marker_recorded_event_attributes.marker_name == "core_patch"
        ]
        for history in histories
    ]
    asked_again = [any(b"model-call-limit-again" in data for data in run) for run in patches]
    assert asked_again[:2] == [False, True] and not any(asked_again[2:])
    for history in histories:  # each run replays as it ran
        await Replayer(
            workflows=[AgentWorkflow],
            data_converter=data_converter_from_env(),
            workflow_runner=workflow_runner(),
            interceptors=[BindingsInterceptor(WorkflowBindings())],
        ).replay_workflow(history)


async def run_histories(stack: Stack, handle: Any) -> list[WorkflowHistory]:
    histories: list[WorkflowHistory] = []
    run_id = handle.first_execution_run_id or handle.run_id
    while True:
        histories.append(await stack.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history())
        last = histories[-1].events[-1]
        if not last.HasField("workflow_execution_continued_as_new_event_attributes"):
            return histories
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id


async def model_call_limits(stack: Stack, handle: Any) -> list[float]:
    """The start-to-close timeout of each model call, over every run, in order."""
    limits: list[float] = []
    run_id = handle.first_execution_run_id or handle.run_id
    while True:
        history = await stack.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        limits += [
            e.activity_task_scheduled_event_attributes.start_to_close_timeout.ToTimedelta().total_seconds()
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "stream_assistant_response"
        ]
        last = history.events[-1]
        if not last.HasField("workflow_execution_continued_as_new_event_attributes"):
            break
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return limits
