"""Following a conversation's events (``client.follow``, ``_EventReader``,
``Conversation.events`` and its watchdog, queries) and printing above the
chat's prompt (``AbovePromptWriter``): unit-level, against stand-ins for the
Temporal client, so no dev server is needed."""

from __future__ import annotations

import asyncio
import io
import time
from types import SimpleNamespace
from typing import Any

import pytest
import temporalio.converter
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.enums.v1 import PendingActivityState, PendingWorkflowTaskState
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.contrib.workflow_streams import PollInput, PollResult
from temporalio.contrib.workflow_streams._types import _encode_payload, _WorkflowStreamWireItem
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

import client
from client import Conversation, Refused, _EventReader, follow
from console.above_prompt import AbovePromptWriter
from workflows.contract import BUSY_ERROR, DRAINING_ERROR, TRUNCATED_ERROR

CONVERTER = temporalio.converter.default()


class Done(Exception):
    """Ends a scripted read."""


class FakeHandle:
    """A workflow handle whose calls the test scripts."""

    def __init__(self, id: str = "chat-x", run_id: str | None = None) -> None:
        self.id = id
        self.run_id = run_id
        self.updates: list[tuple[str, Any]] = []
        self.update_result: Any = Done  # what a started update's result() gives: Done raises
        self.describe_as: Any = None
        self.query_as: Any = None

    async def start_update(self, name: str, arg: Any, **kwargs: Any) -> Any:
        self.updates.append((name, arg))
        result = self.update_result
        if isinstance(result, BaseException) or result is Done:
            raise result if isinstance(result, BaseException) else Exception("refused")

        async def answer() -> Any:
            if callable(result):
                return await result()
            return result

        return SimpleNamespace(workflow_run_id="run-1", result=answer)

    async def describe(self, **kwargs: Any) -> Any:
        if isinstance(self.describe_as, BaseException):
            raise self.describe_as
        return self.describe_as

    async def query(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.query_as, BaseException):
            raise self.query_as
        if callable(self.query_as):
            return await self.query_as()
        return self.query_as


class FakeClient:
    """A client handing out ``FakeHandle``s (recording the run ids asked for)."""

    def __init__(self) -> None:
        self.handle = FakeHandle()
        self.handles: dict[str | None, FakeHandle] = {}
        self.asked: list[str | None] = []
        self.data_converter = CONVERTER

    def get_workflow_handle(self, id: str, *, run_id: str | None = None, **kwargs: Any) -> FakeHandle:
        self.asked.append(run_id)
        if run_id is None:
            return self.handle
        return self.handles.setdefault(run_id, FakeHandle(id, run_id))


def item(offset: int, value: Any) -> _WorkflowStreamWireItem:
    return _WorkflowStreamWireItem(
        "events", _encode_payload(CONVERTER.payload_converter.to_payload(value)), offset
    )


def scripted_reads(monkeypatch: pytest.MonkeyPatch, reads: list[Any], seen: list[Any] | None = None) -> None:
    """``_EventReader._read`` answers ``reads`` in turn (a callable is called
    with the reader, an ``RPCError`` raised), then raises ``Done``."""

    async def read(self: _EventReader) -> Any:
        if seen is not None:
            seen.append((time.monotonic(), self._by_query, self._run_end_wanted))
        if not reads:
            raise Done
        answer = reads.pop(0)
        if isinstance(answer, RPCError):
            raise answer
        return answer(self) if callable(answer) else answer

    monkeypatch.setattr(_EventReader, "_read", read)


async def offsets_read(fake: FakeClient, from_offset: int = 0, **kwargs: Any) -> list[int]:
    out: list[int] = []
    with pytest.raises(Done):
        async for offset, _ in follow(fake, "chat-x", from_offset, **kwargs):  # type: ignore[arg-type]
            out.append(offset)
    return out


# --- follow and its reader --------------------------------------------------------------


