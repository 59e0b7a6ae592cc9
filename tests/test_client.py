"""``Conversation``: pi's ``Agent`` API (SPEC §8-9) through the typed client,
against the dev server, the shared worker and the scripted model."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from client import Conversation, ConversationNotFound, Refused, StoppedWaiting, list_conversations
from runtime.settings import Settings
from testbed.local_stack import start_worker, stop_process
from tests.support.stack import EventLog, Stack
from tests.support.tools import guarded_call
from workflows.inputs import MAX_MESSAGE_BYTES
from workflows.models import AgentMessage, AssistantMessage, ToolResultMessage, UserMessage


def texts(messages: list[AgentMessage]) -> list[str]:
    """``role: text`` of each message, comparable at a glance."""
    out = []
    for m in messages:
        if isinstance(m, UserMessage):
            out.append(f"user: {m.content if isinstance(m.content, str) else m.content[0].text}")  # type: ignore[union-attr]
        elif isinstance(m, AssistantMessage):
            calls = f"[{','.join(c.name for c in m.tool_calls)}]" if m.tool_calls else ""
            out.append(" ".join(part for part in ("assistant:", m.text, calls) if part))
        elif isinstance(m, ToolResultMessage):
            out.append(f"toolResult: {m.content[0].text if m.content else ''}")  # type: ignore[union-attr]
    return out


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 20) -> None:
    """Poll ``check`` until it holds."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def has_tools(chat: Conversation) -> bool:
    return bool((await chat.state()).tools)


def slow_tool(seconds: float = 2, call_id: str = "call_slow") -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": "slow", "arguments": {"seconds": seconds}}]}


# --- prompt and wait ----------------------------------------------------------------


async def test_prompt_with_a_list_adds_every_message_before_the_first_model_call(stack: Stack) -> None:
    stack.script({"text": "both read"})
    chat = await stack.conversation()

    new = await chat.prompt(["first part", {"role": "user", "content": "second part"}])

    assert texts(new) == ["user: first part", "user: second part", "assistant: both read"]
    (request,) = stack.requests()
    assert [m["content"] for m in request["messages"] if m["role"] == "user"] == ["first part", "second part"]


async def test_prompt_returns_only_the_new_messages_of_its_own_run(stack: Stack) -> None:
    stack.script({"text": "one"}, {"text": "two"})
    chat = await stack.conversation()
    await chat.prompt("first")

    new = await chat.prompt("second")

    assert texts(new) == ["user: second", "assistant: two"]
    assert len(await chat.messages()) == 4


async def test_prompt_while_a_run_is_active_is_refused_with_one_sentence(stack: Stack) -> None:
    stack.script(slow_tool(), {"text": "done"})
    chat = await stack.conversation()
    await chat.prompt("work", wait=False)

    with pytest.raises(Refused, match=r"^A run is already active: send `steer` or `follow_up` instead"):
        await chat.prompt("more")

    assert (await chat.wait_for_idle()).stop_reason == "stop"


# --- configure -------------------------------------------------------------------------


async def test_configure_applies_model_and_system_prompt_from_the_next_call(stack: Stack) -> None:
    other = f"{stack.model}-other"
    stack.script({"text": "from the first model"})
    stack.model_server.script(other, [{"text": "from the other model"}])
    chat = await stack.conversation()
    await chat.prompt("hi")

    settings = await chat.configure(model=other, system_prompt="Answer in French.", thinking_level="low")
    new = await chat.prompt("again")

    assert (settings.model, settings.system_prompt, settings.thinking_level) == (
        other,
        "Answer in French.",
        "low",
    )
    assert texts(new)[-1] == "assistant: from the other model"
    (request,) = stack.model_server.requests(other)
    assert request["messages"][0] == {"role": "system", "content": "Answer in French."}
    assert request["reasoning_effort"] == "low"
    assert "system" not in [m["role"] for m in stack.requests()[0]["messages"]]
    state = await chat.state()
    assert (state.model, state.system_prompt, state.thinking_level) == (other, "Answer in French.", "low")


async def test_configure_tools_limits_what_the_model_is_offered(stack: Stack) -> None:
    stack.script({"text": "ok"})
    chat = await stack.conversation()
    # The worker's tools are recorded by the conversation's first activity;
    # until then a tools setting is refused (reported to the workflow's owners).
    await until(lambda: has_tools(chat))

    settings = await chat.configure(tools=["echo", "calculator"])
    await chat.prompt("hi")

    assert settings.tools == ["echo", "calculator"]
    offered = sorted(tool["function"]["name"] for tool in stack.requests()[0]["tools"])
    assert offered == ["calculator", "echo"]


@pytest.mark.parametrize(
    ("setting", "sentence"),
    [
        (
            {"tools": ["no_such_tool"]},
            r"^Unknown tool\(s\) no_such_tool: this conversation's worker declared",
        ),
        ({"model": ""}, r"^The settings are invalid \(model: "),
        ({"thinking_level": "extreme"}, r"^The settings are invalid \(thinkingLevel: "),
    ],
)
async def test_configure_refuses_a_bad_setting_with_one_sentence(
    stack: Stack, setting: dict[str, Any], sentence: str
) -> None:
    chat = await stack.conversation()

    with pytest.raises(Refused, match=sentence) as refused:
        await chat.configure(**setting)

    assert "\n" not in str(refused.value)
    assert (await chat.state()).model == stack.model


