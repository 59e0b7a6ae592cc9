"""The terminal chat's commands, told apart without a server: a fake
conversation records what the chat would send, ``capsys`` what it says."""

from __future__ import annotations

import asyncio
import io
import signal
from typing import Any

import pytest
from prompt_toolkit.formatted_text import fragment_list_to_text, to_formatted_text
from rich.console import Console
from temporalio.service import RPCError, RPCStatusCode

from client import Conversation, Refused, StoppedWaiting
from console.chat import ChatSession, _attach_or_start, _describe
from console.render import EventRenderer
from tests.support.recording_conversation import RecordingConversation
from workflows.contract import SessionState
from workflows.models import Usage, UserMessage


def _state(**fields: Any) -> SessionState:
    base: dict[str, Any] = {
        "status": "idle",
        "is_streaming": False,
        "pending_tool_calls": [],
        "message_count": 0,
        "steering_queue": 0,
        "follow_up_queue": 0,
        "turns": 0,
        "runs": 0,
        "usage": Usage(),
        "event_offset": 0,
    }
    return SessionState(**{**base, **fields})


class _Fake(RecordingConversation):
    """A conversation that records what the chat sends (no server)."""

    id = "c"

    def __init__(self, **state: Any) -> None:
        super().__init__()
        self.current = _state(**state)
        self.queued: dict[str, list[UserMessage]] = {"steering": [], "followUp": []}

    async def state(self) -> SessionState:
        return self.current

    async def send_prompt(self, text: str) -> None:
        self.sent.append(("prompt", text))

    async def approve(self, call_id: str, approved: bool, reason: str | None) -> None:
        self.sent.append(("approve", call_id, approved, reason))

    async def clear_queues(self, which: str) -> list[UserMessage]:
        self.sent.append(("clear_queues", which))
        removed: list[UserMessage] = []
        for queue in ("steering", "followUp") if which == "all" else (which,):
            removed += self.queued[queue]
            self.queued[queue] = []
        return removed

    async def configure(self, **settings: Any) -> SessionState:
        self.sent.append(("configure", settings))
        self.current = self.current.model_copy(update=settings)
        return self.current


def _chat(conversation: Any) -> ChatSession:
    chat = ChatSession(conversation)
    chat._renderer = EventRenderer(Console(file=io.StringIO()))
    return chat


def _request(call_id: str) -> dict[str, Any]:
    return {
        "type": "tool_approval_request",
        "toolCallId": call_id,
        "toolName": "x",
        "args": {},
        "reason": "r",
    }


# --- runs ------------------------------------------------------------------------


async def test_an_empty_line_sends_nothing() -> None:
    fake = _Fake()
    chat = _chat(fake)
    assert await chat._act("")
    assert await chat._act("   ")
    assert fake.sent == []


