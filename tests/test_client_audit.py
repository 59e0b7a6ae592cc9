"""The client library's behaviours a script relies on that no other test
checked (a mutation audit of ``client.py``'s ``Conversation`` and the
functions around it): unit-level, over the scripted fake client of
``tests/test_follow.py``."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.api.enums.v1 import PendingWorkflowTaskState
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.workflow_streams import PollResult
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

import client
from client import Conversation, Refused, _check_fork_point, list_conversations, start_conversation
from tests.test_follow import (
    FakeClient,
    activity,
    ago,
    bare_conversation,
    described_on,
    item,
    scripted_reads,
    waiting_sentence,
)
from workflows.contract import PromptResult, SessionState, WaitForIdleResult
from workflows.models import AssistantMessage, ToolCall, ToolResultMessage, UserMessage

ABORTED = "Unable to perform workflow execution update due to unexpected workflow task failure."


def aborted() -> RPCError:
    return RPCError(ABORTED, RPCStatusCode.FAILED_PRECONDITION, b"")


def no_backoff(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``_backoff`` answers 0 s and records the failure counts it was asked for."""
    asked: list[int] = []

    def backoff(failures: int) -> float:
        asked.append(failures)
        return 0.0

    monkeypatch.setattr(client, "_backoff", backoff)
    return asked


# --- starting ---------------------------------------------------------------------------


async def test_a_started_conversation_gets_the_projects_workflow_task_timeout() -> None:
    """A conversation whose worker died holding a task stalls 4 s, not the server's 10 s default."""
    started: dict[str, Any] = {}

    class Starter:
        async def start_workflow(self, workflow: str, input: Any, **kwargs: Any) -> str:
            started.update(kwargs, workflow=workflow)
            return "handle"

    await start_conversation(Starter(), "chat-x", {}, task_queue="agent")  # type: ignore[arg-type]
    assert started["task_timeout"] == timedelta(seconds=4)
    assert (started["workflow"], started["id"], started["task_queue"]) == ("AgentWorkflow", "chat-x", "agent")


# --- updates ----------------------------------------------------------------------------


async def test_an_update_aborted_by_failed_workflow_tasks_is_given_up_after_the_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An update whose workflow task keeps failing is the caller's after ``MAX_RETRIES`` tries."""
    monkeypatch.setattr(client, "MAX_RETRIES", 2)
    no_backoff(monkeypatch)
    fake = FakeClient()
    calls = 0

    async def execute_update(name: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        assert calls < 10, "made again for ever"
        raise aborted()

    fake.handle.execute_update = execute_update  # type: ignore[attr-defined]
    with pytest.raises(RPCError, match="unexpected workflow task failure"):
        await bare_conversation(fake).configure(max_turns=3)
    assert calls == 3


async def test_a_wait_for_idle_the_server_stops_answering_says_ask_again() -> None:
    """``wait_for_idle`` withdraws nothing: a wait the server gave up is a sentence to ask again."""
    fake = FakeClient()

    async def execute_update(name: str, *args: Any, **kwargs: Any) -> Any:
        raise WorkflowUpdateRPCTimeoutOrCancelledError()

    fake.handle.execute_update = execute_update  # type: ignore[attr-defined]
    with pytest.raises(Refused, match=r"^Conversation chat-x did not answer wait_for_idle: ask again\.$"):
        await bare_conversation(fake).wait_for_idle()


def slow_updates(monkeypatch: pytest.MonkeyPatch, answer: Any) -> tuple[Conversation, list[str]]:
    """A conversation whose updates are answered with ``answer`` after 0.2 s,
    slow notes due at once; the notes said."""
    monkeypatch.setattr(client, "UPDATE_NOTE_AFTER", 0.0)
    notes: list[str] = []
    monkeypatch.setattr(Conversation, "on_slow_update", notes.append)
    fake = FakeClient()
    fake.handle.describe_as = described_on("agent")

    async def execute_update(name: str, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.2)
        return answer

    fake.handle.execute_update = execute_update  # type: ignore[attr-defined]
    return bare_conversation(fake), notes


async def test_wait_for_idle_is_not_noted_as_waiting_for_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long ``wait_for_idle`` is a run going on, not a request no worker took."""
    conversation, notes = slow_updates(monkeypatch, WaitForIdleResult(runs=1))
    assert (await conversation.wait_for_idle()).runs == 1
    assert notes == []


async def test_a_slow_update_is_noted_once_saying_it_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request no worker takes is told once, with what happens to it (kept, applied later)."""
    conversation, notes = slow_updates(monkeypatch, PromptResult(run=1, event_offset=0))
    await conversation.send_prompt("hi")
    assert notes == [
        "prompt has waited 0 s for a worker on 'agent': is one running? It is kept and applies when one "
        "takes it (stopping this wait does not withdraw it)."
    ]


async def test_a_slow_update_to_a_conversation_whose_workflow_task_fails_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker runs but fails the conversation's workflow task (a README
    audit: a worker without its hooks): the note asked "is one running?"
    and said the request applies later, which it did not."""
    conversation, notes = slow_updates(monkeypatch, PromptResult(run=1, event_offset=0))
    conversation.handle.describe_as = described_on("agent", task_attempt=3)  # type: ignore[attr-defined]
    await conversation.send_prompt("hi")
    assert notes == [
        "prompt has waited 0 s: the conversation's workflow task is failing on the worker (attempt 3), and "
        "nothing is taken until it passes; why follows if it goes on failing."
    ]


async def test_a_failing_slow_note_callback_does_not_fail_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A callback that raises is the caller's problem: the request's note ends quietly."""
    monkeypatch.setattr(client, "UPDATE_NOTE_AFTER", 0.0)

    def broken(sentence: str) -> None:
        raise RuntimeError("callback broke")

    monkeypatch.setattr(Conversation, "on_slow_update", broken)
    fake = FakeClient()
    fake.handle.describe_as = described_on("agent")
    await bare_conversation(fake)._note_when_slow("prompt")  # raises nothing


