"""Hooks by composition: a hooks object handed to the worker
(``build_worker(..., hooks=...)``) runs in every conversation of that
worker, on its own task queue; a hook that raises never wedges one."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

import activities.builtin_tools  # noqa: F401  (registers the example tools)
import tests.support.tools  # noqa: F401  (registers the test tools)
from client import Conversation
from runtime.settings import Settings
from testbed.scripted_model import ScriptedModelServer
from tests.support.guarded_hooks import GuardedHooks
from tests.support.stack import EventLog
from worker import build_worker
from workflows.calls import DEFAULTS_BY_ACTIVITY_PATCH, HEARTBEAT_TIMEOUT
from workflows.contract import SessionResult
from workflows.models import AgentMessage, UserMessage
from workflows.versions import CURRENT

TASK_QUEUE = "agent-hooks"


@pytest.fixture
async def hook_worker(client: Client, worker_env: dict[str, str]) -> AsyncIterator[None]:
    settings = Settings.from_env(worker_env, task_queue=TASK_QUEUE)
    async with build_worker(client, settings, hooks=GuardedHooks()):
        yield


async def _go(
    client: Client, model: str, prompt: str = "go", **options: Any
) -> WorkflowHandle[Any, SessionResult]:
    """A conversation on the hooks worker, started with ``prompt``."""
    return await client.start_workflow(
        "AgentWorkflow",
        {"model": model, "prompt": prompt, **options},
        id=f"hooks-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
        result_type=SessionResult,
    )


async def run_guarded(client: Client, model: str, prompt: str) -> SessionResult:
    return await (await _go(client, model, prompt, closeWhenIdle=True)).result()


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def test_before_hook_blocks_a_call_and_after_hook_replaces_fields(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model,
        [
            {"tool_calls": [call("b1", "explode"), call("b2", "echo", text="secret")]},
            {"text": "ok"},
        ],
    )
    result = await run_guarded(client, model, "go")
    blocked, rewritten = result.messages[2], result.messages[3]
    assert blocked.is_error and blocked.content[0].text == "explode is not allowed here"
    assert not rewritten.is_error
    assert rewritten.content[0].text == "redacted" and rewritten.details == {"redacted": True}


async def test_hook_failures_become_error_results(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model,
        [
            {
                "tool_calls": [
                    call("h1", "sequential_echo", text="x"),
                    call("h2", "calculator", expression="1"),
                ]
            },
            {"tool_calls": [call("h3", "sequential_echo", text="fail-before")]},
            {"text": "ok"},
        ],
    )
    result = await run_guarded(client, model, "go")
    by_id = {m.tool_call_id: m for m in result.messages if m.role == "toolResult"}
    assert by_id["h1"].is_error and by_id["h1"].content[0].text == "after hook failed"
    assert not by_id["h2"].is_error
    assert by_id["h3"].is_error and by_id["h3"].content[0].text == "before hook failed"
    assert result.messages[-1].text == "ok"


async def test_a_decision_whose_reason_is_not_text_is_the_calls_error_not_a_wedge(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """`BlockToolCall(reason=12345)` failed every workflow task of the
    conversation (a hooks audit): a reason is text, else the call's error."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model,
        [
            {
                "tool_calls": [
                    call("n1", "echo", text="block-with-a-number"),
                    call("n2", "echo", text="approve-with-an-object"),
                ]
            },
            {"text": "ok"},
        ],
    )
    result = await run_guarded(client, model, "go")
    by_id = {m.tool_call_id: m for m in result.messages if m.role == "toolResult"}
    assert by_id["n1"].is_error and by_id["n1"].content[0].text == (
        "before_tool_call returned BlockToolCall with a reason of type int; the reason must be text."
    )
    assert by_id["n2"].content[0].text.startswith("before_tool_call returned RequireApproval with a reason")
    assert result.messages[-1].text == "ok"


