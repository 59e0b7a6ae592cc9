"""Nothing a user sends or writes wedges a conversation (issue 10): garbage
at every entry is refused or dropped, limits reach a defined end, and the
conversation answers a normal prompt afterwards. Every test here also runs
under the history guard (tests/conftest.py): no workflow task may fail."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import RawValue
from temporalio.service import RPCError

from activities.openai_chat import MAX_TOOL_CALLS_PER_ANSWER
from client import Conversation, follow, start_conversation
from runtime.payloads import data_converter
from runtime.settings import Settings
from tests.support.stack import EventLog, Stack
from workflows.arguments import MAX_NESTING
from workflows.contract import (
    MAX_APPROVAL_TIMEOUT_SECONDS,
    AgentSettings,
    SessionSettings,
    SessionState,
    WaitForIdleResult,
)
from workflows.inputs import (
    MAX_MESSAGE_BYTES,
    InputError,
    check_prompts,
    clean_json,
    json_type,
    prompt_message,
    prompt_messages,
    refusal,
    single_argument,
)
from workflows.models import CustomMessage, UserMessage


def raw_json(text: str) -> RawValue:
    """A JSON payload sent exactly as written (no client-side encoding)."""
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=text.encode("utf-8", "surrogatepass")))


def deep(depth: int) -> str:
    return "[" * depth + '"x"' + "]" * depth


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def still_answers(stack: Stack, handle: WorkflowHandle[Any, Any], text: str = "still here") -> None:
    stack.script({"text": text})
    result = await handle.execute_update("prompt", "are you there?")
    events = await stack.events(handle.id, from_offset=result["eventOffset"])
    assert events[-1]["type"] == "agent_end"
    assert events[-1]["messages"][-1]["content"][0]["text"] == text


async def wait_for_idle(handle: WorkflowHandle[Any, Any]) -> Any:
    """``wait_for_idle``, asked again when the conversation continued as new meanwhile."""
    while True:
        try:
            return await handle.execute_update("wait_for_idle")
        except WorkflowUpdateFailedError as err:
            if getattr(err.cause, "type", None) != "ContinuedAsNew":
                raise


async def state(stack: Stack, handle: WorkflowHandle[Any, Any]) -> SessionState:
    return await handle.query("state", result_type=SessionState)


# --- handlers take any argument count and type --------------------------------------------


async def test_signals_with_no_argument_or_two_are_dropped(stack: Stack) -> None:
    handle = await stack.start()
    await handle.signal("steer")
    await handle.signal("follow_up", args=["a", "b"])
    await handle.signal("steer", raw_json(deep(300)))
    await handle.signal("stop_after_turn", "unexpected")
    current = await state(stack, handle)
    assert current.steering_queue == 0 and current.follow_up_queue == 0 and current.status == "idle"
    await still_answers(stack, handle)
    await handle.signal("close")


@pytest.mark.parametrize(
    ("name", "args", "says"),
    [
        ("prompt", [], "`prompt` needs one argument (the message text or object, or a list of them)"),
        # A contract audit: these said "(the message text or object)" too.
        ("configure", [], "`configure` needs one argument (an object of the settings to change, e.g. "),
        ("approve_tool", [], '`approve_tool` needs one argument ({"toolCallId": "...", "approved": true or'),
        ("prompt", ["a", "b"], "takes one argument"),
        ("prompt", [raw_json(deep(300))], ""),
        ("prompt", [{"role": "user", "content": [{"type": "text", "text": " "}]}], "has no content"),
        ("prompt", [{"role": "", "content": "x"}], "role is empty"),
        ("continue", ["x"], "takes no argument"),
        ("configure", ["gpt"], "takes an object"),
        ("configure", [{"temperature": 2}], "Unknown setting"),
        ("clear_queues", ["everything"], "clear_queues takes"),
        ("reset", [1], "takes no argument"),
        ("wait_for_idle", [1, 2], "takes no argument"),
        ("approve_tool", [{"toolCallId": "nope", "approved": True}], "No tool call"),
        (
            "approve_tool",
            [None],
            'approve_tool takes an object, {"toolCallId": "...", "approved": true or false}, not null.',
        ),
        ("approve_tool", ["call_1"], "not a string."),
        ("configure", [raw_json('{"approvalTimeoutSeconds": 1e300}')], "approvalTimeoutSeconds"),
        ("__temporal_workflow_stream_poll", [None], "A stream poll takes a PollInput object"),
    ],
)
async def test_updates_with_wrong_arguments_are_refused_with_a_sentence(
    stack: Stack, name: str, args: list[Any], says: str
) -> None:
    handle = await stack.start()
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(name, args=args)
    assert says in str(getattr(refused.value.cause, "message", refused.value.cause))
    await still_answers(stack, handle)
    await handle.signal("close")


async def test_updates_that_take_nothing_take_a_lone_null(stack: Stack) -> None:
    """What a client sends when it passes "nothing" as the argument (the CLI's
    ``--input null``, ``execute_update("reset", None)``) is no argument."""
    handle = await stack.start()
    stack.script({"text": "first"})
    await handle.execute_update("prompt", "hi")
    idle = await handle.execute_update("wait_for_idle", None)
    assert idle["runs"] == 1 and idle["messages"][-1]["content"][0]["text"] == "first"
    with pytest.raises(WorkflowUpdateFailedError) as refused:  # for its transcript, not the null
        await handle.execute_update("continue", None)
    assert "takes no argument" not in str(getattr(refused.value.cause, "message", refused.value.cause))
    cleared = await handle.execute_update("reset", None)
    assert cleared["messageCount"] == 0 and cleared["runs"] == 0
    await still_answers(stack, handle, "again")
    await handle.signal("close")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (['"hi"'], "must be a JSON object"),
        (['{"prompt": "hi"}', "{}"], "takes one argument"),
        (['{"carry": {"runs": 3}}'], "`carry` is internal"),
        ([deep(300)], ""),
        (['{"steeringMode": "sometimes"}'], "steeringMode"),
        (['{"prompt": "hi", "sytemPrompt": "Be brief."}'], "Unknown start input key(s) sytemPrompt"),
        (['{"prompt": "hi", "maxTurns": true}'], "maxTurns"),
        (['{"prompt": "hi", "closeWhenIdle": 1}'], "closeWhenIdle"),
        (['{"prompt": "hi", "approvalTimeoutSeconds": 1e300}'], "approvalTimeoutSeconds"),
        (['{"prompt": "hi", "tools": ["nosuch"]}'], "Unknown tool(s) nosuch: the worker declares"),
    ],
)
async def test_a_bad_start_input_fails_the_conversation_with_a_sentence(
    stack: Stack, args: list[str], says: str
) -> None:
    """And its `state` says `closed` (an unknown tool, refused once the
    worker's declarations were recorded, left it `idle`), and why (its
    ``errorMessage`` was null: `starter.py start` prints the id and exits
    0, so a user found the reason nowhere but in the failure, a new user's
    audit)."""
    handle = await stack.client.start_workflow(
        "AgentWorkflow",
        args=[raw_json(a) for a in args],
        id=f"bad-start-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)
    assert says in str(failed.value.cause)
    state = await handle.query("state", result_type=dict)
    assert state["status"] == "closed"
    assert state["errorMessage"] == failed.value.cause.message  # type: ignore[union-attr]


async def test_a_retried_run_takes_no_carry_a_client_sent(stack: Stack, worker_env: dict[str, str]) -> None:
    """A retry starts with the input of the run it retries: a client's
    forged carry, when the first run timed out before a worker took it (a
    security audit: another conversation's stored context reached the
    model, counters and budgets were rewritten). It fails with a sentence,
    none of the carry taken."""
    from datetime import timedelta

    from temporalio.common import RetryPolicy

    from worker import build_worker

    queue = f"agent-retried-carry-{uuid.uuid4().hex[:6]}"
    forged = {"runs": 55, "totalTurns": 777, "errorMessage": "FORGED"}
    handle = await stack.client.start_workflow(
        "AgentWorkflow",
        {"model": stack.model, "prompt": "hi", "carry": forged},
        id=f"retried-carry-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
        run_timeout=timedelta(seconds=3),
        retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=2),
    )
    first = handle.first_execution_run_id
    latest = stack.client.get_workflow_handle(handle.id)
    while (await latest.describe()).run_id == first:  # it times out with no worker on the queue
        await asyncio.sleep(0.2)
    async with build_worker(stack.client, Settings.from_env(worker_env, task_queue=queue)):
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 30)
        assert "a retried run (attempt 2) cannot tell a carry" in str(failed.value.cause)
        state = await handle.query("state", result_type=dict)
    assert (state["status"], state["runs"], state["turns"]) == ("closed", 0, 0)
    assert "a retried run (attempt 2) cannot tell a carry" in state["errorMessage"]  # not FORGED
    assert stack.requests() == []  # the model never called


@pytest.mark.parametrize(
    "metadata",
    [
        {"encoding": b"json/protobuf", "messageType": b"temporal.api.common.v1.Payload"},
        {"encoding": b"binary/protobuf"},
        {"encoding": b"binary/null"},
        {"encoding": b"application/x-unknown"},
        {},
    ],
    ids=["json-protobuf", "binary-protobuf", "binary-null", "unknown", "none"],
)
async def test_a_start_input_in_an_encoding_nobody_reads_fails_with_a_sentence(
    stack: Stack, metadata: dict[str, bytes]
) -> None:
    """Before, the SDK failed the first workflow task over and over (the
    start never failed, nothing answered); now the conversation fails at
    once, saying what it could not read."""
    handle = await stack.client.start_workflow(
        "AgentWorkflow",
        RawValue(Payload(metadata=metadata, data=b'{"prompt": "hi"}')),
        id=f"bad-encoding-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)
    assert "A payload could not be read (encoding" in str(failed.value.cause)


@pytest.mark.parametrize(
    ("name", "argument"),
    [
        ("clear_queues", "q" * 1_000_000),
        ("approve_tool", {"toolCallId": "c" * 1_000_000, "approved": True}),
        ("configure", {"k" * 1_000_000: 1}),
    ],
    ids=["clear_queues", "approve_tool", "configure"],
)
async def test_a_refusal_quotes_at_most_a_thousand_characters_of_what_was_sent(
    stack: Stack, name: str, argument: Any
) -> None:
    """A refusal quoting a megabyte-sized argument was itself too large for
    the server, which failed the workflow tasks for ~30 s; it is cut now."""
    handle = await stack.start()
    plain = (await Client.connect(stack.dev_server.address)).get_workflow_handle(handle.id)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await asyncio.wait_for(plain.execute_update(name, argument), 20)
    message = str(refused.value.cause)
    assert len(message) <= 1100, message[:200]
    # A tool call id is quoted shortened, with its length; the rest is cut.
    assert message.endswith(
        "(1,000,000 characters) is waiting for approval." if name == "approve_tool" else "... (cut)."
    ), message[:200]
    await asyncio.wait_for(still_answers(stack, handle), 20)
    await handle.signal("close")


async def test_lone_surrogates_are_replaced_not_fatal(stack: Stack) -> None:
    handle = await stack.start()
    stack.script({"text": "ok"})
    await handle.execute_update("prompt", raw_json('"broken \\ud800 text"'))
    await handle.execute_update("wait_for_idle")
    messages = await stack.messages(handle)
    assert messages[0].content == "broken \ufffd text"
    # In settings too, at the start and through configure (the strict type
    # check must not refuse what the replacement makes valid).
    settings = await handle.execute_update("configure", raw_json('{"systemPrompt": "be \\ud800 brief"}'))
    assert settings["systemPrompt"] == "be \ufffd brief"
    await handle.signal("close")
    started = await stack.client.start_workflow(
        "AgentWorkflow",
        raw_json(f'{{"model": "{stack.model}", "systemPrompt": "odd \\ud800 prompt"}}'),
        id=f"surrogate-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
    )
    assert (await started.query("state"))["systemPrompt"] == "odd \ufffd prompt"
    await started.signal("close")


async def test_a_key_with_a_lone_surrogate_is_refused_with_a_sentence_that_quotes_it(stack: Stack) -> None:
    """The refusal quotes the unknown key; with a lone surrogate in it the
    SDK could not write the sentence, and the sender read "Failure error"
    (a robustness audit)."""
    handle = await stack.start()
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("configure", raw_json('{"\\udc80bad": 1}'))
    assert refused.value.cause.message.startswith("Unknown setting(s) \ufffdbad"), refused.value.cause
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            "approve_tool", raw_json('{"toolCallId": "x", "approved": true, "\\ud800": 1}')
        )
    assert refused.value.cause.message.startswith("Unknown approve_tool key(s) \ufffd:"), refused.value.cause
    await still_answers(stack, handle)
    await handle.signal("close")

    started = await stack.client.start_workflow(
        "AgentWorkflow",
        raw_json('{"\\ud800": 1}'),
        id=f"surrogate-key-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(started.result(), 30)
    assert "\ufffd" in str(failed.value.cause), failed.value.cause


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
MESSAGE_LIKE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "toolResult", "x"])},
    optional={"content": JSON_VALUES, "timestamp": JSON_VALUES},
)
RAW = st.sampled_from(
    [
        deep(250),
        '"\\udc00"',
        '{"role": "user", "content": "\\ud83d"}',
        '"' + "\\u0000" * 10 + '"',
        '{"toolCallId": 1, "approved": "maybe"}',
    ]
)
TARGETS = st.sampled_from(
    [
        ("update", "prompt"),
        ("update", "continue"),
        ("update", "configure"),
        ("update", "clear_queues"),
        ("update", "approve_tool"),
        ("update", "reset"),
        ("signal", "steer"),
        ("signal", "follow_up"),
        ("signal", "abort"),
        ("signal", "stop_after_turn"),
    ]
)


def big_string(megabytes: int) -> str:
    """Incompressible text (a counter's hashes), ``megabytes`` MB of it."""
    import hashlib

    chunk = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(megabytes * 31_250))
    return chunk.hex()[: megabytes * 1_000_000]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    target=TARGETS,
    args=st.lists(JSON_VALUES | MESSAGE_LIKE | RAW.map(raw_json), max_size=3),
)
async def test_random_json_to_every_signal_and_update_never_wedges(
    stack: Stack, target: tuple[str, str], args: list[Any]
) -> None:
    handle = await _fuzz_conversation(stack)
    kind, name = target
    if kind == "signal":
        await handle.signal(name, args=args)
    else:
        try:
            await handle.execute_update(name, args=args)
        except WorkflowUpdateFailedError:
            pass
    await handle.execute_update("wait_for_idle")