async def test_wait_for_idle_across_continues_as_new_backs_off_from_the_second_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run switching over and over is asked again with growing pauses, not in a tight loop of updates."""
    asked = no_backoff(monkeypatch)
    fake = FakeClient()
    answers: list[Any] = [
        WorkflowUpdateFailedError(ApplicationError("switched", type="ContinuedAsNew")),
        WorkflowUpdateFailedError(ApplicationError("switched", type="ContinuedAsNew")),
        WorkflowUpdateFailedError(ApplicationError("switched", type="ContinuedAsNew")),
        WaitForIdleResult(runs=4),
    ]

    async def execute_update(name: str, *args: Any, **kwargs: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    fake.handle.execute_update = execute_update  # type: ignore[attr-defined]
    assert (await bare_conversation(fake).wait_for_idle()).runs == 4
    assert asked == [0, 1]


# --- runs and signals ---------------------------------------------------------------------


async def test_each_control_method_sends_its_own_signal() -> None:
    """Each control method sends the workflow the signal of its own name."""
    fake = FakeClient()
    sent: list[tuple[str, tuple[Any, ...]]] = []

    async def signal(name: str, *args: Any, **kwargs: Any) -> None:
        sent.append((name, args))

    fake.handle.signal = signal  # type: ignore[attr-defined]
    chat = bare_conversation(fake)
    await chat.steer("now")
    await chat.follow_up("later")
    await chat.abort()
    await chat.stop_after_turn()
    await chat.close()
    assert sent == [
        ("steer", ("now",)),
        ("follow_up", ("later",)),
        ("abort", ()),
        ("stop_after_turn", ()),
        ("close", ()),
    ]


def scripted_events(monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]]) -> None:
    async def stream(*args: Any, **kwargs: Any) -> Any:
        for offset, event in enumerate(events):
            yield offset, event

    monkeypatch.setattr(client, "follow", stream)


async def test_an_agent_end_without_messages_does_not_end_a_runs_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the workflow's own ``agent_end`` (with its messages) ends a run's events, not a forged one."""
    scripted_events(
        monkeypatch,
        [
            {"type": "agent_start"},
            {"type": "agent_end"},
            {"type": "turn_end"},
            {"type": "agent_end", "messages": []},
        ],
    )
    chat = bare_conversation(FakeClient())
    seen = [event["type"] async for _, event in chat.run_events(PromptResult(run=1, event_offset=0))]
    assert seen == ["agent_start", "agent_end", "turn_end", "agent_end"]


