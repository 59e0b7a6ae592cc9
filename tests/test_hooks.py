"""Hooks by composition: a hooks object handed to the worker
(``build_worker(..., hooks=...)``) runs in every conversation of that
worker, on its own task queue; a hook that raises never wedges one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import Client

import activities.builtin_tools  # noqa: F401  (registers the example tools)
import tests.support.tools  # noqa: F401  (registers the test tools)
from runtime.settings import Settings
from testbed.scripted_model import ScriptedModelServer
from tests.support.guarded_hooks import GuardedHooks
from worker import build_worker
from workflows.contract import SessionResult
from workflows.models import AgentMessage, UserMessage

TASK_QUEUE = "agent-hooks"


@pytest.fixture
async def hook_worker(client: Client, worker_env: dict[str, str]) -> AsyncIterator[None]:
    settings = Settings.from_env(worker_env, task_queue=TASK_QUEUE)
    async with build_worker(client, settings, hooks=GuardedHooks()):
        yield


async def run_guarded(client: Client, model: str, prompt: str) -> SessionResult:
    return await client.execute_workflow(
        "AgentWorkflow",
        {"model": model, "prompt": prompt, "closeWhenIdle": True},
        id=f"hooks-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
        result_type=SessionResult,
    )


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
                ]
            },
            {"text": "still here"},
        ],
    )
    result = await run_guarded(client, model, "go")
    by_id = {m.tool_call_id: m for m in result.messages if m.role == "toolResult"}
    assert by_id["x1"].is_error and by_id["x1"].content[0].text == "SystemExit: 4"
    assert by_id["x2"].is_error and by_id["x2"].content[0].text == "SystemExit: 7"
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
    handle = await client.start_workflow(
        "AgentWorkflow",
        {"model": model, "prompt": "go"},
        id=f"hooks-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
        result_type=SessionResult,
    )
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
        handle = await client.start_workflow(
            "AgentWorkflow",
            {"model": model, "prompt": "first"},
            id=f"transform-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
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
