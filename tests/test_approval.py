"""Human approval of tool calls (SPEC §9): the request event, the pending
list, approve/reject/timeout/abort, other calls running meanwhile, and a
wait that survives a killed worker and a continue-as-new."""

from __future__ import annotations

import asyncio
import signal
import uuid
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowUpdateFailedError

from client import start_conversation
from tests.support.stack import EventLog, Stack, outline
from tests.test_crash import Workers, comparable, workers  # noqa: F401  (fixture)
from tests.test_robustness import raw_json
from workflows.contract import MAX_APPROVAL_TIMEOUT_SECONDS


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


BATCH = {
    "tool_calls": [
        call("g1", "guarded_echo", text="yes"),
        call("g2", "guarded_echo", text="no"),
        call("e1", "echo", text="free"),
    ]
}


async def test_the_ui_details_name_ten_waiting_calls_and_count_the_rest(stack: Stack) -> None:
    """The "current details" go with every workflow task: listing each of
    hundreds of waiting calls with long ids made them megabytes, rebuilt at
    every call's start and end."""
    ids = [f"g{i}-" + "x" * 300 for i in range(25)]
    stack.script({"tool_calls": [call(i, "guarded_echo", text="t") for i in ids]}, {"text": "done"})
    handle = await stack.start(prompt="ask")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request", count=25)
    log.close()
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    details = metadata.current_details
    assert details.count("waiting for approval of `guarded_echo`") == 10
    assert "and 15 more calls waiting for approval" in details
    assert ids[0][:79] + "…" in details and ids[0] not in details
    assert len(details) < 6_000
    state = await handle.query("state")
    assert len(state["pendingApprovals"]) == 25  # the query lists them all
    await handle.signal("abort")
    await handle.execute_update("wait_for_idle")
    await handle.signal("close")


async def test_calls_wait_for_a_decision_while_the_rest_of_the_batch_runs(stack: Stack) -> None:
    stack.script(BATCH, {"text": "done"})
    handle = await stack.start(prompt="ask")
    log = EventLog(stack.client, handle.id)
    events = await log.wait_for_type("tool_approval_request", count=2)
    request = next(e for e in events if e["type"] == "tool_approval_request")
    assert request == {
        "type": "tool_approval_request",
        "toolCallId": "g1",
        "toolName": "guarded_echo",
        "args": {"text": "yes", "delay": 0.0},
        "reason": "guarded_echo needs approval",
        "offset": request["offset"],
    }
    await log.wait_until(
        lambda es: any(e["type"] == "tool_execution_end" and e["toolCallId"] == "e1" for e in es)
    )
    state = await handle.query("state")
    assert state["status"] == "awaiting-approval"
    assert [a["toolCallId"] for a in state["pendingApprovals"]] == ["g1", "g2"]
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert "waiting for approval of `guarded_echo` (call g1)" in metadata.current_details

    await handle.execute_update("approve_tool", {"toolCallId": "g1", "approved": True})
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update("approve_tool", {"toolCallId": "g1", "approved": False})
    await handle.execute_update(
        "approve_tool", {"toolCallId": "g2", "approved": False, "reason": "  not today\n"}
    )  # the reason is trimmed (a blank one is none: "... was rejected.")
    events = await log.wait_for_type("agent_end")
    log.close()
    lines = outline(events)
    assert lines.index("tool_execution_start:g1") < lines.index("tool_approval_request:g1")
    assert lines.index("tool_execution_end:e1") < lines.index("tool_execution_end:g1")
    results = {e["toolCallId"]: e for e in events if e["type"] == "tool_execution_end"}
    assert results["g1"]["result"]["content"][0]["text"] == "approved: yes" and not results["g1"]["isError"]
    assert results["g2"]["isError"]
    assert results["g2"]["result"]["content"][0]["text"] == "Tool call guarded_echo was rejected: not today"
    assert (await handle.query("state"))["pendingApprovals"] == []
    await handle.signal("close")