_fuzzed: dict[str, WorkflowHandle[Any, Any]] = {}


async def _fuzz_conversation(stack: Stack) -> WorkflowHandle[Any, Any]:
    """One conversation takes every example of the property test; the last
    test in this group checks it still answers."""
    if "handle" not in _fuzzed:
        _fuzzed["handle"] = await stack.start()
    return _fuzzed["handle"]


async def test_after_the_fuzzing_the_conversation_still_answers(stack: Stack) -> None:
    handle = _fuzzed.get("handle") or await stack.start()
    with_model = await handle.execute_update("configure", {"model": stack.model})
    assert with_model["model"] == stack.model
    await handle.execute_update("clear_queues", "all")
    await still_answers(stack, handle)
    await handle.signal("close")


@pytest.mark.parametrize("megabytes", [1, 3, 5])
async def test_megabytes_of_incompressible_text_are_refused_or_taken(stack: Stack, megabytes: int) -> None:
    handle = await stack.start()
    text = big_string(megabytes)
    try:
        await handle.execute_update("prompt", text)
        accepted = True
    except (WorkflowUpdateFailedError, RPCError) as err:
        accepted = False
        assert megabytes > 2, f"a {megabytes} MB prompt should be taken: {err}"
    if accepted:
        stack.script({"text": "read it"})
        await handle.execute_update("wait_for_idle")
    await handle.signal("steer", text)  # dropped, or taken (and run, as the conversation is idle)
    await handle.execute_update("wait_for_idle")
    await still_answers(stack, handle)
    await handle.signal("close")