async def test_an_item_whose_type_is_not_text_is_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who may signal can publish on the stream: an item whose ``type`` is not a string is skipped."""
    scripted_reads(monkeypatch, [PollResult([item(0, {"type": 5}), item(1, {"type": "turn_end"})], 2, True)])
    assert await offsets_read(FakeClient()) == [1]


async def test_transient_failures_are_counted_in_a_row_not_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long stream with an occasional failed poll is read to its end: only failures in a row give up."""
    monkeypatch.setattr(client, "MAX_RETRIES", 2)
    monkeypatch.setattr(client, "_backoff", lambda failures: 0.0)
    aborted = RPCError("workflow task failure", RPCStatusCode.FAILED_PRECONDITION, b"")
    reads: list[Any] = []
    for n in range(6):  # six failures in all, one at a time, each followed by an event
        reads.append(aborted)
        reads.append(PollResult([item(n, {"type": "turn_start"})], n + 1, True))
    scripted_reads(monkeypatch, reads)
    assert await offsets_read(FakeClient()) == list(range(6))


@pytest.mark.parametrize("code", [RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED])
async def test_a_read_no_worker_answered_in_time_is_made_again(
    monkeypatch: pytest.MonkeyPatch, code: RPCStatusCode
) -> None:
    """While workers were killed and started, a read (a query) ran past its
    deadline: the reader raised "Timeout expired" and stopped mid-conversation
    (the client's own deadline reports it as CANCELLED)."""
    monkeypatch.setattr(client, "_backoff", lambda failures: 0.0)
    reads: list[Any] = [
        RPCError("Timeout expired", code, b""),
        PollResult([item(0, {"type": "turn_start"})], 1, True),
    ]
    scripted_reads(monkeypatch, reads)
    assert await offsets_read(FakeClient()) == [0]


async def test_a_read_a_worker_could_not_replay_for_is_made_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """During a rolling upgrade an old worker answered a read of a run the
    new code made with a nondeterminism error: the reader ended (an upgrade
    audit). Another worker answers the next read; other query failures are
    still the caller's."""
    monkeypatch.setattr(client, "_backoff", lambda failures: 0.0)
    old_worker = WorkflowQueryFailedError("[TMPRL1100] Nondeterminism error: Non-deprecated patch marker ...")

    def replay_fails(reader: _EventReader) -> Any:
        raise old_worker

    reads: list[Any] = [replay_fails, replay_fails, PollResult([item(0, {"type": "turn_start"})], 1, True)]
    scripted_reads(monkeypatch, reads)
    assert await offsets_read(FakeClient()) == [0]

    def unreadable(reader: _EventReader) -> Any:
        raise WorkflowQueryFailedError("A payload is too large on this worker")

    scripted_reads(monkeypatch, [unreadable, PollResult([item(0, {"type": "turn_start"})], 1, True)])
    with pytest.raises(WorkflowQueryFailedError):
        await offsets_read(FakeClient())


@pytest.mark.parametrize(
    "error",
    [
        RPCError("transport error", RPCStatusCode.UNKNOWN, b""),  # the connection broke under a poll
        RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""),  # the server is down
    ],
)
async def test_a_server_that_does_not_answer_is_polled_until_it_does(
    monkeypatch: pytest.MonkeyPatch, error: RPCError
) -> None:
    """A chat gave up on a 12 s server restart ("The event stream failed:
    transport error", an audit) while the CLI's note said it retried until
    the server answered: such failures do not count towards giving up."""
    monkeypatch.setattr(client, "MAX_RETRIES", 2)
    monkeypatch.setattr(client, "_backoff", lambda failures: 0.0)
    reads: list[Any] = [error] * 10 + [PollResult([item(0, {"type": "turn_start"})], 1, True)]
    scripted_reads(monkeypatch, reads)
    assert await offsets_read(FakeClient()) == [0]


async def test_events_gone_over_several_reads_are_told_once_from_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``on_skipped`` names the first offset not read, even when a read between two gaps brought no event."""
    scripted_reads(
        monkeypatch,
        [
            PollResult([item(0, {"type": "turn_start"}), item(1, {"type": "turn_end"})], 2, True),
            PollResult([item(5, "not an event")], 6, True),  # 2-4 gone, nothing to yield
            PollResult([item(9, {"type": "turn_start"})], 10, True),  # 6-8 gone
        ],
    )
    skipped: list[tuple[int, int]] = []
    offsets = await offsets_read(FakeClient(), on_skipped=lambda a, b: skipped.append((a, b)))
    assert offsets == [0, 1, 9] and skipped == [(2, 9)]


async def test_events_before_the_offset_asked_for_are_not_yielded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader from offset 3 gets nothing before it, though a read answers from earlier."""
    scripted_reads(monkeypatch, [PollResult([item(n, {"type": "turn_start"}) for n in range(5)], 5, True)])
    assert await offsets_read(FakeClient(), 3) == [3, 4]


