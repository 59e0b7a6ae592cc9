"""The live clients: the event renderer, ``watch``, ``run`` and the terminal chat.

The renderer and the chat's output writer are tested with hand-made events;
the commands run as real ``starter.py`` processes against the dev server and
the shared worker, the chat inside a pseudo-terminal driven by pexpect.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pexpect
import pytest
from rich.console import Console
from temporalio.client import WorkflowExecutionStatus
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from console.above_prompt import AbovePromptWriter
from console.render import EventRenderer
from testbed.local_stack import DevServer
from tests.support.stack import Stack
from workflows.models import EVENTS_TOPIC

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 20


# --- hand-made events ---------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text, "timestamp": 1}


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
    renderer = EventRenderer(Console(file=out, width=100, **{"force_terminal": False, **console}))
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
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "starter.py",
        *args,
        cwd=ROOT,
        env=client_env(dev_server),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode is not None
    return process.returncode, stdout.decode()


async def test_watch_json_prints_one_event_per_line_like_a_subscriber(stack: Stack) -> None:
    stack.script({"text": "watch this"})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    await handle.result()
    subscriber = WorkflowStreamClient.create(stack.client, handle.id).subscribe(
        [EVENTS_TOPIC], poll_cooldown=timedelta(milliseconds=20)
    )
    expected = [(item.offset, item.data) async for item in subscriber]

    code, stdout = await starter(stack.dev_server, "watch", handle.id, "--json")

    lines = [json.loads(line) for line in stdout.splitlines()]
    assert code == 0
    assert [(line.pop("offset"), line) for line in lines] == expected
    assert [offset for offset, _ in expected] == sorted({offset for offset, _ in expected})


async def test_run_streams_the_answer_once(stack: Stack) -> None:
    stack.script({"text": "streamed only once", "chunk_chars": 3})

    code, stdout = await starter(stack.dev_server, "run", "hi", "--model", stack.model)

    assert (code, stdout.count("streamed only once")) == (0, 1)


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

    child.send("run the slow tool\r")
    await expect(child, "⚙ slow(seconds=3)")
    child.sendcontrol("c")
    await expect(child, "aborting the run")
    await expect(child, "Request was aborted")
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