# --- queues ----------------------------------------------------------------------------


async def queue_during_a_tool(stack: Stack, chat: Conversation, *sends: tuple[str, str]) -> None:
    """Start a run that waits on a slow tool, then queue each ``(queue, text)``
    in its own workflow task (each message gets its own timestamp)."""
    log = EventLog(stack.client, chat.id)
    await chat.prompt("work", wait=False)
    await log.wait_for_type("tool_execution_start")
    log.close()
    for count, (queue, text) in enumerate(sends, 1):
        await (chat.steer(text) if queue == "steering" else chat.follow_up(text))

        async def queued(count: int = count) -> bool:
            state = await chat.state()
            return state.steering_queue + state.follow_up_queue == count

        await until(queued)
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("queue", ["steering", "followUp"])
@pytest.mark.parametrize(
    ("message", "sentence"),
    [
        ("   ", r"^The message text is empty: send some text\.$"),
        ({"role": "assistant", "content": []}, r"^A message with role `assistant` cannot be sent"),
        ({"role": "user", "content": []}, r"^The message has no content"),
    ],
)
async def test_a_steer_or_follow_up_the_workflow_would_drop_is_refused_here(
    stack: Stack, queue: str, message: Any, sentence: str
) -> None:
    """A signal cannot refuse: the workflow drops a message it cannot read
    with a line in the worker's log. The client says so instead of "sent"."""
    chat = await stack.conversation()
    send = chat.steer if queue == "steering" else chat.follow_up
    with pytest.raises(Refused, match=sentence):
        await send(message)
    stack.script({"text": "queued"})
    await send("a real one")  # the same call with a readable message is sent, and starts a run
    await chat.wait_for_idle()
    texts = [m.content for m in await chat.messages() if isinstance(m, UserMessage)]
    assert texts == ["a real one"]


async def test_clear_queues_returns_the_removed_messages_oldest_first(stack: Stack) -> None:
    stack.script(slow_tool(5), {"text": "nothing was injected"})
    chat = await stack.conversation()
    await queue_during_a_tool(
        stack, chat, ("steering", "steer one"), ("followUp", "follow one"), ("steering", "steer two")
    )

    steering = await chat.clear_queues("steering")
    rest = await chat.clear_queues("all")
    idle = await chat.wait_for_idle()

    assert texts(steering) == ["user: steer one", "user: steer two"]
    assert texts(rest) == ["user: follow one"]
    assert texts(idle.messages) == [
        "user: work",
        "assistant: [slow]",
        "toolResult: slept 5.0s",
        "assistant: nothing was injected",
    ]


async def test_clear_queues_all_interleaves_both_queues_by_age(stack: Stack) -> None:
    stack.script(slow_tool(5), {"text": "done"})
    chat = await stack.conversation()
    await queue_during_a_tool(
        stack, chat, ("steering", "steer one"), ("followUp", "follow one"), ("steering", "steer two")
    )

    removed = await chat.clear_queues()
    await chat.wait_for_idle()

    assert texts(removed) == ["user: steer one", "user: follow one", "user: steer two"]
    state = await chat.state()
    assert (state.steering_queue, state.follow_up_queue, state.runs) == (0, 0, 1)


# --- reset, wait_for_idle, state ---------------------------------------------------------


async def test_reset_clears_transcript_usage_and_counters(stack: Stack) -> None:
    stack.script({"text": "before"}, {"text": "after the reset"})
    chat = await stack.conversation()
    await chat.prompt("hi")

    state = await chat.reset()
    new = await chat.prompt("again")

    assert (state.message_count, state.turns, state.runs, state.usage.total_tokens) == (0, 0, 0, 0)
    assert (state.error_message, state.model) == (None, stack.model)
    assert texts(await chat.messages()) == texts(new) == ["user: again", "assistant: after the reset"]
    assert (await chat.state()).runs == 1


async def test_reset_is_refused_while_a_run_is_active(stack: Stack) -> None:
    stack.script(slow_tool(), {"text": "done"})
    chat = await stack.conversation()
    await chat.prompt("work", wait=False)

    with pytest.raises(
        Refused, match=r"^A run is active: abort it \(or wait for it to end\) before reset\.$"
    ):
        await chat.reset()

    assert len((await chat.wait_for_idle()).messages) == 4


async def test_wait_for_idle_returns_runs_stop_reason_and_the_last_runs_messages(stack: Stack) -> None:
    stack.script({"text": "first"}, slow_tool(1), {"text": "second"})
    chat = await stack.conversation()
    idle_before = await chat.wait_for_idle()
    await chat.prompt("one")
    await chat.prompt("two", wait=False)

    idle = await chat.wait_for_idle()

    assert (idle_before.runs, idle_before.stop_reason, idle_before.messages) == (0, None, [])
    assert (idle.runs, idle.stop_reason) == (2, "stop")
    assert texts(idle.messages) == [
        "user: two",
        "assistant: [slow]",
        "toolResult: slept 1.0s",
        "assistant: second",
    ]