async def test_a_forged_agent_end_gives_no_messages_instead_of_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ``agent_end`` whose messages are not the workflow's makes ``prompt`` return none, not raise."""
    scripted_events(monkeypatch, [{"type": "agent_start"}, {"type": "agent_end", "messages": [{"role": 5}]}])
    fake = FakeClient()
    fake.handle.describe_as = SimpleNamespace(status=WorkflowExecutionStatus.RUNNING)
    assert await bare_conversation(fake)._run_messages(PromptResult(run=1, event_offset=0)) == []


# --- the watchdog ---------------------------------------------------------------------


async def test_a_stall_after_events_came_again_is_told_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader told of a stall is told of the next one too once events had come in between."""
    monkeypatch.setattr(client, "_WORKER_CHECKS", (0.05, 0.05))

    async def waits_for_worker(self: Conversation, after: float = 5.0) -> str | None:
        return "it waits"

    notes: list[str] = []
    monkeypatch.setattr(Conversation, "waits_for_worker", waits_for_worker)
    monkeypatch.setattr(Conversation, "on_slow_update", notes.append)
    reading = client._Reading()
    looks = asyncio.create_task(bare_conversation(FakeClient())._note_while_no_worker(reading))
    try:
        await asyncio.sleep(0.12)
        assert notes == ["it waits"]
        reading.saw_event()
        await asyncio.sleep(0.2)
    finally:
        looks.cancel()
    assert notes == ["it waits", "it waits"]


async def test_a_workflow_task_no_worker_took_is_named() -> None:
    """A conversation whose next workflow task waits (every worker gone) says so."""
    raw = DescribeWorkflowExecutionResponse()
    raw.pending_workflow_task.state = PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED
    raw.pending_workflow_task.scheduled_time.CopyFrom(ago(30))
    sentence = await waiting_sentence(raw)
    assert sentence is not None
    assert (
        "waits for a worker on task queue 'agent': its next workflow task has not been taken for 30 s"
        in sentence
    )


async def test_a_call_without_a_task_queue_of_its_own_names_the_conversations() -> None:
    """A model or tool call on the conversation's task queue names that queue."""
    raw = DescribeWorkflowExecutionResponse()
    activity(raw, "stream_assistant_response", 20)
    sentence = await waiting_sentence(raw)
    assert sentence is not None and "task queue 'agent': its model call has not been taken" in sentence


async def test_a_retried_call_waits_from_its_next_attempt_not_its_first() -> None:
    """A call retried a second ago (after a backoff) is not reported as waiting since its first attempt."""
    raw = DescribeWorkflowExecutionResponse()
    call = activity(raw, "execute_tool", 120, attempt=4)
    call.next_attempt_schedule_time.CopyFrom(ago(1))
    assert await waiting_sentence(raw) is None


# --- queries and state ----------------------------------------------------------------


async def test_a_query_the_server_refuses_for_want_of_pollers_says_no_worker_answered() -> None:
    """With its workers gone a while the server refuses a query at once
    ("no poller seen for task queue recently"): `state` printed the
    server's words, not the README's sentence (an operator audit)."""
    fake = FakeClient()
    fake.handle.query_as = RPCError(
        "no poller seen for task queue recently, worker may be down", RPCStatusCode.FAILED_PRECONDITION, b""
    )
    fake.handle.describe_as = described_on("agent")
    with pytest.raises(Refused, match=r"did not answer `state` within 30 s: no worker on task queue 'agent'"):
        await bare_conversation(fake)._query("state", dict)


async def test_a_query_cancelled_by_the_server_says_no_worker_answered() -> None:
    """A query the server gave up (CANCELLED) is the sentence naming the task queue, not a raw RPC error."""
    fake = FakeClient()
    fake.handle.query_as = RPCError("cancelled", RPCStatusCode.CANCELLED, b"")
    fake.handle.describe_as = described_on("agent")
    with pytest.raises(Refused, match=r"did not answer `state` within 30 s: no worker on task queue 'agent'"):
        await bare_conversation(fake)._query("state", dict)


