"""The live clients: the event renderer, ``watch``, ``run`` and the terminal chat.

The renderer and the chat's output writer are tested with hand-made events;
the commands run as real ``starter.py`` processes against the dev server and
the shared worker, the chat inside a pseudo-terminal driven by pexpect.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import signal
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pexpect
import pytest
from rich.console import Console
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from client import Conversation
from console.above_prompt import AbovePromptWriter
from console.chat import ChatSession
from console.render import EventRenderer
from testbed.local_stack import DevServer, start_worker, stop_process
from tests.support.stack import EventLog, Stack
from tests.support.tools import guarded_call
from workflows.contract import SessionState
from workflows.models import EVENTS_TOPIC, AgentMessage, ToolResultMessage, UserMessage

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 20


# --- hand-made events ---------------------------------------------------------------


def user(text: str, **fields: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, "timestamp": 1, **fields}


def assistant(*content: dict[str, Any], stop_reason: str = "stop", **fields: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": list(content),
        "usage": {"totalTokens": 12, "cost": {"total": 0.0}},
        "stopReason": stop_reason,
        **fields,
    }


def delta(kind: str, text: str, index: int = 0) -> dict[str, Any]:
    update = {"type": kind, "contentIndex": index, "delta": text}
    return {"type": "message_update", "assistantMessageEvent": update}


def streamed_run(*updates: dict[str, Any], final: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a one-turn run whose answer streams as ``updates``."""
    return [
        {"type": "agent_start"},
        {"type": "turn_start"},
        {"type": "message_start", "message": user("hi")},
        {"type": "message_end", "message": user("hi")},
        {"type": "message_start", "message": assistant(), "attempt": 1},
        *updates,
        {"type": "message_end", "message": final},
        {"type": "turn_end", "message": final, "toolResults": []},
        {"type": "agent_end", "messages": [user("hi"), final]},
    ]


def render(events: list[dict[str, Any]], **console: Any) -> str:
    out = io.StringIO()
    renderer = EventRenderer(Console(file=out, **{"width": 100, "force_terminal": False, **console}))
    for event in events:
        renderer.render(event)
    return out.getvalue()


def test_renderer_prints_streamed_text_exactly_once() -> None:
    final = assistant({"type": "text", "text": "Hello world"})
    events = streamed_run(
        delta("text_start", ""),
        delta("text_delta", "Hel"),
        delta("text_delta", "lo "),
        delta("text_delta", "world"),
        delta("text_end", ""),
        final=final,
    )

    assert render(events) == "» hi\nHello world\n· 1 turn · 12 tokens\n"


def test_renderer_notes_an_event_of_another_shape_and_goes_on() -> None:
    """Anyone who may signal a conversation can publish on its stream: an
    event of a known type but another shape must not end the chat."""
    final = assistant({"type": "text", "text": "still fine"})
    forged = [
        "not an event",
        {"type": "message_start", "message": "not a message"},
        {"type": "message_end", "message": {"role": "assistant", "content": 5}},
        {"type": "agent_end", "messages": "x"},
    ]
    out = render([*forged, *streamed_run(delta("text_delta", "still fine"), final=final)])
    assert out.count("event this chat cannot show") == 3
    assert out.endswith("» hi\nstill fine\n· 1 turn · 12 tokens\n")


def test_the_chat_passes_over_an_approval_request_of_another_shape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat = ChatSession(None)  # type: ignore[arg-type]  # no conversation is reached
    chat._renderer = EventRenderer(Console(file=io.StringIO()))
    chat._observe({"type": "tool_approval_request"})
    chat._observe(
        {"type": "tool_approval_request", "toolCallId": "c1", "toolName": "x", "args": {}, "reason": "r"}
    )
    assert list(chat._approvals) == ["c1"]


def test_renderer_dims_thinking() -> None:
    final = assistant({"type": "thinking", "thinking": "pondering"}, {"type": "text", "text": "answer"})
    events = streamed_run(
        delta("thinking_start", ""),
        delta("thinking_delta", "pondering"),
        delta("text_start", "", 1),
        delta("text_delta", "answer", 1),
        final=final,
    )

    output = render(events, force_terminal=True, color_system="standard")

    assert "\x1b[2;3mpondering\x1b[0m\nanswer\n" in output


def test_renderer_notes_that_a_retried_call_discards_the_partial_answer() -> None:
    final = assistant({"type": "text", "text": "second try"})
    events = streamed_run(
        delta("text_delta", "first tr"),
        {"type": "message_retry", "attempt": 2},
        {"type": "message_start", "message": assistant(), "attempt": 2},
        delta("text_delta", "second try"),
        final=final,
    )

    lines = render(events).splitlines()

    assert lines[1:4] == [
        "first tr",
        "↻ model call failed: the partial answer above is discarded; retrying (attempt 2)",
        "second try",
    ]


def test_renderer_prints_a_message_joined_mid_stream_whole_at_its_end() -> None:
    final = assistant({"type": "text", "text": "the whole answer"})
    events = [delta("text_delta", "answer"), {"type": "message_end", "message": final}]

    assert render(events) == "the whole answer\n"