async def test_a_reason_with_a_lone_surrogate_is_taken_with_a_replacement(stack: Stack) -> None:
    """Any JSON client can send "\\ud800". The decision was accepted, then its
    echo could not be written: every workflow task failed until the server
    dropped the update, and the decision was lost (a robustness audit)."""
    stack.script({"tool_calls": [call("s1", "guarded_echo", text="t")]}, {"text": "done"})
    handle = await stack.start(prompt="ask")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request")

    # A reason of a megabyte was applied, but its echo went to the payload
    # store: a client without the storage settings got an error back, and
    # its second try was refused as decided (a contract check).
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            "approve_tool", {"toolCallId": "s1", "approved": False, "reason": "x" * 10_001}
        )
    assert refused.value.cause.message == (
        "The reason is 10,001 characters long: give one of at most 10,000 (the model reads it in the "
        "call's result)."
    )
    decided = await handle.execute_update(
        "approve_tool", raw_json('{"toolCallId": "s1", "approved": false, "reason": "bad \\ud800 day"}')
    )

    assert decided["reason"] == "bad \ufffd day"
    events = await log.wait_for_type("agent_end")
    log.close()
    [end] = [e for e in events if e["type"] == "tool_execution_end"]
    assert end["result"]["content"][0]["text"] == "Tool call guarded_echo was rejected: bad \ufffd day"
    await handle.signal("close")


async def test_an_approval_times_out_and_an_abort_ends_the_wait(stack: Stack) -> None:
    stack.script({"tool_calls": [call("t1", "guarded_echo", text="slow")]}, {"text": "ok"})
    handle = await stack.start(prompt="ask", approvalTimeoutSeconds=1)
    await handle.execute_update("wait_for_idle")
    messages = await stack.messages(handle)
    assert (
        messages[2].is_error
        and messages[2].content[0].text == "Tool call guarded_echo was not approved within 1 s."
    )

    stack.script({"tool_calls": [call("t2", "guarded_echo", text="never")]})
    result = await handle.execute_update("prompt", "again")
    log = EventLog(stack.client, handle.id, from_offset=result["eventOffset"])
    await log.wait_for_type("tool_approval_request")
    await handle.signal("abort")
    events = await log.wait_for_type("agent_end")
    log.close()
    ended = next(e for e in events if e["type"] == "tool_execution_end")
    assert ended["result"]["content"][0]["text"] == "Tool execution aborted while waiting for approval."
    assert events[-1]["messages"][-1]["stopReason"] == "aborted"
    await handle.signal("close")


async def test_a_timeout_configured_while_a_call_waits_times_it_out_from_its_request(stack: Stack) -> None:
    """approvalTimeoutSeconds set by ``configure`` reaches calls already
    waiting, counted from each call's request (SPEC §9: a configure setting)."""
    stack.script({"tool_calls": [call("t1", "guarded_echo", text="waits")]}, {"text": "ok"})
    handle = await stack.start(prompt="ask")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request")
    await asyncio.sleep(1.2)  # longer than the timeout about to be set
    loop = asyncio.get_running_loop()
    configured = loop.time()
    await handle.execute_update("configure", {"approvalTimeoutSeconds": 1})
    events = await log.wait_for_type("agent_end")
    log.close()
    assert loop.time() - configured < 5  # its deadline had passed: at once, not 1 s from the configure
    ended = next(e for e in events if e["type"] == "tool_execution_end")
    assert ended["isError"]
    assert ended["result"]["content"][0]["text"] == "Tool call guarded_echo was not approved within 1 s."
    assert (await handle.query("state"))["pendingApprovals"] == []
    await handle.signal("close")


async def test_a_timeout_raised_or_cleared_while_calls_wait_lets_them_wait_on(stack: Stack) -> None:
    stack.script(
        {
            "tool_calls": [
                call("r1", "guarded_echo", text="raised"),
                call("c1", "guarded_echo", text="cleared"),
            ]
        },
        {"text": "both ran"},
    )
    handle = await stack.start(prompt="ask", approvalTimeoutSeconds=2)
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request", count=2)
    await handle.execute_update("configure", {"approvalTimeoutSeconds": 600})
    await asyncio.sleep(2.5)  # past the first deadline
    await handle.execute_update("configure", {"approvalTimeoutSeconds": None})
    await asyncio.sleep(0.5)
    state = await handle.query("state")
    assert [a["toolCallId"] for a in state["pendingApprovals"]] == ["r1", "c1"]
    await handle.execute_update("approve_tool", {"toolCallId": "r1", "approved": True})
    await handle.execute_update("approve_tool", {"toolCallId": "c1", "approved": True})
    events = await log.wait_for_type("agent_end")
    log.close()
    texts = {
        e["toolCallId"]: e["result"]["content"][0]["text"]
        for e in events
        if e["type"] == "tool_execution_end"
    }
    assert texts == {"r1": "approved: raised", "c1": "approved: cleared"}
    await handle.signal("close")