async def test_is_streaming_spans_the_run_and_streaming_message_the_model_stream(stack: Stack) -> None:
    answer = "a slowly streamed answer, " * 4
    stack.script(slow_tool(1.5), {"text": answer, "chunk_chars": 4, "delay_ms": 60})
    chat = await stack.conversation()
    log = EventLog(stack.client, chat.id)
    await chat.prompt("go", wait=False)

    await log.wait_for_type("tool_execution_start")
    during_tools = await chat.state()
    await log.wait_until(
        lambda events: any(
            e["type"] == "message_update" and e["assistantMessageEvent"]["type"] == "text_delta"
            for e in events
        )
    )
    while_streaming = await chat.state()
    await chat.wait_for_idle()
    after = await chat.state()
    log.close()

    assert (during_tools.is_streaming, during_tools.streaming_message) == (True, None)
    assert during_tools.pending_tool_calls == ["call_slow"]
    assert while_streaming.is_streaming
    assert while_streaming.streaming_message is not None
    assert answer.startswith(while_streaming.streaming_message.text)
    assert 0 < len(while_streaming.streaming_message.text) < len(answer)
    assert (after.is_streaming, after.streaming_message, after.status) == (False, None, "idle")


async def test_an_aborted_run_sets_error_message(stack: Stack) -> None:
    stack.script(slow_tool(3), {"text": "never"})
    chat = await stack.conversation()
    log = EventLog(stack.client, chat.id)
    await chat.prompt("go", wait=False)
    await log.wait_for_type("tool_execution_start")
    log.close()

    await chat.abort()
    idle = await chat.wait_for_idle()
    state = await chat.state()

    assert idle.stop_reason == "aborted"
    assert state.error_message
    assert not state.is_streaming


# --- fork -------------------------------------------------------------------------------


async def test_fork_starts_from_the_first_n_messages_and_takes_a_prompt(stack: Stack) -> None:
    stack.script(
        {"text": "the first answer"}, {"text": "the second answer"}, {"text": "another second answer"}
    )
    chat = await stack.conversation(system_prompt="Be brief.")
    await chat.prompt("question one")
    await chat.prompt("question two")

    fork = await chat.fork(at=2)
    forked_before = texts(await fork.messages())
    new = await fork.prompt("question two, asked differently")

    assert forked_before == ["user: question one", "assistant: the first answer"]
    assert texts(new) == ["user: question two, asked differently", "assistant: another second answer"]
    state = await fork.state()
    assert (state.model, state.system_prompt, state.message_count) == (stack.model, "Be brief.", 4)
    assert len(await chat.messages()) == 4  # the original is untouched
    await fork.close()


async def test_a_forks_id_and_options_are_the_callers(stack: Stack) -> None:
    """``fork(at, id=..., **options)``: the id given, and each option over the original's setting."""
    stack.script({"text": "the first answer"})
    chat = await stack.conversation(system_prompt="Be brief.")
    await chat.prompt("question one")

    fork = await chat.fork(at=2, id=f"{chat.id}-mine", system_prompt="Be thorough.")

    assert fork.id == f"{chat.id}-mine"
    state = await fork.state()
    assert (state.model, state.system_prompt) == (stack.model, "Be thorough.")
    assert (await chat.state()).system_prompt == "Be brief."
    await fork.close()


async def test_fork_keeps_the_tools_the_model_may_call(stack: Stack) -> None:
    """A conversation that switched tools off forks into one that has them
    off too: a fork must not offer the model a tool the user took away."""
    stack.script({"text": "first"}, {"text": "from the fork"})
    chat = await stack.conversation()
    await until(lambda: has_tools(chat))
    await chat.configure(tools=["echo"])
    await chat.prompt("hi")

    fork = await chat.fork(at=2)
    await fork.prompt("again")

    assert (await fork.state()).tools == ["echo"]
    offered = [sorted(tool["function"]["name"] for tool in request["tools"]) for request in stack.requests()]
    assert offered == [["echo"], ["echo"]]
    await fork.close()


async def test_fork_refuses_a_point_between_tool_calls_and_their_results(stack: Stack) -> None:
    stack.script(slow_tool(0.1), {"text": "done"})
    chat = await stack.conversation()
    await chat.prompt("work")

    with pytest.raises(
        Refused, match=r"^Message 2 calls tools whose results are messages 3 to 3: fork at 1 or at 3\.$"
    ):
        await chat.fork(at=2)
    with pytest.raises(Refused, match=r"^The transcript has 4 messages: fork at 0 to 4\.$"):
        await chat.fork(at=5)


# --- approvals and refusals ------------------------------------------------------------------


async def test_approve_runs_the_call_and_reject_gives_the_model_the_reason(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [guarded_call("call_a", "yes please"), guarded_call("call_b", "rm -rf")]},
        {"text": "ok"},
    )
    chat = await stack.conversation()
    log = EventLog(stack.client, chat.id)
    await chat.prompt("go", wait=False)
    await log.wait_for_type("tool_approval_request", 2)
    log.close()

    state = await chat.state()
    await chat.approve("call_a")
    await chat.reject("call_b", "not on my machine")
    idle = await chat.wait_for_idle()

    assert state.status == "awaiting-approval"
    assert [(a.tool_call_id, a.tool_name, a.args["text"]) for a in state.pending_approvals] == [
        ("call_a", "guarded_echo", "yes please"),
        ("call_b", "guarded_echo", "rm -rf"),
    ]
    results = {m.tool_call_id: m for m in idle.messages if isinstance(m, ToolResultMessage)}
    assert texts([results["call_a"]]) == ["toolResult: approved: yes please"]
    assert results["call_b"].is_error
    assert "not on my machine" in texts([results["call_b"]])[0]
    assert (await chat.state()).pending_approvals == []