async def test_a_query_to_a_failing_workflow_task_is_asked_again_then_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A workflow task in failed state is asked again a few times, then refused with what to do."""
    no_backoff(monkeypatch)
    fake = FakeClient()
    asked = 0

    async def failing() -> Any:
        nonlocal asked
        asked += 1
        assert asked < 30, "asked for ever"
        raise RPCError(
            "Unable to query workflow due to Workflow Task in failed state.",
            RPCStatusCode.FAILED_PRECONDITION,
            b"",
        )

    fake.handle.query_as = failing
    with pytest.raises(
        Refused, match=r"^Conversation chat-x cannot answer now: its workflow task is failing"
    ):
        await bare_conversation(fake)._query("state", dict)
    assert asked == client._FAILING_TASK_RETRIES + 1


async def test_a_query_a_worker_could_not_replay_for_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """During a rolling upgrade an old worker could not replay a run the new
    code made: `state` was refused at once, though the next worker to take
    the query answers it (an upgrade audit). Asked again for ~3 s, then the
    refusal names the failure as before."""
    monkeypatch.setattr(client, "_backoff", lambda failures: 0.0)
    fake = FakeClient()
    asked = 0

    async def old_worker_first() -> Any:
        nonlocal asked
        asked += 1
        if asked < 3:
            raise WorkflowQueryFailedError("[TMPRL1100] Nondeterminism error: Non-deprecated patch marker")
        return {"status": "idle"}

    fake.handle.query_as = old_worker_first
    assert await bare_conversation(fake)._query("state", dict) == {"status": "idle"}
    assert asked == 3

    fake.handle.query_as = WorkflowQueryFailedError("[TMPRL1100] Nondeterminism error: for good")
    fake.handle.describe_as = SimpleNamespace(status=WorkflowExecutionStatus.RUNNING)
    with pytest.raises(Refused, match=r"a worker could not read its state: \[TMPRL1100\] Nondeterminism"):
        await bare_conversation(fake).state()


def session_state(message_count: int) -> SessionState:
    return SessionState(
        status="idle",
        is_streaming=False,
        pending_tool_calls=[],
        message_count=message_count,
        steering_queue=0,
        follow_up_queue=0,
        turns=0,
        runs=1,
        usage={},
        event_offset=7,
    )


async def test_a_snapshot_keeps_only_the_messages_its_state_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages appended between the two queries are left out: the state and transcript agree."""
    chat = bare_conversation(FakeClient())

    async def state(self: Conversation) -> SessionState:
        return session_state(1)

    async def messages(self: Conversation) -> list[Any]:
        return [UserMessage(content="first"), AssistantMessage(content=[])]

    monkeypatch.setattr(Conversation, "state", state)
    monkeypatch.setattr(Conversation, "messages", messages)
    got_state, got_messages = await chat.snapshot()
    assert got_state.message_count == 1
    assert got_messages == [UserMessage(content="first")]


async def test_a_run_whose_status_the_server_leaves_out_has_not_ended() -> None:
    """When the server does not say a status, the conversation is not taken for ended."""
    fake = FakeClient()
    fake.handle.describe_as = SimpleNamespace(status=None, task_queue="agent")
    assert await bare_conversation(fake).ended_on_task_queue() is None


async def test_a_failed_precondition_that_is_not_a_never_run_conversation_is_raised_as_it_is() -> None:
    """Only "closed before WorkflowTaskStarted" means never ran: other refusals keep their error."""
    chat = bare_conversation(FakeClient())
    with pytest.raises(RPCError, match="limit on number"):
        async with chat._refusals():
            raise RPCError("limit on number of total updates", RPCStatusCode.FAILED_PRECONDITION, b"")


# --- listing --------------------------------------------------------------------------


class Lister:
    """A client whose ``list_workflows`` records the query and yields ``executions`` (or raises ``error``)."""

    def __init__(
        self,
        executions: list[Any] | None = None,
        error: BaseException | None = None,
        current: dict[str, str] | None = None,
    ) -> None:
        self.queries: list[str] = []
        self.executions = executions or []
        self.error = error
        self.current = current or {}  # conversation id -> its current run's id

    def get_workflow_handle(self, workflow_id: str) -> Any:
        async def describe() -> Any:
            return SimpleNamespace(run_id=self.current.get(workflow_id, "run-1"))

        return SimpleNamespace(describe=describe)

    async def list_workflows(self, query: str, **kwargs: Any) -> Any:
        self.queries.append(query)
        if self.error is not None:
            raise self.error
        for execution in self.executions:
            yield execution