def test_renderer_resumes_a_message_joined_mid_stream_from_what_it_had_so_far() -> None:
    """A chat attached mid-answer prints the partial message from the state,
    then the deltas after it on the same line, each token once."""
    final = assistant({"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "the whole answer"})
    partial = assistant({"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "the wh"})
    out = io.StringIO()
    renderer = EventRenderer(Console(file=out, width=80, force_terminal=False))
    renderer.resume_message(partial)
    assert out.getvalue() == "hmm\nthe wh"
    for event in (delta("text_delta", "ole answer", 1), {"type": "message_end", "message": final}):
        renderer.render(event)
    assert out.getvalue() == "hmm\nthe whole answer\n"


def test_renderer_shows_tool_calls_progress_and_error_results() -> None:
    events: list[dict[str, Any]] = [
        {"type": "tool_execution_start", "toolCallId": "c1", "toolName": "slow", "args": {"seconds": 3}},
        {
            "type": "tool_execution_update",
            "toolCallId": "c1",
            "toolName": "slow",
            "args": {"seconds": 3},
            "partialResult": {"content": [{"type": "text", "text": "step 1/4"}], "details": {}},
        },
        {
            "type": "tool_execution_end",
            "toolCallId": "c1",
            "toolName": "slow",
            "result": {"content": [{"type": "text", "text": "Tool execution aborted"}], "details": {}},
            "isError": True,
        },
    ]

    assert render(events).splitlines() == [
        "⚙ slow(seconds=3)",
        "  ⋯ step 1/4",
        "  ✗ slow: Tool execution aborted",
    ]


def test_a_result_whose_end_came_before_the_renderer_joined_is_shown_with_its_message() -> None:
    """A chat re-attached while one call of a batch waited for approval
    never showed the other call's result: its tool_execution_end came
    before the chat joined, and tool result messages were not shown (an
    operations audit). It is shown when its message comes; a result shown
    by its end is not shown twice."""

    def result(call_id: str, name: str, text: str) -> dict[str, Any]:
        message = {
            "role": "toolResult",
            "toolCallId": call_id,
            "toolName": name,
            "content": [{"type": "text", "text": text}],
            "isError": False,
            "timestamp": 0,
        }
        return {"type": "message_end", "message": message}

    joined_waiting = [  # echo (e1) ended before the renderer joined
        {
            "type": "tool_execution_end",
            "toolCallId": "g1",
            "toolName": "guarded_echo",
            "result": {"content": [{"type": "text", "text": "approved: GX"}], "details": {}},
            "isError": False,
        },
        result("g1", "guarded_echo", "approved: GX"),
        result("e1", "echo", "echo: EX"),
    ]
    assert render(joined_waiting).splitlines() == [
        "  ✓ guarded_echo: approved: GX",
        "  ✓ echo: echo: EX",
    ]


def test_renderer_shows_an_approval_request_whole_and_a_rejection_as_an_error() -> None:
    long = "x" * 200  # longer than a tool call's line: the person decides on all of it
    events: list[dict[str, Any]] = [
        {"type": "tool_execution_start", "toolCallId": "c1", "toolName": "shell", "args": {"cmd": long}},
        {
            "type": "tool_approval_request",
            "toolCallId": "c1",
            "toolName": "shell",
            "args": {"cmd": long},
            "reason": "shell commands need approval",
        },
        {
            "type": "tool_execution_end",
            "toolCallId": "c1",
            "toolName": "shell",
            "result": {"content": [{"type": "text", "text": "Tool call shell was rejected: not now"}]},
            "isError": True,
        },
    ]

    lines = render(events, width=400).splitlines()

    assert lines[1:] == [
        f'⏸ approval needed: shell(cmd="{long}")',
        "  shell commands need approval · call c1",
        "  ✗ shell: Tool call shell was rejected: not now",
    ]
    assert lines[0].endswith("…)")


def injected_run(queue: str | None) -> list[dict[str, Any]]:
    """A run that answers, then gets ``later`` injected (by ``queue``, when the event says)."""
    later = {"type": "message_start", "message": user("later")}
    if queue is not None:
        later["queue"] = queue
    final = assistant({"type": "text", "text": "ok"})
    return [*streamed_run(final=final)[:-1], later, {"type": "message_end", "message": user("later")}]


@pytest.mark.parametrize(
    ("queue", "line"),
    [
        ("followUp", "» follow-up: later"),
        ("steering", "» steer: later"),
        (None, "» steer: later"),  # a workflow that does not say: injected after an answer is steering
    ],
)
def test_renderer_labels_an_injected_message_by_its_queue(queue: str | None, line: str) -> None:
    assert render(injected_run(queue)).splitlines()[-1] == line


def test_renderer_labels_a_follow_up_that_starts_a_run() -> None:
    """Queued while idle, it opens the run: the event's queue says what it is."""
    start = {"type": "message_start", "message": user("next"), "queue": "followUp"}

    out = render([{"type": "agent_start"}, {"type": "turn_start"}, start])

    assert out.splitlines() == ["» follow-up: next"]


def test_renderer_replays_a_transcript_like_the_live_stream() -> None:
    call = {"type": "toolCall", "id": "c1", "name": "echo", "arguments": {"text": "x"}}
    result = {
        "role": "toolResult",
        "toolCallId": "c1",
        "toolName": "echo",
        "content": [{"type": "text", "text": "echo: x"}],
    }
    transcript = [
        user("hi"),
        assistant({"type": "text", "text": "calling"}, call, stop_reason="toolUse"),
        result,
        user("also this"),
        assistant(stop_reason="error", errorMessage="The model server answered 500."),
    ]
    out = io.StringIO()

    EventRenderer(Console(file=out, width=100, force_terminal=False)).render_transcript(transcript)

    assert out.getvalue().splitlines() == [
        "» hi",
        "calling",
        '⚙ echo(text="x")',
        "  ✓ echo: echo: x",
        "» steer: also this",
        "✗ The model server answered 500.",
    ]


def test_above_prompt_writer_holds_back_the_unfinished_line() -> None:
    out = io.StringIO()
    writer = AbovePromptWriter(out, on_tail_change=lambda: None, columns=lambda: 80)

    writer.write("first line\nstill strea")
    writer.write("ming")

    assert (out.getvalue(), writer.tail) == ("first line\n", "still streaming")


def test_above_prompt_writer_wraps_the_line_at_the_terminal_width() -> None:
    out = io.StringIO()
    writer = AbovePromptWriter(out, on_tail_change=lambda: None, columns=lambda: 11)

    writer.write("\x1b[2mabcdefghijklmn")

    assert (out.getvalue(), writer.tail) == ("\x1b[2mabcdefghij\x1b[0m\n", "\x1b[2mklmn")


# --- the commands ---------------------------------------------------------------------------


def client_env(dev_server: DevServer) -> dict[str, str]:
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_server.address,
        "TEMPORAL_TASK_QUEUE": "agent-tests",
        "TERM": "xterm",
        "PROMPT_TOOLKIT_NO_CPR": "1",  # a pty answers no cursor-position requests
    }


async def starter(dev_server: DevServer, *args: str) -> tuple[int, str]:
    """Run ``starter.py`` to the end; its exit code and stdout."""
    code, stdout, _ = await starter_with_stderr(dev_server, *args)
    return code, stdout


async def starter_with_stderr(
    dev_server: DevServer, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> tuple[int, str, str]:
    """Run ``starter.py`` to the end; its exit code, stdout and stderr."""
    process = await spawn_starter(dev_server, *args, env=env, cwd=cwd)
    stdout, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def spawn_starter(
    dev_server: DevServer, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> asyncio.subprocess.Process:
    """``starter.py`` started against ``dev_server``, its stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "starter.py"),
        *args,
        cwd=cwd,
        env={**client_env(dev_server), **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_starter_says_in_one_line_that_the_payload_store_cannot_be_written(
    stack: Stack, tmp_path: Path
) -> None:
    """A message over the storage threshold is stored before it is sent: a
    store that cannot be written was a 100-line traceback."""
    conversation = await stack.conversation()
    env = {"AGENT_STORAGE_DIR": "/proc/no-store", "AGENT_STORAGE_THRESHOLD_BYTES": "3000"}
    large = base64.b64encode(os.urandom(6000)).decode()
    code, _, stderr = await starter_with_stderr(stack.dev_server, "steer", conversation.id, large, env=env)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith("error: The payload store cannot be written (No such file or directory)")
    assert "AGENT_STORAGE_DIR (now /proc/no-store)" in stderr


async def test_watch_json_prints_one_event_per_line_like_a_subscriber(stack: Stack) -> None:
    stack.script({"text": "watch this"})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    await handle.result()
    subscriber = WorkflowStreamClient.create(stack.client, handle.id).subscribe(
        [EVENTS_TOPIC], poll_cooldown=timedelta(milliseconds=20)
    )
    expected = [(item.offset, item.data) async for item in subscriber]

    code, stdout, stderr = await starter_with_stderr(stack.dev_server, "watch", handle.id, "--json")

    lines = [json.loads(line) for line in stdout.splitlines()]
    assert code == 0
    assert stderr == "The conversation was closed.\n"  # how it ended, off the JSON lines (it said nothing)
    assert [(line.pop("offset"), line) for line in lines] == expected
    assert [offset for offset, _ in expected] == sorted({offset for offset, _ in expected})


async def test_run_streams_the_answer_once(stack: Stack) -> None:
    stack.script({"text": "streamed only once", "chunk_chars": 3})

    code, stdout = await starter(stack.dev_server, "run", "hi", "--model", stack.model)

    assert (code, stdout.count("streamed only once")) == (0, 1)


async def test_run_exits_after_an_answer_whose_first_token_came_after_the_worker_watch_began(
    stack: Stack, worker_env: dict[str, str], artifacts: Path
) -> None:
    """``run`` watches for a missing worker once no event came for 5 s. An
    answer whose first token took 7 s arrives with its run's end in one
    read, so the run ended just as that watch woke, and on Python 3.11
    ``wait_for`` then lost the cancel at exit: the process hung for good
    (a README audit: ``exit=124`` under ``timeout 40``). A worker of its
    own, whose model read timeout outlasts the 7 s."""
    task_queue = f"quiet-{uuid.uuid4().hex[:6]}"
    env = {**worker_env, "TEMPORAL_TASK_QUEUE": task_queue, "AGENT_LLM_READ_TIMEOUT": "15"}
    worker = start_worker(env, [], artifacts / "quiet-worker.log")
    try:
        stack.script({"text": "Answer after a long think.", "first_delay_ms": 7000})
        code, stdout, _ = await starter_with_stderr(
            stack.dev_server,
            "run",
            "think long",
            "--model",
            stack.model,
            env={"TEMPORAL_TASK_QUEUE": task_queue},
        )
    finally:
        stop_process(worker)

    assert (code, stdout.count("Answer after a long think.")) == (0, 1), stdout


async def test_run_exits_1_when_the_model_call_fails(stack: Stack) -> None:
    stack.script({"fault": {"kind": "400", "message": "bad request body"}})

    code, stdout = await starter(stack.dev_server, "run", "hi", "--model", stack.model)

    assert code == 1
    assert "bad request body" in stdout


# --- the chat in a pseudo-terminal -----------------------------------------------------------


def spawn_chat(dev_server: DevServer, *args: str) -> tuple[pexpect.spawn, io.StringIO]:
    """``starter.py chat`` in a pty, and everything it prints."""
    screen = io.StringIO()
    child = pexpect.spawn(
        sys.executable,
        ["starter.py", "chat", *args],
        cwd=str(ROOT),
        env=client_env(dev_server),
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=TIMEOUT,
    )
    child.logfile_read = screen
    return child, screen


async def expect(child: pexpect.spawn, text: str) -> None:
    await child.expect_exact(text, async_=True)


async def start_chat(stack: Stack) -> tuple[pexpect.spawn, str]:
    """A new chat with the stack's model, ready for input; and its conversation id."""
    child, _ = spawn_chat(stack.dev_server, "--model", stack.model)
    await child.expect(r"conversation (chat-[0-9a-f]+)", async_=True)
    workflow_id = child.match.group(1)
    await expect(child, "›")
    return child, workflow_id


async def leave(child: pexpect.spawn, workflow_id: str) -> None:
    """Ctrl-C while idle leaves, telling how to come back."""
    child.sendcontrol("c")
    await expect(child, f"python starter.py chat --id {workflow_id}")
    await child.expect(pexpect.EOF, async_=True)
    child.close()
    assert child.exitstatus == 0


async def abort_with_ctrl_c(
    child: pexpect.spawn, line: str, shown: str, note: str = "aborting the run"
) -> None:
    """Type ``line``, wait for ``shown`` (the tool call it starts), then
    Ctrl-C: the chat says ``note`` and the run ends aborted."""
    child.send(line + "\r")
    await expect(child, shown)
    child.sendcontrol("c")
    await expect(child, note)
    await expect(child, "Request was aborted")


async def test_chat_steering_typed_during_a_tool_lands_after_its_result(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [{"id": "call_slow", "name": "slow", "arguments": {"seconds": 3}}]},
        {"text": "noted the steer"},
    )
    child, workflow_id = await start_chat(stack)

    child.send("run the slow tool\r")
    await expect(child, "⚙ slow(seconds=3)")
    child.send("also say hi\r")
    await expect(child, "» steering: also say hi")
    await expect(child, "» steer: also say hi")
    await expect(child, "noted the steer")
    await expect(child, "· 2 turns")
    await leave(child, workflow_id)

    handle = stack.client.get_workflow_handle(workflow_id)
    messages: list[dict[str, Any]] = await handle.query("messages")
    assert [(m["role"], m.get("content") if m["role"] == "user" else None) for m in messages] == [
        ("user", "run the slow tool"),
        ("assistant", None),
        ("toolResult", None),
        ("user", "also say hi"),
        ("assistant", None),
    ]
    assert messages[-1]["content"] == [{"type": "text", "text": "noted the steer"}]
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING


async def test_chat_ctrl_c_aborts_the_run_and_a_second_one_leaves(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [{"id": "call_slow", "name": "slow", "arguments": {"seconds": 3}}]},
        {"text": "never reached"},
    )
    child, workflow_id = await start_chat(stack)

    await abort_with_ctrl_c(child, "run the slow tool", "⚙ slow(seconds=3)")
    await leave(child, workflow_id)

    messages: list[dict[str, Any]] = await stack.client.get_workflow_handle(workflow_id).query("messages")
    assert messages[-1]["stopReason"] == "aborted"


async def test_chat_reattach_replays_the_transcript_without_duplicating_it(stack: Stack) -> None:
    stack.script({"text": "the stored answer"}, {"text": "a live answer"})
    handle = await stack.start(prompt="first question")
    await stack.events(handle.id)
    child, screen = spawn_chat(stack.dev_server, "--id", handle.id)

    await expect(child, "the stored answer")
    await expect(child, "›")
    child.send("second question\r")
    await expect(child, "a live answer")
    await expect(child, "· 1 turn")
    child.send("/quit\r")
    await child.expect(pexpect.EOF, async_=True)

    shown = screen.getvalue()
    assert (shown.count("first question"), shown.count("the stored answer")) == (1, 1)


async def test_chat_with_a_new_id_starts_that_conversation(stack: Stack) -> None:
    stack.script({"text": "hello, named chat"})
    workflow_id = f"named-{uuid.uuid4().hex[:8]}"
    child, _ = spawn_chat(stack.dev_server, "--id", workflow_id, "--model", stack.model)

    await expect(child, f"conversation {workflow_id}")
    await expect(child, "›")
    child.send("hi\r")
    await expect(child, "hello, named chat")
    await expect(child, "· 1 turn")
    await leave(child, workflow_id)

    state = await stack.state(stack.client.get_workflow_handle(workflow_id))
    assert (state.model, state.message_count) == (stack.model, 2)


async def test_a_chat_whose_conversation_ends_says_how_and_how_to_go_on(stack: Stack) -> None:
    """A chat said only "The conversation has ended." when another client
    closed or terminated its conversation (a console look): it says how it
    ended, as `watch` does, and how to go on, not how to re-attach."""
    stack.script({"text": "first answer"})
    child, workflow_id = await start_chat(stack)
    try:
        child.send("hi\r")
        await expect(child, "· 1 turn")
        # Ended while its reader waits for the next event (a terminate that
        # lands while the reader's poll is sent, not yet taken, is told only
        # when the server gives up on that poll, ~20 s later).
        await asyncio.sleep(1)
        await stack.client.get_workflow_handle(workflow_id).terminate("by the operator")
        await expect(child, "The conversation was terminated.")
        assert await child.expect(["Re-attach", "first N messages \\(of its 2\\)"], async_=True) == 1
        assert (
            await child.expect(["Re-attach", f"python starter.py fork {workflow_id} --at N"], async_=True)
            == 1
        )
        assert await child.expect(["Re-attach", pexpect.EOF], async_=True) == 1
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def user_texts(messages: list[AgentMessage]) -> list[str]:
    return [m.content for m in messages if isinstance(m, UserMessage) and isinstance(m.content, str)]


def tool_results(messages: list[AgentMessage]) -> dict[str, tuple[bool, str]]:
    """Tool call id -> (is error, text) of each tool result."""
    return {
        m.tool_call_id: (m.is_error, " ".join(getattr(c, "text", "") for c in m.content))
        for m in messages
        if isinstance(m, ToolResultMessage)
    }


async def test_chat_y_approves_the_oldest_call_and_n_rejects_it_with_a_reason(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [guarded_call("call_a", "hello"), guarded_call("call_b", "rm -rf /")]},
        {"text": "decided"},
    )
    child, workflow_id = await start_chat(stack)

    child.send("echo twice\r")
    await expect(child, '⏸ approval needed: guarded_echo(text="rm -rf /"')
    await expect(child, "approve guarded_echo (call_a, +1 more)? y/n")
    child.send("/state\r")
    await expect(child, "awaiting-approval · streaming: yes")
    await expect(child, "waiting for approval: guarded_echo · call call_b")
    child.send("y\r")
    await expect(child, "✓ approved guarded_echo (call_a)")
    await expect(child, "approve guarded_echo (call_b)? y/n")
    child.send("n not on my machine\r")
    await expect(child, "Tool call guarded_echo was rejected: not on my machine")
    await expect(child, "decided")
    await leave(child, workflow_id)

    messages = await Conversation.attach(stack.client, workflow_id).messages()
    assert user_texts(messages) == ["echo twice"]  # y and n decided, they were not sent as steering
    results = tool_results(messages)
    assert results["call_a"] == (False, "approved: hello")
    assert results["call_b"][0] and "not on my machine" in results["call_b"][1]


async def test_chat_attached_later_lists_waiting_calls_and_decides_them_by_id(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [guarded_call("call_a", "first"), guarded_call("call_b", "second")]},
        {"text": "both decided"},
    )
    conversation = await stack.conversation()
    log = EventLog(stack.client, conversation.id)
    await conversation.prompt("echo twice", wait=False)
    await log.wait_for_type("tool_approval_request", 2)
    log.close()
    child, _ = spawn_chat(stack.dev_server, "--id", conversation.id)

    await expect(child, '⏸ approval needed: guarded_echo(text="first"')
    await expect(child, '⏸ approval needed: guarded_echo(text="second"')
    child.send("/reject call_b wrong file\r")
    await expect(child, "✗ rejected guarded_echo (call_b): wrong file")
    child.send("/approve\r")  # the oldest still waiting
    await expect(child, "✓ approved guarded_echo (call_a)")
    await expect(child, "both decided")
    await leave(child, conversation.id)

    results = tool_results((await conversation.wait_for_idle()).messages)
    assert results["call_a"] == (False, "approved: first")
    assert results["call_b"][0] and "wrong file" in results["call_b"][1]


async def test_chat_settings_commands_apply_to_the_next_model_call(stack: Stack) -> None:
    other = f"{stack.model}-other"
    stack.model_server.script(other, [{"text": "configured answer"}])
    child, workflow_id = await start_chat(stack)
    conversation = Conversation.attach(stack.client, workflow_id)

    child.send(f"/model {other}\r")
    await expect(child, f"model: {other} (from the next model call)")
    child.send("/system Answer like a pirate.\r")
    await expect(child, "system prompt changed")
    child.send("/thinking extreme\r")
    await expect(child, "✗ The settings are invalid (thinkingLevel: Input should be 'off'")
    child.send("/thinking high\r")
    await expect(child, "thinking: high (from the next model call)")
    await until_state(conversation, lambda state: bool(state.tools))  # the worker's tools are recorded
    child.send("/tools echo,calculator\r")
    await expect(child, "tools: echo, calculator (from the next model call)")
    child.send("/state\r")
    await expect(child, f"model: {other} · thinking: high · tools: echo, calculator (parallel)")
    await expect(child, "system prompt: Answer like a pirate.")
    child.send("ahoy\r")
    await expect(child, "configured answer")
    await leave(child, workflow_id)

    (request,) = stack.model_server.requests(other)
    assert request["messages"][0] == {"role": "system", "content": "Answer like a pirate."}
    assert request["reasoning_effort"] == "high"
    assert sorted(tool["function"]["name"] for tool in request["tools"]) == ["calculator", "echo"]
    assert stack.requests() == []


async def test_chat_clear_takes_queued_messages_back_into_the_input_line(stack: Stack) -> None:
    """The steering message comes back as the input line, the follow-up as
    a `/followup` line after it: each is sent again as what it was."""
    stack.script(
        {"tool_calls": [{"id": "call_slow", "name": "slow", "arguments": {"seconds": 6}}]},
        {"text": "got the edited steer"},
        {"text": "and the follow-up"},
    )
    child, workflow_id = await start_chat(stack)
    conversation = Conversation.attach(stack.client, workflow_id)

    child.send("run the slow tool\r")
    await expect(child, "⚙ slow(seconds=6)")
    child.send("steer one\r")
    await expect(child, "» steering: steer one")
    child.send("/followup later one\r")
    await expect(child, "» follow-up queued: later one")
    child.send("/clear\r")
    await expect(child, "took 1 steering message back into the input line")
    cleared = await conversation.state()
    child.send(" (edited)\r")  # the cursor is at the end of the restored text
    await expect(child, "» steering: steer one (edited)")
    child.send("\r")  # the next input line holds the follow-up
    await expect(child, "» follow-up queued: later one")
    await expect(child, "got the edited steer")
    await expect(child, "» follow-up: later one")
    await expect(child, "and the follow-up")
    await leave(child, workflow_id)

    assert (cleared.steering_queue, cleared.follow_up_queue) == (0, 0)
    messages = await conversation.messages()
    assert user_texts(messages) == ["run the slow tool", "steer one (edited)", "later one"]


async def test_chat_reset_is_refused_during_a_run_and_clears_the_conversation_after(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [{"id": "call_slow", "name": "slow", "arguments": {"seconds": 3}}]}, {"text": "done"}
    )
    child, workflow_id = await start_chat(stack)

    child.send("run the slow tool\r")
    await expect(child, "⚙ slow(seconds=3)")
    child.send("/reset\r")
    await expect(child, "✗ A run is active: abort it (or wait for it to end) before reset.")
    await expect(child, "· 2 turns")
    child.send("/reset\r")
    await expect(child, "The conversation was reset")
    child.send("/state\r")
    await expect(child, "idle · streaming: no · 0 turns in 0 runs · 0 messages")
    await leave(child, workflow_id)

    state = await Conversation.attach(stack.client, workflow_id).state()
    assert (state.message_count, state.runs, state.usage.total_tokens) == (0, 0, 0)


