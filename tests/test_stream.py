"""The event stream: one ordered stream per conversation that a late or
reconnecting subscriber reads exactly once, in order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError
from temporalio.contrib.workflow_streams import WorkflowStreamClient, WorkflowStreamState
from temporalio.contrib.workflow_streams._types import _WorkflowStreamWireItem
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment

import activities.events as events_module
import client
from activities.events import ActivityEventPublisher
from client import Conversation, PollInterval, follow
from tests.support.stack import EventLog, Stack, accepted_updates, read_events
from workflows.agent import IDLE_ITEMS_CARRIED, STREAM_ITEMS_CARRIED
from workflows.calls import SIGNAL_LIMIT, SIGNAL_RESERVE
from workflows.contract import ToolRequest
from workflows.models import (
    EVENTS_TOPIC,
    MODEL_CALL_TOPIC,
    AgentStartEvent,
    MessageRetryEvent,
    MessageUpdateEvent,
)
from workflows.stream import (
    OFFSET_QUERY,
    RUN_END_UPDATE,
    STREAM_BYTES_CARRIED,
    EventStream,
    partial_arguments,
    partial_message,
)

SCRIPT: list[dict[str, Any]] = [
    {
        "reasoning": "thinking it over",
        "tool_calls": [
            {"id": "s1", "name": "slow", "arguments": {"seconds": 1.0, "steps": 4}},
            {"id": "s2", "name": "echo", "arguments": {"text": "x"}},
        ],
        "delay_ms": 20,
    },
    {"text": "a streamed answer " * 10, "delay_ms": 15, "chunk_chars": 4},
]


def without_offsets(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "offset"} for e in events]


async def test_late_subscriber_sees_exactly_what_a_live_one_saw(stack: Stack) -> None:
    stack.script(*SCRIPT)
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    live = await stack.events(handle.id)
    await handle.result()
    late = await read_events(stack.client, handle.id)
    assert late == live
    assert [e["offset"] for e in live] == list(range(len(live)))


async def test_reconnecting_subscriber_loses_and_duplicates_nothing(stack: Stack) -> None:
    stack.script(*SCRIPT)
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    seen: list[dict[str, Any]] = []
    for _ in range(50):
        # Read a few events, drop the connection, resume after the last offset.
        start = seen[-1]["offset"] + 1 if seen else 0
        log = EventLog(stack.client, handle.id, from_offset=start)
        try:
            await log.wait_until(lambda es: len(es) >= 5 or any(e["type"] == "agent_end" for e in es), 30)
        finally:
            log.close()
        await asyncio.sleep(0.05)
        chunk = log.events
        end = next((i for i, e in enumerate(chunk) if e["type"] == "agent_end"), None)
        seen += chunk if end is None else chunk[: end + 1]
        if end is not None:
            break
    full = await read_events(stack.client, handle.id)
    assert [e["offset"] for e in seen] == list(range(len(seen)))
    assert without_offsets(seen) == without_offsets(full)


async def test_batching_interval_is_a_setting(stack: Stack) -> None:
    stack.script({"text": "tokens " * 30, "delay_ms": 20, "chunk_chars": 7})
    handle = await stack.start(prompt="go", closeWhenIdle=True, streamBatchMs=1000)
    await handle.result()
    history = await handle.fetch_history()
    publishes = [
        e
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
        and e.workflow_execution_signaled_event_attributes.signal_name == "__temporal_workflow_stream_publish"
    ]
    # ~0.6 s of deltas: the first token at once, the rest in one or two batches.
    assert 1 <= len(publishes) <= 4


ABORTED = RPCError(
    "Unable to perform workflow execution update due to unexpected workflow task failure.",
    RPCStatusCode.FAILED_PRECONDITION,
    b"",
)


async def test_a_poll_aborted_by_a_failed_workflow_task_is_made_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server aborts an in-flight poll when the workflow task carrying it
    # fails (a signal that lands during a continue-as-new does that); the
    # workflow itself goes on. The subscriber polls again, losing nothing.
    stack.script(*SCRIPT)
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    real = client._EventReader._read
    reads: list[int] = []
    failed: list[int] = []

    async def flaky(self: client._EventReader) -> Any:
        reads.append(self.offset)
        if self.offset > 0 and len(failed) < 2 and self.offset not in failed:
            failed.append(self.offset)  # the first read from each of two offsets fails
            raise ABORTED
        return await real(self)

    monkeypatch.setattr(client._EventReader, "_read", flaky)
    live = await read_events(stack.client, handle.id)
    await handle.result()
    monkeypatch.undo()
    assert len(failed) == 2
    assert all(reads.count(offset) >= 2 for offset in failed)  # made again from there
    assert live == await read_events(stack.client, handle.id)


async def test_a_subscriber_gives_up_on_an_error_that_does_not_pass(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack.script({"text": "hello"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    await handle.result()
    calls = 0

    def failing(error: RPCError) -> Any:
        async def read(self: client._EventReader) -> Any:
            nonlocal calls
            calls += 1
            raise error

        return read

    monkeypatch.setattr(client, "MAX_RETRIES", 2)
    monkeypatch.setattr(client._EventReader, "_read", failing(ABORTED))
    with pytest.raises(RPCError, match="workflow task failure"):
        await read_events(stack.client, handle.id)
    assert calls == 3  # the first poll and two retries
    calls = 0
    denied = RPCError("Request unauthorized.", RPCStatusCode.PERMISSION_DENIED, b"")
    monkeypatch.setattr(client._EventReader, "_read", failing(denied))
    with pytest.raises(RPCError, match="unauthorized"):
        await read_events(stack.client, handle.id)
    assert calls == 1  # not retried


# --- the end of a conversation: live subscribers read the last events by poll ---


def kinds(history: Any) -> list[str]:
    return [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events]


def without_counters_timer(history: Any) -> list[str]:
    """``kinds(history)`` without the timer the counters' search-attribute
    upsert waits for (a run's first turn starts it; its end cancels it)."""
    counters = {
        e.event_id
        for e in history.events
        if e.HasField("timer_started_event_attributes") and b"counters" in e.user_metadata.summary.data
    }
    return [
        EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        for e in history.events
        if e.event_id not in counters
        and e.timer_canceled_event_attributes.started_event_id not in counters
        and e.timer_fired_event_attributes.started_event_id not in counters
    ]


async def test_a_subscriber_between_polls_reads_the_end_before_completion(stack: Stack) -> None:
    stack.script({"text": "the last words " * 6, "delay_ms": 20, "chunk_chars": 4})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    seen: list[dict[str, Any]] = []
    paused = False
    async for _, data in follow(stack.client, handle.id):
        seen.append(data)
        if data["type"] == "message_update" and not paused:
            # The first tokens are in: stop polling until the answer has
            # ended and the conversation waits for this subscriber.
            paused = True
            for _ in range(200):
                if "TIMER_STARTED" in without_counters_timer(await handle.fetch_history()):
                    break
                await asyncio.sleep(0.05)
    await handle.result()
    assert seen[-1]["type"] == "agent_end"
    assert [e["type"] for e in seen] == [e["type"] for e in await read_events(stack.client, handle.id)]
    # It waited for the subscriber's next poll, which read the rest, then
    # completed (closed: its status upserted): no timer fired, and nobody
    # had to replay the history.
    events = without_counters_timer(await handle.fetch_history())
    tail = events[events.index("TIMER_STARTED") :]
    assert tail[-4:] == [
        "WORKFLOW_EXECUTION_UPDATE_COMPLETED",
        "TIMER_CANCELED",
        "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",
        "WORKFLOW_EXECUTION_COMPLETED",
    ]
    assert "TIMER_FIRED" not in tail


async def test_a_busy_stream_is_read_by_query_and_the_end_still_reaches_the_workflow(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long streamed answer: after each cooldown the subscriber reads what
    # is waiting by query (no history event); only a caught-up subscriber
    # long-polls with an update. A subscriber that stops at agent_end, read
    # by query, still lets the conversation complete at once.
    stack.script({"text": "many words " * 60, "delay_ms": 5, "chunk_chars": 4})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    queries = 0
    real_query = client.WorkflowHandle.query

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal queries
        queries += 1
        return await real_query(self, *args, **kwargs)

    monkeypatch.setattr(client.WorkflowHandle, "query", counted)
    seen = []
    async for _, data in follow(stack.client, handle.id, cooldown_ms=250):
        seen.append(data)
        if data["type"] == "agent_end":
            break
    await asyncio.wait_for(handle.result(), 0.9)  # sooner than the 1 s grace for subscribers
    monkeypatch.undo()
    assert seen == await follow_all(stack, handle.id)
    events = kinds(await handle.fetch_history())
    updates = events.count("WORKFLOW_EXECUTION_UPDATE_ACCEPTED")
    assert queries >= 3
    # The first polls and the one telling the workflow the end was read (4),
    # and on a loaded machine one more: a read that brought no token delta
    # (the batches split otherwise) is followed by a long poll at once, not by
    # a cooldown and a query. (With every read an update: 7 a conversation in
    # the benchmark, and no queries.)
    assert updates <= 5
    assert "TIMER_FIRED" not in events


async def test_many_waiting_subscribers_leave_room_for_a_prompt(stack: Stack) -> None:
    """Temporal admits 10 updates in flight per workflow and refuses the
    rest, and a caught-up subscriber's long poll is one until an event
    comes: twelve watchers of an idle conversation made every `prompt`
    fail (after 15 s of retries). Past MAX_WAITING_READS waiting reads,
    the others read by query, and each still sees every event."""
    stack.script({"text": "first"}, {"text": "second"})
    handle = await stack.start(prompt="go")
    await Conversation.attach(stack.client, handle.id).wait_for_idle()
    end = await handle.query(OFFSET_QUERY)
    seen: list[list[tuple[int, str]]] = [[] for _ in range(12)]

    async def watch(into: list[tuple[int, str]]) -> None:
        async for offset, data in follow(stack.client, handle.id, end):
            into.append((offset, data["type"]))
            if data["type"] == "agent_end":
                return

    watchers = [asyncio.create_task(watch(into)) for into in seen]
    await asyncio.sleep(1.0)  # all caught up, waiting
    await asyncio.wait_for(handle.execute_update("prompt", "again"), 10)
    await asyncio.wait_for(asyncio.gather(*watchers), 20)
    for events in seen:
        assert [offset for offset, _ in events] == list(range(end, end + len(events)))
        assert events[0][1] == "agent_start" and events[-1][1] == "agent_end"
    await handle.signal("close")


@pytest.mark.parametrize("pacing", [(), ((15, 0.5),)], ids=["unpaced", "paced"])
async def test_a_reader_that_sent_many_updates_to_a_run_reads_by_query(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, pacing: tuple[tuple[int, float], ...]
) -> None:
    """Temporal takes 2,000 updates per run, and a tool batch cannot continue
    as new: a reader that read each tool's events by update as they came
    used them all up on a batch of thousands of calls, and then every update
    to the conversation was refused. Past READ_PACING's count (15 here, 500
    by default) it waits between reads, and reads after a wait by query."""
    monkeypatch.setattr(client, "READ_PACING", pacing)
    calls = [
        {"id": f"s{i}", "name": "echo", "arguments": {"text": str(i), "delay": 0.02}} for i in range(100)
    ]
    stack.script({"tool_calls": calls}, {"text": "all done"})
    handle = await stack.start(prompt="go", closeWhenIdle=True, toolExecution="sequential")
    seen = [data async for _, data in follow(stack.client, handle.id)]
    assert seen[-1]["type"] == "agent_end" and seen == await follow_all(stack, handle.id)
    assert sum(e["type"] == "tool_execution_end" for e in seen) == 100
    updates = kinds(await handle.fetch_history()).count("WORKFLOW_EXECUTION_UPDATE_ACCEPTED")
    if pacing:
        assert updates < 30, updates
    else:  # the reads the pacing spares: about one per call (fewer when a loaded machine batches)
        assert updates > 60, updates


async def test_the_end_of_a_run_cuts_a_cooldown_short(stack: Stack) -> None:
    # An answer streaming for under a second, read with a 5 s cooldown: the
    # subscriber is in its first cooldown when the run ends, and reads the
    # end at once (one update waited for it), not 5 s later.
    stack.script({"text": "many words " * 60, "delay_ms": 5, "chunk_chars": 4})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    started = time.monotonic()
    seen = []
    async for _, data in follow(stack.client, handle.id, cooldown_ms=5000):
        seen.append(data)
        if data["type"] == "agent_end":
            break
    assert time.monotonic() - started < 3.5
    await asyncio.wait_for(handle.result(), 0.9)  # the read told the workflow: no grace waited out
    assert seen == await follow_all(stack, handle.id)
    waits = [name for name in accepted_updates(await handle.fetch_history()) if name == RUN_END_UPDATE]
    assert len(waits) == 1


async def test_a_run_continuing_as_new_releases_the_wait_for_its_end(stack: Stack) -> None:
    # Every turn streams text and continues as new: each run's wait for the
    # end is released (the switch waits for every handler) and the
    # subscriber reads every event once, across the runs.
    turns = [
        {
            "text": f"turn {i} " * 20,
            "tool_calls": [{"id": f"t{i}", "name": "echo", "arguments": {"text": str(i)}}],
            "delay_ms": 5,
            "chunk_chars": 4,
        }
        for i in range(3)
    ]
    stack.script(*turns, {"text": "all done " * 20, "delay_ms": 5, "chunk_chars": 4})
    handle = await stack.start(prompt="go", closeWhenIdle=True, continueAsNewAfterTurns=1)
    seen = []

    async def read_to_end() -> None:
        async for _, data in follow(stack.client, handle.id, cooldown_ms=300):
            seen.append(data)
            if data["type"] == "agent_end":
                break

    await asyncio.wait_for(read_to_end(), 60)  # a wait never released would hold the switch for good
    await asyncio.wait_for(handle.result(), 30)
    assert seen == await follow_all(stack, handle.id)
    assert [e["type"] for e in seen].count("turn_end") == 4
    runs = [e async for e in stack.client.list_workflows(f"WorkflowId = '{handle.id}'")]
    assert len(runs) >= 3


async def test_waiting_for_the_end_when_no_run_is_in_progress_is_refused(stack: Stack) -> None:
    stack.script({"text": "done"})
    handle = await stack.start(prompt="go")
    async for _, data in follow(stack.client, handle.id):
        if data["type"] == "agent_end":
            break
    offset = await handle.query(OFFSET_QUERY, result_type=int)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(RUN_END_UPDATE, offset, result_type=int)
    assert "No run is in progress" in str(refused.value.cause)
    await handle.signal("close")


async def follow_all(stack: Stack, workflow_id: str) -> list[dict[str, Any]]:
    return [data async for _, data in follow(stack.client, workflow_id)]


async def test_without_subscribers_a_conversation_completes_at_once(stack: Stack) -> None:
    stack.script({"text": "nobody listens"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    await handle.result()
    assert "TIMER_STARTED" not in without_counters_timer(await handle.fetch_history())


async def test_a_message_sent_while_waiting_for_a_gone_subscriber_is_answered(stack: Stack) -> None:
    # A long first answer: its first tokens are published while it streams,
    # which completes the gone subscriber's last poll mid-answer.
    first = "first answer " * 10
    stack.script({"text": first, "delay_ms": 20, "chunk_chars": 4}, {"text": "second answer"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("agent_start")
    log.close()  # the subscriber goes away mid-answer
    # The run ends; the conversation waits (up to its grace) for the
    # subscriber that never polls again. A steer sent now starts a run.
    for _ in range(200):
        state = await stack.state(handle)
        if state.runs == 1 and state.status == "idle":
            break
        await asyncio.sleep(0.01)
    await handle.signal("steer", "one more thing")
    result = await handle.result()
    texts = [m.content if isinstance(m.content, str) else m.content[0].text for m in result.messages]  # type: ignore[union-attr]
    assert texts == ["go", first, "one more thing", "second answer"]


# --- the activity side: what a fast answer costs ---


class FakeStreamClient:
    """Stands in for the activity's stream client: records what is sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.flushes = 0

    def topic(self, _name: str) -> FakeStreamClient:
        return self

    def publish(self, event: Any) -> None:
        self.sent.append(event)

    async def flush(self) -> None:
        self.flushes += 1


async def test_an_answer_ending_during_the_first_token_delay_returns_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeStreamClient()
    monkeypatch.setattr(events_module, "run_stream_client", lambda: fake)
    monkeypatch.setattr(events_module, "FIRST_FLUSH_MS", 2000)
    started = time.monotonic()
    async with ActivityEventPublisher(batch_ms=100) as events:
        events.publish(AgentStartEvent(), flush=True)  # the first token: send soon
        await asyncio.sleep(0.05)  # the answer ends before the delay is up
    # It did not sit out the delay, and sent nothing: the result carries it.
    assert time.monotonic() - started < 1.0
    assert (fake.sent, fake.flushes) == ([], 0)
    assert [e["type"] for e in events.tail] == ["agent_start"]


async def test_the_first_token_is_sent_after_the_delay_when_the_answer_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeStreamClient()
    monkeypatch.setattr(events_module, "run_stream_client", lambda: fake)
    async with ActivityEventPublisher(batch_ms=10_000) as events:
        events.publish(AgentStartEvent(), flush=True)
        await asyncio.sleep(0.3)  # well past FIRST_FLUSH_MS, far from the batch interval
        assert ([e["type"] for e in fake.sent], fake.flushes) == (["agent_start"], 1)
    assert events.tail == []


def _waits(
    monkeypatch: pytest.MonkeyPatch, interval_ms: int, polls: list[tuple[list[str], float]]
) -> list[float]:
    """For each poll (the events it brought, seconds it took, as the stream
    client sees it), the wait ``PollInterval`` asks for before the next."""
    clock = [100.0]
    monkeypatch.setattr(client.time, "monotonic", lambda: clock[0])
    interval = PollInterval(interval_ms)
    waits = []
    for events, took in polls:
        clock[0] += took
        for event in events:
            interval.saw({"type": event})
        wait = interval.next_wait()
        waits.append(round(wait, 3))
        clock[0] += wait
    return waits


def test_the_poll_cooldown_counts_from_the_start_of_the_previous_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deltas = ["message_update"]
    polls = [(deltas, took) for took in (0.5, 0.02, 0.0, 0.1, 0.07)]
    # A poll that waited 500 ms for events is followed at once; quick ones
    # are spaced so that polls start at most every 100 ms.
    assert _waits(monkeypatch, 100, polls) == [0.0, 0.08, 0.1, 0.0, 0.03]


def test_only_a_poll_that_brought_token_deltas_is_followed_by_a_cooldown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    polls = [
        (["agent_start", "turn_start", "message_start"], 0.01),  # a run starts: the first token next
        (["message_update"], 0.3),  # the first token, after a long poll: the model streams on
        (["message_update", "message_update"], 0.01),
        (["message_update", "message_end", "tool_execution_start"], 0.01),
        (["tool_execution_end", "turn_end", "agent_end"], 0.01),  # nothing to batch: at once
        ([], 0.01),  # nothing (a draining stream): the cooldown stays
    ]
    assert _waits(monkeypatch, 200, polls) == [0.0, 0.0, 0.19, 0.19, 0.0, 0.19]


async def test_a_delta_published_as_json_is_the_event_the_model_would_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # publish_delta skips building MessageUpdateEvent for each chunk; what it
    # buffers (merged deltas included) must be what publish() would.
    monkeypatch.setattr(events_module, "run_stream_client", FakeStreamClient)
    deltas = [
        {"type": "text_start", "contentIndex": 0},
        {"type": "text_delta", "contentIndex": 0, "delta": "Hel"},
        {"type": "text_delta", "contentIndex": 0, "delta": "lo"},
        {
            "type": "toolcall_end",
            "contentIndex": 1,
            "toolCall": {"type": "toolCall", "id": "c", "arguments": {}},
        },
    ]
    async with (
        ActivityEventPublisher(batch_ms=10_000) as typed,
        ActivityEventPublisher(batch_ms=10_000) as raw,
    ):
        for delta in deltas:
            typed.publish(MessageUpdateEvent(assistant_message_event=dict(delta)))
            raw.publish_delta(delta)
    assert raw.tail == typed.tail
    assert len(raw.tail) == 3  # the two text deltas merged
    assert deltas[1]["delta"] == "Hel"  # the caller's dict is not merged into


def test_a_retry_drops_the_partial_message_unless_replaying_from_before() -> None:
    """After ``message_retry`` nothing streams until the next attempt's
    ``message_start`` (its subscribers dropped the partial); a run recorded
    before the stream-events-as-pi patch kept the message, emptied."""
    start = {"role": "assistant", "content": [], "stopReason": "stop", "timestamp": 5}
    events = [
        {"type": "message_start", "message": start},
        {"type": "message_update", "assistantMessageEvent": {"type": "text_start", "contentIndex": 0}},
        {
            "type": "message_update",
            "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": "pa"},
        },
        {"type": "message_retry", "attempt": 2},
    ]
    assert partial_message(events[:3]) is not None and partial_message(events[:3]).text == "pa"
    assert partial_message(events) is None
    kept = partial_message(events, retry_drops=False)
    assert kept is not None and kept.content == [] and kept.timestamp == 5


def test_a_tool_call_streaming_shows_its_arguments_so_far_in_state() -> None:
    """pi's partial message parses a tool call's arguments on every delta
    (``parseStreamingJson``): `state.streamingMessage` showed `{}` until
    the call ended. The workflow's own uses (an abort, a failed call) drop
    streaming tool calls and skip the parse."""
    start = {"role": "assistant", "content": [], "stopReason": "stop", "timestamp": 5}

    def update(event: dict[str, Any]) -> dict[str, Any]:
        return {"type": "message_update", "assistantMessageEvent": event}

    events = [
        {"type": "message_start", "message": start},
        update({"type": "toolcall_start", "contentIndex": 0, "id": "c1", "toolName": "echo"}),
        update({"type": "toolcall_delta", "contentIndex": 0, "delta": '{"text": "a fairly lo'}),
    ]
    partial = partial_message(events, tool_arguments=True)
    assert partial is not None and partial.tool_calls[0].arguments == {"text": "a fairly lo"}
    unparsed = partial_message(events)
    assert unparsed is not None and unparsed.tool_calls[0].arguments == {}


@pytest.mark.parametrize(
    ("streamed", "reads"),
    [
        ("", {}),
        ('{"te', {}),
        ('{"text":', {}),
        ('{"text": "he said \\"hi', {"text": 'he said "hi'}),
        ('{"text": "x\\', {"text": "x"}),
        ('{"n": 1, "items": [1, {"k": "v', {"n": 1, "items": [1, {"k": "v"}]}),
        ('{"n": 1, "flag": tr', {"n": 1}),
        ('{"n": 12.5e', {"n": 12.5}),
        ('{"a": "x"}', {"a": "x"}),
        ("[1, 2", {}),
        ('{"a": ' + "[" * 1500, {}),  # deeper than arguments are read: not a RecursionError out of `state`
        ('{"a": ' + "[" * 1500 + "]" * 1500 + "}", {}),
        (
            '{"a": ' + "[" * 30 + "1" + "]" * 30,
            {"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
        ),
    ],
)
def test_partial_arguments_read_what_has_streamed(streamed: str, reads: dict[str, Any]) -> None:
    assert partial_arguments(streamed) == reads


async def test_events_marked_for_a_model_call_not_in_progress_never_reach_the_stream(stack: Stack) -> None:
    """A model call's activity marks its first batch with its call
    (``LlmRequest.stream_call``). What a publisher marked for a call that
    is not in progress sends (an aborted call's retry, or its first token
    just after the abort) is dropped, that batch and its later ones; a
    publisher without a mark (a tool's progress) is published as ever."""
    stack.script({"text": "hello"})
    handle = await stack.start(prompt="hi")
    await read_events(stack.client, handle.id)
    offset = (await handle.query("state"))["eventOffset"]

    stale = WorkflowStreamClient.create(stack.client, handle.id)
    stale.topic(MODEL_CALL_TOPIC).publish("an-aborted-call")
    stale.topic(EVENTS_TOPIC).publish({"type": "message_retry", "attempt": 2})
    await stale.flush()
    stale.topic(EVENTS_TOPIC).publish({"type": "message_retry", "attempt": 3})  # no mark: the same publisher
    await stale.flush()
    unmarked = WorkflowStreamClient.create(stack.client, handle.id)
    progress = {
        "type": "tool_execution_update",
        "toolCallId": "t",
        "toolName": "slow",
        "args": {},
        "partialResult": "1",
    }
    unmarked.topic(EVENTS_TOPIC).publish(progress)
    await unmarked.flush()

    late = await read_events_until(stack.client, handle.id, offset, "tool_execution_update")
    assert [e["type"] for e in late] == ["tool_execution_update"]
    assert (await handle.query("state"))["eventOffset"] == offset + 1  # the mark is no event either
    await handle.signal("close")


async def read_events_until(client: Any, workflow_id: str, offset: int, kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async for _offset, event in follow(client, workflow_id, offset):
        out.append(event)
        if event["type"] == kind:
            return out
    return out


async def test_a_model_call_marks_its_first_batch_only(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, Any]] = []

    class Topics(FakeStreamClient):
        def topic(self, name: str) -> Any:
            client = self

            class Topic:
                def publish(self, value: Any) -> None:
                    sent.append((name, value))
                    client.sent.append(value)

            return Topic()

    monkeypatch.setattr(events_module, "run_stream_client", Topics)
    async with ActivityEventPublisher(batch_ms=10, call="run/1") as events:
        events.publish(AgentStartEvent(), flush=True)
        await asyncio.sleep(0.1)
        events.publish(AgentStartEvent(), flush=True)
        await asyncio.sleep(0.1)
    assert sent == [
        (MODEL_CALL_TOPIC, "run/1"),
        (EVENTS_TOPIC, {"type": "agent_start"}),
        (EVENTS_TOPIC, {"type": "agent_start"}),
    ]


async def test_progress_first_published_from_outside_the_activity_context_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A blocking tool reporting progress from its executor thread
    (``loop.call_soon_threadsafe``): the flush loop starts there, outside
    the activity's context, and the stream client it makes then is still
    the activity's run's (it failed the activity, after the tool had run)."""
    fake = FakeStreamClient()
    runs: list[str | None] = []

    def stream_client() -> FakeStreamClient:
        runs.append(activity.info().workflow_run_id)  # raises outside an activity
        return fake

    monkeypatch.setattr(events_module, "run_stream_client", stream_client)

    async def tool() -> int:
        loop = asyncio.get_running_loop()
        async with ActivityEventPublisher(batch_ms=5) as events:

            def blocking() -> None:
                loop.call_soon_threadsafe(
                    lambda: events.publish_delta({"type": "text_delta", "delta": "50%"}, flush=True)
                )

            await loop.run_in_executor(None, blocking)
            await asyncio.sleep(0.2)
        return events.batches

    env = ActivityEnvironment()
    assert await env.run(tool) == 1
    assert runs == [env.info.workflow_run_id]
    assert [e["assistantMessageEvent"]["delta"] for e in fake.sent] == ["50%"]


async def test_a_call_whose_run_has_ended_stops_publishing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model call aborted just before its run continued as new streamed on
    into the next run (found by a stream audit). Its batches go to its own
    run, which refuses them once ended (NOT_FOUND): the publisher stops."""

    class EndedRun(FakeStreamClient):
        async def flush(self) -> None:
            self.flushes += 1
            raise RPCError("workflow execution already completed", RPCStatusCode.NOT_FOUND, b"")

    fake = EndedRun()
    monkeypatch.setattr(events_module, "run_stream_client", lambda: fake)
    async with ActivityEventPublisher(batch_ms=20) as events:
        events.publish(AgentStartEvent(), flush=True)
        await asyncio.sleep(0.15)
        assert fake.flushes == 1
        events.publish(AgentStartEvent(), flush=True)
        await asyncio.sleep(0.15)
    assert fake.flushes == 1 and len(fake.sent) == 1  # nothing more was sent


async def test_a_call_refused_a_signal_past_the_limit_stops_and_returns_what_it_had_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Others' signals used up the execution's 10,000: each publisher retried
    its refused batch every round, for as long as its call ran (947 warnings
    in a Temporal review's run), and the batch was lost. It now stops at the
    first refusal, and the refused batch and what came after go back with
    the result (``tail``), which the workflow publishes without a signal."""

    class Full(FakeStreamClient):
        async def flush(self) -> None:
            self.flushes += 1
            raise RPCError(events_module.SIGNAL_LIMIT_REFUSAL, RPCStatusCode.INVALID_ARGUMENT, b"")

    fake = Full()
    monkeypatch.setattr(events_module, "run_stream_client", lambda: fake)
    async with ActivityEventPublisher(batch_ms=20) as events:
        events.publish_delta({"type": "text_delta", "delta": "refused"}, flush=True)
        await asyncio.sleep(0.15)
        events.publish_delta({"type": "thinking_delta", "delta": "later"})
        await asyncio.sleep(0.15)
    assert fake.flushes == 1
    assert [e["assistantMessageEvent"]["delta"] for e in events.tail] == ["refused", "later"]


async def test_a_failing_attempts_last_batch_whose_signal_failed_is_said_undelivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failing model call sends its last batch (its next attempt's
    ``message_retry``) as it ends; a signal that fails then for a passing
    reason would have been retried on the next round, which a closed
    publisher has not: ``undelivered`` says so, and the next attempt then
    says its retry itself."""

    class Down(FakeStreamClient):
        async def flush(self) -> None:
            self.flushes += 1
            raise RPCError("server unavailable", RPCStatusCode.UNAVAILABLE, b"")

    fake = Down()
    monkeypatch.setattr(events_module, "run_stream_client", lambda: fake)
    with pytest.raises(RuntimeError):
        async with ActivityEventPublisher(batch_ms=1000) as events:
            events.publish(MessageRetryEvent(attempt=2, reason="x"))
            raise RuntimeError("the attempt failed")
    assert fake.flushes == 1
    assert events.tail == [] and events.undelivered == [
        {"type": "message_retry", "attempt": 2, "reason": "x"}
    ]


async def test_a_call_given_no_batches_sends_nothing_and_returns_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A budget of 0 (the execution's signals are spoken for) means none,
    not "no bound" as a falsy 0 read before."""
    fake = FakeStreamClient()
    monkeypatch.setattr(events_module, "run_stream_client", lambda: fake)
    async with ActivityEventPublisher(batch_ms=5, max_batches=events_module.attempt_budget(0, 1)) as events:
        events.publish(AgentStartEvent(), flush=True)
        await asyncio.sleep(0.1)
        events.publish(AgentStartEvent(), flush=True)
        await asyncio.sleep(0.1)
    assert fake.flushes == 0 and fake.sent == []
    assert events.tail == [{"type": "agent_start"}] * 2


async def test_tool_calls_running_at_once_are_granted_no_more_signals_than_are_left(stack: Stack) -> None:
    """Each tool call is given a budget of event batches (signals) when it
    starts. Each share used to ignore what the calls already running had
    been given: twelve at once were granted about three times the
    execution's allowance, and twelve tools reporting progress used up its
    10,000 signals within a minute; ``abort`` and ``close`` were then
    refused by the server until the batch ended (a Temporal review)."""
    calls = [{"id": f"g{i}", "name": "echo", "arguments": {"text": str(i)}} for i in range(12)]
    stack.script({"tool_calls": calls}, {"text": "done"})
    handle = await stack.start(prompt="twelve at once", closeWhenIdle=True)
    await handle.result()
    budgets: list[int] = []
    for event in (await handle.fetch_history()).events:
        scheduled = event.activity_task_scheduled_event_attributes
        if event.HasField("activity_task_scheduled_event_attributes") and (
            scheduled.activity_type.name == "execute_tool"
        ):
            [request] = await stack.client.data_converter.decode(scheduled.input.payloads, [ToolRequest])
            assert request.max_batches is not None
            budgets.append(request.max_batches)
    assert len(budgets) == 12
    assert min(budgets) > 0  # each may still stream its progress
    # Twice a budget: what its retries may send too.
    assert sum(2 * b for b in budgets) <= SIGNAL_LIMIT - SIGNAL_RESERVE


async def test_activities_publish_to_the_run_that_scheduled_them(stack: Stack) -> None:
    """Pinned by run id: a signal to a run that continued as new is refused
    by the server instead of landing in the next run."""
    seen: list[tuple[str, str | None]] = []

    async def probe() -> None:
        handle = events_module.run_stream_client()._handle
        seen.append((handle.id, handle.run_id))

    env = ActivityEnvironment(client=stack.client)
    await env.run(probe)
    assert seen == [(env.info.workflow_id, env.info.workflow_run_id)]
    assert env.info.workflow_run_id


MiB = 1024 * 1024


class _Log:
    """The part of a WorkflowStream that ``state_for_carry`` uses: a log of
    items at global offsets from ``base``, truncated as the SDK's is."""

    def __init__(self, sizes: list[int]) -> None:
        self.base = 0
        self.items = [
            _WorkflowStreamWireItem("events", "x" * size, offset) for offset, size in enumerate(sizes)
        ]

    def truncate(self, up_to_offset: int) -> None:
        index = up_to_offset - self.base
        if index > 0:
            self.items, self.base = self.items[index:], up_to_offset

    def get_state(self) -> WorkflowStreamState:
        return WorkflowStreamState(log=list(self.items), base_offset=self.base)


def stream_of(sizes: list[int]) -> EventStream:
    """An EventStream (outside a workflow) over a log of items of these sizes."""
    log = _Log(sizes)
    stream = EventStream.__new__(EventStream)
    stream._stream = log  # type: ignore[assignment]
    stream._offset_query = lambda: log.base + len(log.items)
    return stream


def carried(state: WorkflowStreamState) -> list[int]:
    """The global offsets of the items a carried state holds."""
    assert [item.offset for item in state.log] == list(
        range(state.base_offset, state.base_offset + len(state.log))
    )
    return [item.offset for item in state.log]


def test_the_carried_stream_bounds_are_those_the_readme_states() -> None:
    """README, Limits: the last 2,000 events, 200 when idle with every event read, at most 4 MB."""
    assert (STREAM_ITEMS_CARRIED, IDLE_ITEMS_CARRIED, STREAM_BYTES_CARRIED) == (2000, 200, 4 * MiB)


def test_a_continue_as_new_carries_exactly_the_last_events_asked_for() -> None:
    state = stream_of([10] * 2500).state_for_carry(2000)
    assert carried(state) == list(range(500, 2500))


def test_a_stream_shorter_than_the_bound_is_carried_whole_from_its_first_event() -> None:
    state = stream_of([10] * 150).state_for_carry(200)
    assert state.base_offset == 0 and carried(state) == list(range(150))


def test_a_continue_as_new_carries_at_most_4_mb_of_the_newest_events_at_their_offsets() -> None:
    """Ten events of 1 MiB: the newest four fill the 4 MiB exactly; a reader
    behind reads on from offset 6, the oldest kept, at the right offsets."""
    state = stream_of([MiB] * 10).state_for_carry(2000)
    assert state.base_offset == 6 and carried(state) == [6, 7, 8, 9]
    assert sum(len(item.data) for item in state.log) <= STREAM_BYTES_CARRIED


def test_the_last_event_is_carried_whatever_its_size() -> None:
    """A run's agent_end holds all its messages: a reader waiting for the
    run's end needs it, even past 4 MB (and then nothing before it)."""
    state = stream_of([10, 10, 5 * MiB]).state_for_carry(2000)
    assert state.base_offset == 2 and carried(state) == [2]


def test_the_last_event_counts_toward_the_4_mb_carried() -> None:
    """A 3 MiB last event leaves room for one 1 MiB event before it, not four."""
    state = stream_of([MiB] * 5 + [3 * MiB]).state_for_carry(2000)
    assert carried(state) == [4, 5]


def test_a_reader_that_read_to_the_last_offset_has_read_everything() -> None:
    """Idle with every event read, only the last 200 are carried and a
    completing conversation need not linger: a poll whose next offset is
    the stream's offset has read it all; one short of it has not."""
    stream = stream_of([10] * 5)
    stream.polled, stream.delivered = True, 5
    assert stream.all_read()
    stream.delivered = 4
    assert not stream.all_read()
    stream.polled, stream.delivered = False, 0
    assert stream.all_read()  # nobody polled: nobody to wait for


def test_the_streaming_message_is_read_past_the_first_poll_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll answers at most ~1 MB at a time (``more_ready``): the message
    being streamed (``state.streamingMessage``, and what an abort keeps) is
    rebuilt from every batch since its ``message_start``, not the first."""
    import temporalio.converter
    from temporalio.contrib.workflow_streams import PollInput, PollResult
    from temporalio.contrib.workflow_streams._types import _encode_payload

    import workflows.stream as stream_module

    converter = temporalio.converter.default().payload_converter
    start = {"role": "assistant", "content": [], "stopReason": "stop", "timestamp": 5}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "message_update", "assistantMessageEvent": {"type": "text_start", "contentIndex": 0}},
        *(
            {
                "type": "message_update",
                "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": d},
            }
            for d in ("one ", "two ", "three")
        ),
    ]
    items = [
        _WorkflowStreamWireItem("events", _encode_payload(converter.to_payload(event)), offset)
        for offset, event in enumerate(events)
    ]

    def read(poll: PollInput) -> PollResult:  # two items a batch, as a large stream is read
        batch = items[poll.from_offset : poll.from_offset + 2]
        end = poll.from_offset + len(batch)
        return PollResult(batch, end, end < len(items))

    monkeypatch.setattr(stream_module.workflow, "get_query_handler", lambda name: read)
    monkeypatch.setattr(stream_module.workflow, "payload_converter", lambda: converter)
    stream = stream_of([])
    stream.model_call_offset = 0
    message = stream.streamed_message()
    assert message is not None and message.text == "one two three"


def test_partial_arguments_nested_deeper_than_arguments_are_read_read_as_nothing() -> None:
    """README/SPEC: a streaming tool call's arguments nested deeper than the
    workflow reads arguments show as ``{}`` (64 levels), as a finished one would."""
    from workflows.arguments import MAX_NESTING

    assert partial_arguments('{"a": ' + "[" * (MAX_NESTING + 5) + "1") == {}
    assert partial_arguments('{"a": ' + "[" * 10 + "1") == {"a": [[[[[[[[[[1]]]]]]]]]]}


def test_a_partial_message_orders_its_blocks_by_content_index() -> None:
    start = {"role": "assistant", "content": [], "stopReason": "stop", "timestamp": 5}

    def update(event: dict[str, Any]) -> dict[str, Any]:
        return {"type": "message_update", "assistantMessageEvent": event}

    events = [
        {"type": "message_start", "message": start},
        update({"type": "text_start", "contentIndex": 1}),
        update({"type": "text_delta", "contentIndex": 1, "delta": "answer"}),
        update({"type": "thinking_start", "contentIndex": 0}),
        update({"type": "thinking_delta", "contentIndex": 0, "delta": "hmm"}),
    ]
    message = partial_message(events)
    assert message is not None and [block.type for block in message.content] == ["thinking", "text"]


# --- through a running conversation (the `stack` fixture) ---


async def test_the_wait_for_a_runs_end_answers_the_offset_past_that_runs_own_agent_end(stack: Stack) -> None:
    """`__agent_stream_run_end` from where the second run starts (just past
    the first run's `agent_end`) waits for the second run's end, and answers
    the offset just past its `agent_end`: not the first run's end at once."""
    stack.script(
        {"text": "first"},
        {"tool_calls": [{"id": "s1", "name": "slow", "arguments": {"seconds": 1.0}}]},
        {"text": "second"},
    )
    handle = await stack.start(prompt="one")
    await handle.execute_update("wait_for_idle")
    first_end = await handle.query(OFFSET_QUERY, result_type=int)
    await handle.execute_update("prompt", "two")
    end = await asyncio.wait_for(handle.execute_update(RUN_END_UPDATE, first_end, result_type=int), 30)
    idle = await handle.execute_update("wait_for_idle")
    assert idle["messages"][-1]["content"][0]["text"] == "second"
    assert end > first_end
    assert end == await handle.query(OFFSET_QUERY, result_type=int)  # nothing published after agent_end
    await handle.signal("close")


async def test_a_wait_for_a_runs_end_from_a_negative_offset_is_refused(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [{"id": "s1", "name": "slow", "arguments": {"seconds": 1.0}}]}, {"text": "done"}
    )
    handle = await stack.start(prompt="go")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(RUN_END_UPDATE, -1, result_type=int)
    assert "from_offset must be an offset" in str(refused.value.cause)
    await handle.execute_update("wait_for_idle")
    await handle.signal("close")


async def test_the_sixth_waiting_read_of_a_caught_up_stream_is_refused_as_busy(stack: Stack) -> None:
    """README, Updates in flight: "a conversation lets at most 5 reads wait
    at once and refuses the next (`StreamBusy`)"; five leave room for a
    prompt and its run-end wait within Temporal's 10 updates in flight."""
    from temporalio.client import WorkflowUpdateStage
    from temporalio.contrib.workflow_streams import PollInput, PollResult
    from temporalio.exceptions import ApplicationError

    from workflows.contract import BUSY_ERROR, POLL_UPDATE
    from workflows.models import EVENTS_TOPIC

    stack.script({"text": "first"}, {"text": "second"})
    handle = await stack.start(prompt="go")
    await handle.execute_update("wait_for_idle")
    end = await handle.query(OFFSET_QUERY, result_type=int)
    poll = PollInput(topics=[EVENTS_TOPIC], from_offset=end)
    waiting = [
        await handle.start_update(
            POLL_UPDATE, poll, wait_for_stage=WorkflowUpdateStage.ACCEPTED, result_type=PollResult
        )
        for _ in range(5)
    ]
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await asyncio.wait_for(handle.execute_update(POLL_UPDATE, poll, result_type=PollResult), 5)
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == BUSY_ERROR
    await handle.execute_update("prompt", "again")  # the waiting reads get its events
    for update in waiting:
        assert (await asyncio.wait_for(update.result(), 10)).items
    await handle.signal("close")
