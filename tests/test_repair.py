"""A conversation wedged by the SDK core's update fault (sdk-rust #888) is
found and reset by a worker, and goes on (runtime/repair.py).

The fault is made on purpose: a first workflow task answered by hand, as
the core answered it in a crash audit (an update accepted and a local
activity's marker recorded, a new task asked for), whose next task then
times out as a killed worker's would. Every worker that takes the
workflow after that fails its tasks with BadUpdateWorkflowExecutionMessage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.duration_pb2 import Duration
from temporalio import activity, workflow
from temporalio.api.command.v1 import (
    Command,
    ProtocolMessageCommandAttributes,
    RecordMarkerCommandAttributes,
    UpsertWorkflowSearchAttributesCommandAttributes,
)
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import CommandType, EventType, TaskQueueKind, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.protocol.v1 import Message
from temporalio.api.sdk.v1 import WorkflowTaskCompletedMetadata
from temporalio.api.taskqueue.v1 import StickyExecutionAttributes, TaskQueue
from temporalio.api.update.v1 import Acceptance
from temporalio.api.workflowservice.v1 import (
    PollWorkflowTaskQueueRequest,
    RespondWorkflowTaskCompletedRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowHistory
from temporalio.worker import Worker

from client import Conversation, Refused, follow, list_conversations, start_conversation
from runtime.repair import claim_id, repair, repair_loop, repair_wedged, reset_point
from testbed.local_stack import start_worker, stop_process
from tests.support.stack import Stack

HISTORIES = Path(__file__).resolve().parent / "histories"

_WEDGED = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_BAD_UPDATE_WORKFLOW_EXECUTION_MESSAGE


@activity.defn
async def noop() -> str:
    return "ok"


@workflow.defn(name="RepairProbe", sandboxed=False)
class RepairProbe:
    """A local activity, then an update's answer: AgentWorkflow's first
    steps (``session_defaults``, then a subscriber's read answered)."""

    def __init__(self) -> None:
        self.ready = False

    @workflow.run
    async def run(self) -> str:
        await workflow.execute_local_activity(noop, start_to_close_timeout=timedelta(seconds=5))
        self.ready = True
        await workflow.wait_condition(lambda: workflow.all_handlers_finished())
        return "finished"

    @workflow.update
    async def read(self) -> str:
        await workflow.wait_condition(lambda: self.ready)
        return "read"


def _json(value: object) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(value).encode())


def _probe_marker() -> Command:
    """RepairProbe's ``noop`` local activity's marker, as the core records it."""
    now = time.time()
    stamp = {"seconds": int(now), "nanos": int(now % 1 * 1e9)}
    data = {
        "seq": 1,
        "attempt": 1,
        "activity_id": "1",
        "activity_type": "noop",
        "complete_time": stamp,
        "backoff": None,
        "original_schedule_time": stamp,
    }
    return Command(
        command_type=CommandType.COMMAND_TYPE_RECORD_MARKER,
        record_marker_command_attributes=RecordMarkerCommandAttributes(
            marker_name="core_local_activity",
            details={"data": Payloads(payloads=[_json(data)]), "result": Payloads(payloads=[_json("ok")])},
        ),
    )


