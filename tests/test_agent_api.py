"""The rest of pi's Agent (SPEC §8), through the public contract as any
client (the Temporal CLI, another SDK) uses it: plain JSON arguments to
the updates, signals and queries."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from tests.support.stack import EventLog, Stack
from tests.test_robustness import deep, raw_json
from workflows.contract import SessionResult


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def running_a_slow_tool(
    stack: Stack, seconds: float = 1.0
) -> tuple[WorkflowHandle[Any, Any], EventLog]:
    """A conversation whose run is busy with a tool call of ``seconds``, and its event log."""
    stack.script({"tool_calls": [call("s1", "slow", seconds=seconds)]}, {"text": "done"})
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
    # One setting in both spellings: one would be dropped unseen.
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("configure", {"systemPrompt": "Be long.", "system_prompt": "Be short."})
    assert isinstance(refused.value.cause, ApplicationError)
    twice = "`systemPrompt` is given twice, also as `system_prompt`: give it once."
    assert refused.value.cause.message == twice
    assert (await handle.query("state"))["systemPrompt"] == "Be brief."
    # JSON has no Infinity or NaN, yet encoders write them: an infinite
    # maxCost was taken as no limit, unsaid.
    for value in ("Infinity", "-Infinity", "NaN"):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(
                "configure", raw_json(f'{{"maxCost": 2, "approvalTimeoutSeconds": {value}}}')
            )
        assert isinstance(refused.value.cause, ApplicationError)
        assert refused.value.cause.message == (
            f"`approvalTimeoutSeconds` must be a finite number, not {value} (null sets no limit)."
        )
    assert (await handle.query("state"))["maxCost"] is None
    # Past 2**53 - 1 a JavaScript client reads another limit back from `state`.
    for key in ("maxTurns", "maxTotalTokens", "maxCost"):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("configure", {key: 2**63})
        assert isinstance(refused.value.cause, ApplicationError)
        assert refused.value.cause.message == (
            f"`{key}` must be at most 9007199254740991 (2**53 - 1, the largest integer every JSON "
            "reader reads exactly; null sets no limit)."
        )
    # It said "between -9007199254740991 and ..." though the least is 1 (a contract check).
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("configure", {"maxTurns": -(2**60)})
    assert "greater than or equal to 1" in str(refused.value.cause)
    # A model's id of 300,000 characters was taken, sent with every call and echoed by every reply.
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("configure", {"model": "m" * 10_001})
    assert refused.value.cause.message == (
        "The model name is 10,001 characters long: a model's id is at most 10,000."
    )
    assert (await handle.execute_update("configure", {"model": "m" * 10_000}))["model"] == "m" * 10_000
    await handle.execute_update("configure", {"model": other_model})
    assert (await handle.execute_update("configure", {"maxTotalTokens": 2**53 - 1}))[
        "maxTotalTokens"
    ] == 2**53 - 1
    await handle.execute_update("configure", {"maxTotalTokens": None})
    # An empty partial object changes nothing and answers with the settings in force.
    assert await handle.execute_update("configure", {}) == settings
    assert (await handle.query("state"))["model"] == other_model
    await handle.signal("close")


async def test_a_start_refused_for_a_settings_type_takes_none_of_its_settings(stack: Stack) -> None:
    """`"maxTurns": true` failed the conversation, yet its `state` said
    `"maxTurns": 1`: the value as read leniently before the check."""
    handle = await stack.start(maxTurns=True, systemPrompt="Be brief.")
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)
    assert "maxTurns" in str(failed.value.cause)
    state = await handle.query("state")
    assert state["status"] == "closed"
    assert state["maxTurns"] is None and state["systemPrompt"] is None
    # Past 2**53 - 1, as configure refuses it (it was taken, and reported back as given).
    handle = await stack.start(maxTotalTokens=2**60)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)
    assert isinstance(failed.value.cause, ApplicationError)
    assert failed.value.cause.message.startswith("`maxTotalTokens` must be at most 9007199254740991 (")
    assert (await handle.query("state"))["maxTotalTokens"] is None


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


async def test_a_start_input_object_nested_too_deep_fails_the_conversation_with_a_sentence(
    stack: Stack,
) -> None:
    """An object start input (not just a list) nested past the limit is
    refused with a sentence naming the nesting, and `state` says closed."""
    text = '{"prompt": "hi", "messages": [{"role": "note", "data": ' + deep(200) + "}]}"
    handle = await stack.client.start_workflow(
        "AgentWorkflow",
        args=[raw_json(text)],
        id=f"deep-start-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)
    assert "nested deeper than" in str(failed.value.cause)
    assert (await handle.query("state", result_type=dict))["status"] == "closed"


async def test_a_prompt_of_more_than_a_hundred_messages_is_refused(stack: Stack) -> None:
    """The largest list a prompt takes is 100 messages; the 101st is refused
    with a sentence that says the limit (and 100 are taken)."""
    stack.script({"text": "read them all"})
    handle = await stack.start()
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("prompt", [f"m{i}" for i in range(101)])
    assert "at most 100 messages" in str(refused.value.cause)
    await handle.execute_update("prompt", [f"m{i}" for i in range(100)])
    result = await handle.execute_update("wait_for_idle", result_type=dict)
    assert result["stopReason"] == "stop" and len(result["messages"]) == 101
    await handle.signal("close")


async def test_a_steer_during_a_plain_answer_is_delivered_after_a_continue_as_new_at_that_turn(
    stack: Stack,
) -> None:
    """SPEC §7: continue-as-new carries the queues "so no signal, queued
    message ... is lost". A steer sent while the model writes an answer
    without tool calls is injected before the next model call of the SAME
    run, also when the run continues as new at that turn boundary (the
    resumed run polls the steering queue as the loop would have)."""
    stack.script({"text": "first answer", "first_delay_ms": 1500}, {"text": "answered the steer"})
    handle = await stack.start(prompt="hi", continueAsNewAfterTurns=1)
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("turn_start")
    await handle.signal("steer", "also this")
    events = await log.wait_for_type("agent_end", timeout=30)
    log.close()
    assert [e["type"] for e in events].count("agent_start") == 1
    messages = await stack.messages(handle)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2].content == "also this"
    assert messages[3].content[0].text == "answered the steer"
    assert (await handle.query("state", result_type=dict))["steeringQueue"] == 0
    await handle.signal("close")


async def test_settings_configured_before_a_continue_as_new_are_in_force_after_it(stack: Stack) -> None:
    """SPEC §7: continue-as-new carries the settings. A conversation that
    switches after every turn keeps its model, system prompt, thinking
    level and tools on the next run's model call (a fast check; the
    300-turn comparison test is the only one that caught a switch dropping them)."""
    stack.script({"tool_calls": [{"id": "e1", "name": "echo", "arguments": {"text": "x"}}]}, {"text": "done"})
    handle = await stack.start(continueAsNewAfterTurns=1)
    await handle.execute_update(
        "configure", {"systemPrompt": "Be brief.", "thinkingLevel": "high", "tools": ["echo"]}
    )
    await handle.execute_update("prompt", "go")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("agent_end")
    log.close()
    first, second = stack.requests()
    for request in (first, second):
        assert request["messages"][0] == {"role": "system", "content": "Be brief."}
        assert request["reasoning_effort"] == "high"
        assert [t["function"]["name"] for t in request["tools"]] == ["echo"]
    state = await handle.query("state", result_type=dict)
    assert state["systemPrompt"] == "Be brief." and state["model"] == stack.model
    await handle.signal("close")


async def test_close_when_idle_waits_for_a_first_run_when_started_without_a_prompt(stack: Stack) -> None:
    """README: closeWhenIdle completes the conversation "when a run ends and
    both queues are empty". Started without a prompt, no run has ended: the
    conversation stays open for its first prompt and completes after it."""
    stack.script({"text": "hello"})
    handle = await stack.start(closeWhenIdle=True)
    await asyncio.sleep(1.0)
    state = await handle.query("state", result_type=dict)
    assert state["status"] == "idle"
    await handle.execute_update("prompt", "hi")
    result = await asyncio.wait_for(handle.result(), 30)
    assert [m.role for m in result.messages] == ["user", "assistant"]


@pytest.mark.parametrize("switched", [False, True], ids=["same-run", "after-continue-as-new"])
async def test_close_when_idle_completes_once_clear_queues_drops_what_an_abort_left_queued(
    stack: Stack, switched: bool
) -> None:
    """README: a run ended by ``abort`` leaves its queued messages queued, so
    a closeWhenIdle conversation stays open "until `continue` runs them,
    `clear_queues` drops them or `close` ends it". Dropped, it stayed open
    until a ``close`` (a README audit); now it completes. Also once it
    continued as new while it waited (``continueAsNewAfterTurns``, a long
    history): the next run did not know a run had ended (a review)."""
    stack.script({"text": "a slow answer " * 40, "delay_ms": 50, "chunk_chars": 4})
    start: dict[str, Any] = {"continueAsNewAfterTurns": 1} if switched else {}
    handle = await stack.start(prompt="hi", closeWhenIdle=True, **start)
    first_run = (await handle.describe()).run_id
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("message_update")
    await handle.signal("follow_up", "later")
    await handle.signal("abort")  # after the follow-up: signals are applied in order
    await log.wait_for_type("agent_end")
    log.close()
    await asyncio.sleep(1.0)
    handle = stack.client.get_workflow_handle(handle.id, result_type=SessionResult)  # the latest run
    assert ((await handle.describe()).run_id != first_run) == switched
    state = await handle.query("state", result_type=dict)
    assert (state["status"], state["followUpQueue"]) == ("idle", 1)  # kept, as pi keeps it

    removed = await handle.execute_update("clear_queues", "all")

    assert [m["content"] for m in removed] == ["later"]
    result = await asyncio.wait_for(handle.result(), 10)
    assert [m.role for m in result.messages] == ["user", "assistant"]
    assert result.messages[-1].stop_reason == "aborted"  # type: ignore[union-attr]
    assert (await handle.query("state", result_type=dict))["status"] == "closed"


async def test_concurrent_decisions_on_one_call_are_taken_once(stack: Stack) -> None:
    """SPEC §9: approve_tool on an "already decided id" is refused. Several
    decisions sent at once (two people clicking) are all answered, exactly
    one accepted, and the call's outcome is the accepted one's: a caller
    told "accepted" must not be overruled by a later decision."""
    stack.script(
        {"tool_calls": [{"id": "g1", "name": "guarded_echo", "arguments": {"text": "x"}}]}, {"text": "ok"}
    )
    handle = await stack.start(prompt="ask")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request")
    decisions = [{"toolCallId": "g1", "approved": i % 2 == 0, "reason": f"r{i}"} for i in range(6)]
    outcomes = await asyncio.gather(
        *(handle.execute_update("approve_tool", d) for d in decisions), return_exceptions=True
    )
    accepted = [d for d, o in zip(decisions, outcomes, strict=True) if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, WorkflowUpdateFailedError) for o in refused), refused
    assert len(accepted) == 1, f"{len(accepted)} decisions accepted for one call"
    events = await log.wait_for_type("agent_end")
    log.close()
    end = next(e for e in events if e["type"] == "tool_execution_end")
    assert end["isError"] == (not accepted[0]["approved"])
    await handle.signal("close")


async def test_clear_queues_with_no_argument_clears_both_queues(stack: Stack) -> None:
    """README: clear_queues with "no argument for all": the follow-up queue
    is cleared too, not only the steering one."""
    stack.script(
        {"tool_calls": [{"id": "s1", "name": "slow", "arguments": {"seconds": 1.5}}]}, {"text": "done"}
    )
    handle = await stack.start(prompt="work")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start")
    await handle.signal("follow_up", "follow one")
    await handle.signal("steer", "steer one")
    await asyncio.sleep(0.2)
    removed = await handle.execute_update("clear_queues")
    assert [m["content"] for m in removed] == ["follow one", "steer one"]
    state = await handle.query("state")
    assert state["steeringQueue"] == 0 and state["followUpQueue"] == 0
    await log.wait_for_type("agent_end")
    log.close()
    await handle.signal("close")


async def test_continue_returns_the_offset_its_run_starts_at_and_the_client_its_messages(
    stack: Stack,
) -> None:
    """README: `continue` returns `{run, eventOffset}` as `prompt` does;
    `Conversation.continue_()` reads its run's events from that offset, so it
    returns the messages of the continued run, not those of an earlier one."""
    stack.script(
        {"tool_calls": [{"id": "s1", "name": "slow", "arguments": {"seconds": 1.0}}]}, {"text": "after tools"}
    )
    conversation = await stack.conversation()
    await conversation.send_prompt("work")
    log = EventLog(stack.client, conversation.id)
    await log.wait_for_type("tool_execution_start")
    await conversation.stop_after_turn()
    await conversation.wait_for_idle()
    log.close()
    offset = (await conversation.state()).event_offset
    started = await conversation.send_continue()
    assert started.run == 2 and started.event_offset == offset
    new = [m async for _, m in conversation.run_events(started)]
    assert new[0]["type"] == "agent_start" and new[-1]["type"] == "agent_end"
    ended = new[-1]["messages"]
    assert [m["role"] for m in ended] == ["assistant"] and ended[0]["content"][0]["text"] == "after tools"
    await conversation.handle.signal("close")


async def test_a_user_message_sent_without_a_timestamp_is_stamped_with_workflow_time(stack: Stack) -> None:
    """SPEC §1: a message's timestamp is ms since the epoch, from
    workflow.now(). A user message object sent without one (prompt or steer)
    gets the time it was taken, not 0 (1970 in every pi client)."""
    stack.script({"text": "one"})
    handle = await stack.start()
    before = int(time.time() * 1000) - 60_000
    await handle.execute_update("prompt", {"role": "user", "content": "hi"})
    await handle.execute_update("wait_for_idle")
    messages = await stack.messages(handle)
    assert messages[0].role == "user" and messages[0].timestamp > before
    await handle.signal("close")


async def test_a_refusal_names_a_boolean_in_jsons_words(stack: Stack) -> None:
    """Refusals say what was sent in JSON's words: `true` is "a boolean"
    (not "a number", which Python's bool-is-int would make it)."""
    handle = await stack.start()
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("configure", True)
    assert str(refused.value.cause).endswith("not a boolean.")
    await handle.signal("close")


async def test_a_message_over_two_megabytes_is_refused_by_prompt_and_dropped_as_a_steer(stack: Stack) -> None:
    """README (troubleshooting): a steer "over 2 MB" is dropped; a prompt
    that large is refused with a sentence naming the limit (the existing
    test takes either outcome)."""
    handle = await stack.start()
    text = "large " * 500_000  # 3 MB, compressible: it reaches the workflow
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("prompt", text)
    assert "the limit is 2.1 MB" in str(refused.value.cause)
    await handle.signal("steer", text)
    await asyncio.sleep(1.0)
    state = await handle.query("state", result_type=dict)
    assert state["runs"] == 0 and state["messageCount"] == 0 and state["steeringQueue"] == 0
    await handle.signal("close")


async def test_an_abort_while_a_tool_call_streams_leaves_no_call_without_a_result(stack: Stack) -> None:
    """SPEC §6: "A transcript never keeps a toolCall without a matching tool
    result". The aborted message keeps the text that had streamed but not
    the tool call that was streaming when the abort came."""
    stack.script(
        {
            "text": "Let me echo.",
            "tool_calls": [{"id": "e1", "name": "echo", "arguments": {"text": "x" * 300}}],
            "chunk_chars": 3,
            "delay_ms": 40,
        }
    )
    handle = await stack.start(prompt="echo it")
    log = EventLog(stack.client, handle.id)
    await log.wait_until(
        lambda es: any(
            e["type"] == "message_update" and e["assistantMessageEvent"]["type"].startswith("toolcall")
            for e in es
        )
    )
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    log.close()
    messages = await stack.messages(handle)
    last = messages[-1]
    assert last.role == "assistant" and last.stop_reason == "aborted"
    assert [c.type for c in last.content] == ["text"]
    assert not any(m.role == "toolResult" for m in messages)
    await handle.signal("close")


async def test_tools_configured_during_a_run_apply_from_its_next_model_call(stack: Stack) -> None:
    """SPEC §8: configure is "applied from the next model call": tools
    changed while a run's tools execute are what its next call offers."""
    stack.script(
        {"tool_calls": [{"id": "s1", "name": "slow", "arguments": {"seconds": 1.0}}]}, {"text": "done"}
    )
    handle = await stack.start(prompt="work")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start")
    await handle.execute_update("configure", {"tools": ["echo"]})
    await log.wait_for_type("agent_end")
    log.close()
    first, second = stack.requests()
    assert "echo" in [t["function"]["name"] for t in first["tools"]] and len(first["tools"]) > 1
    assert [t["function"]["name"] for t in second["tools"]] == ["echo"]
    await handle.signal("close")


async def test_a_reused_tool_call_id_gets_a_new_idempotency_key_after_a_continue_as_new(stack: Stack) -> None:
    """A model that reuses call ids (`call_0` every turn) must never hand a
    tool the same idempotency key twice, also when the turns are in two runs
    of the conversation (the key then names the run): a tool deduplicating
    by key would skip the second call."""
    stack.script(
        {"tool_calls": [{"id": "call_0", "name": "whoami", "arguments": {}}]},
        {"tool_calls": [{"id": "call_0", "name": "whoami", "arguments": {}}]},
        {"text": "ok"},
    )
    handle = await stack.start(prompt="who", continueAsNewAfterTurns=1)
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("agent_end")
    log.close()
    keys = [m.details["key"] for m in await stack.messages(handle) if m.role == "toolResult"]
    assert len(keys) == 2 and keys[0] == f"{handle.id}/tool-call_0"
    assert keys[0] != keys[1], keys
    await handle.signal("close")


async def test_calls_of_a_large_batch_not_started_at_an_abort_never_run(stack: Stack) -> None:
    """SPEC §6: an abort during tools gives every unfinished call the error
    result `Tool execution aborted`. In a batch larger than the 200 tool
    activities run at once, the calls still waiting for a slot at the abort
    must not start afterwards (a tool with side effects would run after
    the person pressed stop). The tools outlast the test's own waits: with
    2 s ones, on a loaded machine a tool started first ended before the
    abort landed."""
    calls = [{"id": f"s{i}", "name": "slow", "arguments": {"seconds": 20.0, "steps": 20}} for i in range(210)]
    stack.script({"tool_calls": calls})
    handle = await stack.start(prompt="work")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start", count=210)
    await asyncio.sleep(0.5)
    await handle.signal("abort")
    await log.wait_for_type("agent_end", timeout=90)
    log.close()
    results = [m for m in await stack.messages(handle) if m.role == "toolResult"]
    assert len(results) == 210
    texts = {m.content[0].text for m in results}
    assert texts == {"Tool execution aborted"}, sorted(texts)
    await handle.signal("close")


async def test_an_aborted_message_keeps_the_timestamp_its_message_start_showed(stack: Stack) -> None:
    """The aborted assistant message in the transcript (and its message_end)
    is the message whose message_start subscribers saw: same timestamp (pi
    stamps a message once, when the request is made), so a client that keys
    messages by timestamp does not see two."""
    stack.script({"text": "word " * 200, "chunk_chars": 5, "delay_ms": 40})
    handle = await stack.start(prompt="talk")
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: sum(e["type"] == "message_update" for e in es) > 3)
    await asyncio.sleep(1.2)  # the abort comes a while after the request
    await handle.signal("abort")
    events = await log.wait_for_type("agent_end")
    log.close()
    started = [e for e in events if e["type"] == "message_start" and e["message"]["role"] == "assistant"]
    ended = [e for e in events if e["type"] == "message_end" and e["message"]["role"] == "assistant"]
    assert ended[-1]["message"]["stopReason"] == "aborted"
    last = (await stack.messages(handle))[-1]
    assert last.timestamp == started[-1]["message"]["timestamp"] == ended[-1]["message"]["timestamp"]
    await handle.signal("close")