async def test_a_read_answering_an_earlier_next_offset_does_not_rewind_the_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No event is yielded twice or before ``from_offset``, whatever next offset a read answers."""
    scripted_reads(
        monkeypatch,
        [
            PollResult([], 2, True),
            PollResult([item(n, {"type": "turn_start"}) for n in range(2, 7)], 7, True),
        ],
    )
    assert await offsets_read(FakeClient(), 5) == [5, 6]


async def test_a_read_answering_an_earlier_next_offset_reports_no_gap_already_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``on_skipped`` is not called for offsets the reader had already had."""
    scripted_reads(
        monkeypatch,
        [
            PollResult([item(n, {"type": "turn_start"}) for n in range(5)], 5, True),
            PollResult([], 2, True),
            PollResult([item(4, {"type": "turn_start"}), item(5, {"type": "turn_end"})], 6, True),
        ],
    )
    skipped: list[tuple[int, int]] = []
    offsets = await offsets_read(FakeClient(), on_skipped=lambda a, b: skipped.append((a, b)))
    assert offsets == [0, 1, 2, 3, 4, 5] and skipped == []


async def test_a_backlog_is_read_on_at_once_without_a_cooldown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches marked ``more_ready`` are read one after another, not a cooldown apart."""
    delta = {"type": "message_update"}
    scripted_reads(monkeypatch, [PollResult([item(n, delta)], n + 1, True) for n in range(4)])
    started = time.monotonic()
    assert await offsets_read(FakeClient(), cooldown_ms=5000) == [0, 1, 2, 3]
    assert time.monotonic() - started < 2.5  # three cooldowns would be 15 s


async def test_the_read_after_a_runs_end_is_a_long_poll_even_after_deltas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After ``agent_end`` the conversation may complete: the next read is no query (it would replay it)."""
    seen: list[Any] = []
    batch = [item(0, {"type": "message_update"}), item(1, {"type": "agent_end"})]
    scripted_reads(monkeypatch, [PollResult(batch, 2, False)], seen)
    await offsets_read(FakeClient(), cooldown_ms=50)
    assert [by_query for _, by_query, _ in seen] == [False, False]


async def test_read_pacing_does_not_hold_back_the_read_after_a_runs_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """README: the end of a run still comes at once, however many updates the reader sent."""
    monkeypatch.setattr(client, "READ_PACING", ((0, 5.0),))
    seen: list[Any] = []
    scripted_reads(monkeypatch, [PollResult([item(0, {"type": "agent_end"})], 1, False)], seen)
    await asyncio.wait_for(offsets_read(FakeClient()), 2)
    assert seen[1][0] - seen[0][0] < 1.0


async def test_a_new_run_is_waited_for_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run's end cuts a cooldown short: an ``agent_start`` makes the reader wait for that run's end."""

    def first(reader: _EventReader) -> PollResult:
        reader._run_end_wanted = False  # the previous run's wait was used
        return PollResult([item(0, {"type": "agent_start"})], 1, True)

    seen: list[Any] = []
    scripted_reads(monkeypatch, [first], seen)
    await offsets_read(FakeClient())
    assert seen[1][2] is True


async def test_leaving_a_follow_withdraws_its_wait_for_the_runs_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that stops reading leaves no wait behind in the background."""
    fake = FakeClient()
    waiting = asyncio.Event()
    withdrawn = asyncio.Event()

    async def never() -> Any:
        waiting.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            withdrawn.set()
            raise

    fake.handle.update_result = never
    delta = {"type": "message_update"}
    scripted_reads(
        monkeypatch, [PollResult([item(0, delta)], 1, False), PollResult([item(1, delta)], 2, False)]
    )
    stream = follow(fake, "chat-x", 0, cooldown_ms=100)  # type: ignore[arg-type]
    await stream.__anext__()
    await stream.__anext__()  # after a cooldown, during which the wait started
    await asyncio.wait_for(waiting.wait(), 2)
    await stream.aclose()
    await asyncio.wait_for(withdrawn.wait(), 2)


