"""Conformance of the agent loop (SPEC §3-§6), on a real dev server with the
real worker process and the scripted model over HTTP. Each test asserts the
exact event order a client sees on the ``events`` topic."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from tests.support.stack import EventLog, Stack, outline
from workflows.calls import ActivityCalls, _tool_failure_text, activity_failure_text, tool_summary
from workflows.contract import PromptResult


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def transcript_roles(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        role = m["role"]
        if role == "toolResult":
            role += f":{m['toolCallId']}"
        elif role == "assistant":
            role += f":{m['stopReason']}"
        out.append(role)
    return out


async def test_tool_call_result_and_final_answer(stack: Stack) -> None:
    stack.script({"tool_calls": [call("c1", "calculator", expression="6*7")]}, {"text": "It is 42."})
    handle = await stack.start(prompt="What is 6*7?", closeWhenIdle=True)
    events = await stack.events(handle.id)
    assert outline(events) == [
        "agent_start",
        "turn_start",
        "message_start:user",
        "message_end:user",
        "message_start:assistant",
        "message_end:assistant:toolUse",
        "tool_execution_start:c1",
        "tool_execution_end:c1",
        "message_start:toolResult:c1",
        "message_end:toolResult:c1",
        "turn_end",
        "turn_start",
        "message_start:assistant",
        "message_end:assistant:stop",
        "turn_end",
        "agent_end",
    ]
    result = (await handle.result()).messages
    assert result[2].content[0].text == "6*7 = 42"
    assert result[-1].text == "It is 42."
    end = events[-1]
    assert [m["role"] for m in end["messages"]] == ["user", "assistant", "toolResult", "assistant"]
    # The model saw the tool result and the tool schema.
    second = stack.requests()[1]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "6*7 = 42"}
    assert any(t["function"]["name"] == "calculator" for t in second["tools"])


async def test_streamed_text_arrives_as_deltas_in_order(stack: Stack) -> None:
    stack.script({"text": "Hello there, durable world!", "reasoning": "Let me think.", "chunk_chars": 5})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    events = await stack.events(handle.id)
    updates = [e["assistantMessageEvent"] for e in events if e["type"] == "message_update"]
    kinds = [u["type"] for u in updates]
    assert kinds[0] == "thinking_start" and "text_start" in kinds
    assert "".join(u["delta"] for u in updates if u["type"] == "text_delta") == "Hello there, durable world!"
    assert "".join(u["delta"] for u in updates if u["type"] == "thinking_delta") == "Let me think."
    final = (await handle.result()).messages[-1]
    assert [c.type for c in final.content] == ["thinking", "text"]
    # The streamed message has its time from message_start on (pi stamps it once).
    started = next(
        e["message"] for e in events if e["type"] == "message_start" and e["message"]["role"] == "assistant"
    )
    assert started["timestamp"] == final.timestamp > 1_700_000_000_000


async def test_parallel_tools_end_in_completion_order_results_in_source_order(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("slow1", "echo", text="a", delay=1.0), call("fast2", "echo", text="b")]},
        {"text": "done"},
    )
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    lines = outline(await stack.events(handle.id))
    tool_part = lines[lines.index("tool_execution_start:slow1") : lines.index("turn_end")]
    assert tool_part == [
        "tool_execution_start:slow1",
        "tool_execution_start:fast2",
        "tool_execution_end:fast2",
        "tool_execution_end:slow1",
        "message_start:toolResult:slow1",
        "message_end:toolResult:slow1",
        "message_start:toolResult:fast2",
        "message_end:toolResult:fast2",
    ]


async def test_one_sequential_tool_makes_the_batch_sequential(stack: Stack) -> None:
    stack.script(
        {
            "tool_calls": [
                call("s1", "echo", text="a", delay=0.6),
                call("s2", "sequential_echo", text="b"),
            ]
        },
        {"text": "done"},
    )
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    lines = outline(await stack.events(handle.id))
    tool_part = lines[lines.index("tool_execution_start:s1") : lines.index("turn_end")]
    assert tool_part == [
        "tool_execution_start:s1",
        "tool_execution_end:s1",
        "message_start:toolResult:s1",
        "message_end:toolResult:s1",
        "tool_execution_start:s2",
        "tool_execution_end:s2",
        "message_start:toolResult:s2",
        "message_end:toolResult:s2",
    ]


async def test_sequential_mode_setting_runs_calls_one_after_another(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("q1", "echo", text="a", delay=0.5), call("q2", "echo", text="b")]},
        {"text": "done"},
    )
    handle = await stack.start(prompt="go", closeWhenIdle=True, toolExecution="sequential")
    lines = outline(await stack.events(handle.id))
    assert lines.index("tool_execution_end:q1") < lines.index("tool_execution_start:q2")


async def test_steering_waits_for_the_whole_tool_batch(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("t1", "slow", seconds=1.5), call("t2", "echo", text="x")]},
        {"text": "I see your steer."},
    )
    handle = await stack.start(prompt="work", closeWhenIdle=True)
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_start" for e in es))
    await handle.signal("steer", "change of plan")
    await log.wait_for_type("agent_end")
    log.close()
    lines = outline(log.events)
    assert lines[lines.index("message_end:toolResult:t2") :] == [
        "message_end:toolResult:t2",
        "turn_end",
        "turn_start",
        "message_start:user",
        "message_end:user",
        "message_start:assistant",
        "message_end:assistant:stop",
        "turn_end",
        "agent_end",
    ]
    messages = (await handle.result()).messages
    assert transcript_roles([m.model_dump() for m in messages]) == [
        "user",
        "assistant:toolUse",
        "toolResult:t1",
        "toolResult:t2",
        "user",
        "assistant:stop",
    ]
    assert messages[4].content == "change of plan"
    # Both tools ran: steering never skips the current message's tool calls.
    assert not any(m.is_error for m in messages if m.role == "toolResult")


async def test_follow_up_runs_only_when_the_agent_would_stop(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("f1", "slow", seconds=1.0)]},
        {"text": "first answer"},
        {"text": "follow-up answer"},
    )
    handle = await stack.start(prompt="task", closeWhenIdle=True)
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_start" for e in es))
    await handle.signal("follow_up", "and then this")
    await log.wait_for_type("agent_end")
    log.close()
    messages = (await handle.result()).messages
    assert transcript_roles([m.model_dump() for m in messages]) == [
        "user",
        "assistant:toolUse",
        "toolResult:f1",
        "assistant:stop",
        "user",
        "assistant:stop",
    ]
    assert messages[4].content == "and then this"
    lines = outline(log.events)
    assert lines.count("agent_start") == 1 and lines.count("agent_end") == 1
    assert lines.count("turn_start") == 3


async def test_steering_queue_modes(stack: Stack) -> None:
    """one-at-a-time injects one steering message per turn; all drains the queue."""
    for mode, expected_turns in (("one-at-a-time", 3), ("all", 2)):
        stack.script(
            {"tool_calls": [call(f"m-{mode}", "slow", seconds=1.0)]},
            {"text": "a"},
            {"text": "b"},
        )
        handle = await stack.start(prompt="go", closeWhenIdle=True, steeringMode=mode)
        log = EventLog(stack.client, handle.id)
        await log.wait_until(lambda es: any(e["type"] == "tool_execution_start" for e in es))
        await handle.signal("steer", "one")
        await handle.signal("steer", "two")
        await log.wait_for_type("agent_end")
        log.close()
        messages = (await handle.result()).messages
        assistant_turns = sum(1 for m in messages if m.role == "assistant")
        assert assistant_turns == expected_turns, mode
        users = [m.content for m in messages if m.role == "user"]
        assert users == ["go", "one", "two"]
        stack.model_server.reset()


async def test_terminate_only_when_every_result_says_so(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("a1", "finish"), call("a2", "echo", text="x")]},
        {"tool_calls": [call("b1", "finish"), call("b2", "finish")]},
    )
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    events = await stack.events(handle.id)
    messages = (await handle.result()).messages
    # Mixed batch: the loop goes on; all-terminate batch: it stops without another model call.
    assert transcript_roles([m.model_dump() for m in messages]) == [
        "user",
        "assistant:toolUse",
        "toolResult:a1",
        "toolResult:a2",
        "assistant:toolUse",
        "toolResult:b1",
        "toolResult:b2",
    ]
    assert len(stack.requests()) == 2
    assert outline(events)[-2:] == ["turn_end", "agent_end"]


async def test_stop_after_turn_skips_both_queues(stack: Stack) -> None:
    stack.script({"tool_calls": [call("s1", "slow", seconds=1.0)]}, {"text": "later"})
    handle = await stack.start(prompt="go")
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_start" for e in es))
    await handle.signal("steer", "queued steer")
    await handle.signal("follow_up", "queued follow-up")
    await handle.signal("stop_after_turn")
    await log.wait_for_type("agent_end")
    state = await stack.state(handle)
    assert state.steering_queue == 1 and state.follow_up_queue == 1
    assert state.status == "idle"
    messages = await stack.messages(handle)
    assert transcript_roles([m.model_dump() for m in messages]) == [
        "user",
        "assistant:toolUse",
        "toolResult:s1",
    ]
    # The queued messages are delivered by the next run (continue drains steering first).
    await handle.execute_update("continue")
    await log.wait_for_type("agent_end", count=2)
    messages = await stack.messages(handle)
    assert [m.content for m in messages if m.role == "user"] == ["go", "queued steer", "queued follow-up"]
    log.close()
    await handle.signal("close")


async def test_max_turns_ends_the_run(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("x1", "echo", text="1")]},
        {"tool_calls": [call("x2", "echo", text="2")]},
    )
    handle = await stack.start(prompt="loop", closeWhenIdle=True, maxTurns=2)
    messages = (await handle.result()).messages
    assert transcript_roles([m.model_dump() for m in messages]) == [
        "user",
        "assistant:toolUse",
        "toolResult:x1",
        "assistant:toolUse",
        "toolResult:x2",
    ]


async def test_tool_errors_become_error_results(stack: Stack) -> None:
    stack.script(
        {
            "tool_calls": [
                call("u1", "no_such_tool"),
                call("v1", "calculator", wrong="field"),
                call("e1", "explode"),
                {"id": "j1", "name": "echo", "arguments": '{"text": "unterminated'},
            ]
        },
        {"text": "I will fix that."},
    )
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    events = await stack.events(handle.id)
    ends = {e["toolCallId"]: e for e in events if e["type"] == "tool_execution_end"}
    assert all(e["isError"] for e in ends.values())
    texts = {k: e["result"]["content"][0]["text"] for k, e in ends.items()}
    assert texts["u1"] == "Tool no_such_tool not found"
    assert texts["v1"].startswith('Validation failed for tool "calculator"')
    assert "expression" in texts["v1"] and '"wrong": "field"' in texts["v1"]
    assert texts["e1"] == "the tool blew up"
    assert "not valid JSON" in texts["j1"] and "unterminated" in texts["j1"]
    # SPEC §5: every error result, a raising tool's included, has details {}.
    assert {k: e["result"].get("details") for k, e in ends.items()} == {k: {} for k in ends}
    messages = (await handle.result()).messages
    assert all(m.details == {} for m in messages if m.role == "toolResult")
    assert messages[-1].text == "I will fix that."
    # Immediate errors end before anything runs; only the exploding tool ran as an activity.
    history = await handle.fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.count("execute_tool") == 1


async def test_a_tool_raising_cancelled_error_itself_gets_an_error_result_and_runs_once(stack: Stack) -> None:
    """Nobody cancelled it: the CancelledError is the tool's failure, as any
    exception. Re-raised, it failed the activity, Temporal ran the tool
    three times (its side effects too), and the model read the SDK's text."""
    stack.script({"tool_calls": [call("c1", "cancels_itself")]}, {"text": "noted"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    messages = (await handle.result()).messages
    result = next(m for m in messages if m.role == "toolResult")
    assert result.is_error and result.content[0].text == "a library's own cancellation"
    assert messages[-1].text == "noted"
    history = await handle.fetch_history()
    started = [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    # The worker's defaults, two model calls and the tool, each run once.
    assert [s.attempt for s in started] == [1, 1, 1, 1]
    assert not [e for e in history.events if e.HasField("activity_task_failed_event_attributes")]


async def test_length_truncated_tool_calls_are_not_executed(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("l1", "explode")], "finish_reason": "length"},
        {"text": "retrying with shorter output"},
    )
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    messages = (await handle.result()).messages
    assert transcript_roles([m.model_dump() for m in messages]) == [
        "user",
        "assistant:length",
        "toolResult:l1",
        "assistant:stop",
    ]
    assert messages[2].is_error and "token limit" in messages[2].content[0].text
    history = await handle.fetch_history()
    assert not any(
        e.activity_task_scheduled_event_attributes.activity_type.name == "execute_tool"
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    )


async def test_rate_limit_is_retried_after_retry_after(stack: Stack) -> None:
    stack.script(
        {"fault": {"kind": "status", "status": 429, "retry_after": 2, "message": "slow down"}},
        {"text": "made it"},
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    messages = (await handle.result()).messages
    assert messages[-1].text == "made it" and messages[-1].stop_reason == "stop"
    history = await handle.fetch_history()
    started = [e for e in history.events if e.HasField("activity_task_started_event_attributes")][
        -1
    ].activity_task_started_event_attributes
    assert started.attempt == 2
    assert "429" in started.last_failure.message
    # Retry-After (2 s) was honoured, not the 1 s default backoff.
    requests = stack.requests()
    assert len(requests) == 2


async def test_a_retry_is_announced_as_its_attempt_fails_not_as_the_next_starts(stack: Stack) -> None:
    """A 429 asking to wait 4 s: ``message_retry`` reaches subscribers as
    the attempt fails, before the wait, not 4 s later as the next attempt
    starts (the stream was silent meanwhile, up to the 5 minutes a
    Retry-After may ask: a fault audit). The next attempt does not say it
    again."""
    stack.script(
        {"fault": {"kind": "status", "status": 429, "retry_after": 4, "message": "slow down"}},
        {"text": "made it"},
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    log = EventLog(stack.client, handle.id)
    started = asyncio.get_running_loop().time()
    seen = await log.wait_for_type("message_retry", timeout=3)
    [retry] = [e for e in seen if e["type"] == "message_retry"]
    assert asyncio.get_running_loop().time() - started < 3
    assert len(stack.requests()) == 1, "told before the next attempt asked the model"
    assert retry["attempt"] == 2
    assert retry["reason"] == "The model server answered 429: slow down (Retry-After: 4 s)"
    assert (await handle.result()).messages[-1].text == "made it"
    events = await log.wait_for_type("agent_end")
    log.close()
    assert [e["attempt"] for e in events if e["type"] == "message_retry"] == [2]
    assert [
        e.get("attempt")
        for e in events
        if e["type"] == "message_start" and e["message"]["role"] == "assistant"
    ] == [2]


async def test_retried_attempt_is_marked_on_the_stream(stack: Stack) -> None:
    stack.script(
        {"text": "partial answer that will be dropped", "fault": {"kind": "drop", "after_chunks": 4}},
        {"text": "complete answer"},
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    events = await stack.events(handle.id)
    kinds = [e["type"] for e in events]
    retry = kinds.index("message_retry")
    assert events[retry]["attempt"] == 2
    assert kinds.index("message_start", retry) > retry
    after = [
        e["assistantMessageEvent"]["delta"]
        for e in events[retry:]
        if e["type"] == "message_update" and e["assistantMessageEvent"]["type"] == "text_delta"
    ]
    assert "".join(after) == "complete answer"
    assert (await handle.result()).messages[-1].text == "complete answer"


async def test_every_retried_attempt_is_marked_even_one_that_fails_at_once(stack: Stack) -> None:
    """Attempt 2 fails before its first batch of events would go out: its
    ``message_retry`` must still reach subscribers (they drop the partial
    message of attempt 1 by it), and attempt 3's follows."""
    stack.script(
        {"text": "partial answer that will be dropped", "fault": {"kind": "drop", "after_chunks": 4}},
        {"fault": {"kind": "status", "status": 500, "retry_after": 0}},
        {"text": "complete answer"},
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    events = await stack.events(handle.id)
    retries = [e for e in events if e["type"] == "message_retry"]
    assert [e["attempt"] for e in retries] == [2, 3]
    # Each says why the attempt before it failed (the chat prints it).
    assert retries[0]["reason"].startswith("The model's stream broke off mid-answer: ")
    assert retries[1]["reason"].startswith("The model server answered 500")
    assert (await handle.result()).messages[-1].text == "complete answer"


async def test_a_last_attempt_that_breaks_mid_answer_ends_the_message_it_streamed(stack: Stack) -> None:
    """Retries used up, the last attempt broken off after some text: that
    streamed message ends with stopReason error and what had streamed (as
    pi's provider ends its partial output), not a second message_start; the
    error says the stream broke, not that the server was unreachable."""
    stack.script(
        *[{"fault": {"kind": "status", "status": 500, "retry_after": 0.1}} for _ in range(4)],
        {
            "text": "partial answer that breaks off",
            "chunk_chars": 4,
            "fault": {"kind": "drop", "after_chunks": 3},
        },
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    events = await stack.events(handle.id)
    last_retry = max(i for i, e in enumerate(events) if e["type"] == "message_retry")
    assert events[last_retry]["attempt"] == 5
    tail = [e for e in events[last_retry:] if e["type"] in ("message_start", "message_end")]
    assert [e["type"] for e in tail] == ["message_start", "message_end"]
    streamed = "".join(
        e["assistantMessageEvent"].get("delta", "")
        for e in events[last_retry:]
        if e["type"] == "message_update"
    )
    ended = tail[-1]["message"]
    assert (
        ended["stopReason"] == "error"
        and streamed
        and ended["content"] == [{"type": "text", "text": streamed}]
    )
    assert "stream broke off mid-answer" in ended["errorMessage"]
    assert ended["timestamp"] == tail[0]["message"]["timestamp"]
    assert (await handle.result()).messages[-1].text == streamed


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "status", "status": 500},
        {"kind": "malformed", "after_chunks": 2},
        {"kind": "stall", "after_chunks": 2, "seconds": 6},
    ],
    ids=["500", "malformed", "stall"],
)
async def test_transient_failures_are_retried(stack: Stack, fault: dict[str, Any]) -> None:
    stack.script({"text": "first try", "fault": fault}, {"text": "second try"})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    messages = (await handle.result()).messages
    assert messages[-1].text == "second try"


async def test_bad_request_ends_the_run_with_an_error_message(stack: Stack) -> None:
    stack.script(
        {"fault": {"kind": "status", "status": 400, "message": "context_length_exceeded: too long"}},
        {"text": "never used"},
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    events = await stack.events(handle.id)
    assert outline(events)[-4:] == [
        "message_start:assistant",
        "message_end:assistant:error",
        "turn_end",
        "agent_end",
    ]
    last = (await handle.result()).messages[-1]
    assert last.stop_reason == "error"
    assert "400" in last.error_message and "context_length_exceeded" in last.error_message
    assert len(stack.requests()) == 1  # not retried


async def test_prompt_while_running_is_refused(stack: Stack) -> None:
    stack.script({"tool_calls": [call("p1", "slow", seconds=1.0)]}, {"text": "ok"})
    handle = await stack.start(prompt="first")
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_start" for e in es))
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("prompt", "second")
    assert "A run is already active" in str(refused.value.cause)
    await log.wait_for_type("agent_end")
    # Idle again: a prompt is accepted and its run's events start at the returned offset.
    stack.script({"text": "second answer"})
    result = await handle.execute_update("prompt", "second", result_type=PromptResult)
    assert result.run == 2
    await log.wait_for_type("agent_end", count=2)
    second_run = [e for e in log.events if e["offset"] >= result.event_offset]
    assert outline(second_run)[0] == "agent_start"
    log.close()
    await handle.signal("close")


async def test_invalid_payloads_are_refused_or_dropped(stack: Stack) -> None:
    handle = await stack.start()
    for bad in ("", "   ", {"role": "assistant", "content": []}, {"content": 3}, 42):
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("prompt", bad)
    await handle.signal("steer", "")
    await handle.signal("follow_up", {"nonsense": True})
    state = await stack.state(handle)
    assert state.steering_queue == 0 and state.follow_up_queue == 0 and state.status == "idle"
    stack.script({"text": "still fine"})
    await handle.execute_update("prompt", {"role": "user", "content": [{"type": "text", "text": "hello"}]})
    await handle.execute_update("wait_for_idle")  # close would abort the run
    await handle.signal("close")
    messages = (await handle.result()).messages
    assert messages[-1].text == "still fine"


async def test_invalid_start_input_fails_with_a_clear_message(stack: Stack) -> None:
    handle = await stack.start(steeringMode="sometimes")
    with pytest.raises(Exception) as failed:
        await handle.result()
    assert "steeringMode" in str(failed.value.cause) or "steering_mode" in str(failed.value.cause)


async def test_steer_while_idle_starts_a_run(stack: Stack) -> None:
    stack.script({"text": "first"}, {"text": "answer to the steer"})
    handle = await stack.start(prompt="hi")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("agent_end")
    await handle.signal("steer", "one more thing")
    await log.wait_for_type("agent_end", count=2)
    log.close()
    messages = await stack.messages(handle)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[-1].text == "answer to the steer"
    await handle.signal("close")


async def test_continue_from_an_assistant_message_without_queue_is_refused(stack: Stack) -> None:
    stack.script({"text": "done"})
    handle = await stack.start(prompt="hi")
    await stack.events(handle.id)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("continue")
    assert "Cannot continue from an assistant message" in str(refused.value.cause)
    await handle.signal("close")


async def test_abort_mid_stream_keeps_partial_text(stack: Stack) -> None:
    stack.script({"text": "a long answer " * 40, "delay_ms": 50})
    handle = await stack.start(prompt="talk", closeWhenIdle=True)
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "message_update" for e in es))
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    log.close()
    assert outline(log.events)[-3:] == ["message_end:assistant:aborted", "turn_end", "agent_end"]
    last = (await handle.result()).messages[-1]
    assert last.stop_reason == "aborted"
    # It keeps exactly what had streamed to subscribers when the abort came.
    seen = "".join(
        e["assistantMessageEvent"].get("delta", "")
        for e in log.events
        if e["type"] == "message_update" and e["assistantMessageEvent"]["type"] == "text_delta"
    )
    assert last.text == seen and last.text and ("a long answer " * 40).startswith(last.text)
    assert len(last.text) < len("a long answer " * 40)
    # One message from start to end: stamped once, when it was requested (pi's).
    started = next(
        e for e in log.events if e["type"] == "message_start" and e["message"]["role"] == "assistant"
    )
    assert last.timestamp == started["message"]["timestamp"] > 0


async def test_abort_during_tools_leaves_no_orphan_tool_calls(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("r1", "slow", seconds=20), call("r2", "echo", text="quick")]},
        {"text": "must not be requested"},
    )
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_end" for e in es))
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    log.close()
    messages = (await handle.result()).messages
    assert transcript_roles([m.model_dump() for m in messages]) == [
        "user",
        "assistant:toolUse",
        "toolResult:r1",
        "toolResult:r2",
        "assistant:aborted",
    ]
    assert messages[2].content[0].text == "Tool execution aborted"
    assert messages[3].content[0].text == "echo: quick"
    assert len(stack.requests()) == 1  # the model is not called again after an abort
    tool_call_ids = {c.id for m in messages if m.role == "assistant" for c in m.tool_calls}
    result_ids = {m.tool_call_id for m in messages if m.role == "toolResult"}
    assert tool_call_ids == result_ids