# --- limits reach a defined end ---------------------------------------------------------------


async def test_two_thousand_one_hundred_tool_calls_all_get_results(stack: Stack) -> None:
    calls = [call(f"c{i}", "calculator", expression=f"{i}+1") for i in range(2100)]
    # The answer twice: under load, the 2,100-result request can outlast the
    # tests' 3 s read timeout once, and the retried call must answer the same.
    stack.script({"tool_calls": calls, "chunk_chars": 4000}, {"text": "all done"}, {"text": "all done"})
    handle = await stack.start(prompt="many", closeWhenIdle=True)
    result = await asyncio.wait_for(handle.result(), 300)
    results = [m for m in result.messages if m.role == "toolResult"]
    assert [m.tool_call_id for m in results] == [f"c{i}" for i in range(2100)]
    assert results[2099].content[0].text == "2099+1 = 2100" and not results[2099].is_error
    assert result.messages[-1].text == "all done"


async def test_an_answer_with_more_tool_calls_than_allowed_ends_the_run_and_the_conversation_answers(
    stack: Stack,
) -> None:
    """10,000 calls in one answer: the workflow's work on them outlasted
    the SDK's 2 s deadlock check on every attempt, and the conversation
    stalled for good. Now the answer past the cap ends the run as an error
    that says so, no call runs, and the next prompt is answered."""
    calls = [call(f"c{i}", "calculator", expression="1+1") for i in range(MAX_TOOL_CALLS_PER_ANSWER * 2)]
    stack.script({"text": "Let me compute.", "tool_calls": calls, "chunk_chars": 4000})
    handle = await stack.start()
    started = await handle.execute_update("prompt", "compute everything")
    idle = await asyncio.wait_for(wait_for_idle(handle), 120)
    assert idle["stopReason"] == "error"
    answer = idle["messages"][-1]
    assert answer["errorMessage"] == (
        f"The model asked for more than {MAX_TOOL_CALLS_PER_ANSWER:,} tool calls in one answer, "
        "so none of them ran."
    )
    assert [c["type"] for c in answer["content"]] == ["text"]
    events = await stack.events(handle.id, from_offset=started["eventOffset"])
    assert not [e for e in events if e["type"].startswith("tool_execution")]
    assert events[-1]["type"] == "agent_end"
    await still_answers(stack, handle)
    await handle.signal("close")