async def until_state(conversation: Conversation, check: Callable[[SessionState], bool]) -> None:
    for _ in range(200):
        if check(await conversation.state()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the state never got there")


# --- the starter's commands for pi's Agent API ---------------------------------------------------


async def test_starter_prompt_wait_streams_the_run_and_exits_by_how_it_ended(stack: Stack) -> None:
    stack.script({"text": "waited for"}, {"fault": {"kind": "400", "message": "bad request body"}})
    conversation = await stack.conversation()

    ok = await starter(stack.dev_server, "prompt", conversation.id, "first", "--wait")
    failed = await starter(stack.dev_server, "prompt", conversation.id, "second", "--wait")

    assert (ok[0], ok[1].count("waited for")) == (0, 1)
    assert "» first" in ok[1] and "· 1 turn" in ok[1]
    assert failed[0] == 1 and "bad request body" in failed[1]
    assert "waited for" not in failed[1]  # only this run's events


async def test_starter_configure_prints_the_settings_in_force(stack: Stack) -> None:
    conversation = await stack.conversation()
    await until_state(conversation, lambda state: bool(state.tools))

    code, stdout = await starter(
        stack.dev_server,
        "configure",
        conversation.id,
        "--model",
        "another-model",
        "--system",
        "Be brief.",
        "--thinking",
        "low",
        "--tools",
        "echo",
        "--steering-mode",
        "all",
        "--max-turns",
        "5",
    )

    assert code == 0
    in_force = json.loads(stdout)
    assert {
        k: in_force[k]
        for k in ("model", "systemPrompt", "thinkingLevel", "tools", "steeringMode", "maxTurns")
    } == {
        "model": "another-model",
        "systemPrompt": "Be brief.",
        "thinkingLevel": "low",
        "tools": ["echo"],
        "steeringMode": "all",
        "maxTurns": 5,
    }
    state = await conversation.state()
    assert (state.model, state.steering_mode, state.max_turns) == ("another-model", "all", 5)

    code, stdout = await starter(stack.dev_server, "configure", conversation.id)  # no option
    assert (code, json.loads(stdout)) == (0, in_force)
    # Every key, null where unset, as the update answers (SPEC 8; unset ones were left out).
    assert (in_force["maxCost"], in_force["approvalTimeoutSeconds"]) == (None, None)


async def test_starter_sets_and_clears_limits_with_none(stack: Stack) -> None:
    """`--approval-timeout` at the start (SPEC 9: a start/configure setting),
    and `none` in `configure` clears a limit, as null does in the update
    (only the Python client could before, an audit)."""
    code, stdout = await starter(stack.dev_server, "start", "--approval-timeout", "30", "--max-turns", "4")
    assert code == 0
    conversation = Conversation.attach(stack.client, stdout.strip())
    state = await conversation.state()
    assert (state.approval_timeout_seconds, state.max_turns) == (30, 4)

    code, stdout = await starter(
        stack.dev_server,
        "configure",
        conversation.id,
        "--max-cost",
        "2.5",
        "--max-total-tokens",
        "1000",
    )
    assert code == 0
    code, stdout = await starter(
        stack.dev_server,
        "configure",
        conversation.id,
        "--approval-timeout",
        "none",
        "--max-turns",
        "None",
        "--max-cost",
        "null",
        "--max-total-tokens",
        "none",
    )
    assert code == 0
    in_force = json.loads(stdout)
    limits = ("approvalTimeoutSeconds", "maxTurns", "maxCost", "maxTotalTokens")
    assert [in_force[k] for k in limits] == [None] * 4
    state = await conversation.state()
    assert (state.approval_timeout_seconds, state.max_turns, state.max_cost) == (None, None, None)
    await conversation.close()


async def test_starter_clear_prints_the_removed_messages_oldest_first(stack: Stack) -> None:
    stack.script({"tool_calls": [{"id": "call_slow", "name": "slow", "arguments": {"seconds": 30}}]})
    conversation = await stack.conversation()
    log = EventLog(stack.client, conversation.id)
    await conversation.prompt("work", wait=False)
    await log.wait_for_type("tool_execution_start")
    log.close()
    await conversation.follow_up("later")
    await until_state(conversation, lambda state: state.follow_up_queue == 1)
    await conversation.steer("now")
    await until_state(conversation, lambda state: state.steering_queue == 1)

    steering = await starter(stack.dev_server, "clear", conversation.id, "steering")
    rest = await starter(stack.dev_server, "clear", conversation.id)
    state = await conversation.state()
    await conversation.abort()
    await conversation.wait_for_idle()

    assert steering[0] == rest[0] == 0
    assert [m["content"] for m in json.loads(steering[1])] == ["now"]
    assert [(m["role"], m["content"]) for m in json.loads(rest[1])] == [("user", "later")]
    assert (state.is_streaming, state.steering_queue, state.follow_up_queue) == (True, 0, 0)


async def test_starter_approve_and_reject_decide_waiting_calls(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [guarded_call("call_a", "yes"), guarded_call("call_b", "no")]}, {"text": "done"}
    )
    conversation = await stack.conversation()
    log = EventLog(stack.client, conversation.id)
    waiting = asyncio.create_task(starter(stack.dev_server, "prompt", conversation.id, "go", "--wait"))
    await log.wait_for_type("tool_approval_request", 2)
    log.close()

    approved = await starter(stack.dev_server, "approve", conversation.id, "call_a")
    rejected = await starter(
        stack.dev_server, "approve", conversation.id, "call_b", "--reject", "--reason", "not today"
    )
    again = await starter_with_stderr(stack.dev_server, "approve", conversation.id, "call_b")

    assert approved == (0, "approved call_a\n")
    assert rejected == (0, "rejected call_b\n")
    assert again == (2, "", "error: No tool call 'call_b' is waiting for approval.\n")
    code, streamed = await waiting
    assert code == 0
    assert f"decide: python starter.py approve {conversation.id} call_b" in streamed
    assert "rejected: not today" in streamed and "done" in streamed
    results = tool_results((await conversation.wait_for_idle()).messages)
    assert results["call_a"] == (False, "approved: yes")
    assert results["call_b"][0] and "not today" in results["call_b"][1]