async def test_an_end_read_by_query_is_acknowledged_to_the_workflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query cannot tell the workflow what was read: an ``agent_end`` read by query is told by an update
    poll."""
    fake = FakeClient()
    fake.handle.update_result = PollResult([], 2, False)

    def by_query(reader: _EventReader) -> PollResult:
        reader._by_query = True  # this read was a query
        return PollResult([item(0, {"type": "message_update"}), item(1, {"type": "agent_end"})], 2, False)

    scripted_reads(monkeypatch, [by_query])
    await offsets_read(fake, cooldown_ms=20)
    await asyncio.sleep(0.05)
    assert [(name, poll.from_offset) for name, poll in fake.handle.updates] == [(client.POLL_UPDATE, 1)]


def test_read_pacing_starts_at_its_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """README/READ_PACING: a reader that has sent 500 updates to a run waits 1 s between reads."""
    reader = _EventReader(FakeClient(), "chat-x", 0, 200)  # type: ignore[arg-type]
    for _ in range(500):
        reader._sent_update("run-1")
    assert reader._least_wait() == 1.0


def test_updates_are_counted_per_run() -> None:
    """A run that continued as new starts a fresh count of the updates sent to it (2,000 a run)."""
    reader = _EventReader(FakeClient(), "chat-x", 0, 200)  # type: ignore[arg-type]
    for _ in range(600):
        reader._sent_update("run-1")
    reader._sent_update("run-2")
    assert reader.updates_in_run == 1 and reader._least_wait() == 0.0


async def test_one_wait_for_a_runs_end_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """One run-end update a run: a second cooldown of the same run sends none."""
    fake = FakeClient()
    fake.handle.update_result = 3  # the end, already read
    reader = _EventReader(fake, "chat-x", 5, 200)  # type: ignore[arg-type]
    await reader._cool_down(0.05, False)
    await reader._cool_down(0.05, False)
    assert [name for name, _ in fake.handle.updates] == [client.RUN_END_UPDATE]


async def test_a_wait_released_for_continue_as_new_is_made_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run-end wait released for continue-as-new (None) waits again, on the next run."""
    fake = FakeClient()
    fake.handle.update_result = None
    reader = _EventReader(fake, "chat-x", 5, 200)  # type: ignore[arg-type]
    await reader._cool_down(0.05, False)
    await reader._cool_down(0.05, False)
    assert [name for name, _ in fake.handle.updates] == [client.RUN_END_UPDATE] * 2


@pytest.mark.parametrize("answer", [RuntimeError("refused"), 5], ids=["refused", "already-read"])
async def test_the_cooldown_stays_whole_unless_a_new_run_end_comes(answer: Any) -> None:
    """A worker without the run-end update, or the wait answering the offset
    already reached: the cooldown goes on as it was, not cut short."""
    fake = FakeClient()
    fake.handle.update_result = answer
    reader = _EventReader(fake, "chat-x", 5, 200)  # type: ignore[arg-type]
    started = time.monotonic()
    await reader._cool_down(0.3, False)
    assert time.monotonic() - started >= 0.28


async def test_a_run_end_during_a_cooldown_is_read_by_long_poll() -> None:
    """The end that cut a cooldown short is read by update, which tells the workflow it was read."""
    fake = FakeClient()
    fake.handle.update_result = 9
    reader = _EventReader(fake, "chat-x", 5, 200)  # type: ignore[arg-type]
    reader._by_query = True
    started = time.monotonic()
    await reader._cool_down(5.0, False)
    assert time.monotonic() - started < 2.5 and reader._by_query is False


async def test_a_query_that_finds_nothing_new_gives_way_to_the_long_poll() -> None:
    """A caught-up reader waits on a long poll, not by queries at every cooldown."""
    fake = FakeClient()
    fake.handle.query_as = PollResult([], 5, False)
    reader = _EventReader(fake, "chat-x", 5, 200)  # type: ignore[arg-type]
    reader._by_query = True
    polled = PollResult([item(5, {"type": "turn_start"})], 6, False)

    async def long_poll() -> PollResult:
        return polled

    reader._long_poll = long_poll  # type: ignore[method-assign]
    assert await reader._read() is polled and reader._by_query is False