async def test_details_an_after_hook_sets_that_json_cannot_carry_are_the_calls_error_not_a_wedge(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """`ToolResultOverride(details={"marker": object()})` failed every
    workflow task of the conversation as its `tool_execution_end` was
    written (a parity audit): it is the call's error result, and the run
    goes on (the suite fails a test whose conversation fails a task)."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model, [{"tool_calls": [call("j1", "echo", text="details-not-json")]}, {"text": "ok"}]
    )
    result = await run_guarded(client, model, "go")
    tool_result = result.messages[2]
    assert tool_result.is_error and tool_result.content[0].text.startswith(
        "after_tool_call returned details that cannot be sent as JSON"
    )
    assert result.messages[-1].text == "ok"


async def test_an_override_flag_that_is_not_a_bool_is_the_calls_error_not_its_truth(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """`ToolResultOverride(terminate="false")` ended the run: the string's
    truth was taken. It is now the call's error result, naming the value,
    and the run goes on; a new run has it by its one combined marker."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model, [{"tool_calls": [call("t1", "echo", text="terminate-as-text")]}, {"text": "ok"}]
    )
    handle = await _go(client, model, closeWhenIdle=True)
    result = await handle.result()
    tool_result = result.messages[2]
    assert tool_result.is_error
    assert tool_result.content[0].text == (
        "after_tool_call returned ToolResultOverride(terminate='false'); expected True, False or None."
    )
    assert result.messages[-1].text == "ok"
    markers = [
        str(e.marker_recorded_event_attributes)
        async for e in handle.fetch_history_events()
        if e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    # The combined marker, and the one patch every new conversation asks
    # by its own marker where it reads the worker's defaults.
    assert len(markers) == 2 and CURRENT in markers[0] and DEFAULTS_BY_ACTIVITY_PATCH in markers[1], markers


async def test_a_hooks_text_with_a_lone_surrogate_is_no_wedge(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """A hook raising with a file name read with surrogateescape in its
    message (or asking approval with such a reason) failed every workflow
    task as the event was written: the text goes on with U+FFFD instead."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model,
        [
            {
                "tool_calls": [
                    call("s1", "echo", text="fail-with-a-lone-surrogate"),
                    call("s2", "echo", text="approve-with-a-lone-surrogate"),
                ]
            },
            {"text": "ok"},
        ],
    )
    handle = await client.start_workflow(
        "AgentWorkflow",
        {"model": model, "prompt": "go", "closeWhenIdle": True, "approvalTimeoutSeconds": 1},
        id=f"hooks-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
        result_type=SessionResult,
    )
    log = EventLog(client, handle.id)
    events = await log.wait_for_type("agent_end")
    log.close()
    result = await handle.result()
    by_id = {m.tool_call_id: m for m in result.messages if m.role == "toolResult"}
    assert by_id["s1"].is_error and by_id["s1"].content[0].text == "no file named caf\ufffd"
    assert by_id["s2"].is_error  # not approved within 1 s (its text rewritten by the after hook)
    requests = [e for e in events if e["type"] == "tool_approval_request"]
    assert [r["reason"] for r in requests] == ["asks for caf\ufffd"]


async def test_hooks_changing_what_they_are_given_change_nothing(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """Hooks are handed the transcript and the outcome: clearing it erased
    the transcript, and appending to either failed every workflow task (a
    hooks audit). They get copies; a change goes through the return value."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model, [{"tool_calls": [call("m1", "sequential_echo", text="clear-the-transcript")]}, {"text": "ok"}]
    )
    result = await run_guarded(client, model, "go")
    assert [m.role for m in result.messages] == ["user", "assistant", "toolResult", "assistant"]
    assert result.messages[2].content[0].text == "sequential: clear-the-transcript"
    assert "edited" not in (result.messages[2].details or {})
    assert result.messages[-1].text == "ok"


async def test_a_hook_raising_cancelled_error_gives_an_error_result_and_the_run_goes_on(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """asyncio.CancelledError is no Exception: raised by a hook it used to
    fail the whole conversation as cancelled."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model, [{"tool_calls": [call("c1", "sequential_echo", text="cancel-before")]}, {"text": "ok"}]
    )
    result = await run_guarded(client, model, "go")
    cancelled = result.messages[2]
    assert cancelled.is_error and cancelled.content[0].text == "before hook cancelled"
    assert result.messages[-1].text == "ok"


async def test_a_hook_or_tool_calling_sys_exit_gives_an_error_result_and_the_worker_goes_on(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """SystemExit is no Exception: raised by a hook (workflow code) or a
    tool (an activity), it went up and stopped the worker process, and the
    next worker to take the task after it."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model,
        [
            {
                "tool_calls": [
                    call("x1", "sequential_echo", text="exit-before"),
                    call("x2", "exits", code=7),
                    # Raised out of an async hook: once hooks ran in a task of their own
                    # (abortable), SystemExit left the workflow's event loop (a review).
                    call("x3", "sequential_echo", text="exit-before-async"),
                    call("x4", "sequential_echo", text="cancel-before-async"),
                ]
            },
            {"text": "still here"},
        ],
    )
    result = await run_guarded(client, model, "go")
    by_id = {m.tool_call_id: m for m in result.messages if m.role == "toolResult"}
    assert by_id["x1"].is_error and by_id["x1"].content[0].text == "SystemExit: 4"
    assert by_id["x2"].is_error and by_id["x2"].content[0].text == "SystemExit: 7"
    assert by_id["x3"].is_error and by_id["x3"].content[0].text == "SystemExit: 5"
    assert by_id["x4"].is_error and by_id["x4"].content[0].text == "async before hook cancelled"
    assert result.messages[-1].text == "still here"
    # The same worker answers the next conversation.
    model_server.script(model, [{"text": "next"}])
    assert (await run_guarded(client, model, "again")).messages[-1].text == "next"


async def test_should_stop_after_turn_hook_ends_the_run(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(model, [{"tool_calls": [call("w1", "whoami")]}, {"text": "never requested"}])
    result = await run_guarded(client, model, "go")
    assert [m.role for m in result.messages] == ["user", "assistant", "toolResult"]
    assert len(model_server.requests(model)) == 1


async def test_a_failing_stop_hook_ends_the_run_and_the_next_prompt_works(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(model, [{"text": "fail-stop"}, {"text": "recovered"}])
    handle = await _go(client, model)
    idle = await handle.execute_update("wait_for_idle", result_type=dict)
    assert idle["stopReason"] == "error"
    assert "stop hook failed" in idle["messages"][-1]["errorMessage"]
    state = await handle.query("state", result_type=dict)
    assert state["turns"] == 1, "the failure's turn_end is no model turn"
    await handle.execute_update("prompt", "again")
    await handle.execute_update("wait_for_idle")
    await handle.signal("close")
    result = await handle.result()
    assert result.messages[-1].text == "recovered"


async def test_a_hook_raising_an_exception_whose_message_cannot_be_read_is_no_wedge(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """Its `__str__` raised inside the loop's except clause, and every
    workflow task failed for good, `abort` included (a robustness audit).
    The type is the message instead: the call's error result, or the run's
    `error` end."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model,
        [
            {"tool_calls": [call("u1", "echo", text="fail-unreadably-before")]},
            {"text": "fail-stop-unreadably"},
        ],
    )
    handle = await _go(client, model)
    idle = await handle.execute_update("wait_for_idle", result_type=dict)
    unreadable = "UnreadableError (its message could not be read: RuntimeError)"
    [result] = [m for m in idle["messages"] if m["role"] == "toolResult"]
    assert result["isError"] and result["content"][0]["text"] == unreadable
    assert idle["stopReason"] == "error" and unreadable in idle["messages"][-1]["errorMessage"]
    await handle.signal("close")


async def _start(client: Client, queue: str, model: str, kind: str) -> WorkflowHandle[Any, Any]:
    """A conversation on ``queue`` whose first prompt is "first"."""
    workflow_id = f"{kind}-{uuid.uuid4().hex[:8]}"
    return await client.start_workflow(
        "AgentWorkflow", {"model": model, "prompt": "first"}, id=workflow_id, task_queue=queue
    )


def _pruned(messages: list[AgentMessage]) -> list[AgentMessage]:
    """A context transform: the model sees only the last user message."""
    last = [m for m in messages if isinstance(m, UserMessage)][-1:]
    if last and last[0].content == "break the transform":
        raise RuntimeError("no context for you")
    return last


async def test_the_context_transform_shapes_each_model_call_and_its_failure_ends_the_run(
    client: Client, model_server: ScriptedModelServer, worker_env: dict[str, str]
) -> None:
    """pi's transformContext, given to build_worker: each model call sees
    its result (the transcript keeps everything); if it raises, the run
    ends with an error message and the next prompt works."""
    queue = f"agent-transform-{uuid.uuid4().hex[:6]}"
    model = f"transform-{uuid.uuid4().hex[:6]}"
    model_server.script(model, [{"text": "one"}, {"text": "two"}, {"text": "three"}])
    settings = Settings.from_env(worker_env, task_queue=queue)
    async with build_worker(client, settings, transform_context=_pruned):
        handle = await _start(client, queue, model, "transform")
        await handle.execute_update("wait_for_idle")
        await handle.execute_update("prompt", "second")
        await handle.execute_update("wait_for_idle")
        sent = model_server.requests(model)[1]["messages"]
        assert [(m["role"], m["content"]) for m in sent] == [("user", "second")]
        await handle.execute_update("prompt", "break the transform")
        idle = await handle.execute_update("wait_for_idle", result_type=dict)
        assert idle["stopReason"] == "error"
        assert (
            "The context transform failed: RuntimeError: no context for you"
            in idle["messages"][-1]["errorMessage"]
        )
        await handle.execute_update("prompt", "third")
        idle = await handle.execute_update("wait_for_idle", result_type=dict)
        assert idle["messages"][-1]["content"][0]["text"] == "three"
        await handle.signal("close")
        assert len((await handle.result())["messages"]) == 8


async def _slow_transform(messages: list[AgentMessage]) -> list[AgentMessage]:
    """A context transform that awaits past the 3 s heartbeat timeout (a
    retrieval or summarising call)."""
    await asyncio.sleep(HEARTBEAT_TIMEOUT.total_seconds() + 1)
    return messages


async def test_a_context_transform_may_await_past_the_heartbeat_timeout(
    client: Client, model_server: ScriptedModelServer, worker_env: dict[str, str]
) -> None:
    """The model activity heartbeats while the transform awaits, not only
    once the request is sent: before, every attempt timed out on its
    heartbeat before asking the model (which was still asked, and billed,
    each time) and the run ended with "activity Heartbeat timeout" after
    five attempts (a Temporal review)."""
    queue = f"agent-slow-transform-{uuid.uuid4().hex[:6]}"
    model = f"slow-transform-{uuid.uuid4().hex[:6]}"
    model_server.script(model, [{"text": "worth the wait"}])
    settings = Settings.from_env(worker_env, task_queue=queue)
    async with build_worker(client, settings, transform_context=_slow_transform):
        handle = await _start(client, queue, model, "slow-transform")
        idle = await handle.execute_update("wait_for_idle", result_type=dict)
        assert idle["stopReason"] == "stop"
        assert idle["messages"][-1]["content"][0]["text"] == "worth the wait"
        assert len(model_server.requests(model)) == 1  # asked once: no attempt timed out
        await handle.signal("close")
        await handle.result()


_WAITING: dict[str, Callable[[list[dict[str, Any]]], bool]] = {
    # Calls are prepared in turn: w2's preparation waits behind w1's hook.
    "hang-before": lambda es: any(e["type"] == "tool_execution_start" for e in es),
    "hang-after": lambda es: sum(e["type"] == "tool_execution_end" for e in es) == 1,
    "hang-stop": lambda es: any(e["type"] == "turn_end" for e in es),
}
"""When each waiting hook has begun to wait, by the events so far."""


@pytest.mark.parametrize("where", ["hang-before", "hang-after", "hang-stop"])
async def test_an_abort_ends_a_run_whose_hook_never_returns(
    client: Client, model_server: ScriptedModelServer, hook_worker: None, where: str
) -> None:
    """A hook awaiting forever held the run, and an abort with it, until the
    conversation was closed (carried since the hooks audit): the abort now
    cancels the hook's await. A call whose before or after hook waited is
    aborted (the after hook might have redacted its result); a stop hook
    that waited ends the run aborted."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    first: dict[str, Any] = (
        {"text": "hang-stop"}
        if where == "hang-stop"
        else {"tool_calls": [call("w1", "echo", text=where), call("w2", "calculator", expression="2+2")]}
    )
    model_server.script(model, [first, {"text": "never asked"}])
    messages = await _aborted_once(client, model, _WAITING[where])
    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    assert messages[-1].role == "assistant" and messages[-1].stop_reason == "aborted"
    if where == "hang-before":
        for call_id in ("w1", "w2"):
            assert results[call_id].is_error and results[call_id].content[0].text == "Tool execution aborted"
    elif where == "hang-after":
        # The tool ran, but the hook that may change its result did not decide.
        assert results["w1"].is_error and results["w1"].content[0].text == "Tool execution aborted"
        assert not results["w2"].is_error and results["w2"].content[0].text == "2+2 = 4"
    else:
        assert [m.role for m in messages] == ["user", "assistant", "assistant"]
        assert messages[1].text == "hang-stop" and messages[1].stop_reason == "stop"


async def test_a_hook_that_does_not_wait_still_decides_after_an_abort(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    """The after hook of a call cancelled by an abort runs as before: an
    ``async`` one that never waits is not cut short (it redacts ``echo``)."""
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model, [{"tool_calls": [call("r1", "echo", text="slow", delay=30)]}, {"text": "never"}]
    )
    messages = await _aborted_once(
        client, model, lambda es: any(e["type"] == "tool_execution_start" for e in es)
    )
    result = next(m for m in messages if m.role == "toolResult")
    assert result.content[0].text == "redacted" and result.details == {"redacted": True}
    assert messages[-1].stop_reason == "aborted"


async def _aborted_once(
    client: Client, model: str, ready: Callable[[list[dict[str, Any]]], bool]
) -> list[AgentMessage]:
    """Prompt a conversation on the hooks worker, abort it once its events
    satisfy ``ready``, and return its transcript when the run has ended."""
    handle = await client.start_workflow(
        "AgentWorkflow",
        {"model": model, "prompt": "go"},
        id=f"hooks-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
    )
    log = EventLog(client, handle.id)
    try:
        await log.wait_until(ready)
        await handle.signal("abort")
        await log.wait_for_type("agent_end", timeout=15)
    finally:
        log.close()
    messages = await Conversation.attach(client, handle.id).messages()
    await handle.signal("close")
    await handle.result()
    return messages