async def test_three_thousand_calls_waiting_for_approval_at_once_do_not_wedge_it(stack: Stack) -> None:
    """Each waiting call's condition went through the whole batch, and all
    the calls started in one workflow task: from ~1,200 waiting calls on
    (machines differ) the SDK's 2 s deadlock check failed it on every
    attempt (the history guard fails this test on any WorkflowTaskFailed).
    An abort then answers them all."""
    calls = [call(f"g{i}", "guarded_echo", text=str(i)) for i in range(3000)]
    stack.script({"tool_calls": calls, "chunk_chars": 4000})
    handle = await stack.start(prompt="ask for everything")
    for _ in range(600):
        state = await handle.query("state")
        if len(state["pendingApprovals"]) == 3000:
            break
        await asyncio.sleep(0.1)
    assert state["status"] == "awaiting-approval" and len(state["pendingApprovals"]) == 3000
    await handle.execute_update("approve_tool", {"toolCallId": "g7", "approved": True})
    await handle.signal("abort")
    idle = await asyncio.wait_for(wait_for_idle(handle), 120)
    assert idle["stopReason"] == "aborted"
    results = {m["toolCallId"]: m for m in idle["messages"] if m["role"] == "toolResult"}
    assert len(results) == 3000 and not results["g7"]["isError"]
    assert results["g8"]["content"][0]["text"] == "Tool execution aborted while waiting for approval."
    await still_answers(stack, handle)
    await handle.signal("close")


async def test_a_timeout_configured_while_three_thousand_calls_wait_reaches_them_all(stack: Stack) -> None:
    """Each waiting call sets its timer again when approvalTimeoutSeconds
    changes: 3,000 of them in one workflow task (cancel and start) stay
    under the SDK's deadlock check and gRPC's message size (the history
    guard fails this test on any WorkflowTaskFailed)."""
    calls = [call(f"g{i}", "guarded_echo", text=str(i)) for i in range(3000)]
    stack.script({"tool_calls": calls, "chunk_chars": 4000}, {"text": "all timed out"})
    handle = await stack.start(prompt="ask for everything", approvalTimeoutSeconds=600)
    for _ in range(600):
        state = await handle.query("state")
        if len(state["pendingApprovals"]) == 3000:
            break
        await asyncio.sleep(0.1)
    assert len(state["pendingApprovals"]) == 3000
    await handle.execute_update("configure", {"approvalTimeoutSeconds": 900})
    await handle.execute_update("configure", {"approvalTimeoutSeconds": 1})
    idle = await asyncio.wait_for(wait_for_idle(handle), 120)
    results = [m for m in idle["messages"] if m["role"] == "toolResult"]
    assert len(results) == 3000
    assert {r["content"][0]["text"] for r in results} == {
        "Tool call guarded_echo was not approved within 1 s."
    }
    await still_answers(stack, handle)
    await handle.signal("close")


async def test_fifteen_hundred_waiting_calls_continue_as_new_together(stack: Stack) -> None:
    """Continue-as-new falls due while every call of a batch waits for a
    person: every waiting call woke for it and built the carry, which at
    ~600 calls outlasted the SDK's deadlock check on every attempt. The
    first one now carries the batch; the next run waits on."""
    calls = [call(f"g{i}", "guarded_echo", text=str(i)) for i in range(1500)]
    stack.script({"tool_calls": calls, "chunk_chars": 4000})
    handle = await stack.start(prompt="ask", continueAsNewAfterTurns=1)
    first_run = handle.first_execution_run_id
    for _ in range(600):
        described = await handle.describe()
        if described.run_id != first_run:
            state = await handle.query("state")
            if len(state["pendingApprovals"]) == 1500:
                break
        await asyncio.sleep(0.1)
    assert described.run_id != first_run and len(state["pendingApprovals"]) == 1500
    await handle.signal("abort")
    idle = await asyncio.wait_for(wait_for_idle(handle), 120)
    results = [m for m in idle["messages"] if m["role"] == "toolResult"]
    assert idle["stopReason"] == "aborted" and len(results) == 1500
    await still_answers(stack, handle)
    await handle.signal("close")