async def _first_task_as_in_the_crash(client: Client, queue: str, commands: list[Command]) -> None:
    """Take the workflow's first task and answer it as the core did: the
    pending updates accepted, then ``commands`` (up to a local activity's
    marker), a new task asked for (returned to this "worker", which never
    answers it: it times out)."""
    service = client.workflow_service
    task = await service.poll_workflow_task_queue(
        PollWorkflowTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            identity="killed-worker",
        )
    )
    accepts, messages = [], []
    for request in task.messages:  # every update waiting, accepted
        accept_id = f"{request.id}/accept"
        body = AnyMessage()
        body.Pack(
            Acceptance(
                accepted_request_message_id=request.id, accepted_request_sequencing_event_id=request.event_id
            )
        )
        accepts.append(
            Command(
                command_type=CommandType.COMMAND_TYPE_PROTOCOL_MESSAGE,
                protocol_message_command_attributes=ProtocolMessageCommandAttributes(message_id=accept_id),
            )
        )
        messages.append(Message(id=accept_id, protocol_instance_id=request.protocol_instance_id, body=body))
    await service.respond_workflow_task_completed(
        RespondWorkflowTaskCompletedRequest(
            namespace=client.namespace,
            task_token=task.task_token,
            identity="killed-worker",
            commands=[*accepts, *commands],
            messages=messages,
            force_create_new_workflow_task=True,
            return_new_workflow_task=True,
            sticky_attributes=StickyExecutionAttributes(
                worker_task_queue=TaskQueue(
                    name=f"{queue}-sticky", kind=TaskQueueKind.TASK_QUEUE_KIND_STICKY, normal_name=queue
                ),
                schedule_to_start_timeout=Duration(seconds=1),
            ),
            sdk_metadata=WorkflowTaskCompletedMetadata(core_used_flags=[1, 2, 3, 4]),
        )
    )


def _commands_up_to_first_local_activity(events: list[HistoryEvent]) -> list[Command]:
    """The commands a first workflow task recorded, up to and with its first
    local activity's marker (what the core sent in the crash audit)."""
    first_task = next(
        e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    commands = []
    for event in events:
        if event.event_id <= first_task:
            continue
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            commands.append(
                Command(
                    command_type=CommandType.COMMAND_TYPE_RECORD_MARKER,
                    record_marker_command_attributes=RecordMarkerCommandAttributes(
                        marker_name=marker.marker_name, details=marker.details, header=marker.header
                    ),
                )
            )
            if marker.marker_name == "core_local_activity":
                return commands
        elif event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            upsert = event.upsert_workflow_search_attributes_event_attributes
            commands.append(
                Command(
                    command_type=CommandType.COMMAND_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
                    upsert_workflow_search_attributes_command_attributes=UpsertWorkflowSearchAttributesCommandAttributes(
                        search_attributes=upsert.search_attributes
                    ),
                )
            )
        else:
            raise AssertionError(
                f"the first task recorded {EventType.Name(event.event_type)} before its marker"
            )
    raise AssertionError("the first task recorded no local activity")


async def _events(handle: WorkflowHandle) -> list:
    return [event async for event in handle.fetch_history_events()]


async def _until(condition, seconds: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while True:
        result = await condition()
        if result:
            return result
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.5)


@pytest.mark.expect_task_failures("the wedge is made on purpose, then repaired")
async def test_a_worker_resets_a_conversation_the_update_fault_wedged(client: Client) -> None:
    queue = f"repair-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        RepairProbe.run,
        id=f"repair-{uuid.uuid4().hex[:6]}",
        task_queue=queue,
        task_timeout=timedelta(seconds=2),
    )
    reading = asyncio.create_task(handle.execute_update(RepairProbe.read))
    await asyncio.sleep(0.5)  # the update waits for the first task
    await _first_task_as_in_the_crash(client, queue, [_probe_marker()])
    wedged_run = (await handle.describe()).run_id

    async with Worker(client, task_queue=queue, workflows=[RepairProbe], activities=[noop]):

        async def wedged() -> bool:
            return any(
                event.workflow_task_failed_event_attributes.cause == _WEDGED
                for event in await _events(client.get_workflow_handle(handle.id, run_id=wedged_run))
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            )

        # If this fails, the SDK's core no longer has the fault: the repair
        # (runtime/repair.py) can go.
        await _until(wedged, 30, "the update fault did not wedge the workflow")
        assert not reading.done()

        # Two workers repair it at once (the end-to-end test below finds it
        # by the server's mark, after two failed attempts): one resets it.
        resets = await asyncio.gather(*(repair(client, handle.id, wedged_run, queue) for _ in "ab"))
        assert resets.count(None) == 1, resets

        description = await handle.describe()
        assert description.run_id != wedged_run  # reset: a new run, from the last completed task
        result = await client.get_workflow_handle(handle.id).result()
        assert result == "finished"
        events = await _events(client.get_workflow_handle(handle.id, run_id=description.run_id))
        kinds = [event.event_type for event in events]
        assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED in kinds  # the read was answered
        assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED in kinds[:6]  # the reset point's
        assert kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED) == 1

    # The claim's record says what was done; a second look (another worker's) does nothing.
    claim = await client.get_workflow_handle(claim_id(wedged_run)).describe()
    assert claim.status == WorkflowExecutionStatus.TERMINATED
    assert await repair(client, handle.id, wedged_run, queue) is None
    runs = [execution.run_id async for execution in client.list_workflows(f"WorkflowId = '{handle.id}'")]
    assert len(runs) == 2  # the wedged run and the one it was reset to: no second reset
    assert await repair_wedged(client, queue, workflow_type="RepairProbe") == []
    reading.cancel()