async def test_a_run_that_ended_before_any_worker_took_it_reads_as_no_events() -> None:
    """A conversation terminated before its first task: following it ends, with no event and no error."""
    fake = FakeClient()
    reader = _EventReader(fake, "chat-x", 0, 200)  # type: ignore[arg-type]
    reader._ended = FakeHandle(run_id="ended")
    reader._ended.query_as = RPCError(
        "workflow closed before WorkflowTaskStarted", RPCStatusCode.FAILED_PRECONDITION, b""
    )
    result = await reader._read()
    assert result is not None and (result.items, result.next_offset) == ([], 0)


def refused_as(kind: str) -> WorkflowUpdateFailedError:
    return WorkflowUpdateFailedError(ApplicationError("refused", type=kind))


async def test_a_truncated_offset_reads_on_from_the_oldest_event_kept() -> None:
    """An offset the stream no longer keeps is read on from the oldest kept (then told by ``on_skipped``)."""
    fake = FakeClient()
    fake.handle.update_result = refused_as(TRUNCATED_ERROR)
    reader = _EventReader(fake, "chat-x", 7, 200)  # type: ignore[arg-type]
    assert await reader._long_poll() is None
    assert reader.offset == 0


async def test_a_draining_stream_is_polled_again_after_a_cooldown() -> None:
    """A stream draining for continue-as-new is not polled in a tight loop."""
    fake = FakeClient()
    fake.handle.update_result = refused_as(DRAINING_ERROR)
    reader = _EventReader(fake, "chat-x", 7, 300)  # type: ignore[arg-type]
    started = time.monotonic()
    assert await reader._long_poll() is None
    assert time.monotonic() - started >= 0.28


async def test_a_reader_refused_as_busy_reads_by_query_next() -> None:
    """README: past 5 waiting reads the others read by query (they do not keep asking for a wait)."""
    fake = FakeClient()
    fake.handle.update_result = refused_as(BUSY_ERROR)
    reader = _EventReader(fake, "chat-x", 7, 20)  # type: ignore[arg-type]
    assert await reader._long_poll() is None
    assert reader._by_query is True


@pytest.mark.parametrize(
    "status",
    [WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TERMINATED],
    ids=["failed", "terminated"],
)
async def test_a_poll_of_a_run_that_ended_reads_the_rest_from_that_run(
    status: WorkflowExecutionStatus,
) -> None:
    """Following a failed or terminated conversation ends, reading what it kept, not with the poll error."""
    fake = FakeClient()
    fake.handle.update_result = RPCError("workflow execution already completed", RPCStatusCode.NOT_FOUND, b"")
    fake.handles[None] = fake.handle
    fake.handle.describe_as = run_described(status, "run-9")
    reader = _EventReader(fake, "chat-x", 7, 200)  # type: ignore[arg-type]
    assert await reader._long_poll() is None
    assert reader._ended is not None and reader._ended.run_id == "run-9"


def run_described(status: WorkflowExecutionStatus, run_id: str, reset_run_id: str = "") -> SimpleNamespace:
    extended = SimpleNamespace(reset_run_id=reset_run_id)
    return SimpleNamespace(
        status=status, run_id=run_id, raw_description=SimpleNamespace(workflow_extended_info=extended)
    )


@pytest.mark.parametrize(
    ("status", "reset_to"),
    [(WorkflowExecutionStatus.CONTINUED_AS_NEW, ""), (WorkflowExecutionStatus.TERMINATED, "run-2")],
    ids=["continued-as-new", "reset"],
)
async def test_a_poll_of_a_run_that_went_on_in_another_is_made_again_on_the_latest_run(
    status: WorkflowExecutionStatus, reset_to: str
) -> None:
    """A poll whose run continued as new, or was reset (terminated, going on in a new run: a worker's
    repair, runtime/repair.py), is no error and no end: the reader polls the latest run next."""
    fake = FakeClient()

    async def gone() -> Any:
        raise RPCError("workflow execution already completed", RPCStatusCode.NOT_FOUND, b"")

    fake.handle.update_result = gone
    fake.handle.describe_as = run_described(WorkflowExecutionStatus.RUNNING, "run-2")
    fake.handles["run-1"] = FakeHandle(run_id="run-1")
    fake.handles["run-1"].describe_as = run_described(status, "run-1", reset_to)
    reader = _EventReader(fake, "chat-x", 7, 200)  # type: ignore[arg-type]
    assert await reader._long_poll() is None
    assert reader._ended is None