async def test_deciding_a_call_that_does_not_wait_is_refused(stack: Stack) -> None:
    chat = await stack.conversation()

    with pytest.raises(Refused, match=r"^No tool call 'call_x' is waiting for approval\.$"):
        await chat.approve("call_x")


async def test_misused_calls_are_refused_with_a_sentence(stack: Stack) -> None:
    """A hooks and client audit: `approve(id, "too risky")` failed in
    pydantic, `approved="no"` rejected the call, `prompt(123)` raised an
    AttributeError."""
    chat = await stack.conversation()

    with pytest.raises(Refused, match=r"^approved is True or False, not 'too risky' \(a reason goes in"):
        await chat.approve("call_x", "too risky")  # type: ignore[arg-type]
    with pytest.raises(Refused, match=r"^approved is True or False, not 'no'"):
        await chat.approve("call_x", approved="no")  # type: ignore[arg-type]
    with pytest.raises(Refused, match=r"^A message is a text, a message object or a dict of one, not int\.$"):
        await chat.prompt(123)  # type: ignore[arg-type]
    assert (await chat.state()).status == "idle"  # nothing was sent


async def test_a_missing_or_ended_conversation_says_so(stack: Stack) -> None:
    missing = Conversation.attach(stack.client, "test-no-such-conversation")
    ended = await stack.conversation()
    await ended.close()
    await ended.result()

    with pytest.raises(ConversationNotFound, match=r"^No conversation has the id test-no-such-conversation"):
        await missing.state()
    with pytest.raises(ConversationNotFound, match=r"^No conversation has the id test-no-such-conversation"):
        await missing.result()
    with pytest.raises(ConversationNotFound, match=rf"^Conversation {ended.id} was closed: start a new one"):
        await ended.steer("anyone there?")
    terminated = await stack.conversation()
    await terminated.handle.terminate("operator")
    with pytest.raises(
        ConversationNotFound, match=rf"^Conversation {terminated.id} was terminated: start a new"
    ):
        await terminated.prompt("hello?")


async def test_a_cancelled_wait_for_idle_is_the_callers_cancellation(stack: Stack) -> None:
    """A race audit: `asyncio.wait_for(wait_for_idle(), 0.5)` raised the SDK's
    WorkflowUpdateRPCTimeoutOrCancelledError instead of TimeoutError, and a
    cancelled task did not end cancelled (task groups and timeouts broke)."""
    stack.script({"tool_calls": [guarded_call("call_a", "later")]}, {"text": "done"})
    chat = await stack.conversation()
    log = EventLog(stack.client, chat.id)
    await chat.prompt("go", wait=False)
    await log.wait_for_type("tool_approval_request")
    log.close()

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(chat.wait_for_idle(), 0.5)
    task = asyncio.get_running_loop().create_task(chat.wait_for_idle())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()

    await chat.approve("call_a")  # the conversation goes on as before
    assert (await chat.wait_for_idle()).stop_reason == "stop"


async def test_a_cancelled_request_is_the_callers_cancellation_and_is_kept(
    client: Client, worker_env: dict[str, str], artifacts: Path
) -> None:
    """A request whose wait is cancelled (no worker takes it) raises the
    caller's own cancellation, so `asyncio.timeout`, `asyncio.wait_for`,
    task groups and `task.cancel()` behave as with any awaitable, with a
    ``StoppedWaiting`` as its cause saying what was sent is kept; and it
    is: a worker that starts later applies each. (A race audit: the SDK's
    WorkflowUpdateRPCTimeoutOrCancelledError came out of wait_for, and a
    StoppedWaiting raised in place of the cancellation broke task groups.)"""
    task_queue = f"no-worker-yet-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        "AgentWorkflow", {}, id=f"nobody-{uuid.uuid4().hex[:8]}", task_queue=task_queue
    )
    chat = Conversation.attach(client, handle.id)
    worker = None
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await chat.configure(system_prompt="terse")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(chat.clear_queues("steering"), 0.5)
        async with asyncio.TaskGroup() as group:
            cancelled_in_group = group.create_task(chat.configure(max_turns=7))
            await asyncio.sleep(0.3)
            cancelled_in_group.cancel()
        assert cancelled_in_group.cancelled()
        task = asyncio.get_running_loop().create_task(chat.prompt("second", wait=False))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as stopped:
            await task
        assert task.cancelled()
        assert isinstance(stopped.value.__cause__, StoppedWaiting)
        assert str(stopped.value.__cause__) == (
            "Stopped waiting for prompt: what was sent is kept, and applies when a worker takes it "
            "(unless the Temporal server restarts first: see `state` before sending it again)."
        )
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

        worker = start_worker(
            {**worker_env, "TEMPORAL_TASK_QUEUE": task_queue},
            ["tests.support.tools"],
            artifacts / "late-worker.log",
        )
        idle = await asyncio.wait_for(chat.wait_for_idle(), 30)
        state = await chat.state()
        assert (state.system_prompt, state.max_turns) == ("terse", 7)
        assert texts(idle.messages)[0] == "user: second"
    finally:
        await handle.terminate("test")
        if worker is not None:
            stop_process(worker)