async def test_starter_wait_reset_and_fork(stack: Stack) -> None:
    stack.script({"text": "one"}, {"text": "two"}, {"text": "forked two"})
    conversation = await stack.conversation()
    await conversation.prompt("first")
    await conversation.prompt("second", wait=False)

    waited = await starter(stack.dev_server, "wait", conversation.id)
    forked = await starter(
        stack.dev_server, "fork", conversation.id, "--at", "2", "--id", f"{conversation.id}-f"
    )
    reset = await starter(stack.dev_server, "reset", conversation.id)

    assert waited == (0, '{"runs": 2, "stopReason": "stop"}\n')
    assert forked == (0, f"{conversation.id}-f\n")
    assert reset[0] == 0 and (await conversation.state()).message_count == 0
    fork = Conversation.attach(stack.client, f"{conversation.id}-f")
    assert user_texts(await fork.prompt("second, again")) == ["second, again"]
    assert user_texts(await fork.messages()) == ["first", "second, again"]
    await fork.close()


async def test_starter_errors_are_one_line_on_stderr_with_exit_2(stack: Stack) -> None:
    stack.script({"tool_calls": [{"id": "call_slow", "name": "slow", "arguments": {"seconds": 60}}]})
    conversation = await stack.conversation()
    await conversation.prompt("work", wait=False)
    missing = f"missing-{uuid.uuid4().hex[:6]}"

    cases = {
        (
            "prompt",
            conversation.id,
            "more",
        ): "error: A run is already active: send `steer` or `follow_up` instead",
        ("reset", conversation.id): "error: A run is active: abort it (or wait for it to end) before reset.",
        ("configure", conversation.id, "--model", ""): "error: The settings are invalid (model: ",
        ("fork", conversation.id, "--at", "9"): "error: The transcript has ",
        (
            "start",
            "--id",
            conversation.id,
        ): f"error: A conversation with the id {conversation.id} exists already",
        ("state", missing): f"error: No conversation has the id {missing}: check it, or start one",
        ("steer", missing, "hi"): f"error: No conversation has the id {missing}",
    }
    outcomes = {args: await starter_with_stderr(stack.dev_server, *args) for args in cases}
    still_running = (await conversation.state()).is_streaming
    await conversation.abort()
    await conversation.wait_for_idle()

    assert still_running  # every refusal above met an active run

    for args, start in cases.items():
        code, stdout, stderr = outcomes[args]
        assert (code, stdout) == (2, ""), args
        assert stderr.startswith(start) and stderr.count("\n") == 1, (args, stderr)