async def test_megabytes_of_tool_arguments_in_one_answer_are_scheduled_in_parts(stack: Stack) -> None:
    """60 calls of 150 KiB of (incompressible) arguments each, ~9 MB:
    scheduled at once they made a workflow task completion past gRPC's 4 MB,
    and the server terminated the conversation. Now at most ~1 MB of
    arguments is in flight, and the continue-as-new that follows carries at
    most 4 MB of the event stream (else the next run's input was too large
    to read)."""
    calls = [call(f"b{i}", "echo", text=base64.b64encode(os.urandom(150 * 768)).decode()) for i in range(60)]
    stack.script(
        {"tool_calls": calls, "chunk_chars": 64 * 1024}, {"text": "all echoed"}, {"text": "all echoed"}
    )
    handle = await stack.start(prompt="big", closeWhenIdle=True)
    result = await asyncio.wait_for(handle.result(), 240)
    results = [m for m in result.messages if m.role == "toolResult"]
    assert [m.tool_call_id for m in results] == [f"b{i}" for i in range(60)]
    assert not any(m.is_error for m in results) and result.messages[-1].text == "all echoed"
    first_run = stack.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    scheduled: dict[int, int] = {}  # workflow task -> bytes of tool input it scheduled
    for event in (await first_run.fetch_history()).events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attributes = event.activity_task_scheduled_event_attributes
            if attributes.activity_type.name == "execute_tool":
                task = attributes.workflow_task_completed_event_id
                scheduled[task] = scheduled.get(task, 0) + attributes.input.ByteSize()
    assert len(scheduled) > 5 and max(scheduled.values()) < 1_300_000, scheduled


async def test_long_tool_call_ids_run(stack: Stack) -> None:
    long_id = "call_" + "x" * 2000
    stack.script({"tool_calls": [call(long_id, "whoami"), call(long_id + "y", "whoami")]}, {"text": "ok"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    result = await asyncio.wait_for(handle.result(), 60)
    results = [m for m in result.messages if m.role == "toolResult"]
    assert [m.tool_call_id for m in results] == [long_id, long_id + "y"]
    keys = {m.details["key"] for m in results}
    assert len(keys) == 2 and all(len(k) < 400 for k in keys)


async def test_a_tool_returning_50_megabytes_is_cut_for_the_model(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("b1", "big_output", megabytes=50), call("b2", "big_details", megabytes=5)]},
        {"text": "ok"},
    )
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    result = await asyncio.wait_for(handle.result(), 120)
    big, details = result.messages[2], result.messages[3]
    assert "Output truncated: 50000000 characters" in big.content[0].text
    assert len(big.content[0].text) < 60_000
    assert "details were dropped" in details.details["notes"]["details"]
    assert result.messages[-1].text == "ok"


async def test_a_single_stream_event_over_two_megabytes_arrives(stack: Stack) -> None:
    text = "z" * 2_500_000
    stack.script({"text": text, "chunk_chars": 500_000})
    handle = await stack.start(prompt="write a lot", closeWhenIdle=True)
    events = await stack.events(handle.id, timeout=120)
    end = next(e for e in events if e["type"] == "message_end" and e["message"]["role"] == "assistant")
    assert len(end["message"]["content"][0]["text"]) == len(text)
    assert (await handle.result()).messages[-1].text == text


async def test_a_very_long_stream_stays_under_the_signal_limit_and_abort_still_works(stack: Stack) -> None:
    long_answer = {"text": "a" * 12_000, "chunk_chars": 1, "delay_ms": 2}
    stack.script(long_answer, {"text": "b" * 100_000, "chunk_chars": 1, "delay_ms": 5})
    handle = await stack.start(prompt="stream", streamBatchMs=1)
    await asyncio.wait_for(wait_for_idle(handle), 300)
    per_execution = []
    async for execution in stack.client.list_workflows(f"WorkflowId = '{handle.id}'"):
        run = stack.client.get_workflow_handle(handle.id, run_id=execution.run_id)
        history = await run.fetch_history()
        per_execution.append(
            sum(e.HasField("workflow_execution_signaled_event_attributes") for e in history.events)
        )
    print(f"\n[signals] per execution: {per_execution}")
    assert sum(per_execution) > 2_000, "the stream should have sent many batches"
    assert max(per_execution) < 10_000 - 1_000
    result = await handle.execute_update("prompt", "again")
    log = EventLog(stack.client, handle.id, from_offset=result["eventOffset"])
    await log.wait_for_type("message_update", timeout=60)
    await handle.signal("abort")
    events = await log.wait_for_type("agent_end", timeout=60)
    log.close()
    assert events[-1]["messages"][-1]["stopReason"] == "aborted"
    await handle.signal("close")


async def test_abort_at_a_continue_as_new_boundary_is_honoured(stack: Stack) -> None:
    stack.script({"tool_calls": [call("s1", "slow", seconds=1.0)]})
    handle = await stack.start(prompt="work", continueAsNewAfterTurns=1)
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start")
    await handle.signal("abort")
    events = await log.wait_for_type("agent_end")
    log.close()
    assert events[-1]["messages"][-1]["stopReason"] == "aborted"
    await still_answers(stack, handle)
    await handle.signal("close")