async def test_a_conversation_ended_before_its_first_task_has_no_events(client: Client) -> None:
    """Terminated before any worker took its first task (here: none runs on
    its task queue), a conversation has published nothing: its events end
    at once. A reader waited, then failed with the server's "Workflow
    execution closed before WorkflowTaskStarted event" (a console look)."""
    handle = await client.start_workflow(
        "AgentWorkflow", {}, id=f"never-ran-{uuid.uuid4().hex[:8]}", task_queue=f"none-{uuid.uuid4().hex[:6]}"
    )
    await handle.terminate("by the operator")
    chat = Conversation.attach(client, handle.id)

    events = await asyncio.wait_for(_all_events(chat), 10)

    assert events == []
    assert await chat.how_it_ended() == "The conversation was terminated."
    with pytest.raises(
        ConversationNotFound, match=rf"^Conversation {handle.id} was terminated before any worker"
    ):
        await chat.state()


async def _all_events(chat: Conversation) -> list[dict[str, Any]]:
    return [event async for _, event in chat.events(0)]


async def test_an_update_aborted_by_a_failed_workflow_task_is_made_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal landing while the conversation continues as new fails that
    workflow task, and the server aborts the updates it carried: `prompt`
    and `wait_for_idle` raised the server's RPCError (found by two audits).
    The client makes them again, with the same update id (applied once)."""
    stack.script({"text": "once"})
    conversation = await stack.conversation()
    real = type(conversation.handle).execute_update
    sent: list[tuple[str, str | None]] = []

    async def flaky(self: Any, update: str, *args: Any, **kwargs: Any) -> Any:
        sent.append((update, kwargs.get("id")))
        if sum(name == update for name, _ in sent) == 1:
            raise RPCError(
                "Unable to perform workflow execution update due to unexpected workflow task failure.",
                RPCStatusCode.FAILED_PRECONDITION,
                b"",
            )
        return await real(self, update, *args, **kwargs)

    monkeypatch.setattr(type(conversation.handle), "execute_update", flaky)
    messages = await conversation.prompt("hi")
    await conversation.wait_for_idle()
    assert texts(messages) == ["user: hi", "assistant: once"]
    assert [name for name, _ in sent] == ["prompt", "prompt", "wait_for_idle", "wait_for_idle"]
    assert sent[0][1] == sent[1][1] and sent[2][1] == sent[3][1] and sent[0][1] != sent[2][1]
    assert len(stack.requests()) == 1  # one run


async def test_an_update_sent_as_the_run_closes_is_made_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server refuses an update that arrives while the run continues as
    new or completes (RESOURCE_EXHAUSTED "workflow is closing"): it reached
    the caller as a raw RPCError (a crash audit). The next run takes it."""
    stack.script({"text": "once"})
    conversation = await stack.conversation()
    real = type(conversation.handle).execute_update
    sent: list[str | None] = []

    async def closing(self: Any, update: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(kwargs.get("id"))
        if len(sent) == 1:
            raise RPCError(
                "workflow operation can not be applied because workflow is closing",
                RPCStatusCode.RESOURCE_EXHAUSTED,
                b"",
            )
        return await real(self, update, *args, **kwargs)

    monkeypatch.setattr(type(conversation.handle), "execute_update", closing)
    messages = await conversation.prompt("hi")
    assert texts(messages) == ["user: hi", "assistant: once"]
    assert len(sent) == 2 and sent[0] == sent[1]  # the same update id: applied once


async def test_an_update_refused_for_good_is_not_made_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversation = await stack.conversation()
    calls = 0

    async def denied(self: Any, update: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        raise RPCError("Request unauthorized.", RPCStatusCode.PERMISSION_DENIED, b"")

    monkeypatch.setattr(type(conversation.handle), "execute_update", denied)
    with pytest.raises(RPCError, match="unauthorized"):
        await conversation.wait_for_idle()
    assert calls == 1


async def test_the_servers_update_limit_is_not_waited_out(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAILED_PRECONDITION is also the server's limit on a run's updates,
    which waiting does not lift: only an update aborted with its workflow
    task is made again (found by review)."""
    conversation = await stack.conversation()
    calls = 0

    async def limited(self: Any, update: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        raise RPCError(
            "limit on number of total updates has been reached (2000)", RPCStatusCode.FAILED_PRECONDITION, b""
        )

    monkeypatch.setattr(type(conversation.handle), "execute_update", limited)
    with pytest.raises(RPCError, match="limit on number"):
        await conversation.wait_for_idle()
    assert calls == 1


async def test_follow_says_where_events_were_no_longer_kept(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that fell behind while a run continued as new read on from
    the oldest event carried, and its offsets jumped without a word (a
    stream audit: 26 tool calls never got a result). ``on_skipped`` says
    which were not read; an item that is no event (anyone who may signal
    can publish one), skipped by the reader, is no loss (a review)."""
    from temporalio.contrib.workflow_streams._types import (
        PollResult,
        _encode_payload,
        _WorkflowStreamWireItem,
    )

    from client import _EventReader, follow

    converter = stack.client.data_converter.payload_converter

    def item(offset: int, value: Any) -> Any:
        return _WorkflowStreamWireItem("events", _encode_payload(converter.to_payload(value)), offset)

    reads = [
        PollResult(
            [item(0, {"type": "turn_start"}), item(1, "not an event"), item(2, {"type": "turn_end"})], 3, True
        ),
        PollResult([item(9, {"type": "turn_start"}), item(10, {"type": "turn_end"})], 11, True),  # 3-8 gone
    ]

    class Done(Exception):
        pass

    async def read(self: Any) -> Any:
        if not reads:
            raise Done
        return reads.pop(0)

    monkeypatch.setattr(_EventReader, "_read", read)
    skipped: list[tuple[int, int]] = []
    offsets: list[int] = []
    with pytest.raises(Done):
        async for offset, _ in follow(
            stack.client, "gone", 0, on_skipped=lambda a, b: skipped.append((a, b))
        ):
            offsets.append(offset)
    assert offsets == [0, 2, 9, 10]
    assert skipped == [(3, 9)]


async def test_a_runs_events_end_at_the_next_runs_start_when_its_end_was_not_kept(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent_end too large to carry across continue-as-new is not kept
    for a reader behind: `run_events` then yielded the next run's events
    as its own. They end where the next run starts."""
    from temporalio.contrib.workflow_streams._types import (
        PollResult,
        _encode_payload,
        _WorkflowStreamWireItem,
    )

    from client import _EventReader
    from workflows.contract import PromptResult

    converter = stack.client.data_converter.payload_converter

    def item(offset: int, kind: str) -> Any:
        return _WorkflowStreamWireItem(
            "events", _encode_payload(converter.to_payload({"type": kind})), offset
        )

    reads = [
        PollResult([item(5, "agent_start"), item(6, "turn_start")], 7, True),
        PollResult([item(9, "agent_start"), item(10, "turn_start")], 11, True),  # 7-8 (its end) gone
    ]

    async def read(self: Any) -> Any:
        return reads.pop(0)

    monkeypatch.setattr(_EventReader, "_read", read)
    skipped: list[tuple[int, int]] = []
    chat = Conversation.attach(stack.client, "gone")
    started = PromptResult(run=1, event_offset=5)
    events = [o async for o, _ in chat.run_events(started, on_skipped=lambda a, b: skipped.append((a, b)))]
    assert events == [5, 6] and skipped == [(7, 9)]


async def test_state_is_asked_again_while_the_servers_query_buffer_is_full(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With several clients polling `state`, the server refused one with
    RESOURCE_EXHAUSTED "consistent query buffer is full" and
    Conversation.state() raised it raw (an operations audit). It asks
    again; any other error is the caller's at once."""
    conversation = await stack.conversation()
    real = conversation.handle.query
    refusals = 2
    asked = 0

    async def busy(name: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal refusals, asked
        asked += 1
        if refusals:
            refusals -= 1
            raise RPCError("consistent query buffer is full", RPCStatusCode.RESOURCE_EXHAUSTED, b"")
        return await real(name, *args, **kwargs)

    monkeypatch.setattr(conversation.handle, "query", busy)
    assert (await conversation.state()).status == "idle" and asked == 3

    async def broken(name: str, *args: Any, **kwargs: Any) -> Any:
        raise RPCError("permission denied", RPCStatusCode.PERMISSION_DENIED, b"")

    monkeypatch.setattr(conversation.handle, "query", broken)
    with pytest.raises(RPCError, match="permission denied"):
        await conversation.state()

    # A tool blocking the worker's event loop fails the workflow task: the
    # server refuses queries meanwhile, and state() raised it raw (a chaos audit).
    failing = 0

    async def task_failing(name: str, *args: Any, **kwargs: Any) -> Any:
        nonlocal failing
        failing += 1
        raise RPCError(
            "Unable to query workflow due to Workflow Task in failed state.",
            RPCStatusCode.FAILED_PRECONDITION,
            b"",
        )

    # A failed conversation's history no worker can read: not "goes on once
    # the worker can read it" (nothing goes on; a chaos audit).
    async def unreadable(name: str, *args: Any, **kwargs: Any) -> Any:
        raise WorkflowQueryFailedError(
            "A payload is too large on this worker; the conversation goes on once the worker can read it."
        )

    async def failed(running: str = "") -> str:
        return "failed (its next run could not read its input)"

    monkeypatch.setattr(conversation.handle, "query", unreadable)
    monkeypatch.setattr(conversation, "_how_it_ended", failed)
    with pytest.raises(Refused) as refused:
        await conversation.state()
    assert str(refused.value) == (
        f"Conversation {conversation.id} failed (its next run could not read its input); a worker could not "
        "read its state: A payload is too large on this worker"
    )
    monkeypatch.undo()

    monkeypatch.setattr(conversation.handle, "query", task_failing)
    with pytest.raises(Refused, match=r"cannot answer now: its workflow task is failing \(the worker's log"):
        await conversation.state()
    assert failing == 6  # asked again for ~3 s first
    await conversation.close()


async def test_a_conversation_terminated_mid_run_reads_closed_and_its_prompt_says_so(stack: Stack) -> None:
    """The server terminates a conversation past its history limit (a batch
    of large tool results): `prompt(wait=True)` returned [] as if the run had
    made no message, and `state` said `running` for good (a limits audit)."""
    stack.script({"tool_calls": [{"id": "s1", "name": "slow", "arguments": {"seconds": 30}}]})
    chat = await stack.conversation()
    waiting = asyncio.ensure_future(chat.prompt("work"))

    async def tool_running() -> bool:
        return bool((await chat.state()).pending_tool_calls)

    await until(tool_running)
    await chat.handle.terminate("Workflow history size exceeds limit.")
    with pytest.raises(ConversationNotFound) as ended:
        await asyncio.wait_for(waiting, 60)
    assert str(ended.value).startswith(f"Conversation {chat.id} was terminated before run 1 ended"), (
        ended.value
    )
    state = await chat.state()
    assert (state.status, state.is_streaming) == ("closed", False)


async def test_a_reader_is_told_of_each_stall_once_and_a_failing_callback_does_not_stop_the_looks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog of ``Conversation.events`` (``waits_for_worker`` stubbed,
    its looks shortened): one note a stall, again for a stall after events
    came back (a review found the second one was not told), and a callback
    that raises does not end the looks."""
    import client

    monkeypatch.setattr(client, "_WORKER_CHECKS", (0.05, 0.05))
    waiting = {"now": True}

    async def waits_for_worker(self: Conversation, after: float = 5.0) -> str | None:
        return "it waits" if waiting["now"] else None

    notes: list[str] = []

    def say(sentence: str) -> None:
        notes.append(sentence)
        raise RuntimeError("a callback of the caller's that fails")

    monkeypatch.setattr(Conversation, "waits_for_worker", waits_for_worker)
    monkeypatch.setattr(Conversation, "on_slow_update", say)
    conversation = Conversation.__new__(Conversation)
    reading = client._Reading()
    looks = asyncio.create_task(conversation._note_while_no_worker(reading))
    try:
        await asyncio.sleep(0.5)
        assert notes == ["it waits"]  # told once, though it still waits and the callback failed
        reading.saw_event()  # events came: it went on
        await asyncio.sleep(0.5)  # and stalled again
        assert notes == ["it waits", "it waits"]
        assert not looks.done()
    finally:
        looks.cancel()


async def test_an_answered_request_is_not_noted_as_waiting_for_a_worker(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``on_slow_update`` hears of a request that waits for a worker, not of
    one a worker answered (the chat would print "prompt has waited 5 s for
    a worker ... is one running?" 5 s after every answered request)."""

    monkeypatch.setattr("client.UPDATE_NOTE_AFTER", 1.0)
    notes: list[str] = []
    monkeypatch.setattr(Conversation, "on_slow_update", notes.append)
    conversation = await stack.conversation()

    await conversation.configure(system_prompt="Be brief.")
    await asyncio.sleep(1.5)

    assert notes == []


async def test_list_finds_a_model_whose_name_has_a_quote(stack: Stack) -> None:
    """A filter value is quoted for the visibility query: a model named with
    a quote is listed (not refused as "This server does not keep the Agent*
    search attributes"), and cannot widen the query."""

    model = f"o'brien-{uuid.uuid4().hex[:6]}"
    conversation = await stack.conversation(model=model)

    async def listed() -> list[str]:
        return [found.id async for found in list_conversations(stack.client, model=model)]

    for _ in range(100):  # the visibility store lags a little
        if await listed():
            break
        await asyncio.sleep(0.1)
    assert await listed() == [conversation.id]
    widened = f"{model}' OR AgentModel != '"
    assert [found.id async for found in list_conversations(stack.client, model=widened)] == []


async def test_list_filters_conversations_that_ended_without_closing(stack: Stack) -> None:
    """``--status terminated`` finds a terminated conversation on a real
    visibility store (the execution's status, not AgentStatus)."""
    conversation = await stack.conversation()
    await conversation.handle.terminate("over")

    async def listed(status: str) -> dict[str, str | None]:
        found = list_conversations(stack.client, status=status, limit=1000)
        return {summary.id: summary.status async for summary in found}

    for _ in range(100):  # the visibility store lags a little
        if conversation.id in await listed("terminated"):
            break
        await asyncio.sleep(0.1)
    assert (await listed("terminated"))[conversation.id] == "terminated"
    assert conversation.id not in await listed("failed")
    assert conversation.id not in await listed("idle")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"max_turns": 0}, "maxTurns"),
        # The workflow's own check: a JavaScript reader of `state` would read another number.
        ({"max_total_tokens": 2**53}, "`maxTotalTokens` must be at most 9007199254740991 (2**53 - 1"),
        ({"sytem_prompt": "Be brief."}, "Unknown start input key(s) sytemPrompt"),
        ({"thinking_level": "extreme"}, "thinkingLevel"),
        ({"prompt": "   "}, "The message text is empty"),
        ({"prompt": [f"m{i}" for i in range(101)]}, "at most 100 messages"),
        ({"prompt": {"role": "assistant", "content": []}}, "role `assistant` cannot be sent"),
        # at the limit as sent, past it as the workflow measures it (with its timestamp)
        ({"prompt": {"role": "user", "content": "x" * (MAX_MESSAGE_BYTES - 28)}}, "the limit is 2.1 MB"),
    ],
)
async def test_a_start_the_workflow_would_refuse_is_refused_before_anything_starts(
    client: Client, options: dict[str, Any], said: str
) -> None:
    """The workflow fails such a start at once; `Conversation.start` used to
    return as if it had started, and the next call found it failed."""
    conversation_id = f"test-{uuid.uuid4().hex[:10]}"

    with pytest.raises(Refused, match=re.escape(said)):
        await Conversation.start(client, Settings.from_env(), id=conversation_id, **options)

    with pytest.raises(RPCError) as missing:
        await client.get_workflow_handle(conversation_id).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND


async def test_a_start_prompt_is_measured_as_the_workflow_parses_it() -> None:
    """A key a message does not have is dropped before its size is measured,
    as the workflow does: 2 MB of it is no reason to refuse the start."""

    class Started(Exception):
        pass

    class StartingClient:
        async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
            raise Started

    prompt = {"role": "user", "content": "hi", "junk": "x" * MAX_MESSAGE_BYTES}
    with pytest.raises(Started):
        await Conversation._start(StartingClient(), "q", "id", prompt, None, {})  # type: ignore[arg-type]


@pytest.mark.parametrize("empty", ["", "  "])
async def test_a_start_with_an_empty_id_is_refused_before_anything_starts(empty: str) -> None:
    """It made up an id without a word (a diff review); None still does."""

    class StartingClient:
        async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("started")

    with pytest.raises(Refused, match=r"^A conversation's id cannot be empty"):
        await Conversation._start(StartingClient(), "q", empty, "hi", None, {})  # type: ignore[arg-type]


async def test_a_start_with_settings_the_converter_makes_json_is_not_refused(stack: Stack) -> None:
    """A set of tools goes to the workflow as a list: the client's check
    reads the input as it is sent, so it neither raises nor refuses it."""
    stack.script({"text": "hello"})

    chat = await stack.conversation(tools={"calculator"}, prompt="hi")

    assert (await chat.state()).tools == ["calculator"]


async def test_a_task_failing_on_a_payload_over_the_limit_is_refused_naming_the_payload_store(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers on AGENT_STORAGE=off and a transcript past 2 MB: every task
    failed on PayloadsTooLarge, and the refusal blamed a blocking tool or a
    slow hook (a wedge audit). It names the store that lets it go on."""
    from temporalio.api.enums.v1 import WorkflowTaskFailedCause

    async def last_task_failure(self: Conversation) -> tuple[int, str]:
        cause = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_PAYLOADS_TOO_LARGE
        return cause, "[TMPRL1103] Attempted to upload payloads with size that exceeded the error limit."

    monkeypatch.setattr(Conversation, "_last_task_failure", last_task_failure)
    sentence = await Conversation(client, "big")._failing_task_sentence("cannot answer now")

    assert sentence.startswith(
        "Conversation big cannot answer now: a payload its next step sends is over Temporal's payload limit"
    ), sentence
    assert "AGENT_STORAGE=file or s3://" in sentence and "blocks" not in sentence


@pytest.mark.expect_task_failures  # a worker without the hooks fails to replay, on purpose
async def test_a_conversation_a_worker_replays_differently_is_refused_with_what_to_do(
    stack: Stack, worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation run by a worker with hooks, then sent a prompt when
    only a worker without them ran: its workflow task failed on
    nondeterminism, ``prompt`` said the server's raw "Workflow Task in
    failed state" and ``state`` blamed a blocking tool (a README audit)."""
    import client as client_module
    from tests.support.guarded_hooks import GuardedHooks
    from worker import build_worker

    monkeypatch.setattr(client_module, "_backoff", lambda failures: 0.05)  # the same answers, sooner
    retries = client_module.MAX_RETRIES
    monkeypatch.setattr(client_module, "MAX_RETRIES", 2)  # each try of the update waits ~1 s
    queue = f"hooks-gone-{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env(worker_env, task_queue=queue)
    stack.script({"tool_calls": [{"id": "x1", "name": "explode", "arguments": {}}]}, {"text": "blocked"})
    async with build_worker(stack.client, settings, hooks=GuardedHooks()):  # blocks `explode`
        conversation = await Conversation.start(stack.client, settings, model=stack.model)
        assert (await conversation.prompt("explode"))[-1].text == "blocked"
    notes: list[str] = []
    monkeypatch.setattr(Conversation, "on_slow_update", notes.append)
    async with build_worker(stack.client, settings):  # replays the call as run, not blocked
        with pytest.raises(Refused) as refused:
            await conversation.prompt("again")
        assert str(refused.value).endswith("(`prompt` was not taken: send it again then).")
        # The note while it waited: not "is one running?" (one was).
        assert len(notes) == 1 and notes[0].startswith(
            "prompt has waited 5 s: the conversation's workflow task is failing on the worker (attempt "
        ), notes
        assert str(refused.value).startswith(
            f"Conversation {conversation.id} cannot take `prompt` now: a worker replays its history "
            "differently from how it ran (nondeterminism). Every worker on its task queue must run the "
            "same workflow code, tool modules and hooks"
        ), refused.value
        monkeypatch.setattr(client_module, "MAX_RETRIES", retries)
        with pytest.raises(Refused, match=r"cannot answer now: a worker replays its history differently"):
            await conversation.state()
    await conversation.handle.terminate("test over")