async def test_a_wait_survives_a_killed_worker(stack: Stack, workers: Workers) -> None:  # noqa: F811
    queue = workers.env["TEMPORAL_TASK_QUEUE"]
    script = [BATCH, {"text": "all decided"}]

    async def conversation(kill: bool) -> list[dict[str, Any]]:
        stack.script(*script)
        first = workers.start()
        handle = await start_conversation(
            stack.client,
            f"approve-{uuid.uuid4().hex[:6]}",
            {"model": stack.model, "prompt": "ask", "closeWhenIdle": True},
            task_queue=queue,
        )
        log = EventLog(stack.client, handle.id)
        await log.wait_for_type("tool_approval_request", count=2)
        if kill:
            first.send_signal(signal.SIGKILL)
            first.wait()
            workers.start()
        await handle.execute_update("approve_tool", {"toolCallId": "g1", "approved": True})
        await handle.execute_update("approve_tool", {"toolCallId": "g2", "approved": False, "reason": "no"})
        transcript = comparable((await asyncio.wait_for(handle.result(), 60)).messages)
        log.close()
        workers.stop_all()
        return transcript

    undisturbed = await conversation(kill=False)
    assert await conversation(kill=True) == undisturbed


async def test_a_wait_survives_a_continue_as_new(stack: Stack) -> None:
    stack.script({"tool_calls": [call("w0", "echo", text="warm up")]}, BATCH, {"text": "after the switch"})
    handle = await stack.start(prompt="ask", continueAsNewAfterTurns=2, closeWhenIdle=True)
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request", count=2)
    # The second turn waits for people: the conversation switches runs now.
    for _ in range(100):
        runs = [e async for e in stack.client.list_workflows(f"WorkflowId = '{handle.id}'")]
        if len(runs) > 1:
            break
        await asyncio.sleep(0.1)
    assert len(runs) > 1, "the conversation should have continued as new while waiting"
    state = await handle.query("state")
    assert [a["toolCallId"] for a in state["pendingApprovals"]] == ["g1", "g2"]
    assert state["pendingToolCalls"] == ["g1", "g2"]  # still open in the new run
    await handle.execute_update("approve_tool", {"toolCallId": "g1", "approved": True})
    await handle.execute_update("approve_tool", {"toolCallId": "g2", "approved": True})
    result = await asyncio.wait_for(handle.result(), 60)
    events = await log.wait_for_type("agent_end")
    log.close()
    roles = [(m.role, getattr(m, "tool_call_id", None)) for m in result.messages]
    assert roles == [
        ("user", None),
        ("assistant", None),
        ("toolResult", "w0"),
        ("assistant", None),
        ("toolResult", "g1"),
        ("toolResult", "g2"),
        ("toolResult", "e1"),
        ("assistant", None),
    ]
    assert result.messages[4].content[0].text == "approved: yes"
    lines = outline(events)
    assert lines.count("tool_approval_request:g1") == 1, "announced once across the switch"
    assert lines.count("tool_execution_start:g1") == 1 and lines.count("tool_execution_end:g1") == 1
    assert [e["offset"] for e in events] == list(range(len(events)))