async def test_a_workflows_end_is_acknowledged_from_the_last_event_read() -> None:
    """The acknowledgement in the background polls from the ``agent_end`` read: the workflow learns of it."""
    fake = FakeClient()
    fake.handle.update_result = PollResult([], 10, False)
    reader = _EventReader(fake, "chat-x", 10, 200)  # type: ignore[arg-type]
    reader._acknowledge(9)
    await asyncio.sleep(0.05)
    [(_, poll)] = fake.handle.updates
    assert isinstance(poll, PollInput) and poll.from_offset == 9


# --- Conversation: the watchdog, queries, endings -----------------------------------------


def described_on(task_queue: str, *, task_attempt: int = 1) -> SimpleNamespace:
    """What ``describe`` answers for a running conversation on ``task_queue``
    whose next workflow task is at ``task_attempt`` (past 1: failing)."""
    task = SimpleNamespace(attempt=task_attempt)
    return SimpleNamespace(task_queue=task_queue, raw_description=SimpleNamespace(pending_workflow_task=task))


def bare_conversation(fake: FakeClient) -> Conversation:
    return Conversation(fake, "chat-x")  # type: ignore[arg-type]


async def test_a_stall_that_ended_without_events_is_told_again_when_it_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog tells a new stall, also when the previous one ended with no event between."""
    monkeypatch.setattr(client, "_WORKER_CHECKS", (0.05, 0.05))
    answers = iter(["it waits", None, None, "it waits again"])

    async def waits_for_worker(self: Conversation, after: float = 5.0) -> str | None:
        return next(answers, "it waits again")

    notes: list[str] = []
    monkeypatch.setattr(Conversation, "waits_for_worker", waits_for_worker)
    monkeypatch.setattr(Conversation, "on_slow_update", notes.append)
    looks = asyncio.create_task(bare_conversation(FakeClient())._note_while_no_worker(client._Reading()))
    try:
        await asyncio.sleep(0.5)
    finally:
        looks.cancel()
    assert notes == ["it waits", "it waits again"]


async def test_the_watchdog_looks_at_most_as_often_as_its_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet conversation costs a describe call per look, spaced as ``_WORKER_CHECKS`` says."""
    monkeypatch.setattr(client, "_WORKER_CHECKS", (0.05, 0.2))
    looks = 0

    async def waits_for_worker(self: Conversation, after: float = 5.0) -> str | None:
        nonlocal looks
        looks += 1
        await asyncio.sleep(0)
        return None

    monkeypatch.setattr(Conversation, "waits_for_worker", waits_for_worker)
    reading = client._Reading()
    reading.saw_event()
    task = asyncio.create_task(bare_conversation(FakeClient())._note_while_no_worker(reading))
    try:
        await asyncio.sleep(0.6)
    finally:
        task.cancel()
    assert 1 <= looks <= 5


async def _watched_events(monkeypatch: pytest.MonkeyPatch, events: int, after: float) -> int:
    """How often the watchdog looked while ``events`` came 20 ms apart, and ``after`` s after."""
    monkeypatch.setattr(client, "_WORKER_CHECKS", (0.1, 0.1))
    looks = 0

    async def waits_for_worker(self: Conversation, after: float = 5.0) -> str | None:
        nonlocal looks
        looks += 1
        return None

    async def stream(*args: Any, **kwargs: Any) -> Any:
        for n in range(events):
            await asyncio.sleep(0.02)
            yield n, {"type": "message_update"}

    monkeypatch.setattr(client, "follow", stream)
    monkeypatch.setattr(Conversation, "waits_for_worker", waits_for_worker)
    monkeypatch.setattr(Conversation, "on_slow_update", lambda sentence: None)
    async for _ in bare_conversation(FakeClient()).events():
        pass
    await asyncio.sleep(after)
    return looks


async def test_the_watchdog_does_not_look_while_events_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversation whose events flow is never described for a stall."""
    assert await _watched_events(monkeypatch, 20, 0) == 0


async def test_the_watchdog_stops_when_the_reader_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the events end, nothing keeps describing the conversation."""
    assert await _watched_events(monkeypatch, 1, 0.4) == 0