async def test_an_aborted_model_call_ends_before_its_run_continues_as_new(stack: Stack) -> None:
    """The abort is answered at once, but the run switches only once the
    cancelled call has ended: before, its last event batches could land
    during the workflow task that continued as new, which the server failed
    (UnhandledCommand) and the worker ran again (1 try in 4 or so). A
    prompt and a wait_for_idle sent while it waits are answered by the next
    run, the wait asked once more (not in a loop, as when the run said it
    was switching all along the wait)."""
    stack.script({"text": "old answer " * 60, "delay_ms": 40, "chunk_chars": 6}, {"text": "new answer"})
    handle = await stack.start(prompt="talk", continueAsNewAfterTurns=1)
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: sum(e["type"] == "message_update" for e in es) > 2)
    await handle.signal("abort")
    events = await log.wait_for_type("agent_end")
    assert events[-1]["messages"][-1]["stopReason"] == "aborted"
    conversation = Conversation(stack.client, handle.id)
    prompting = asyncio.create_task(conversation.prompt("again"))  # answered once the next run starts it
    await asyncio.sleep(0.1)
    idle = await asyncio.wait_for(conversation.wait_for_idle(), 30)
    await prompting
    assert idle.messages[-1].text == "new answer"
    log.close()
    first = stack.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    events = list((await first.fetch_history()).events)
    [cancelled] = [e for e in events if e.HasField("activity_task_cancel_requested_event_attributes")]
    aborted_call = cancelled.activity_task_cancel_requested_event_attributes.scheduled_event_id
    ended = [  # the aborted call's end: completed with what it had, cancelled, failed or timed out
        e
        for e in events
        for attributes in (
            e.activity_task_completed_event_attributes,
            e.activity_task_canceled_event_attributes,
            e.activity_task_failed_event_attributes,
            e.activity_task_timed_out_event_attributes,
        )
        if attributes.scheduled_event_id == aborted_call
    ]
    [switched] = [e for e in events if e.HasField("workflow_execution_continued_as_new_event_attributes")]
    assert len(ended) == 1 and cancelled.event_id < ended[0].event_id < switched.event_id
    waits = [
        e
        for e in events
        if e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        == "wait_for_idle"
    ]
    assert len(waits) <= 1
    await stack.client.get_workflow_handle(handle.id).signal("close")


async def test_close_at_a_continue_as_new_boundary_is_honoured(stack: Stack) -> None:
    stack.script({"tool_calls": [call("s1", "slow", seconds=1.0)]})
    handle = await stack.start(prompt="work", continueAsNewAfterTurns=1)
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start")
    await handle.signal("close")
    result = await asyncio.wait_for(handle.result(), 30)
    log.close()
    assert result.messages[-1].stop_reason == "aborted"


async def test_a_tool_removed_from_the_worker_gets_a_clear_error_result(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """A conversation records its worker's tools when it starts; a later
    worker without one of them answers its calls with an error result (and
    replays the conversation without complaint)."""
    import tests.support.tools  # noqa: F401  (registers echo in this process)
    from activities.tools import registered_tools
    from runtime.settings import Settings
    from worker import build_worker

    queue = f"vanish-{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env(worker_env, task_queue=queue)
    everything = registered_tools()
    without_echo = {name: spec for name, spec in everything.items() if name != "echo"}
    async with build_worker(stack.client, settings, tools=everything):
        handle = await start_conversation(
            stack.client, f"vanish-{uuid.uuid4().hex[:6]}", {"model": stack.model}, task_queue=queue
        )
        stack.script({"text": "hello"})
        await handle.execute_update("prompt", "hi")
        await handle.execute_update("wait_for_idle")
        assert "echo" in (await handle.query("state"))["tools"]
    stack.script({"tool_calls": [call("e1", "echo", text="hi"), call("c1", "calculator", expression="2*3")]})
    stack.script({"text": "ok"})
    async with build_worker(stack.client, settings, tools=without_echo):
        await handle.execute_update("prompt", "use both")
        await asyncio.wait_for(handle.execute_update("wait_for_idle"), 30)
        messages = await stack.messages(handle)
        await handle.signal("close")
        await handle.result()
    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    echo, calculator = results["e1"], results["c1"]
    assert echo.is_error and "not available on this worker" in echo.content[0].text
    assert "does not load the tool module the others on its task queue do" in echo.content[0].text
    assert not calculator.is_error and calculator.content[0].text == "2*3 = 6"


async def test_stream_batches_per_call_are_budgeted(stack: Stack) -> None:
    stack.script({"text": "abc" * 400, "chunk_chars": 1, "delay_ms": 1})
    handle = await stack.start(prompt="x", streamBatchMs=1, closeWhenIdle=True)
    await asyncio.wait_for(handle.result(), 60)
    history = await handle.fetch_history()
    scheduled = next(
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "stream_assistant_response"
    )
    request = json.loads(scheduled.input.payloads[0].data)
    assert 0 < request["maxBatches"] <= (10_000 - 1_000) // 2


# --- the event stream's own handlers ---------------------------------------------------------

PUBLISH = "__temporal_workflow_stream_publish"


def _item(data: str) -> dict[str, str]:
    return {"topic": "events", "data": data}


def _event_item(event: Any) -> dict[str, str]:
    payload = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(event).encode())
    return _item(base64.b64encode(payload.SerializeToString()).decode())