@pytest.mark.parametrize(
    ("decision", "says"),
    [
        ({"toolCallId": "g1", "approved": "yes"}, '"approved": true or false'),
        ({"toolCallId": "g1", "approved": 1}, '"approved": true or false'),
        ({"toolCallId": "g1", "approved": "false"}, '"approved": true or false'),
        ({"toolCallId": "g1", "approved": True, "aproved": False}, "Unknown approve_tool key(s) aproved"),
        ({"toolCallId": "g1", "approved": False, "reson": "typo"}, "Unknown approve_tool key(s) reson"),
        # Both spellings: which call is decided must not hang on which one wins.
        (
            {"tool_call_id": "nonexistent", "toolCallId": "g1", "approved": True},
            "`toolCallId` is given twice, also as `tool_call_id`: give it once.",
        ),
        ({"toolCallId": "x" * 200_000, "approved": True}, "xx'… (200,000 characters) is waiting"),
    ],
)
async def test_a_decision_must_say_true_or_false_in_so_many_words(
    stack: Stack, decision: dict[str, Any], says: str
) -> None:
    """The gate of a tool that needs a person: a decision that is not a JSON
    boolean, or carries a misspelt key, is refused and the call still waits."""
    stack.script({"tool_calls": [call("g1", "guarded_echo", text="x")]}, {"text": "done"})
    handle = await stack.start(prompt="ask")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("approve_tool", decision)
    assert says in str(refused.value.cause)
    assert len(str(refused.value.cause)) < 300  # a long id is not repeated whole
    assert [a["toolCallId"] for a in (await handle.query("state"))["pendingApprovals"]] == ["g1"]
    await handle.execute_update("approve_tool", {"tool_call_id": "g1", "approved": False, "reason": "no"})
    events = await log.wait_for_type("agent_end")
    log.close()
    result = next(e for e in events if e["type"] == "tool_execution_end")
    assert result["isError"] and "no" in result["result"]["content"][0]["text"]
    await handle.signal("close")


async def test_the_longest_approval_timeout_taken_sets_a_timer(stack: Stack) -> None:
    """approvalTimeoutSeconds is refused past the longest timer that can be
    set; the longest one taken waits like any other (no task fails)."""
    stack.script({"tool_calls": [call("g1", "guarded_echo", text="x")]}, {"text": "done"})
    handle = await stack.start()
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update("configure", {"approvalTimeoutSeconds": MAX_APPROVAL_TIMEOUT_SECONDS + 1})
    await handle.execute_update("configure", {"approvalTimeoutSeconds": MAX_APPROVAL_TIMEOUT_SECONDS})
    log = EventLog(stack.client, handle.id)
    await handle.execute_update("prompt", "ask")
    await log.wait_for_type("tool_approval_request")
    await handle.execute_update("approve_tool", {"toolCallId": "g1", "approved": True})
    await log.wait_for_type("agent_end")
    log.close()
    history = await handle.fetch_history()
    assert [e for e in history.events if e.HasField("timer_started_event_attributes")]
    await handle.signal("close")


@pytest.mark.parametrize("late", ["past the timeout", "after an abort"])
async def test_a_decision_sent_while_no_worker_runs_and_too_late_is_refused(
    stack: Stack,
    workers: Workers,  # noqa: F811
    late: str,
) -> None:
    """With its worker away, an approval sent after the call's timeout had
    fired (or after an abort) reached the next worker in the activation that
    ended the wait: the decision ran first, the tool ran past its deadline,
    and the approver heard "accepted" (a durability audit). It is refused,
    and the call ends as the timer (or the abort) says."""
    stack.script({"tool_calls": [call("l1", "guarded_echo", text="late")]}, {"text": "ok"})
    first = workers.start()
    handle = await start_conversation(
        stack.client,
        f"late-{uuid.uuid4().hex[:6]}",
        {
            "model": stack.model,
            "prompt": "ask",
            "approvalTimeoutSeconds": 2 if late == "past the timeout" else 60,
        },
        task_queue=workers.env["TEMPORAL_TASK_QUEUE"],
    )
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request")
    first.send_signal(signal.SIGKILL)
    first.wait()
    if late == "after an abort":
        await handle.signal("abort")
    else:
        await asyncio.sleep(3)  # the timer fires on the server meanwhile
    decision = asyncio.ensure_future(
        handle.execute_update("approve_tool", {"toolCallId": "l1", "approved": True})
    )
    await asyncio.sleep(0.5)
    workers.start()

    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await asyncio.wait_for(decision, 30)
    events = await log.wait_for_type("agent_end")
    log.close()

    said = str(refused.value.cause)
    ended = next(e for e in events if e["type"] == "tool_execution_end")["result"]["content"][0]["text"]
    if late == "after an abort":
        assert "The run is being aborted: tool call 'l1' will not run." in said
        assert ended == "Tool execution aborted while waiting for approval."
    else:
        assert "Tool call 'l1' is past its approval timeout" in said
        assert ended == "Tool call guarded_echo was not approved within 2 s."
    await handle.signal("close")