@pytest.mark.expect_task_failures("the wedge is made on purpose; the worker repairs it")
async def test_a_wedged_conversation_goes_on_by_itself(
    stack: Stack, worker_env: dict[str, str], artifacts: Path
) -> None:
    """A conversation the fault wedged, with a follow-up queued and a
    subscriber reading: its worker resets it, the follow-up runs, and the
    subscriber, which had read from the wedged run, reads the answer."""
    client = stack.client
    # What AgentWorkflow's first task recorded up to its first local
    # activity's marker (session_defaults) in the release before
    # defaults-by-activity: a conversation of that release, in the fault. A
    # conversation of this one takes its defaults by a plain activity, but
    # a task with a local tool's marker can meet the same fault.
    recorded = WorkflowHistory.from_json("agent_api", (HISTORIES / "v21" / "agent_api.json").read_text())
    commands = _commands_up_to_first_local_activity(list(recorded.events))

    queue = f"agent-repair-{uuid.uuid4().hex[:6]}"
    conversation_id = f"repair-{uuid.uuid4().hex[:6]}"
    await start_conversation(client, conversation_id, {"model": stack.model}, task_queue=queue)
    conversation = Conversation.attach(client, conversation_id)
    stack.script({"text": "The answer after the repair."})
    await conversation.follow_up("hello")
    events: list[dict] = []

    async def subscribe() -> None:
        async for _, event in follow(client, conversation_id):
            events.append(event)
            if event.get("type") == "agent_end":
                return

    subscriber = asyncio.create_task(subscribe())
    waiting = asyncio.create_task(conversation.wait_for_idle())
    await asyncio.sleep(0.5)  # the first read and the wait wait for the first task
    await _first_task_as_in_the_crash(client, queue, commands)
    wedged_run = (await client.get_workflow_handle(conversation_id).describe()).run_id

    # Its first look comes 20 s or more after it starts: time to see the
    # conversation wedged (``state`` below) before it is repaired.
    worker = start_worker(
        {**worker_env, "TEMPORAL_TASK_QUEUE": queue, "AGENT_REPAIR_INTERVAL_SECONDS": "20"},
        ["tests.support.tools"],
        artifacts / "repair-worker.log",
    )
    try:
        wedged = client.get_workflow_handle(conversation_id, run_id=wedged_run)

        async def failing() -> bool:
            return any(
                e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in await _events(wedged)
            )

        await _until(failing, 30, "the conversation's tasks did not fail")
        with pytest.raises(Refused, match=r"update fault \(sdk-rust #888\) wedged it .* A worker resets it"):
            await conversation.state()  # said while wedged: what it is, and that it heals
        await asyncio.wait_for(subscriber, 120)
        idle = await asyncio.wait_for(waiting, 30)  # asked again of the new run, answered there
    finally:
        stop_process(worker)
    ended = [event["message"] for event in events if event.get("type") == "message_end"]
    assert [message["role"] for message in ended] == ["user", "assistant"], events
    assert json.dumps(ended[0]["content"]).count("hello") == 1  # the follow-up, applied again, once
    assert "The answer after the repair." in json.dumps(ended[1]["content"])
    assert idle.messages[-1].role == "assistant"
    causes = [
        e.workflow_task_failed_event_attributes.cause
        for e in await _events(wedged)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert causes and set(causes) == {_WEDGED}  # it was wedged, by the fault
    assert (await wedged.describe()).status == WorkflowExecutionStatus.TERMINATED  # and reset
    log = (artifacts / "repair-worker.log").read_text()
    assert f"Conversation {conversation_id} was wedged by the SDK core's update fault" in log

    async def listed_once() -> list[str | None] | None:  # `starter.py list`: once, as it is now
        listed = list_conversations(client, model=stack.model)  # this test's model: its two conversations
        statuses = [found.status async for found in listed if found.id == conversation_id]
        return statuses if len(statuses) == 1 and statuses != ["running"] else None

    assert await _until(listed_once, 15, "the conversation is not listed once") == ["idle"]
    await conversation.close()


async def test_a_server_that_does_not_mark_failing_tasks_is_said_once_and_not_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without TemporalReportedProblems (an older server, or a self-hosted one without the dynamic
    config) the worker says at start that wedged conversations are not repaired, and lists nothing."""
    capabilities = SimpleNamespace(reported_problems_search_attribute=False)
    described = SimpleNamespace(namespace_info=SimpleNamespace(capabilities=capabilities))
    listed: list[str] = []

    async def describe_namespace(request: object, timeout: object = None) -> object:
        return described

    def list_workflows(query: str) -> object:
        listed.append(query)
        raise AssertionError("listed")

    client = SimpleNamespace(
        namespace="default",
        workflow_service=SimpleNamespace(describe_namespace=describe_namespace),
        list_workflows=list_workflows,
    )
    with caplog.at_level(logging.WARNING, logger="runtime.repair"):
        await asyncio.wait_for(repair_loop(client, "agent", asyncio.Event(), 0.01), 5)  # type: ignore[arg-type]
    assert not listed
    assert "numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=5" in caplog.text


def _event(event_id: int, kind: int, cause: int | None = None) -> HistoryEvent:
    event = HistoryEvent(event_id=event_id, event_type=kind)  # type: ignore[arg-type]
    if cause is not None:
        event.workflow_task_failed_event_attributes.cause = cause  # type: ignore[assignment]
    return event


def _reading(*events: HistoryEvent) -> Client:
    """A client whose history, read from its end, is ``events`` (newest first)."""

    async def reverse(request: object, timeout: object = None) -> object:
        return SimpleNamespace(history=SimpleNamespace(events=list(events)), next_page_token=b"")

    service = SimpleNamespace(get_workflow_execution_history_reverse=reverse)
    return SimpleNamespace(namespace="default", workflow_service=service)  # type: ignore[return-value]


_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
_FAILED = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
_STARTED = EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
_RESET = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
_UNHANDLED = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND


@pytest.mark.parametrize(
    ("events", "point"),
    [
        # wedged: reset to the last completed task, whatever failed before it
        ([_event(14, _STARTED), _event(12, _FAILED, _WEDGED), _event(9, _STARTED), _event(5, _COMPLETED)], 5),
        ([_event(12, _FAILED, _WEDGED), _event(5, _COMPLETED), _event(3, _FAILED, _UNHANDLED)], 5),
        # failing for another reason, or not failing: left alone
        ([_event(12, _FAILED, _UNHANDLED), _event(10, _FAILED, _WEDGED), _event(5, _COMPLETED)], None),
        ([_event(12, _COMPLETED), _event(10, _FAILED, _WEDGED), _event(5, _COMPLETED)], None),
        # wedged again right after a reset, before a task completed: a reset would only repeat it
        (
            [
                _event(12, _FAILED, _WEDGED),
                _event(8, _STARTED),
                _event(5, _FAILED, _RESET),
                _event(3, _COMPLETED),
            ],
            None,
        ),
    ],
    ids=["wedged", "older-failure", "other-cause", "healed", "wedged-after-reset"],
)
async def test_the_reset_point_is_the_last_completed_task_of_a_wedged_run(
    events: list[HistoryEvent], point: int | None
) -> None:
    assert await reset_point(_reading(*events), "chat-x", f"run-{uuid.uuid4().hex[:6]}") == point