async def listed(lister: Lister, **filters: Any) -> list[client.ConversationSummary]:
    return [summary async for summary in list_conversations(lister, **filters)]  # type: ignore[arg-type]


async def test_the_list_leaves_out_runs_that_continued_as_new() -> None:
    """One entry per conversation: its earlier runs are not listed."""
    lister = Lister()
    await listed(lister)
    assert lister.queries == ["WorkflowType = 'AgentWorkflow' AND ExecutionStatus != 'ContinuedAsNew'"]


async def test_listing_closed_conversations_asks_for_completed_runs_and_other_statuses_for_running_ones() -> (
    None
):
    """``status="closed"`` finds completed conversations; ``idle`` and the others only running ones."""
    lister = Lister()
    await listed(lister, status="closed")
    await listed(lister, status="idle")
    assert "AgentStatus = 'closed' AND ExecutionStatus = 'Completed'" in lister.queries[0]
    assert "AgentStatus = 'idle' AND ExecutionStatus = 'Running'" in lister.queries[1]


@pytest.mark.parametrize(
    ("status", "execution_status"),
    [
        ("failed", "Failed"),
        ("terminated", "Terminated"),
        ("timed-out", "TimedOut"),
        ("cancelled", "Canceled"),
    ],
)
async def test_listing_conversations_that_ended_without_closing_asks_for_their_execution_status(
    status: str, execution_status: str
) -> None:
    """``list`` shows a conversation that failed or was terminated as
    ``failed`` / ``terminated``, but ``--status`` took only idle, running,
    awaiting-approval and closed, so those rows could not be filtered (a
    README audit). Their ``AgentStatus`` is where they stopped: the filter
    is the execution's status."""
    lister = Lister()
    await listed(lister, status=status)
    assert lister.queries[0].endswith(f"AND ExecutionStatus = '{execution_status}'")
    assert "AgentStatus" not in lister.queries[0]


async def test_a_model_filter_quotes_backslashes() -> None:
    """A model name with a backslash is matched as written, not read as an escape."""
    lister = Lister()
    await listed(lister, model="a\\b")
    assert lister.queries[0].endswith("AgentModel = 'a\\\\b'")


async def test_a_filter_the_server_cannot_apply_is_refused_with_what_to_do() -> None:
    """A server without the Agent* search attributes refuses a filter: the caller gets a sentence."""
    bad = RPCError("invalid query", RPCStatusCode.INVALID_ARGUMENT, b"")
    with pytest.raises(Refused, match=r"^This server does not keep the Agent\* search attributes"):
        await listed(Lister(error=bad), status="idle")
    with pytest.raises(RPCError, match="invalid query"):
        await listed(Lister(error=bad))


async def test_a_conversation_that_ended_without_closing_is_listed_by_its_end() -> None:
    """A terminated conversation reads ``terminated``, not the ``running`` its search attribute kept."""
    execution = listed_run("chat-x", "run-1", WorkflowExecutionStatus.TERMINATED)
    [summary] = await listed(Lister([execution]))
    assert summary.status == "terminated"


def listed_run(id: str, run_id: str, status: WorkflowExecutionStatus) -> SimpleNamespace:
    return SimpleNamespace(
        id=id,
        run_id=run_id,
        start_time=None,
        status=status,
        typed_search_attributes=TypedSearchAttributes([SearchAttributePair(client._STATUS, "running")]),
    )


async def test_a_run_a_conversation_was_reset_from_is_not_listed() -> None:
    """After a reset (a worker's repair of a wedged conversation, runtime/repair.py) the old run is
    terminated: the conversation is listed once, by its current run, and not as terminated."""
    running = listed_run("chat-x", "run-2", WorkflowExecutionStatus.RUNNING)
    reset_from = listed_run("chat-x", "run-1", WorkflowExecutionStatus.TERMINATED)
    lister = Lister([running, reset_from], current={"chat-x": "run-2"})
    assert [(s.id, s.status) for s in await listed(lister)] == [("chat-x", "running")]
    assert await listed(Lister([reset_from], current={"chat-x": "run-2"}), status="terminated") == []