async def test_starter_list_shows_conversations_by_status_and_model(stack: Stack) -> None:
    idle = await stack.conversation()
    stack.script({"tool_calls": [guarded_call("call_g", "wait for me")]}, {"text": "done"})
    waiting = await stack.conversation()
    log = EventLog(stack.client, waiting.id)
    await waiting.prompt("ask", wait=False)
    await log.wait_for_type("tool_approval_request")
    log.close()

    async def listed(*filters: str) -> dict[str, str]:
        """id -> its line, once both conversations are listed as expected (visibility lags)."""
        lines: dict[str, str] = {}
        for _ in range(30):
            code, stdout = await starter(stack.dev_server, "list", "--model", stack.model, *filters)
            assert code == 0
            lines = {line.split()[0]: line for line in stdout.splitlines()}
            if waiting.id in lines and "awaiting-approval" in lines[waiting.id]:
                break
            await asyncio.sleep(0.3)
        return lines

    everything = await listed()
    only_waiting = await listed("--status", "awaiting-approval")
    await waiting.abort()

    assert set(everything) == {idle.id, waiting.id}
    assert everything[idle.id].split()[1:3] == ["idle", stack.model]
    assert set(only_waiting) == {waiting.id}


async def test_starter_list_shows_unknown_usage_as_a_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server without the Agent* search attributes keeps no usage: the
    line says it is unknown, not that the conversation used nothing."""
    import starter
    from client import ConversationSummary

    started = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    found = [
        ConversationSummary("plain", started, None, None, None, None, None),
        ConversationSummary("kept", started, "idle", "m", 3, 1234, 0.5),
    ]

    async def listing(*_: Any, **__: Any) -> Any:
        for summary in found:
            yield summary

    monkeypatch.setattr(starter, "list_conversations", listing)
    args = argparse.Namespace(status=None, model=None, limit=50)
    assert await starter.cmd_list(None, None, args) == 0  # type: ignore[arg-type]
    plain, kept = capsys.readouterr().out.splitlines()
    assert plain.split()[:7] == ["plain", "-", "-", "-", "turns", "-", "tokens"] and "$-" in plain
    assert kept.split()[:7] == ["kept", "idle", "m", "3", "turns", "1,234", "tokens"] and "$0.5000" in kept


async def test_starter_list_shows_each_conversation_once_and_how_an_ended_one_ended(stack: Stack) -> None:
    """One line per conversation, not per run of it (a conversation that
    continued as new has several), and a conversation that ended without
    closing says how: a terminated one listed `running` and a start refused
    for its input `? ?`."""
    stack.script({"text": "one"}, {"text": "two"})
    switched = await stack.start(prompt="first", continueAsNewAfterTurns=1)
    await switched.execute_update("wait_for_idle")
    await switched.execute_update("prompt", "second")
    await switched.execute_update("wait_for_idle")
    stack.script({"text": "slow", "fault": {"kind": "stall", "after_chunks": 2, "seconds": 30}})
    terminated = await stack.start(prompt="hang on")
    while not (await terminated.query("state"))["isStreaming"]:
        await asyncio.sleep(0.05)
    await terminated.terminate("operator")
    refused = await stack.start(sytemPrompt="misspelt")
    with pytest.raises(WorkflowFailureError):
        await refused.result()
    ids = {switched.id, terminated.id, refused.id}

    lines: list[str] = []
    for _ in range(30):
        code, stdout = await starter(stack.dev_server, "list", "--limit", "200")
        assert code == 0
        lines = [line for line in stdout.splitlines() if line.split()[0] in ids]
        if {line.split()[0] for line in lines} == ids and "idle" in "".join(lines):
            break
        await asyncio.sleep(0.3)
    by_id: dict[str, list[str]] = {}
    for line in lines:
        by_id.setdefault(line.split()[0], []).append(line)
    assert {k: len(v) for k, v in by_id.items()} == dict.fromkeys(ids, 1)
    assert by_id[switched.id][0].split()[1:3] == ["idle", stack.model]
    assert by_id[terminated.id][0].split()[1:3] == ["terminated", stack.model]
    assert by_id[refused.id][0].split()[1:3] == ["failed", "-"]
    await switched.signal("close")


async def test_starter_settings_errors_are_one_line_and_it_runs_from_any_directory(
    dev_server: DevServer, tmp_path: Path
) -> None:
    code, stdout, stderr = await starter_with_stderr(dev_server, "list", env={"AGENT_STORAGE": "bogus"})
    assert (code, stdout) == (2, "")
    assert stderr.startswith("error: AGENT_STORAGE must be 'file', 'off'") and stderr.count("\n") == 1
    # The default store under the working directory (say, run from the home
    # directory): only a worker, whose tools read that directory, refuses it.
    home = {"AGENT_DATA_DIR": str(tmp_path / "data"), "AGENT_WORKSPACE": "", "AGENT_STORAGE_DIR": ""}
    code, _, stderr = await starter_with_stderr(dev_server, "list", env=home, cwd=tmp_path)
    assert code == 0, stderr
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "worker.py"),
        cwd=tmp_path,
        env={**client_env(dev_server), **home},
        stderr=asyncio.subprocess.PIPE,
    )
    _, werr = await asyncio.wait_for(worker.communicate(), TIMEOUT)
    assert worker.returncode == 2
    assert (
        werr.decode().startswith("error: The payload store")
        and "inside the tools' workspace" in werr.decode()
    )


CLOSED = "The conversation was closed.\n"  # how it ended: on stderr with --json


async def test_watch_says_when_older_events_are_no_longer_kept(capsys: pytest.CaptureFixture[str]) -> None:
    """A long conversation keeps only its latest events across
    continue-as-new: `watch --from 10` began at offset 686 without a word
    (a stream audit), mid-run. It says so on stderr; stdout stays events."""
    from console.watch import watch

    class Kept:
        """Offsets as ``client.follow`` yields them, calling ``on_skipped`` where they jump."""

        id = "long"

        def __init__(self, *offsets: int) -> None:
            self.offsets = offsets

        async def ended_on_task_queue(self) -> str:
            return "agent"

        async def how_it_ended(self) -> str:
            return CLOSED.strip()

        async def events(self, from_offset: int, on_skipped: Any = None) -> Any:
            expected = from_offset
            for offset in self.offsets:
                if offset > expected:
                    on_skipped(expected, offset)
                expected = offset + 1
                yield offset, {"type": "turn_end"}

    await watch(Kept(686, 687), as_json=True, from_offset=10)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert [json.loads(line)["offset"] for line in out.splitlines()] == [686, 687]
    assert err == "note: events before offset 686 are no longer kept; reading from 686.\n" + CLOSED
    await watch(Kept(686, 687), as_json=True, from_offset=686)  # type: ignore[arg-type]
    assert capsys.readouterr().err == CLOSED
    # A reader that fell behind while the run continued as new (a stream
    # audit: 87 events gone, 26 tool calls never got a result, no word).
    await watch(Kept(128, 216, 217), as_json=True, from_offset=128)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert [json.loads(line)["offset"] for line in out.splitlines()] == [128, 216, 217]
    assert err == (
        "note: events 129 to 215 are no longer kept (the conversation continued as new and carried only "
        "its latest events before they were read); reading from 216.\n" + CLOSED
    )


@pytest.mark.parametrize("offset", ["-5", "-1"])
def test_watch_refuses_a_negative_offset(capsys: pytest.CaptureFixture[str], offset: str) -> None:
    """`--from -5` read from 0 as if nothing was wrong."""
    import starter

    with pytest.raises(SystemExit) as raised:
        starter.build_parser().parse_args(["watch", "x", "--from", offset])
    assert raised.value.code == 2
    assert f"an offset is 0 or more, not {offset}" in capsys.readouterr().err


async def test_watch_says_how_the_conversation_ended(stack: Stack) -> None:
    """A terminated or failed conversation printed "The conversation has
    ended." like a closed one (a stream audit)."""
    stack.script({"text": "before the end"})
    handle = await stack.start(prompt="hi")
    await stack.events(handle.id)
    await handle.terminate("by the operator")

    code, stdout = await starter(stack.dev_server, "watch", handle.id)

    assert code == 0
    assert "before the end" in stdout and "The conversation was terminated." in stdout

    # Closed (`close`, or `closeWhenIdle`) printed "The conversation has ended." (an operations audit).
    closed = await stack.start()
    await closed.signal("close")
    await closed.result()
    code, stdout = await starter(stack.dev_server, "watch", closed.id)
    assert code == 0 and "The conversation was closed." in stdout