async def test_malformed_publish_signals_are_dropped_not_fatal(stack: Stack) -> None:
    """Anyone who may signal may send the stream's publish signal: a shape
    it cannot take is dropped, and the conversation goes on (before, each
    failed the workflow task over and over: a wedged conversation)."""
    handle = await stack.start()
    await handle.signal(PUBLISH)
    await handle.signal(PUBLISH, raw_json("null"))
    await handle.signal(PUBLISH, {"items": [_item("!!!not base64")]})
    await handle.signal(PUBLISH, {"items": [_item(base64.b64encode(b"\xff\x00garbage").decode())]})
    await handle.signal(PUBLISH, {"items": [], "publisher_id": "p", "sequence": "a"})
    await handle.signal(PUBLISH, args=[{"items": []}, "extra", 3])  # more arguments than it takes
    await handle.signal(PUBLISH, args=[[1, 2]])
    await still_answers(stack, handle)
    for missing in ("__temporal_workflow_stream_poll", "__agent_stream_run_end"):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(missing)
        assert "positional argument" not in str(refused.value.cause)  # a sentence, not a TypeError
    await still_answers(stack, handle)
    await handle.signal("close")


async def test_forged_events_while_the_model_streams_break_neither_state_nor_abort(stack: Stack) -> None:
    stack.script({"text": "a long answer " * 40, "delay_ms": 50})
    handle = await stack.start(prompt="talk")
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "message_update" for e in es))
    log.close()  # it reads events as this project publishes them
    forged = [
        {"type": "message_update", "assistantMessageEvent": "not an update"},
        {
            "type": "message_update",
            "assistantMessageEvent": {"type": "text_delta", "contentIndex": "0", "delta": 5},
        },
        {"type": "message_start", "message": "not a message"},
    ]
    await handle.signal(
        PUBLISH, {"items": [_event_item(e) for e in forged], "publisher_id": "f", "sequence": 1}
    )
    current = await state(stack, handle)
    assert current.is_streaming and current.streaming_message is not None
    assert current.streaming_message.text and ("a long answer " * 40).startswith(
        current.streaming_message.text
    )
    # A forged assistant message_start that no message validates against: nothing streams.
    invalid = {"type": "message_start", "message": {"role": "assistant", "content": 5, "usage": "none"}}
    await handle.signal(PUBLISH, {"items": [_event_item(invalid)], "publisher_id": "f", "sequence": 2})
    assert (await state(stack, handle)).streaming_message is None
    await handle.signal("abort")
    await handle.execute_update("wait_for_idle")
    messages = await handle.query("messages", result_type=list)
    assert messages[-1]["stopReason"] == "aborted"
    # Readers skip items that are no event; the forged events of an event's shape reach them as sent.
    unknown = Payload(metadata={"encoding": b"binary/unknown"}, data=b"?")
    strange = [_event_item("not an event"), _item(base64.b64encode(unknown.SerializeToString()).decode())]
    for sequence, item in enumerate(strange, start=3):
        await handle.signal(PUBLISH, {"items": [item], "publisher_id": "g", "sequence": sequence})
    await still_answers(stack, handle)
    await handle.signal("close")
    read = [event async for _, event in follow(stack.client, handle.id)]
    assert read[-1]["type"] == "agent_end"
    assert all(isinstance(e, dict) and isinstance(e.get("type"), str) for e in read)
    assert sum(e.get("message") == "not a message" for e in read) == 1
    offsets = [offset async for offset, _ in follow(stack.client, handle.id)]
    assert len(offsets) == len(read) and offsets != list(range(offsets[0], offsets[0] + len(offsets)))


async def test_a_reference_to_a_payload_the_workers_cannot_find_is_refused_not_fatal(
    stack: Stack, tmp_path: Path
) -> None:
    """A client with other storage settings (or anyone who may signal) sends
    a stored-payload reference the workers' store does not hold: before,
    every workflow task failed for good; now a signal carrying it is dropped,
    an update and a start input are refused with the reason."""
    elsewhere = data_converter(Settings.from_env(storage_dir=tmp_path / "elsewhere"))
    noise = base64.b64encode(os.urandom(400_000)).decode()  # stays over the storage threshold compressed
    [reference] = await elsewhere.encode([noise])
    assert reference.metadata["messageType"] == b"temporal.api.sdk.v1.ExternalStorageReference"
    handle = await stack.start()
    await handle.signal("steer", RawValue(reference))
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("prompt", RawValue(reference))
    assert "refers to a stored payload that is gone" in str(refused.value.cause)
    await still_answers(stack, handle)
    assert (await state(stack, handle)).steering_queue == 0
    await handle.signal("close")

    started = await stack.client.start_workflow(
        "AgentWorkflow",
        RawValue(reference),
        id=f"missing-ref-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(started.result(), 30)
    assert "refers to a stored payload that is gone" in str(failed.value.cause)


async def test_a_payload_marked_as_a_reference_that_is_none_is_refused_not_fatal(stack: Stack) -> None:
    """Anyone who may signal can mark a plain payload as a stored payload's
    reference (`temporal workflow signal --input-meta
    __temporal_external_storage_reference=true`): the SDK raised on it
    (TMPRL1106) before any handler ran, so every workflow task failed for
    good, across worker restarts (a security audit). Now a signal carrying
    it is dropped and an update refused, and the conversation goes on."""
    marked = RawValue(
        Payload(
            metadata={"encoding": b"json/plain", "__temporal_external_storage_reference": b"true"},
            data=b'"hello"',
        )
    )
    handle = await stack.start()
    for name in ("steer", "follow_up", "abort"):
        await handle.signal(name, marked)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("prompt", marked)
    assert "is marked as a reference to a stored payload, but is none" in str(refused.value.cause)
    await still_answers(stack, handle)
    assert (await state(stack, handle)).steering_queue == 0
    await handle.signal("close", marked)  # dropped too: the conversation is still open
    await still_answers(stack, handle, "and still")
    await handle.signal("close")


def now() -> int:
    return 42


def refused(payload: Any) -> str:
    with pytest.raises(InputError) as err:
        check_prompts(prompt_messages(payload, now))
    return str(err.value)


def test_an_empty_list_of_messages_is_refused() -> None:
    assert refused([]) == "The list of messages is empty: send at least one."


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_blank_text_is_refused(text: str) -> None:
    assert refused(text) == "The message text is empty: send some text."


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "  "},
        {"role": "user", "content": []},
        {"role": "user", "content": [{"type": "text", "text": " "}, {"type": "text", "text": ""}]},
    ],
)
def test_a_user_message_without_content_is_refused(message: dict[str, Any]) -> None:
    assert refused(message) == "The message has no content: send some text or an image."