# --- forking and small helpers ---------------------------------------------------------------


def with_a_tool_call() -> list[Any]:
    """user, assistant calling two tools, their two results, assistant."""
    return [
        UserMessage(content="go"),
        AssistantMessage(content=[ToolCall(id="a", name="t"), ToolCall(id="b", name="t")]),
        ToolResultMessage(tool_call_id="a", tool_name="t"),
        ToolResultMessage(tool_call_id="b", tool_name="t"),
        AssistantMessage(content=[]),
    ]


def test_a_fork_may_take_the_whole_transcript_or_none_of_it() -> None:
    """``at`` runs from 0 to the number of messages, both ends included."""
    messages = with_a_tool_call()
    _check_fork_point(messages, 0)
    _check_fork_point(messages, len(messages))
    for at in (-1, len(messages) + 1):
        with pytest.raises(Refused, match=r"^The transcript has 5 messages: fork at 0 to 5\.$"):
            _check_fork_point(messages, at)


def test_a_fork_right_after_a_tool_calls_last_result_is_taken() -> None:
    """Forking just after a batch's results is allowed; cutting inside them is refused with both points."""
    messages = with_a_tool_call()
    _check_fork_point(messages, 4)
    with pytest.raises(
        Refused, match=r"^Message 2 calls tools whose results are messages 3 to 4: fork at 1 or at 4\.$"
    ):
        _check_fork_point(messages, 3)


def test_a_fork_after_a_call_that_has_no_result_yet_is_refused() -> None:
    """A fork that would keep a call without its result is refused, even at the transcript's end."""
    messages = with_a_tool_call()[:2]
    with pytest.raises(Refused, match=r"^Message 2 calls tools that have not answered yet: fork at 1"):
        _check_fork_point(messages, 2)


def test_the_backoff_is_capped_at_two_seconds() -> None:
    """Retries wait 0.1 s doubling, never more than 2 s between tries."""
    assert [client._backoff(n) for n in (0, 1, 4, 5, 30)] == [0.1, 0.2, 1.6, 2.0, 2.0]


LATER_RUN = [
    (9, {"type": "agent_start"}),
    (
        10,
        {
            "type": "agent_end",
            "messages": [UserMessage(content="another client's prompt").model_dump(mode="json")],
        },
    ),
]


async def test_a_run_whose_start_was_not_kept_does_not_return_the_next_runs_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``prompt`` never returns a later run's messages, also when its own events were dropped."""
    scripted_reads(monkeypatch, [PollResult([item(o, e) for o, e in LATER_RUN], 11, True)])
    fake = FakeClient()
    fake.handle.describe_as = SimpleNamespace(status=WorkflowExecutionStatus.RUNNING)
    assert await bare_conversation(fake)._run_messages(PromptResult(run=1, event_offset=5)) == []


async def test_a_runs_events_do_not_include_a_later_runs_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_events`` ends at another run's start, also when its own ``agent_start`` was dropped."""
    scripted_reads(monkeypatch, [PollResult([item(o, e) for o, e in LATER_RUN], 11, True)])
    skipped: list[tuple[int, int]] = []
    chat = bare_conversation(FakeClient())
    started = PromptResult(run=1, event_offset=5)
    offsets = [o async for o, _ in chat.run_events(started, on_skipped=lambda a, b: skipped.append((a, b)))]
    assert offsets == [] and skipped == [(5, 9)]


async def test_a_worker_that_cannot_read_the_state_is_told_in_one_line_of_at_most_300_characters() -> None:
    """A replay failure's message (lines, a long detail) is shown as one line, cut to 300 characters."""
    fake = FakeClient()
    detail = "A payload is too large\non this worker:\n  " + "x" * 1000
    fake.handle.query_as = WorkflowQueryFailedError(detail)
    fake.handle.describe_as = SimpleNamespace(status=WorkflowExecutionStatus.RUNNING)
    conversation = bare_conversation(fake)
    with pytest.raises(Refused) as refused:
        await conversation.state()
    prefix = f"Conversation {conversation.id}; a worker could not read its state: "
    assert str(refused.value) == prefix + ("A payload is too large on this worker: " + "x" * 1000)[:300]