async def test_a_request_no_worker_takes_is_noted_and_ctrl_c_stops_only_the_wait(stack: Stack) -> None:
    """With the worker killed, `prompt` and `configure` waited with no word,
    Ctrl-C printed a traceback, and the prompt was applied once a worker
    came back (a durability audit): the CLI says so after 5 s, and at
    Ctrl-C that the request is kept."""
    handle = await stack.client.start_workflow(
        "AgentWorkflow", {}, id=f"nobody-{uuid.uuid4().hex[:8]}", task_queue="no-worker-here"
    )
    process = await spawn_starter(stack.dev_server, "prompt", handle.id, "hello")
    assert process.stderr is not None
    try:
        line = await asyncio.wait_for(process.stderr.readline(), 20)
        assert line.decode().startswith(
            "note: prompt has waited 5 s for a worker on 'no-worker-here': is one running? It is kept "
            "and applies when one takes it"
        ), line
        process.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(process.stderr.read(), 20)
        assert await process.wait() == 130
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await handle.terminate("test")
    assert rest.decode() == (
        "note: Stopped waiting for prompt: what was sent is kept, and applies when a worker takes it "
        "(unless the Temporal server restarts first: see `state` before sending it again).\n"
    )


async def test_watch_of_a_running_conversation_no_worker_takes_says_what_it_waits_for(stack: Stack) -> None:
    """A running conversation whose only worker is gone (here, never
    started) showed `watch` nothing at all (a durability audit): after 5 s
    without an event it says which step waits, on which task queue."""
    handle = await stack.client.start_workflow(
        "AgentWorkflow", {"prompt": "hi"}, id=f"nobody-{uuid.uuid4().hex[:8]}", task_queue="no-worker-here"
    )
    try:
        line = await _first_note_of_watch(stack, handle.id, 30)
    finally:
        await handle.terminate("test")
    assert line.decode().startswith(
        f"note: {handle.id} waits for a worker on task queue 'no-worker-here': its next workflow task "
        "has not been taken for "
    ), line
    assert line.decode().endswith(
        " s: no worker runs there, or all are busy. The conversation goes on when one takes it.\n"
    ), line