def test_a_message_over_two_megabytes_is_refused_as_text_or_as_an_object() -> None:
    big = "x" * (MAX_MESSAGE_BYTES + 1)
    assert "the limit is 2.1 MB" in refused(big)
    assert "the limit is 2.1 MB" in refused({"role": "user", "content": big})
    assert prompt_message("x" * MAX_MESSAGE_BYTES, now).content == "x" * MAX_MESSAGE_BYTES


def test_a_message_nested_one_level_too_deep_is_refused() -> None:
    def nested(depth: int) -> dict[str, Any]:
        value: Any = "leaf"
        for _ in range(depth - 3):  # the message, its content list and the block are three levels
            value = {"k": value}
        return {"role": "note", "content": [{"type": "data", "data": value}]}

    from workflows.arguments import nesting_depth

    at_limit = nested(MAX_NESTING)
    while nesting_depth(at_limit) < MAX_NESTING:  # make it exactly MAX_NESTING deep
        at_limit = {
            "role": "note",
            "content": [{"type": "data", "data": {"k": at_limit["content"][0]["data"]}}],
        }
    assert nesting_depth(at_limit) == MAX_NESTING
    prompt_message(at_limit, now)  # taken
    too_deep = {"role": "note", "content": [{"type": "data", "data": {"k": at_limit["content"][0]["data"]}}]}
    assert refused(too_deep) == f"The message is nested deeper than {MAX_NESTING} levels."


def test_a_user_message_without_a_timestamp_is_stamped_when_it_arrives() -> None:
    message = prompt_message({"role": "user", "content": "hi"}, now)
    assert isinstance(message, UserMessage) and message.timestamp == 42
    stamped = prompt_message({"role": "user", "content": "hi", "timestamp": 7}, now)
    assert isinstance(stamped, UserMessage) and stamped.timestamp == 7


@pytest.mark.parametrize("timestamp", [-99999999999999999999999, 99999999999999999999, 2**53])
def test_a_timestamp_no_javascript_reader_takes_exactly_is_stamped_when_it_arrives(timestamp: int) -> None:
    """A security audit's follow_up with timestamp -10**22 sat in the
    transcript as sent, past what the UI or a pi client reads exactly."""
    message = prompt_message({"role": "user", "content": "hi", "timestamp": timestamp}, now)
    assert isinstance(message, UserMessage) and message.timestamp == 42
    edge = prompt_message({"role": "user", "content": "hi", "timestamp": 2**53 - 1}, now)
    assert isinstance(edge, UserMessage) and edge.timestamp == 2**53 - 1


def test_an_application_message_is_taken_and_one_with_an_empty_role_refused() -> None:
    message = prompt_message({"role": "note", "content": "kept, not sent to the model"}, now)
    assert isinstance(message, CustomMessage) and message.role == "note"
    assert "role is empty" in refused({"role": " ", "content": "x"})


def test_lone_surrogates_in_object_keys_are_replaced() -> None:
    cleaned = clean_json({"k\ud83d": ["v\ud83d"]})
    assert list(cleaned) == ["k\ufffd"] and cleaned["k\ufffd"] == ["v\ufffd"]


def test_a_long_refusal_is_cut_to_a_thousand_characters() -> None:
    error = refusal("x" * 5000)
    assert len(str(error.message)) <= 1000 and error.message.endswith(" ... (cut).")
    assert error.type == "InvalidInput" and error.non_retryable
    assert refusal("short").message == "short"


def test_json_types_are_named_in_jsons_words() -> None:
    values: tuple[Any, ...] = (None, True, 1, 1.5, "s", [], {})
    assert [json_type(v) for v in values] == [
        "null",
        "a boolean",
        "a number",
        "a number",
        "a string",
        "a list",
        "an object",
    ]


def test_a_handler_with_an_optional_argument_takes_none() -> None:
    assert single_argument((), "clear_queues", optional=True) is None
    with pytest.raises(InputError, match="needs one argument"):
        single_argument((), "prompt")
    with pytest.raises(InputError, match="takes one argument; it got 2 arguments"):
        single_argument((1, 2), "prompt")


@pytest.mark.parametrize(
    "settings",
    [
        {"maxTurns": 0},
        {"maxTotalTokens": 0},
        {"maxCost": 0},
        {"model": ""},
        {"approvalTimeoutSeconds": 0},
        {"approvalTimeoutSeconds": MAX_APPROVAL_TIMEOUT_SECONDS + 1},
        {"steeringMode": "two-at-a-time"},
        {"thinkingLevel": "max"},
    ],
)
def test_settings_out_of_range_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        AgentSettings.model_validate(settings)


@pytest.mark.parametrize(
    "settings", [{"continueAsNewAfterTurns": 0}, {"streamBatchMs": 0}, {"streamBatchMs": 10_001}]
)
def test_start_settings_out_of_range_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SessionSettings.model_validate(settings)


def test_wait_for_idle_before_any_run_says_stop_reason_null() -> None:
    """SPEC 8: {"runs", "stopReason", "messages"}, every key present."""
    assert WaitForIdleResult(runs=0).model_dump(mode="json") == {
        "runs": 0,
        "stopReason": None,
        "messages": [],
    }