async def test_queued_messages_stay_queued_after_an_error(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("q1", "slow", seconds=1.0)]},
        {"fault": {"kind": "status", "status": 401, "message": "bad key"}},
    )
    handle = await stack.start(prompt="go")
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_start" for e in es))
    await handle.signal("follow_up", "later")
    await log.wait_for_type("agent_end")
    log.close()
    state = await stack.state(handle)
    assert state.status == "idle" and state.follow_up_queue == 1
    assert state.error_message and "401" in state.error_message
    await handle.signal("close")


async def test_images_reach_the_model(stack: Stack) -> None:
    stack.script({"text": "a red pixel"})
    pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
    handle = await stack.start(
        prompt={
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image", "data": pixel, "mimeType": "image/png"},
            ],
        },
        closeWhenIdle=True,
    )
    await handle.result()
    content = stack.requests()[0]["messages"][-1]["content"]
    assert content[1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{pixel}"}}


async def test_an_image_a_model_would_refuse_is_refused_by_prompt_and_never_sent(stack: Stack) -> None:
    """An image with bad base64 or a non-image mimeType made the model
    refuse the call, and every later one with it in the context: the
    conversation could not answer again. `prompt` refuses it with a
    sentence; one that comes another way (a signal, the start input, a
    tool) reaches the model as a note saying why."""
    pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="

    def message(data: str, mime: str = "image/png") -> dict[str, Any]:
        return {
            "role": "user",
            "content": [{"type": "text", "text": "see"}, {"type": "image", "data": data, "mimeType": mime}],
        }

    handle = await stack.start()
    refusals = {
        "not base64!": "its data is not valid base64",
        f"data:image/png;base64,{pixel}": "its data is a data: URL",
        "": "its data is empty",
        base64.b64encode(
            b"<html>not a picture</html>"
        ).decode(): "its data is not a PNG, JPEG, GIF or WebP image",
    }
    for data, why in refusals.items():
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("prompt", message(data))
        assert f"An image of the message cannot be sent to a model: {why}" in str(refused.value.cause)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("prompt", message(pixel, "text/plain"))
    assert "its mimeType 'text/plain' is not an image type" in str(refused.value.cause)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("prompt", message(pixel, "Image/SVG+XML"))
    assert "it is an SVG (vector) image, which models do not take" in str(refused.value.cause)
    for kind in ("image/bmp", "image/tiff", "image/heic"):  # OpenAI: "You uploaded an unsupported image"
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("prompt", message(pixel, kind))
        assert f"models take PNG, JPEG, GIF or WebP images, not {kind}" in str(refused.value.cause)

    stack.script({"text": "I cannot see it"}, {"text": "still answering"})
    await handle.signal("follow_up", message("not base64!"))  # a signal has no caller to refuse
    await handle.execute_update("wait_for_idle")
    await handle.execute_update("prompt", message(pixel))
    idle = await handle.execute_update("wait_for_idle")
    assert idle["messages"][-1]["content"][0]["text"] == "still answering"
    first, second = stack.requests()
    assert first["messages"][-1]["content"][1] == {
        "type": "text",
        "text": "[An image was left out: its data is not valid base64.]",
    }
    assert second["messages"][-1]["content"][1]["type"] == "image_url"
    await handle.signal("close")


async def test_tool_images_reach_the_model_after_all_the_batch_tool_messages(stack: Stack) -> None:
    """A tool-result image goes to the model in a user message (a `tool`
    message cannot carry one). Put between the batch's `tool` messages, it
    made OpenAI refuse that call and every later one (400: the assistant's
    `tool_calls` must be answered first); the scripted model refuses it the
    same way."""
    stack.script(
        {"tool_calls": [call("p1", "picture"), call("e1", "echo", text="t")]},
        {"text": "a pixel"},
        {"text": "still here"},
    )
    handle = await stack.start(prompt="take a picture and echo t", tools=["picture", "echo"])
    first = await handle.execute_update("wait_for_idle")
    assert first["stopReason"] == "stop"
    await handle.execute_update("prompt", "and now?")
    second = await handle.execute_update("wait_for_idle")
    assert second["stopReason"] == "stop"
    for request in stack.requests()[1:]:
        sent = request["messages"][2:5]
        assert [(m["role"], m.get("tool_call_id")) for m in sent] == [
            ("tool", "p1"),
            ("tool", "e1"),
            ("user", None),
        ]
        assert sent[2]["content"][0] == {"type": "text", "text": "Image(s) returned by tool picture:"}
        assert sent[2]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    await handle.signal("close")


async def test_a_start_transcript_with_a_call_left_unanswered_still_gets_answers(stack: Stack) -> None:
    """A transcript given at the start whose last assistant turn has a call
    without a result made every model call fail (400); the call is answered
    "No result provided" in what the model is sent, as pi does."""
    stack.script({"text": "ok"})
    asked = {"type": "toolCall", "id": "c1", "name": "echo", "arguments": {"text": "x"}}
    messages = [
        {"role": "user", "content": "echo x", "timestamp": 1},
        {"role": "assistant", "content": [asked], "stopReason": "toolUse", "timestamp": 2},
    ]
    handle = await stack.start(prompt="hi", messages=messages, closeWhenIdle=True)
    assert (await handle.result()).messages[-1].text == "ok"
    sent = stack.requests()[0]["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "c1", "content": "No result provided"}
    assert sent[3]["role"] == "user"


async def test_a_start_transcript_repeating_a_call_id_still_gets_answers(stack: Stack) -> None:
    """Two calls `d` and one result `d` in a transcript given at the start:
    the model server refused every model call of the conversation (400,
    "tool_call_ids did not have response messages: d") until a `reset`."""
    stack.script({"text": "ok"}, {"text": "again"})
    asked = {"type": "toolCall", "id": "d", "name": "echo", "arguments": {"text": "x"}}
    messages = [
        {"role": "user", "content": "echo x twice", "timestamp": 1},
        {"role": "assistant", "content": [asked, asked], "stopReason": "toolUse", "timestamp": 2},
        {
            "role": "toolResult",
            "toolCallId": "d",
            "toolName": "echo",
            "content": [{"type": "text", "text": "x"}],
            "isError": False,
            "timestamp": 3,
        },
    ]
    handle = await stack.start(prompt="and?", messages=messages)
    await handle.execute_update("wait_for_idle")
    await handle.execute_update("prompt", "still there?")
    idle = await handle.execute_update("wait_for_idle")

    assert idle["stopReason"] == "stop" and idle["messages"][-1]["content"][0]["text"] == "again"
    sent = stack.requests()[0]["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["d", "d_2"]
    assert [(m["tool_call_id"], m["content"]) for m in sent[2:4]] == [
        ("d", "x"),
        ("d_2", "No result provided"),
    ]
    await handle.signal("close")


async def test_a_context_with_nothing_a_model_reads_ends_the_run_with_a_sentence(stack: Stack) -> None:
    """Only an application message and no system prompt: the model server
    was sent `messages: []` and answered 400 in its own words."""
    handle = await stack.start(prompt={"role": "ui-event", "content": "clicked"}, closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert last.stop_reason == "error"
    assert last.error_message is not None and last.error_message.startswith("Nothing to send to the model")
    assert stack.requests() == []


async def test_settings_reach_the_model_and_the_key_stays_out_of_history(stack: Stack) -> None:
    stack.script({"text": "ok"})
    handle = await stack.start(
        prompt="hi", closeWhenIdle=True, systemPrompt="Be brief.", thinkingLevel="high", tools=["calculator"]
    )
    await handle.result()
    request = stack.requests()[0]
    assert request["messages"][0] == {"role": "system", "content": "Be brief."}
    assert request["reasoning_effort"] == "high"
    assert [t["function"]["name"] for t in request["tools"]] == ["calculator"]
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    history = await handle.fetch_history()
    assert b"test-key-never-in-history" not in history.to_json().encode()


async def test_unknown_tool_in_settings_fails_the_start_clearly(stack: Stack) -> None:
    handle = await stack.start(prompt="hi", tools=["calculator", "teleport"])
    with pytest.raises(Exception) as failed:
        await handle.result()
    assert "teleport" in str(failed.value.cause)


async def test_tool_sees_an_idempotency_key_derived_from_the_call_id(stack: Stack) -> None:
    stack.script({"tool_calls": [call("key-1", "whoami")]}, {"text": "ok"})
    handle = await stack.start(prompt="who", closeWhenIdle=True)
    messages = (await handle.result()).messages
    assert messages[2].details["key"] == f"{handle.id}/tool-key-1"


async def test_tool_progress_is_streamed(stack: Stack) -> None:
    stack.script({"tool_calls": [call("pr1", "slow", seconds=0.4, steps=2)]}, {"text": "ok"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    lines = outline(await stack.events(handle.id), updates=False)
    events = await stack.events(handle.id)
    updates = [e for e in events if e["type"] == "tool_execution_update"]
    assert [u["partialResult"]["content"][0]["text"] for u in updates] == ["step 1/2", "step 2/2"]
    assert lines.index("tool_execution_start:pr1") < lines.index("tool_execution_end:pr1")
    kinds = [e["type"] for e in events]
    assert (
        kinds.index("tool_execution_start")
        < kinds.index("tool_execution_update")
        < kinds.index("tool_execution_end")
    )


async def test_progress_carries_the_arguments_the_model_sent(stack: Stack) -> None:
    """As pi's: `tool_execution_update` shows the call's arguments as
    `tool_execution_start` did, not as validation coerced them and filled
    in its defaults (the tool itself gets those)."""
    stack.script({"tool_calls": [call("pr2", "slow", seconds="0.2")]}, {"text": "ok"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    events = await stack.events(handle.id)
    start = next(e for e in events if e["type"] == "tool_execution_start")
    updates = [e for e in events if e["type"] == "tool_execution_update"]
    assert start["args"] == {"seconds": "0.2"}
    assert [u["partialResult"]["content"][0]["text"] for u in updates] == [
        f"step {i}/4" for i in (1, 2, 3, 4)
    ]
    assert [u["args"] for u in updates] == [{"seconds": "0.2"}] * 4
    assert (await handle.result()).messages[2].content[0].text == "slept 0.2s"


async def test_close_ends_the_conversation_with_its_transcript(stack: Stack) -> None:
    stack.script({"text": "hello"})
    handle = await stack.start(prompt="hi")
    await stack.events(handle.id)
    await handle.signal("close")
    result = await asyncio.wait_for(handle.result(), 10)
    assert [m.role for m in result.messages] == ["user", "assistant"]


async def test_a_call_whose_arguments_alone_pass_the_in_flight_limit_still_runs(
    stack: Stack,
) -> None:
    """At most ~1 MB of tool arguments is scheduled at once, but a call
    above that on its own runs (alone) instead of waiting for good."""
    text = "a" * 1_100_000
    stack.script(
        {"tool_calls": [call("big", "echo", text=text)], "chunk_chars": 64 * 1024},
        {"text": "echoed"},
    )
    handle = await stack.start(prompt="big", closeWhenIdle=True)
    result = await asyncio.wait_for(handle.result(), 120)
    [echoed] = [m for m in result.messages if m.role == "toolResult"]
    assert not echoed.is_error and echoed.content[0].text.startswith("echo: aaa")


async def test_a_call_id_reused_in_the_same_run_gets_its_own_idempotency_key(
    stack: Stack,
) -> None:
    """Some models number their calls `call_0` in every answer: within one
    run the second call's activity id gets a suffix, and so does its key
    (a tool deduplicating by key would skip the second call)."""
    stack.script(
        {"tool_calls": [call("call_0", "whoami")]},
        {"tool_calls": [call("call_0", "whoami")]},
        {"text": "ok"},
    )
    handle = await stack.start(prompt="who", closeWhenIdle=True)
    result = await asyncio.wait_for(handle.result(), 60)
    keys = [m.details["key"] for m in result.messages if m.role == "toolResult"]
    assert keys == [f"{handle.id}/tool-call_0", f"{handle.id}/tool-call_0-2"]


def test_the_ui_summary_of_a_tool_call_is_at_most_200_characters() -> None:
    summary = tool_summary("search", {f"field{i}": "value" for i in range(40)})
    assert len(summary) == 200 and summary.endswith("...")
    assert tool_summary("read_file", {"path": "x" * 50}) == f"tool: read_file path={'x' * 37}..."


def _failed_tool_activity(cause: BaseException) -> ActivityError:
    """A tool activity's failure as the workflow gets it, caused by ``cause``."""
    failure = ActivityError(
        "Activity task failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker",
        activity_type="execute_tool",
        activity_id="tool-c1",
        retry_state=None,
    )
    failure.__cause__ = cause
    return failure


def _heartbeat_timeout() -> TemporalTimeoutError:
    return TemporalTimeoutError(
        "activity Heartbeat timeout", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[]
    )


def test_an_activity_failure_reads_as_its_innermost_message() -> None:
    timeout = _heartbeat_timeout()
    timeout.__cause__ = ApplicationError("the worker running it stopped")

    assert activity_failure_text(_failed_tool_activity(timeout)) == "the worker running it stopped"


def test_a_tool_given_up_for_want_of_heartbeats_says_what_usually_causes_it() -> None:
    """The result read "activity Heartbeat timeout": a tool blocking the
    event loop with time.sleep left its author guessing (a robustness audit)."""
    assert _tool_failure_text(_failed_tool_activity(_heartbeat_timeout())) == (
        "The tool stopped heartbeating for 3 s and was given up (tried 3 times): it blocks the worker's "
        "event loop (time.sleep, blocking I/O: run such work with asyncio.to_thread), or its worker died."
    )
    assert _tool_failure_text(_failed_tool_activity(ApplicationError("disk full"))) == "disk full"


@pytest.mark.parametrize(("recorded", "limit"), [(1500.0, "1500"), (None, "600")])
def test_a_model_call_past_its_time_limit_names_the_limit_and_its_setting(
    recorded: float | None, limit: str
) -> None:
    """It read "activity StartToClose timeout" (found by a provider audit:
    a slow local model's long answer)."""
    timeout = TemporalTimeoutError(
        "activity StartToClose timeout", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[]
    )
    calls = SimpleNamespace(_session=SimpleNamespace(model_call_timeout=recorded))
    text = ActivityCalls._model_failure_text(calls, _failed_tool_activity(timeout))  # type: ignore[arg-type]
    assert text == (
        f"The model call ran past its time limit of {limit} s (the worker's AGENT_MODEL_CALL_TIMEOUT, "
        "recorded when the conversation started) and was given up after its last attempt."
    )
    other = ActivityCalls._model_failure_text(calls, _failed_tool_activity(ApplicationError("boom")))  # type: ignore[arg-type]
    assert other == "boom"