async def test_a_query_no_worker_answers_is_noted_then_refused_with_a_sentence(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chat` attached to a conversation with no worker (or `state`, or
    `messages`) said nothing for 30 s (the SDK's deadline), then "error:
    Timeout expired": the CLI notes the wait after 5 s, and the refusal
    says what answers a query."""
    import client

    handle = await stack.client.start_workflow(
        "AgentWorkflow", {}, id=f"nobody-{uuid.uuid4().hex[:8]}", task_queue="no-worker-here"
    )
    process = await spawn_starter(stack.dev_server, "state", handle.id)
    assert process.stderr is not None
    try:
        line = await asyncio.wait_for(process.stderr.readline(), 20)
    finally:
        process.kill()
        await process.wait()
    assert line.decode() == (
        "note: state has waited 5 s for a worker on 'no-worker-here' to answer it: is one running?\n"
    )
    monkeypatch.setattr(client, "QUERY_WAIT", timedelta(seconds=2))
    conversation = Conversation.attach(stack.client, handle.id)
    with pytest.raises(client.Refused) as refused:
        await conversation.messages()
    assert str(refused.value) == (
        f"Conversation {handle.id} did not answer `messages` within 2 s: no worker on task queue "
        "'no-worker-here' answered (none runs there, or all are busy). Start one, then ask again."
    )

    async def unknown(self: Conversation) -> None:
        return None  # the server did not say (a review read "task queue its task queue")

    monkeypatch.setattr(Conversation, "_task_queue_name", unknown)
    with pytest.raises(client.Refused) as refused:
        await conversation.state()
    await handle.terminate("test")
    assert "did not answer `state` within 2 s: no worker on its task queue answered" in str(refused.value)


async def test_watch_of_a_failed_conversation_says_why_it_failed(stack: Stack) -> None:
    """It said "see the workflow in the Temporal UI", which shows only
    "Encoded failure" when the workers encrypt (a design audit): the reason
    is read through the client's converter, as `prompt --wait` does."""
    handle = await stack.start(prompt="hi", sytemPrompt="misspelt")
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    code, stdout = await starter(stack.dev_server, "watch", handle.id)
    assert code == 0
    assert "The conversation failed (" in stdout and "sytemPrompt" in stdout, stdout


async def test_watch_of_an_ended_conversation_no_worker_can_replay_says_what_it_waits_for(
    stack: Stack, worker_env: dict[str, str], artifacts: Path
) -> None:
    """Its events are read by a query a worker answers: with none on its task
    queue, `watch` printed nothing at all (a README audit waited 30 s). One
    that ended before any worker took it has no events to replay: `watch`
    says how it ended at once."""
    task_queue = f"gone-{uuid.uuid4().hex[:6]}"
    worker = start_worker(
        {**worker_env, "TEMPORAL_TASK_QUEUE": task_queue}, [], artifacts / "gone-worker.log"
    )
    try:
        handle = await stack.client.start_workflow(
            "AgentWorkflow", {}, id=f"gone-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        await Conversation.attach(stack.client, handle.id).state()  # its first task ran
    finally:
        stop_process(worker)
    await handle.terminate("test")
    line = await _first_note_of_watch(stack, handle.id, 20)
    assert line.decode().startswith(
        "note: nothing read yet: the conversation has ended, and reading its events needs a worker on "
        f"task queue '{task_queue}' to replay it; waiting for one."
    ), line

    never_ran = await stack.client.start_workflow(
        "AgentWorkflow", {}, id=f"nobody-{uuid.uuid4().hex[:8]}", task_queue="no-worker-here"
    )
    await never_ran.terminate("test")
    code, stdout = await asyncio.wait_for(starter(stack.dev_server, "watch", never_ran.id), 20)
    assert (code, stdout.strip()) == (0, "The conversation was terminated.")


async def _first_note_of_watch(stack: Stack, conversation_id: str, timeout: float) -> bytes:
    """The first line `watch` prints on stderr (it is stopped then)."""
    process = await spawn_starter(stack.dev_server, "watch", conversation_id)
    assert process.stderr is not None
    try:
        return await asyncio.wait_for(process.stderr.readline(), timeout)
    finally:
        process.kill()
        await process.wait()


async def test_a_lost_server_is_one_note_not_the_sdks_log_lines(tmp_path: Path) -> None:
    """A `watch` attached through a server outage printed the SDK core's
    retry warnings, 35 coloured lines a minute (a durability audit)."""
    server = DevServer(log_path=tmp_path / "server.log").start()
    try:
        code, _, _ = await starter_with_stderr(server, "start", "--id", "outage")
        assert code == 0
        process = await spawn_starter(server, "watch", "outage")
        assert process.stderr is not None
        await asyncio.sleep(5)  # connected and reading (a starter starts in ~1.5 s)
    finally:
        server.stop()
    try:
        line = await asyncio.wait_for(process.stderr.readline(), 60)
        process.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(process.stderr.read(), 20)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
    assert (
        line.decode()
        == f"note: the Temporal server at {server.address} does not answer; retrying until it does.\n"
    )
    assert rest == b"note: stopped watching; the conversation goes on.\n"


async def test_chat_text_typed_while_a_call_waits_for_approval_steers_the_run(stack: Stack) -> None:
    """A run waiting for approval is active ("awaiting-approval"): a line
    that is not y/n steers it, and /abort aborts it; neither is refused as
    "no run is active"."""
    stack.script({"tool_calls": [guarded_call("call_a", "hello")]}, {"text": "never reached"})
    child, workflow_id = await start_chat(stack)

    child.send("echo once\r")
    await expect(child, "approve guarded_echo (call_a)? y/n")
    child.send("also mention the weather\r")
    await expect(child, "» steering: also mention the weather")
    child.send("/abort\r")
    await expect(child, "aborting the run")
    await expect(child, "Request was aborted")
    await leave(child, workflow_id)

    idle = await Conversation.attach(stack.client, workflow_id).wait_for_idle()
    assert idle.stop_reason == "aborted"


async def test_chat_ctrl_c_after_an_aborted_run_aborts_the_next_run_too(stack: Stack) -> None:
    """ "Ctrl-C aborts the run; a second Ctrl-C, or one while idle, leaves":
    a Ctrl-C that aborted one run does not make the Ctrl-C of a later run
    (after a line was typed) leave the chat."""
    slow = {"name": "slow", "arguments": {"seconds": 5}}
    stack.script({"tool_calls": [{"id": "call_one", **slow}]}, {"tool_calls": [{"id": "call_two", **slow}]})
    child, workflow_id = await start_chat(stack)

    await abort_with_ctrl_c(child, "run the slow tool", "⚙ slow(seconds=5)")
    await abort_with_ctrl_c(
        child, "run it again", "⚙ slow(seconds=5)", "aborting the run (Ctrl-C again leaves the chat)"
    )
    await leave(child, workflow_id)

    idle = await Conversation.attach(stack.client, workflow_id).wait_for_idle()
    assert (idle.runs, idle.stop_reason) == (2, "aborted")


async def test_run_closes_the_conversation_once_its_run_ends(stack: Stack) -> None:
    """``run``: "start, stream the answer, close" (README): the conversation
    does not stay open after the answer (one left open per `run`)."""
    stack.script({"text": "and closed"})
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    code, stdout = await starter(stack.dev_server, "run", "hi", "--model", stack.model, "--id", run_id)

    assert (code, stdout.count("and closed")) == (0, 1)
    handle = stack.client.get_workflow_handle(run_id)
    await asyncio.wait_for(handle.result(), 15)
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED


async def test_start_passes_its_settings_to_the_conversation(stack: Stack) -> None:
    """``start``/``run``/``chat`` take --model, --system, --thinking, --tools and --max-turns."""
    code, stdout = await starter(
        stack.dev_server,
        "start",
        "--model",
        stack.model,
        "--system",
        "Be terse.",
        "--thinking",
        "low",
        "--tools",
        "echo,calculator",
        "--max-turns",
        "3",
    )

    assert code == 0
    state = await Conversation.attach(stack.client, stdout.strip()).state()
    assert (state.model, state.system_prompt, state.thinking_level) == (stack.model, "Be terse.", "low")
    assert (sorted(state.tools or []), state.max_turns) == (["calculator", "echo"], 3)


async def test_prompt_without_wait_says_which_run_started_and_where_its_events_start(stack: Stack) -> None:
    """`prompt ID TEXT` prints the run and its first event's offset, for
    `watch ID --from OFFSET`."""
    stack.script({"text": "answered"})
    conversation = await stack.conversation()

    code, stdout = await starter(stack.dev_server, "prompt", conversation.id, "hi")

    assert code == 0
    match = re.fullmatch(r"run 1 started \(events from offset (\d+)\)\n", stdout)
    assert match, stdout
    async for offset, event in conversation.events(int(match.group(1))):
        assert (offset, event["type"]) == (int(match.group(1)), "agent_start")
        break


async def test_watch_says_how_to_decide_a_call_waiting_for_approval(stack: Stack) -> None:
    """`watch` prints, under an approval request, the command that decides
    it from another terminal (as `run` does)."""
    stack.script({"tool_calls": [guarded_call("call_a", "hello")]}, {"text": "decided"})
    conversation = await stack.conversation(close_when_idle=True)
    log = EventLog(stack.client, conversation.id)
    await conversation.prompt("echo", wait=False)
    await log.wait_for_type("tool_approval_request", 1)
    log.close()
    await conversation.approve("call_a")
    await conversation.result()

    code, stdout = await starter(stack.dev_server, "watch", conversation.id)

    assert code == 0
    assert f"decide: python starter.py approve {conversation.id} call_a [--reject]" in stdout


async def test_watch_from_starts_at_that_offset(stack: Stack) -> None:
    """`watch ID --from N` prints the events from offset N on, not from 0."""
    stack.script({"text": "one"})
    conversation = await stack.conversation(close_when_idle=True)
    await conversation.prompt("hi", wait=False)
    await conversation.result()

    code, stdout = await starter(stack.dev_server, "watch", conversation.id, "--json", "--from", "3")

    offsets = [json.loads(line)["offset"] for line in stdout.splitlines()]
    assert code == 0 and offsets and offsets[0] == 3, stdout


async def test_starter_wait_exits_1_when_the_run_ended_in_error(stack: Stack) -> None:
    """`wait ID`: "exit 1: it ended in error" (its help), and why on
    stderr, as `prompt --wait` says it (the JSON alone sent users to
    `state`: a new user's audit)."""
    stack.script({"fault": {"kind": "400", "message": "bad request body"}})
    conversation = await stack.conversation()
    await conversation.prompt("hi")

    assert await starter_with_stderr(stack.dev_server, "wait", conversation.id) == (
        1,
        '{"runs": 1, "stopReason": "error"}\n',
        "✗ The model server answered 400: bad request body\n",
    )


async def test_starter_stop_ends_the_run_after_its_turn_not_aborted(stack: Stack) -> None:
    """`stop ID` lets the current turn finish (its tool result is kept);
    it does not abort it. (The call waits for approval until the stop is
    in: a timed tool raced the CLI's start on a loaded machine.)"""
    guarded = {"name": "guarded_echo", "arguments": {"text": "kept"}}
    stack.script({"tool_calls": [{"id": "call_stop", **guarded}]}, {"text": "not asked"})
    conversation = await stack.conversation()
    log = EventLog(stack.client, conversation.id)
    await conversation.prompt("run the guarded tool", wait=False)
    await log.wait_for_type("tool_approval_request", 1)
    log.close()

    assert await starter(stack.dev_server, "stop", conversation.id) == (
        0,
        f"sent stop_after_turn to {conversation.id}\n",
    )
    await conversation.approve("call_stop")
    idle = await conversation.wait_for_idle()

    assert idle.stop_reason != "aborted"
    assert [m.role for m in idle.messages] == ["user", "assistant", "toolResult"]
    assert [m.is_error for m in idle.messages if m.role == "toolResult"] == [False]


async def test_prompt_wait_fails_when_the_conversation_ends_before_its_run(stack: Stack) -> None:
    """`prompt ID TEXT --wait` whose conversation is terminated mid-run does
    not exit 0 as if the run had ended well."""
    stack.script({"tool_calls": [{"id": "call_slow", "name": "slow", "arguments": {"seconds": 5}}]})
    conversation = await stack.conversation()
    log = EventLog(stack.client, conversation.id)
    process = await spawn_starter(stack.dev_server, "prompt", conversation.id, "hi", "--wait")
    await log.wait_for_type("tool_execution_start", 1)
    log.close()
    await conversation.handle.terminate("by the operator")

    _, stderr = await asyncio.wait_for(process.communicate(), 20)

    assert process.returncode == 2, stderr
    assert f"error: Conversation {conversation.id} ended before run 1 did." in stderr.decode()


class _Recorded:
    """A conversation that records what the chat sends (no server)."""

    id = "c"

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    async def approve(self, call_id: str, approved: bool, reason: str | None) -> None:
        self.sent.append(("approve", call_id, approved, reason))

    async def steer(self, text: str) -> None:
        self.sent.append(("steer", text))

    async def send_prompt(self, text: str) -> None:
        self.sent.append(("prompt", text))

    async def state(self) -> Any:
        return SimpleNamespace(status="awaiting-approval")


async def test_chat_yes_and_no_decide_the_oldest_call_like_y_and_n() -> None:
    """`yes` / `no REASON` decide as `y` / `n` do (case aside): a typed
    "yes" is not sent to the model as steering while the call goes on waiting."""
    recorded = _Recorded()
    chat = ChatSession(recorded)  # type: ignore[arg-type]
    chat._renderer = EventRenderer(Console(file=io.StringIO()))
    for call_id in ("c1", "c2"):
        request = {"toolCallId": call_id, "toolName": "x", "args": {}, "reason": "r"}
        chat._observe({"type": "tool_approval_request", **request})

    assert await chat._act("Yes")
    assert await chat._act("NO too risky")

    assert recorded.sent == [("approve", "c1", True, None), ("approve", "c2", False, "too risky")]


def test_chat_forgets_a_call_decided_elsewhere_once_it_ran() -> None:
    """A call approved from another terminal runs (its ``tool_execution_end``):
    the chat no longer asks "approve ...? y/n" for it, and a `y` goes to the
    next waiting call, not to the decided one."""
    chat = ChatSession(None)  # type: ignore[arg-type]  # no conversation is reached
    chat._renderer = EventRenderer(Console(file=io.StringIO()))
    for call_id in ("c1", "c2"):
        request = {"toolCallId": call_id, "toolName": "x", "args": {}, "reason": "r"}
        chat._observe({"type": "tool_approval_request", **request})
    chat._observe(
        {"type": "tool_execution_end", "toolCallId": "c1", "toolName": "x", "result": {}, "isError": False}
    )
    assert list(chat._approvals) == ["c2"]


async def test_chat_approve_and_reject_decide_the_call_they_name() -> None:
    """`/approve CALL_ID` approves that call, not the oldest waiting one."""
    recorded = _Recorded()
    chat = ChatSession(recorded)  # type: ignore[arg-type]
    chat._renderer = EventRenderer(Console(file=io.StringIO()))
    for call_id in ("c1", "c2", "c3"):
        request = {"toolCallId": call_id, "toolName": "x", "args": {}, "reason": "r"}
        chat._observe({"type": "tool_approval_request", **request})

    assert await chat._act("/approve c2")
    assert await chat._act("/reject c3 not that one")

    assert recorded.sent == [("approve", "c2", True, None), ("approve", "c3", False, "not that one")]
    assert list(chat._approvals) == ["c1"]


# --- input that is not typed ---------------------------------------------------------------


async def _user_texts(stack: Stack, conversation_id: str, count: int) -> list[str]:
    """The conversation's user messages, once it has ``count`` of them."""
    conversation = Conversation(stack.client, conversation_id)
    for _ in range(100):
        texts = [m.content for m in await conversation.messages() if isinstance(m, UserMessage)]
        if len(texts) >= count:
            return [t if isinstance(t, str) else "" for t in texts]
        await asyncio.sleep(0.1)
    raise AssertionError(f"{conversation_id} has {texts}")


async def test_chat_reads_a_file_redirected_to_it_line_by_line_whatever_its_bytes(
    stack: Stack, tmp_path: Path
) -> None:
    """`chat < file` sent nothing and exited 0 (prompt_toolkit's editor read
    the file as no input); a line that is not UTF-8 ended in a traceback;
    a last line without a newline was dropped (an operator audit)."""
    stack.script({"text": "one"}, {"text": "two"})
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"hi\ncaf\xe9 and more")  # no newline at the end
    conversation_id = f"chat-file-{uuid.uuid4().hex[:6]}"
    with lines.open("rb") as given:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "starter.py"),
            "chat",
            "--id",
            conversation_id,
            "--model",
            stack.model,
            cwd=ROOT,
            env=client_env(stack.dev_server),
            stdin=given,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT)

    assert process.returncode == 0 and b"Traceback" not in stderr, stderr
    assert await _user_texts(stack, conversation_id, 2) == ["hi", "caf\ufffd and more"]
    # It left once the answers were shown (it left at once, the answers unseen).
    assert b"two" in stdout and stdout.index(b"two") < stdout.index(b"Left the chat"), stdout


async def _chat_piped(stack: Stack, given: bytes, *args: str) -> tuple[bytes, bytes]:
    """``starter.py chat ARGS`` with ``given`` piped in: its stdout and
    stderr, once it exited 0 without a traceback."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "starter.py"),
        "chat",
        *args,
        cwd=ROOT,
        env=client_env(stack.dev_server),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(given), TIMEOUT)
    assert process.returncode == 0 and b"Traceback" not in stderr, stderr
    return stdout, stderr


async def test_piped_chat_output_is_not_cut_to_a_width(stack: Stack) -> None:
    """Piped, the chat cut its lines at 80 columns, some mid-word ("talk t"
    / "o a real model": a new user's audit)."""
    answer = " ".join(f"word{i}" for i in range(40))  # ~270 characters
    stack.script({"text": answer})
    stdout, _ = await _chat_piped(stack, b"hello\n", "--model", stack.model)
    assert answer.encode() in stdout, stdout


async def test_piped_quit_on_a_terminated_conversation_says_how_it_ended(stack: Stack) -> None:
    """A piped `/quit` is read before the stream tells the chat the
    conversation had ended: it said "Left the chat; the conversation goes
    on" of one that was terminated (a README audit)."""
    stack.script({"text": "hello"})
    conversation = await stack.conversation()
    await conversation.prompt("hi")
    await conversation.handle.terminate("by an operator")
    stdout, stderr = await _chat_piped(stack, b"/quit\n", "--id", conversation.id)

    assert b"goes on" not in stdout, (stdout, stderr)
    assert b"terminated" in stdout and b"starter.py fork" in stdout, stdout


async def test_piped_chat_leaves_when_a_call_waits_for_approval(stack: Stack) -> None:
    """Input that ends while a call waits for a decision: no line is left
    to give it, and the chat waited for good (an audit). It leaves, saying
    how to decide the call; the call still waits."""
    stack.script({"tool_calls": [guarded_call("call_p", "x")]}, {"text": "done"})
    conversation_id = f"chat-approval-{uuid.uuid4().hex[:6]}"
    stdout, _ = await _chat_piped(stack, b"please\n", "--id", conversation_id, "--model", stack.model)

    said = b" ".join(stdout.split())  # wrapped at the terminal's width
    assert b"call_p wait for approval" in said, stdout
    assert f"python starter.py approve {conversation_id} CALL_ID".encode() in said, stdout
    conversation = Conversation.attach(stack.client, conversation_id)
    assert [a.tool_call_id for a in (await conversation.state()).pending_approvals] == ["call_p"]
    await conversation.close()


async def test_chat_on_a_conversation_that_ended_with_no_state_says_it_starts_a_new_one(stack: Stack) -> None:
    """Attaching by id to a conversation terminated before any worker took
    it started a new conversation under that id without a word."""
    conversation_id = f"chat-ended-{uuid.uuid4().hex[:6]}"
    handle = await stack.client.start_workflow(
        "AgentWorkflow", {"model": stack.model}, id=conversation_id, task_queue="no-worker-here"
    )
    await handle.terminate("before any worker")
    _, stderr = await _chat_piped(stack, b"/quit\n", "--id", conversation_id, "--model", stack.model)

    assert b"was terminated before any worker took it" in stderr, stderr
    assert b"Starting a new one with that id." in stderr, stderr


async def test_an_argument_that_is_not_utf8_is_sent_with_a_replacement(stack: Stack) -> None:
    """`starter.py steer ID $'caf\\xe9'` ended in a traceback (a lone
    surrogate no payload can carry), as did every command taking text."""
    conversation = await stack.conversation()
    stack.script({"text": "ok"})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "starter.py"),
        "follow-up",
        conversation.id,
        b"caf\xe9",
        cwd=ROOT,
        env=client_env(stack.dev_server),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT)

    assert process.returncode == 0 and not stderr, stderr
    assert await _user_texts(stack, conversation.id, 1) == ["caf\ufffd"]


async def test_ctrl_c_in_run_aborts_its_run_and_says_so(stack: Stack) -> None:
    """It exited 130 without a word and the run went on, billed, to its end
    (an operator audit); the chat's first Ctrl-C already aborts its run."""
    stack.script({"text": "a long answer " * 50, "delay_ms": 20})
    process = await spawn_starter(stack.dev_server, "run", "tell me", "--model", stack.model)
    assert process.stdout is not None and process.stderr is not None
    try:
        started = (await asyncio.wait_for(process.stderr.readline(), 20)).decode()
        conversation_id = started.split()[1].rstrip(":")
        await asyncio.wait_for(process.stdout.readuntil(b"a long answer"), 20)  # the answer is streaming
        process.send_signal(signal.SIGINT)
        rest = (await asyncio.wait_for(process.stderr.read(), 20)).decode()
        answer = (await asyncio.wait_for(process.stdout.read(), 20)).decode()
        assert await process.wait() == 130
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    assert rest.strip() == f"note: aborted the run; conversation {conversation_id} closes itself", rest
    assert answer.endswith("\n"), "the answer cut short ends its line (a new user's audit)"
    handle = stack.client.get_workflow_handle(conversation_id)
    result = await asyncio.wait_for(handle.result(), 20)
    assert result["messages"][-1]["stopReason"] == "aborted"


async def test_chat_attached_while_an_answer_streams_shows_it_so_far_then_the_rest(stack: Stack) -> None:
    """A chat re-attached mid-answer showed none of it while it streamed (a
    user audit): it shows the answer so far at once, then streams the rest."""
    answer = " ".join(f"w{i}" for i in range(30))  # one line of the pty's 120 columns
    stack.script({"text": answer, "chunk_chars": 3, "delay_ms": 300})  # ~11 s
    conversation = await stack.conversation()
    await conversation.send_prompt("stream slowly")
    await until_state(conversation, lambda s: "w1 " in _streamed_text(s))

    child, screen = spawn_chat(stack.dev_server, "--id", conversation.id)
    try:
        await expect(child, "w0 w1 ")
        assert (await conversation.state()).streaming_message is not None  # shown before its end
        await expect(child, "· 1 turn")
        child.send("/quit\r")
        await child.expect(pexpect.EOF, async_=True)
    finally:
        child.close(force=True)
    assert answer in re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", screen.getvalue())


def _streamed_text(state: SessionState) -> str:
    message = state.streaming_message
    return "".join(getattr(block, "text", "") for block in message.content) if message else ""