async def test_a_prompt_refused_as_another_client_started_a_run_steers_that_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two chats pressed Enter at once: the one refused ("A run is already
    active") lost its text (an audit); it steers the run the other started."""
    fake = _Fake(status="idle")

    async def refused(text: str) -> None:
        fake.current = fake.current.model_copy(update={"status": "running"})
        raise Refused("A run is already active: send `steer` or `follow_up` instead.")

    fake.send_prompt = refused  # type: ignore[method-assign]
    chat = _chat(fake)
    assert await chat._act("me too")
    assert fake.sent == [("steer", "me too")]
    assert "» steering: me too" in capsys.readouterr().out


async def test_a_prompt_refused_for_another_reason_is_not_sent_as_a_steer() -> None:
    fake = _Fake(status="idle")

    async def refused(text: str) -> None:
        raise Refused("The conversation is closed: start a new one.")

    fake.send_prompt = refused  # type: ignore[method-assign]
    with pytest.raises(Refused):
        await _chat(fake)._act("hello")
    assert fake.sent == []


async def test_followup_without_text_says_how_to_use_it_and_queues_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake(status="running")
    chat = _chat(fake)
    assert await chat._act("/followup")
    assert fake.sent == []
    assert "Usage: /followup TEXT" in capsys.readouterr().out


async def test_abort_while_idle_says_no_run_is_active_and_sends_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake(status="idle")
    chat = _chat(fake)
    assert await chat._act("/abort")
    assert fake.sent == []
    assert "No run is active." in capsys.readouterr().out


async def test_stop_while_idle_says_no_run_is_active_and_sends_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake(status="idle")
    chat = _chat(fake)
    assert await chat._act("/stop")
    assert fake.sent == []
    assert "No run is active." in capsys.readouterr().out


async def test_stop_ends_the_run_after_its_turn_instead_of_aborting_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake(status="running")
    chat = _chat(fake)
    assert await chat._act("/stop")
    assert fake.sent == [("stop_after_turn",)]
    assert "the run ends after the current turn" in capsys.readouterr().out


def _prompt_text(chat: ChatSession) -> str:
    return fragment_list_to_text(to_formatted_text(chat._prompt_message()))


def test_the_prompt_says_enter_steers_while_a_run_is_active() -> None:
    """The same `›` showed whether Enter would start a run or steer one (an audit)."""
    chat = _chat(_Fake())
    assert _prompt_text(chat) == "› "
    chat._observe({"type": "agent_start"})
    assert _prompt_text(chat) == "steer › "
    chat._observe({"type": "agent_end", "messages": []})
    assert _prompt_text(chat) == "› "


def test_the_approval_question_takes_the_place_of_the_steer_prompt() -> None:
    chat = _chat(_Fake())
    chat._observe({"type": "agent_start"})
    chat._observe(_request("c1"))
    assert _prompt_text(chat) == "approve x (c1)? y/n › "


# --- queues ----------------------------------------------------------------------


async def test_clear_takes_the_queue_name_as_the_help_spells_it() -> None:
    """`/clear followUp` (as /help and the README write it) clears the follow-up queue."""
    fake = _Fake()
    chat = _chat(fake)
    assert await chat._act("/clear followUp")
    assert await chat._act("/clear steering")
    assert fake.sent == [("clear_queues", "followUp"), ("clear_queues", "steering")]


async def test_clear_with_nothing_queued_says_so_and_restores_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake()
    chat = _chat(fake)
    assert await chat._act("/clear")
    assert "Nothing was queued." in capsys.readouterr().out
    assert chat._restore == []


async def test_clear_brings_back_steering_and_follow_ups_as_lines_that_resend_them_as_they_were(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both queues came back joined into one line, sent as one steer: the
    follow-ups lost their kind (an audit). The steering messages come back
    as the input line, the follow-ups as a `/followup` line after it."""
    fake = _Fake(status="running")
    fake.queued = {
        "steering": [UserMessage(content="steer one"), UserMessage(content="steer two")],
        "followUp": [UserMessage(content="later one")],
    }
    chat = _chat(fake)
    defaults = _typed(chat, "/clear", "steer one steer two (edited)", "/followup later one", "/quit")
    await chat._read_lines()
    assert defaults == ["", "steer one steer two", "/followup later one", ""]
    assert fake.sent[-2:] == [("steer", "steer one steer two (edited)"), ("follow_up", "later one")]
    said = " ".join(capsys.readouterr().out.split())  # as one line, however the console wrapped it
    assert (
        "took 2 steering messages back into the input line and 1 follow-up (as /followup) into the next one"
        in said
    )


async def test_clear_of_follow_ups_alone_brings_them_back_as_a_followup_line() -> None:
    fake = _Fake(status="running")
    fake.queued["followUp"] = [UserMessage(content="later one")]
    chat = _chat(fake)
    assert await chat._act("/clear followUp")
    assert chat._restore == ["/followup later one"]


# --- settings --------------------------------------------------------------------


async def test_model_thinking_system_and_tools_without_an_argument_show_the_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake(model="m-1", thinking_level="high", system_prompt="Be brief.", tools=["echo", "calculator"])
    chat = _chat(fake)
    for command in ("/model", "/thinking", "/system", "/tools"):
        assert await chat._act(command)
    out = capsys.readouterr().out.splitlines()
    assert out == ["model: m-1", "thinking: high", "system prompt: Be brief.", "tools: echo, calculator"]
    assert fake.sent == []


async def test_system_without_a_prompt_set_shows_none(capsys: pytest.CaptureFixture[str]) -> None:
    chat = _chat(_Fake(system_prompt=None))
    assert await chat._act("/system")
    assert capsys.readouterr().out == "system prompt: (none)\n"


async def test_tools_names_are_trimmed_and_empty_ones_dropped() -> None:
    fake = _Fake()
    chat = _chat(fake)
    assert await chat._act("/tools echo, calculator,")
    assert fake.sent == [("configure", {"tools": ["echo", "calculator"]})]


def test_state_shows_the_last_error() -> None:
    assert "last error: the model failed" in _describe(_state(error_message="the model failed"))


# --- commands ---------------------------------------------------------------------


async def test_an_unknown_command_is_named_and_points_to_help(capsys: pytest.CaptureFixture[str]) -> None:
    fake = _Fake()
    chat = _chat(fake)
    assert await chat._act("/modle gpt")
    assert fake.sent == []
    assert "Unknown command /modle: /help lists the commands." in capsys.readouterr().out


async def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    chat = _chat(_Fake())
    assert await chat._act("/help")
    out = capsys.readouterr().out
    for command in (
        "/followup",
        "/abort",
        "/stop",
        "/model",
        "/clear",
        "/reset",
        "/approve",
        "/reject",
        "/quit",
    ):
        assert command in out


# --- approvals ----------------------------------------------------------------------


async def test_a_y_after_the_run_ended_says_no_call_waits_and_a_second_y_is_a_prompt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run that ended (aborted, say) while calls waited takes them with it:
    the prompt no longer asks "approve ...? y/n"; the `y` typed next was
    meant for the call, so it is not sent; typed again, it starts a run."""
    fake = _Fake(status="idle")
    chat = _chat(fake)
    chat._observe(_request("c1"))
    chat._observe({"type": "agent_end", "messages": []})
    assert chat._approvals == {}
    assert await chat._act("y")
    assert fake.sent == []
    assert "No tool call is waiting for approval: x (c1) no longer waits." in capsys.readouterr().out
    assert await chat._act("y")
    assert fake.sent == [("prompt", "y")]


@pytest.mark.parametrize("line", ["y", "n", "no too risky"])
async def test_a_y_or_n_after_the_call_was_decided_elsewhere_is_not_sent_to_the_model(
    capsys: pytest.CaptureFixture[str], line: str
) -> None:
    """The approval prompt was shown, then another terminal decided the call
    (its result came): a bare y/n was sent to the model as a message (an audit)."""
    fake = _Fake(status="running")
    chat = _chat(fake)
    chat._observe(_request("c1"))
    chat._observe({"type": "tool_execution_end", "toolCallId": "c1", "toolName": "x", "result": {}})
    assert await chat._act(line)
    assert fake.sent == []
    assert "No tool call is waiting for approval" in capsys.readouterr().out


async def test_a_y_with_no_approval_shown_is_a_message() -> None:
    fake = _Fake(status="idle")
    chat = _chat(fake)
    assert await chat._act("y")
    assert fake.sent == [("prompt", "y")]


async def test_a_call_decided_here_leaves_no_y_held_back() -> None:
    fake = _Fake(status="running")
    chat = _chat(fake)
    chat._observe(_request("c1"))
    assert await chat._act("y")
    chat._observe({"type": "tool_execution_end", "toolCallId": "c1", "toolName": "x", "result": {}})
    assert await chat._act("y")
    assert fake.sent == [("approve", "c1", True, None), ("steer", "y")]


def test_a_second_waiting_call_says_it_comes_after_the_ones_before_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat = _chat(None)
    chat._observe(_request("c1"))
    chat._observe(_request("c2"))
    lines = [line for line in capsys.readouterr().out.splitlines() if "y approves" in line]
    assert lines == [
        "  y approves, n [reason] rejects",
        "  y approves, n [reason] rejects (after the ones before it)",
    ]


async def test_approve_takes_the_call_id_before_any_further_words() -> None:
    fake = _Fake()
    chat = _chat(fake)
    chat._observe(_request("c1"))
    chat._observe(_request("c2"))
    assert await chat._act("/approve c2 please")
    assert fake.sent == [("approve", "c2", True, None)]


# --- reading lines -----------------------------------------------------------------


def _typed(chat: ChatSession, *lines: str | type[BaseException]) -> list[str]:
    """Make the chat's input line return ``lines`` one by one (an exception
    class is raised, as prompt_toolkit raises EOFError on Ctrl-D); returns
    the text each input line started with (``default``), as they are asked."""
    pending = list(lines)
    defaults: list[str] = []

    async def prompt_async(*_: Any, default: str = "", **__: Any) -> str:
        defaults.append(default)
        item = pending.pop(0)
        if isinstance(item, type):
            raise item()
        return item

    chat._input.prompt_async = prompt_async  # type: ignore[method-assign]
    chat._piped = False  # typed, as at a terminal (pytest's stdin is none)
    return defaults


async def test_ctrl_d_leaves_the_chat() -> None:
    fake = _Fake()
    chat = _chat(fake)
    _typed(chat, EOFError, "never read")
    await chat._read_lines()
    assert fake.sent == []


async def test_a_server_error_is_one_red_line_and_the_chat_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake()
    chat = _chat(fake)

    async def unreachable() -> SessionState:
        raise RPCError("the server is unreachable", RPCStatusCode.UNAVAILABLE, b"")

    fake.state = unreachable  # type: ignore[method-assign]
    _typed(chat, "hello", "/quit")
    await chat._read_lines()
    assert "✗ the server is unreachable" in capsys.readouterr().out


async def test_a_line_the_server_did_not_take_goes_back_into_the_input_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Typed while the server was down, a line was lost (an audit): it is
    said not sent, and the next input line starts with it."""
    fake = _Fake()
    chat = _chat(fake)

    async def unreachable(text: str) -> None:
        raise RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b"")

    fake.send_prompt = unreachable  # type: ignore[method-assign]
    defaults = _typed(chat, "  hello there ", "/quit")
    await chat._read_lines()
    assert defaults == ["", "hello there"]
    assert "✗ tcp connect error: not sent; it is back in the input line" in capsys.readouterr().out


async def test_a_failed_event_stream_is_said_in_one_line_before_how_to_re_attach(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command to re-attach is quoted for the shell: pasted, an id with
    spaces failed with "unrecognized arguments" (a new user's audit)."""
    fake = _Fake()
    fake.id = "notes of may"

    async def events(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the stream broke")
        yield  # an async generator

    async def typing_forever() -> None:
        await asyncio.Event().wait()

    fake.events = events  # type: ignore[attr-defined]
    chat = ChatSession(fake)  # type: ignore[arg-type]
    chat._read_lines = typing_forever  # type: ignore[method-assign]
    assert await chat.run(None, []) == 1  # the exit code: the chat gave up (it exited 0, an audit)
    out = capsys.readouterr().out
    assert "The event stream failed: the stream broke\nLeft the chat; the conversation goes on." in out
    assert "python starter.py chat --id 'notes of may'\n" in out


async def test_a_request_the_server_stopped_answering_is_one_line_and_the_chat_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake()

    async def not_answered(text: str) -> None:
        raise StoppedWaiting(
            "Stopped waiting for prompt: what was sent is kept, and applies when a worker takes it "
            "(unless the Temporal server restarts first: see `state` before sending it again)."
        )

    fake.send_prompt = not_answered  # type: ignore[method-assign]
    chat = _chat(fake)
    _typed(chat, "hello", "/followup later", "/quit")
    await chat._read_lines()
    assert ("follow_up", "later") in fake.sent  # it went on reading after the first line
    assert "✗ Stopped waiting for prompt" in capsys.readouterr().out


async def test_a_decision_that_failed_to_reach_the_conversation_keeps_the_call_waiting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server did not take `y` (unreachable): the call still waits, so the
    prompt still asks for it and the next `y` decides it; it is not sent to
    the model as a steering message "y"."""
    fake = _Fake(status="awaiting-approval")
    chat = _chat(fake)
    chat._observe(_request("c1"))
    approve = fake.approve

    async def unreachable(*_: Any) -> None:
        raise RPCError("the server is unreachable", RPCStatusCode.UNAVAILABLE, b"")

    fake.approve = unreachable  # type: ignore[method-assign]
    _typed(chat, "y", "/quit")
    await chat._read_lines()
    assert "✗ the server is unreachable" in capsys.readouterr().out
    fake.approve = approve  # type: ignore[method-assign]
    assert await chat._act("y")
    assert fake.sent == [("approve", "c1", True, None)]


async def test_approve_and_reject_with_no_call_waiting_say_so_and_send_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = _Fake()
    chat = _chat(fake)
    assert await chat._act("/approve")
    assert await chat._act("/reject")
    assert fake.sent == []
    assert capsys.readouterr().out.count("No tool call is waiting for approval.") == 2


async def test_ctrl_c_while_idle_leaves_without_aborting() -> None:
    fake = _Fake(status="idle")
    chat = _chat(fake)
    assert not await chat._act(None)
    assert fake.sent == []


@pytest.mark.parametrize("line", [None, "/abort"])  # Ctrl-C, or the command
async def test_an_abort_says_how_many_messages_are_still_queued_and_how_to_take_them_back(
    capsys: pytest.CaptureFixture[str], line: str | None
) -> None:
    """Queued messages outlive an abort and start the next run: the abort
    notice says so (they silently took over the next prompt, an audit)."""
    fake = _Fake(status="running", steering_queue=1, follow_up_queue=1)
    chat = _chat(fake)
    assert await chat._act(line)
    assert fake.sent == [("abort",)]
    assert "2 messages still queued (/clear takes them back)" in capsys.readouterr().out


async def test_an_abort_with_nothing_queued_says_nothing_of_queues(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat = _chat(_Fake(status="running"))
    assert await chat._act("/abort")
    assert "queued" not in capsys.readouterr().out


def _waiting_for_a_worker(fake: _Fake, request: str, name: str) -> None:
    """The update ``request`` (``send_prompt``, ``configure``) waits for a
    worker that never comes, and the user presses Ctrl-C meanwhile;
    cancelled, it raises as the client does."""

    async def waits(*args: Any, **kwargs: Any) -> None:
        fake.sent.append((name, *args))
        asyncio.get_running_loop().call_later(0.05, signal.raise_signal, signal.SIGINT)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as err:
            raise err from StoppedWaiting(
                f"Stopped waiting for {name}: what was sent is kept, and applies when a worker takes it "
                "(unless the Temporal server restarts first: see `state` before sending it again)."
            )

    setattr(fake, request, waits)


async def _read_until_left(chat: ChatSession) -> None:
    """``_read_lines`` with Ctrl-C handled as ``asyncio.run`` handles it
    outside the chat's own handler: the main task is cancelled (the chat left)."""
    reading = asyncio.ensure_future(chat._read_lines())
    previous = signal.signal(signal.SIGINT, lambda *_: reading.cancel())
    try:
        await asyncio.wait_for(reading, 5)
    finally:
        signal.signal(signal.SIGINT, previous)


async def test_ctrl_c_while_a_request_waits_for_a_worker_stops_the_wait_and_the_chat_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No worker runs: Ctrl-C after "prompt has waited 5 s for a worker"
    left the whole chat (an audit). It stops the wait only."""
    fake = _Fake(status="idle")
    _waiting_for_a_worker(fake, "send_prompt", "prompt")
    chat = _chat(fake)
    _typed(chat, "hello", "/followup later", "/quit")
    await _read_until_left(chat)
    assert fake.sent == [("prompt", "hello"), ("follow_up", "later")]
    out = capsys.readouterr().out
    assert "✗ Stopped waiting for prompt: what was sent is kept" in out
    assert "(Ctrl-C again leaves the chat)" in out


async def test_a_second_ctrl_c_after_a_stopped_wait_leaves_the_chat() -> None:
    """The first Ctrl-C stopped the wait: the next one leaves, as the second
    Ctrl-C does, even with a run active (nothing is aborted)."""
    fake = _Fake(status="running")
    _waiting_for_a_worker(fake, "configure", "configure")
    chat = _chat(fake)
    _typed(chat, "/model m-2", KeyboardInterrupt, "never read")
    await _read_until_left(chat)
    assert fake.sent == [("configure",)]


async def test_ctrl_c_while_the_state_is_read_before_a_line_is_sent_puts_the_line_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The chat reads the state (waiting for a worker to answer it) before
    it sends a line: stopped then, the line was not sent, and is back in the
    input line."""
    fake = _Fake(status="idle")
    state = fake.state

    async def waits() -> SessionState:
        fake.state = state  # type: ignore[method-assign]
        asyncio.get_running_loop().call_later(0.05, signal.raise_signal, signal.SIGINT)
        await asyncio.Event().wait()
        raise AssertionError("not reached")

    fake.state = waits  # type: ignore[method-assign]
    chat = _chat(fake)
    defaults = _typed(chat, " hello ", "/quit")
    await _read_until_left(chat)
    assert fake.sent == []
    assert defaults == ["", "hello"]
    assert "✗ Stopped waiting: not sent; it is back in the input line." in capsys.readouterr().out


async def test_start_options_for_a_conversation_that_exists_are_said_to_change_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`chat --id EXISTING --model foo` re-attaches; its start options set
    nothing, which it said nowhere: `/model` then showed the old model (a
    new user's audit). It says so, and how to change them."""
    fake = _Fake()

    async def snapshot() -> tuple[SessionState, list[Any]]:
        return fake.current, []

    fake.snapshot = snapshot  # type: ignore[attr-defined]
    monkeypatch.setattr(Conversation, "attach", classmethod(lambda cls, client, cid: fake))
    options = {"model": "foo", "system_prompt": "sys"}
    conversation, _, _ = await _attach_or_start(None, None, "c", options)  # type: ignore[arg-type]
    assert conversation is fake
    err = capsys.readouterr().err
    assert "note: c exists, so --model, --system (for a new conversation) changed nothing" in err
    assert "/model, /system, /tools or `starter.py configure`" in err
    await _attach_or_start(None, None, "c", {})  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""  # no option: nothing to say