def described(*, status: WorkflowExecutionStatus = WorkflowExecutionStatus.RUNNING, **raw: Any) -> Any:
    return SimpleNamespace(status=status, task_queue="agent", raw_description=raw["raw"])


def ago(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(int((time.time() - seconds) * 1000))
    return stamp


def activity(raw: DescribeWorkflowExecutionResponse, kind: str, since: float, **fields: Any) -> Any:
    call = raw.pending_activities.add()
    call.activity_type.name = kind
    call.state = PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
    call.scheduled_time.CopyFrom(ago(since))
    call.attempt = fields.pop("attempt", 1)
    for name, value in fields.items():
        if name == "task_queue":
            call.activity_options.task_queue.name = value
        else:
            setattr(call, name, value)
    return call


async def waiting_sentence(raw: DescribeWorkflowExecutionResponse, **kwargs: Any) -> str | None:
    fake = FakeClient()
    fake.handle.describe_as = described(raw=raw, **kwargs)
    return await bare_conversation(fake).waits_for_worker(5.0)


async def test_an_ended_conversation_waits_for_no_worker() -> None:
    """``waits_for_worker`` is None once the conversation has ended, whatever it had pending."""
    raw = DescribeWorkflowExecutionResponse()
    activity(raw, "execute_tool", 60)
    assert await waiting_sentence(raw, status=WorkflowExecutionStatus.TERMINATED) is None


async def test_a_paused_call_is_not_waiting_for_a_worker() -> None:
    """A call paused by an operator is not a missing worker."""
    raw = DescribeWorkflowExecutionResponse()
    activity(raw, "execute_tool", 60, paused=True)
    assert await waiting_sentence(raw) is None


async def test_a_first_attempt_is_not_numbered() -> None:
    """The sentence names the step, with its attempt only from the second one."""
    raw = DescribeWorkflowExecutionResponse()
    activity(raw, "execute_tool", 60)
    sentence = await waiting_sentence(raw)
    assert sentence is not None and "a tool call has not been taken for 60 s" in sentence


async def test_the_step_waiting_longest_is_named() -> None:
    """With several steps waiting, the sentence names the one that waited longest, and its task queue."""
    raw = DescribeWorkflowExecutionResponse()
    activity(raw, "execute_tool", 10)
    activity(raw, "stream_assistant_response", 90, attempt=3, task_queue="models")
    sentence = await waiting_sentence(raw)
    assert sentence is not None
    assert "task queue 'models': its model call (attempt 3) has not been taken for 90 s" in sentence


async def test_a_step_with_no_scheduled_time_is_not_late() -> None:
    """A workflow task the server gives no time for is not reported as waiting since 1970."""
    raw = DescribeWorkflowExecutionResponse()
    raw.pending_workflow_task.state = PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED
    assert await waiting_sentence(raw) is None


async def test_a_query_busy_for_good_is_the_callers_after_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RESOURCE_EXHAUSTED is asked again ``MAX_RETRIES`` times, then raised: never a wait for ever."""
    monkeypatch.setattr(client, "MAX_RETRIES", 2)
    monkeypatch.setattr(client, "_backoff", lambda failures: 0.0)
    fake = FakeClient()
    asked = 0

    async def busy() -> Any:
        nonlocal asked
        asked += 1
        assert asked < 10, "asked for ever"
        raise RPCError("consistent query buffer is full", RPCStatusCode.RESOURCE_EXHAUSTED, b"")

    fake.handle.query_as = busy
    with pytest.raises(RPCError, match="buffer is full"):
        await bare_conversation(fake)._query("state", dict)
    assert asked == 3


async def test_a_query_no_worker_answered_in_time_says_start_one() -> None:
    """A query past its deadline is refused with the sentence naming the task queue, not a raw RPC error."""
    fake = FakeClient()
    fake.handle.query_as = RPCError("Timeout expired", RPCStatusCode.DEADLINE_EXCEEDED, b"")
    fake.handle.describe_as = described_on("agent")
    with pytest.raises(Refused, match="no worker on task queue 'agent' answered"):
        await bare_conversation(fake)._query("state", dict)


async def test_a_slow_query_note_says_it_waits_for_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query waiting for a worker is noted as such, not as an update that is kept and applied later."""
    monkeypatch.setattr(client, "UPDATE_NOTE_AFTER", 0.0)
    notes: list[str] = []
    monkeypatch.setattr(Conversation, "on_slow_update", notes.append)
    fake = FakeClient()
    fake.handle.describe_as = described_on("agent")
    await bare_conversation(fake)._note_when_slow("state", query=True)
    assert notes == ["state has waited 0 s for a worker on 'agent' to answer it: is one running?"]


async def test_how_a_running_conversation_ended_is_the_callers_word() -> None:
    """``_how_it_ended(running=...)`` answers ``running`` while the conversation runs."""
    fake = FakeClient()
    fake.handle.describe_as = SimpleNamespace(status=WorkflowExecutionStatus.RUNNING)
    assert await bare_conversation(fake)._how_it_ended(running="", unknown="?") == ""


async def test_a_failed_conversation_says_why_without_a_doubled_full_stop() -> None:
    """A failure's reason is quoted in parentheses, without its trailing full stop."""
    fake = FakeClient()
    fake.handle.describe_as = SimpleNamespace(status=WorkflowExecutionStatus.FAILED)

    async def result(**kwargs: Any) -> Any:
        raise WorkflowFailureError(cause=ApplicationError("The model server answered 500."))

    fake.handle.result = result  # type: ignore[attr-defined]
    assert await bare_conversation(fake)._how_it_ended() == "failed (The model server answered 500)"


# --- AbovePromptWriter ------------------------------------------------------------------


def writer(columns: int = 80) -> tuple[AbovePromptWriter, io.StringIO, list[int]]:
    out = io.StringIO()
    changes: list[int] = []
    return (
        AbovePromptWriter(out, on_tail_change=lambda: changes.append(1), columns=lambda: columns),
        out,
        changes,
    )


def test_a_style_reset_is_not_carried_to_the_next_line() -> None:
    """After a reset, the next line starts unstyled, and no stray reset ends the finished one."""
    w, out, _ = writer()
    w.write("\x1b[1mbold\x1b[0m plain\nnext")
    assert (out.getvalue(), w.tail) == ("\x1b[1mbold\x1b[0m plain\n", "next")


def test_a_tail_of_styles_only_shows_nothing() -> None:
    """The prompt shows no line in progress when only style codes were written."""
    w, _, _ = writer()
    w.write("\x1b[2m")
    assert w.tail == ""


def test_each_write_tells_the_prompt_its_tail_changed() -> None:
    """The prompt redraws the streaming line at every write."""
    w, _, changes = writer()
    w.write("tok")
    w.write("ens")
    assert len(changes) == 2


def test_ending_with_no_line_in_progress_writes_nothing() -> None:
    """``end_line`` adds no blank line when nothing was streaming."""
    w, out, changes = writer()
    w.write("done\n")
    w.end_line()
    assert out.getvalue() == "done\n" and len(changes) == 1


def test_ending_mid_line_passes_the_line_on_and_clears_the_prompt() -> None:
    """The unfinished line is printed, and the prompt is told its tail is gone."""
    w, out, changes = writer()
    w.write("half a li")
    w.end_line()
    assert (out.getvalue(), w.tail, len(changes)) == ("half a li\n", "", 2)


def test_wide_characters_wrap_by_their_cells() -> None:
    """A CJK character takes two cells: a line wraps where the terminal would."""
    w, out, _ = writer(columns=5)
    w.write("漢字漢")
    assert (out.getvalue(), w.tail) == ("漢字\n", "漢")


def test_a_one_column_terminal_still_shows_each_character() -> None:
    """A terminal too narrow for the margin wraps at one cell a line, with no blank lines."""
    w, out, _ = writer(columns=1)
    w.write("ab")
    assert (out.getvalue(), w.tail) == ("a\n", "b")


def test_flush_reaches_the_terminal() -> None:
    """``flush`` flushes the patched stdout."""
    flushed: list[int] = []
    out = io.StringIO()
    out.flush = lambda: flushed.append(1)  # type: ignore[method-assign]
    w = AbovePromptWriter(out, on_tail_change=lambda: None, columns=lambda: 80)
    w.flush()
    assert flushed == [1]
