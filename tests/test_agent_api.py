"""The rest of pi's Agent (SPEC §8), through the public contract as any
client (the Temporal CLI, another SDK) uses it: plain JSON arguments to
the updates, signals and queries."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from tests.support.stack import EventLog, Stack


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def running_a_slow_tool(stack: Stack) -> tuple[WorkflowHandle[Any, Any], EventLog]:
    """A conversation whose run is busy with a one-second tool call, and its event log."""
    stack.script({"tool_calls": [call("s1", "slow", seconds=1.0)]}, {"text": "done"})
    handle = await stack.start(prompt="work")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start")
    return handle, log


async def test_prompt_takes_a_list_of_messages_all_before_the_first_model_call(stack: Stack) -> None:
    stack.script({"text": "both read"})
    handle = await stack.start()
    await handle.execute_update(
        "prompt", ["first part", {"role": "user", "content": [{"type": "text", "text": "second part"}]}]
    )
    idle = await handle.execute_update("wait_for_idle")
    assert [m["role"] for m in idle["messages"]] == ["user", "user", "assistant"]
    sent = stack.requests()[0]["messages"]
    assert [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in sent] == [
        "first part",
        "second part",
    ]
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update("prompt", [])
    await handle.signal("close")


async def test_configure_applies_from_the_next_model_call_and_returns_the_settings(stack: Stack) -> None:
    stack.script({"text": "one"}, {"text": "two"})
    handle = await stack.start(prompt="hi")
    await handle.execute_update("wait_for_idle")
    other_model = f"{stack.model}-b"
    stack.model_server.script(other_model, [{"text": "from the other model"}])
    settings = await handle.execute_update(
        "configure",
        {
            "model": other_model,
            "systemPrompt": "Be brief.",
            "thinkingLevel": "high",
            "tools": ["calculator"],
            "steeringMode": "all",
        },
    )
    assert settings["model"] == other_model and settings["tools"] == ["calculator"]
    assert settings["steeringMode"] == "all" and settings["thinkingLevel"] == "high"
    await handle.execute_update("prompt", "again")
    await handle.execute_update("wait_for_idle")
    request = stack.model_server.requests(other_model)[0]
    assert request["messages"][0] == {"role": "system", "content": "Be brief."}
    assert request["reasoning_effort"] == "high"
    assert [t["function"]["name"] for t in request["tools"]] == ["calculator"]
    state = await handle.query("state")
    assert state["model"] == other_model and state["systemPrompt"] == "Be brief."
    for bad in (
        {"model": ""},
        {"model": "   "},
        {"tools": ["teleport"]},
        {"thinkingLevel": "max"},
        {"followUpMode": "some"},
        {"maxTurns": True},  # not read as 1
        {"maxTotalTokens": "10"},  # not read as 10
        {"approvalTimeoutSeconds": False},
    ):
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("configure", bad)
    for not_an_object, named in (("gpt-4o", "not a string."), (None, "not null."), ([1], "not a list.")):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("configure", not_an_object)
        assert str(refused.value.cause).endswith(named)  # JSON's words, not Python's
    # An empty partial object changes nothing and answers with the settings in force.
    assert await handle.execute_update("configure", {}) == settings
    assert (await handle.query("state"))["model"] == other_model
    await handle.signal("close")


async def test_state_and_settings_read_as_plain_json_with_every_key_by_a_client_without_the_codec(
    stack: Stack,
) -> None:
    """SPEC §10: the state query and the control updates' results stay plain
    JSON under the storage threshold (a long system prompt, a long streaming
    message), so a client with the SDK's default converter reads them;
    SPEC §8: the keys are there, null where unset."""
    handle = await stack.start()
    plain = (await Client.connect(stack.dev_server.address)).get_workflow_handle(handle.id)
    long_prompt = "Answer carefully and cite the tool results you used. " * 100  # over the 2 KB threshold
    settings = await plain.execute_update("configure", {"systemPrompt": long_prompt})
    assert settings["systemPrompt"] == long_prompt
    assert settings["maxTurns"] is None and settings["approvalTimeoutSeconds"] is None
    state = await plain.query("state")
    assert state["systemPrompt"] == long_prompt and state["runs"] == 0
    assert state["streamingMessage"] is None and state["errorMessage"] is None and state["maxCost"] is None
    reset = await plain.execute_update("reset")
    assert reset["systemPrompt"] == long_prompt and reset["messageCount"] == 0
    await handle.signal("close")


async def test_clear_queues_refuses_anything_but_the_three_names(stack: Stack) -> None:
    handle, log = await running_a_slow_tool(stack)
    await handle.signal("steer", "kept")
    await asyncio.sleep(0.2)
    for bad in ("", False, 0, {}, [], "Steering"):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("clear_queues", bad)
        assert 'clear_queues takes "steering", "followUp" or "all"' in str(refused.value.cause)
        # A refusal is final, typed as the handlers' own failures (the CLI shows it so).
        cause = refused.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput" and cause.non_retryable
    assert (await handle.query("state"))["steeringQueue"] == 1  # nothing was cleared
    assert [m["content"] for m in await handle.execute_update("clear_queues")] == ["kept"]  # none: all
    await log.wait_for_type("agent_end")
    log.close()
    await handle.signal("close")


async def test_clear_queues_returns_the_removed_messages_oldest_first(stack: Stack) -> None:
    handle, log = await running_a_slow_tool(stack)
    await handle.signal("steer", "steer one")
    await handle.signal("follow_up", "follow one")
    await handle.signal("steer", "steer two")
    await asyncio.sleep(0.2)
    only_steering = await handle.execute_update("clear_queues", "steering")
    assert [m["content"] for m in only_steering] == ["steer one", "steer two"]
    await handle.signal("steer", "steer three")
    everything = await handle.execute_update("clear_queues", "all")
    assert [m["content"] for m in everything] == ["follow one", "steer three"]
    state = await handle.query("state")
    assert state["steeringQueue"] == 0 and state["followUpQueue"] == 0
    await log.wait_for_type("agent_end")
    log.close()
    await handle.signal("close")


async def test_reset_clears_the_session_and_is_refused_while_running(stack: Stack) -> None:
    stack.script({"tool_calls": [call("s1", "slow", seconds=1.0)]}, {"text": "done"}, {"text": "fresh"})
    handle = await stack.start(prompt="work")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("reset")
    assert "run is active" in str(refused.value.cause)
    await log.wait_for_type("agent_end")
    log.close()
    state = await handle.execute_update("reset")
    assert state["messageCount"] == 0 and state["turns"] == 0 and state["runs"] == 0
    assert state["usage"]["totalTokens"] == 0
    await handle.execute_update("prompt", "new start")
    idle = await handle.execute_update("wait_for_idle")
    assert idle["runs"] == 1 and [m["role"] for m in await handle.query("messages")] == ["user", "assistant"]
    await handle.signal("close")


async def test_wait_for_idle_returns_when_the_run_ends(stack: Stack) -> None:
    handle = await stack.start()
    idle = await handle.execute_update("wait_for_idle")
    # SPEC's shape, every key present: no run yet, so no stop reason (null).
    assert idle == {"runs": 0, "stopReason": None, "messages": []}
    stack.script({"tool_calls": [call("s1", "slow", seconds=0.5)]}, {"text": "done"})
    await handle.execute_update("prompt", "work")
    idle = await handle.execute_update("wait_for_idle")
    assert idle["runs"] == 1 and idle["stopReason"] == "stop"
    assert [m["role"] for m in idle["messages"]] == ["user", "assistant", "toolResult", "assistant"]
    await handle.signal("close")


async def test_wait_for_idle_answers_a_run_due_to_continue_as_new_after_every_turn(stack: Stack) -> None:
    """SPEC §7-8: continue-as-new comes after all handlers finish, and
    wait_for_idle returns when no run is active: a plain caller waiting
    through a run that is due to switch after each turn gets its answer
    (the run switches once idle), not a request to ask again."""
    stack.script(
        {"tool_calls": [call("w0", "echo", text="0", delay=0.3)]},
        {"tool_calls": [call("w1", "echo", text="1")]},
        {"text": "done"},
    )
    handle = await stack.start(prompt="count", continueAsNewAfterTurns=1)
    idle = await handle.execute_update("wait_for_idle")
    assert idle["runs"] == 1 and idle["stopReason"] == "stop"
    assert [m["role"] for m in idle["messages"]] == [
        "user",
        "assistant",
        "toolResult",
        "assistant",
        "toolResult",
        "assistant",
    ]
    # Once idle it did switch: the next run carries the conversation on.
    for _ in range(100):
        runs = [e async for e in stack.client.list_workflows(f"WorkflowId = '{handle.id}'")]
        if len(runs) > 1:
            break
        await asyncio.sleep(0.05)
    assert len(runs) == 2
    latest = stack.client.get_workflow_handle(handle.id)
    assert len(await latest.query("messages")) == 6
    await latest.signal("close")


async def test_state_is_streaming_for_the_whole_run_with_the_partial_message(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [call("s1", "slow", seconds=1.0)]},
        {"text": "a slow answer, token by token", "chunk_chars": 2, "delay_ms": 80},
    )
    handle = await stack.start(prompt="work")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start")
    during_tools = await handle.query("state")
    assert during_tools["isStreaming"] is True and during_tools["pendingToolCalls"] == ["s1"]
    assert during_tools["streamingMessage"] is None  # SPEC: else null (the key is there)
    await log.wait_for_type("message_update", count=4)
    streaming = await handle.query("state")
    partial = streaming["streamingMessage"]
    assert streaming["isStreaming"] and partial["role"] == "assistant"
    assert "a slow answer".startswith(partial["content"][0]["text"][:5])
    await log.wait_for_type("agent_end")
    log.close()
    idle = await handle.query("state")
    assert idle["isStreaming"] is False and idle["streamingMessage"] is None
    await handle.signal("close")


async def test_state_shows_a_tool_call_arguments_as_they_stream(stack: Stack) -> None:
    """As pi's partial message: what has streamed of the arguments, parsed
    (it showed `{}` until the call ended)."""
    text = "a fairly long piece of text to stream slowly"
    stack.script(
        {"tool_calls": [call("e1", "echo", text=text)], "chunk_chars": 3, "delay_ms": 40},
        {"text": "done"},
    )
    handle = await stack.start(prompt="echo it")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("message_update")
    seen: list[str] = []
    while (state := await handle.query("state"))["streamingMessage"] is not None:
        arguments = state["streamingMessage"]["content"][0]["arguments"]
        if arguments:
            seen.append(arguments["text"])
        await asyncio.sleep(0.05)
    assert any(0 < len(s) < len(text) and text.startswith(s) for s in seen), seen
    await log.wait_for_type("agent_end")
    log.close()
    await handle.signal("close")


async def test_error_message_is_set_for_aborted_runs_too(stack: Stack) -> None:
    stack.script({"text": "slow" * 50, "chunk_chars": 1, "delay_ms": 50})
    handle = await stack.start(prompt="talk")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("message_update")
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    log.close()
    state = await handle.query("state")
    assert state["errorMessage"] == "Request was aborted"
    await handle.signal("close")


async def test_abort_sent_with_the_start_aborts_the_prompted_run(stack: Stack) -> None:
    """Signal-with-start: the abort lands before the run begins (the worker
    is still recording its defaults) while ``state`` already says running.
    The run begins aborted, as pi's ``abort()`` right after ``prompt()``:
    the prompt is kept, no model call is made."""
    stack.script({"text": "never asked"})
    handle = await stack.start(prompt="hi", closeWhenIdle=True, start_signal="abort")
    messages = (await handle.result()).messages
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[-1].stop_reason == "aborted"
    assert messages[-1].error_message == "Request was aborted"
    assert stack.requests() == []


async def test_stop_after_turn_sent_with_the_start_ends_the_run_after_its_first_turn(stack: Stack) -> None:
    stack.script({"tool_calls": [call("c1", "calculator", expression="1+1")]}, {"text": "not asked"})
    handle = await stack.start(prompt="add", start_signal="stop_after_turn")
    idle = await handle.execute_update("wait_for_idle")
    assert [m["role"] for m in idle["messages"]] == ["user", "assistant", "toolResult"]
    assert len(stack.requests()) == 1
    state = await handle.query("state")
    assert state["status"] == "idle" and state["turns"] == 1
    await handle.signal("close")


async def test_continue_after_an_application_message_runs_the_model_as_pi_does(stack: Stack) -> None:
    """pi's continue() refuses only an assistant message last; after an
    application message (any other role, kept but not sent to the model)
    the model answers the transcript."""
    stack.script({"text": "answered"})
    note = {"role": "note", "content": "for the app only"}
    handle = await stack.start(messages=[{"role": "user", "content": "q"}, note])
    await handle.execute_update("continue")
    idle = await handle.execute_update("wait_for_idle")
    assert [m["role"] for m in idle["messages"]] == ["assistant"]
    assert [m["role"] for m in await handle.query("messages")] == ["user", "note", "assistant"]
    assert [m["role"] for m in stack.requests()[0]["messages"]] == ["user"]
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("continue")
    assert "Cannot continue from an assistant message" in str(refused.value.cause)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("prompt", {"role": "assistant", "content": []})
    assert "A message with role `assistant` cannot be sent" in str(refused.value.cause)
    await handle.signal("close")


@pytest.mark.parametrize("order", ["stop then abort", "abort then stop"])
async def test_an_abort_with_stop_after_turn_still_ends_the_run_aborted(stack: Stack, order: str) -> None:
    """SPEC 6 and 8: a run aborted during its tools ends with an aborted
    message and `errorMessage`, also when the turn would have stopped the run
    anyway (here stop_after_turn; maxTurns and the budgets are the same)."""
    handle, log = await running_a_slow_tool(stack)
    signals = ["stop_after_turn", "abort"] if order == "stop then abort" else ["abort", "stop_after_turn"]
    for name in signals:
        await handle.signal(name)
    idle = await handle.execute_update("wait_for_idle")
    log.close()
    assert idle["stopReason"] == "aborted"
    assert idle["messages"][-1]["role"] == "assistant" and idle["messages"][-1]["stopReason"] == "aborted"
    assert (await handle.query("state"))["errorMessage"] == "Request was aborted"
    await handle.signal("close")


async def test_state_at_the_start_names_the_workers_tools_before_they_are_recorded(
    client: Client, worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first workflow task records the worker's tool declarations (a
    local activity); a `state` query answered meanwhile said `tools: []`, as
    if the conversation had none (found by a contract audit: 2 starts in 10).
    It names the tools the worker declares, which is what gets recorded."""
    import uuid

    from temporalio import activity

    from activities.session import SessionActivities
    from runtime.settings import Settings
    from worker import build_worker

    recorded, release = asyncio.Event(), asyncio.Event()

    @activity.defn(name="session_defaults")
    async def slow_defaults(self: Any) -> Any:
        # The window held open until the test has asked (a fixed second was
        # not enough on a loaded CI machine).
        await asyncio.wait_for(release.wait(), 30)
        recorded.set()
        return self._defaults

    monkeypatch.setattr(SessionActivities, "session_defaults", slow_defaults)
    queue = f"agent-state-start-{uuid.uuid4().hex[:6]}"
    async with build_worker(client, Settings.from_env(worker_env, task_queue=queue)):
        handle = await client.start_workflow(
            "AgentWorkflow", {}, id=f"state-start-{uuid.uuid4().hex[:8]}", task_queue=queue
        )  # no model: the worker's default is recorded (`state` said `model: null` until then)
        early = await handle.query("state", result_type=dict)
        assert not recorded.is_set()
        release.set()
        await recorded.wait()
        await asyncio.sleep(0.3)
        later = await handle.query("state", result_type=dict)
        assert later["tools"] and early["tools"] == later["tools"]
        assert early["model"] == later["model"] == worker_env["AGENT_MODEL"]
        await handle.signal("close")
