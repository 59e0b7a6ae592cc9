"""starter.py's command line: what each command sends and prints, its
argument checks and exit codes, with fakes in place of the server (the
real processes against a dev server are in test_console.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

import starter
from client import ConversationSummary, PromptResult
from tests.support.recording_conversation import RecordingConversation


class Recorder(RecordingConversation):
    """A conversation that records what the command sends (no server)."""

    id = "c1"

    def __init__(self, events: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self._events = events or []

    async def close(self) -> None:
        self.sent.append(("close",))

    async def configure(self, **changes: Any) -> Any:
        self.sent.append(("configure", changes))

        class InForce:
            def model_dump(self, mode: str) -> dict[str, Any]:
                return {"configured": sorted(changes)}

        return InForce()

    async def send_continue(self) -> PromptResult:
        self.sent.append(("continue",))
        return PromptResult(run=2, event_offset=7)

    async def run_events(self, started: PromptResult, on_skipped: Any = None) -> AsyncIterator[Any]:
        for offset, event in enumerate(self._events, start=started.event_offset):
            yield offset, event

    async def events(self, on_skipped: Any = None) -> AsyncIterator[Any]:
        for offset, event in enumerate(self._events):
            yield offset, event


@pytest.fixture
def conversation(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(starter.Conversation, "attach", classmethod(lambda cls, client, cid: recorder))
    return recorder


def parse(*argv: str) -> argparse.Namespace:
    return starter.build_parser().parse_args(list(argv))


def assistant(stop_reason: str, text: str = "") -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": stop_reason}


# --- what the signal commands send ------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "sent", "printed"),
    [
        (("steer", "c1", "look here"), ("steer", "look here"), "sent steer to c1\n"),
        (("follow-up", "c1", "then this"), ("follow_up", "then this"), "sent follow_up to c1\n"),
        (("abort", "c1"), ("abort",), "sent abort to c1\n"),
        (("stop", "c1"), ("stop_after_turn",), "sent stop_after_turn to c1\n"),
        (("close", "c1"), ("close",), "sent close to c1\n"),
    ],
)
async def test_each_signal_command_sends_its_own_signal_and_says_so(
    conversation: Recorder, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], sent: Any, printed: str
) -> None:
    code = await starter.COMMANDS[argv[0]](None, None, parse(*argv))  # type: ignore[arg-type]
    assert (code, conversation.sent, capsys.readouterr().out) == (0, [sent], printed)


# --- configure -----------------------------------------------------------------------------------


async def test_configure_sends_every_option_it_is_given(
    conversation: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each of configure's options reaches the update, by its snake_case name."""
    args = parse(
        "configure", "c1",
        "--tool-execution", "sequential",
        "--follow-up-mode", "all",
        "--max-total-tokens", "1000",
        "--max-cost", "0.5",
        "--approval-timeout", "2.5",
    )  # fmt: skip
    assert await starter.cmd_configure(None, None, args) == 0  # type: ignore[arg-type]
    assert conversation.sent == [
        (
            "configure",
            {
                "tool_execution": "sequential",
                "follow_up_mode": "all",
                "max_total_tokens": 1000,
                "max_cost": 0.5,
                "approval_timeout_seconds": 2.5,
            },
        )
    ]


def test_tools_are_split_on_commas_with_spaces_and_empty_names_dropped() -> None:
    """`--tools "echo, calculator,"` names two tools, not " calculator" and ""."""
    assert starter.start_options(parse("start", "--tools", "echo, calculator,")) == {
        "tools": ["echo", "calculator"]
    }


# --- argument checks -------------------------------------------------------------------------------


def test_an_unknown_thinking_level_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        parse("start", "--thinking", "extreme")
    assert raised.value.code == 2
    assert "invalid choice: 'extreme'" in capsys.readouterr().err


def test_fork_without_at_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        parse("fork", "c1")
    assert raised.value.code == 2
    assert "--at" in capsys.readouterr().err


def test_fork_at_a_negative_count_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any connection is made, in a sentence (it used to
    connect first and only the client refused it)."""
    with pytest.raises(SystemExit) as raised:
        parse("fork", "c1", "--at", "-1")
    assert raised.value.code == 2
    assert "a number of messages to keep is 0 or more, not -1" in capsys.readouterr().err
    assert parse("fork", "c1", "--at", "0").at == 0


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["start", "--id", ""], "an id cannot be empty: give one, or leave --id out for a new one"),
        (["run", "hi", "--id", "  "], "an id cannot be empty"),
        (["fork", "c1", "--at", "1", "--id", ""], "an id cannot be empty"),
        (["chat", "--id", "a\x1b[31mb"], "an id cannot hold control characters: 'a\\x1b[31mb'"),
    ],
)
def test_a_new_conversations_id_that_is_empty_or_holds_control_characters_is_refused(
    argv: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty --id started a conversation under a made-up id, and an
    escape sequence in one reached the terminal raw (a wedge audit)."""
    with pytest.raises(SystemExit) as raised:
        parse(*argv)
    assert raised.value.code == 2
    assert refusal in capsys.readouterr().err
    assert parse("start", "--id", "notes of 3 May/π").id == "notes of 3 May/π"


def test_watch_refuses_an_offset_that_is_not_a_number_in_a_sentence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as raised:
        parse("watch", "c1", "--from", "ten")
    assert raised.value.code == 2
    assert "an offset is a whole number, not 'ten'" in capsys.readouterr().err


def test_watch_from_zero_is_accepted() -> None:
    assert parse("watch", "c1", "--from", "0").from_offset == 0


# --- list ----------------------------------------------------------------------------------------


async def test_list_passes_its_filters_and_limit_and_says_when_nothing_is_found(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[dict[str, Any]] = []

    async def listing(client: Any, **filters: Any) -> AsyncIterator[ConversationSummary]:
        asked.append(filters)
        for _ in ():
            yield ConversationSummary("x", datetime.now(UTC), None, None, None, None, None)

    monkeypatch.setattr(starter, "list_conversations", listing)
    args = parse("list", "--status", "idle", "--model", "m1", "--limit", "3")
    assert await starter.cmd_list(None, None, args) == 0  # type: ignore[arg-type]
    assert asked == [{"status": "idle", "model": "m1", "limit": 3}]
    assert capsys.readouterr() == ("", "No conversations found.\n")


# --- runs and their exit codes ---------------------------------------------------------------------


def test_a_run_whose_last_model_call_failed_after_a_tool_call_ended_in_error() -> None:
    """The exit code of `prompt --wait`/`run` follows the run's last answer,
    not its first (a tool call, then a failed model call: exit 1)."""
    messages = [
        {"role": "user", "content": "hi"},
        assistant("toolUse"),
        {"role": "toolResult", "toolCallId": "a", "content": []},
        assistant("error"),
    ]
    assert starter._ended_in_error(messages)


async def test_continue_wait_streams_the_run_and_exits_1_when_it_ended_in_error(
    conversation: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    conversation._events = [{"type": "agent_start"}, {"type": "agent_end", "messages": [assistant("error")]}]
    code = await starter.cmd_continue(None, None, parse("continue", "c1", "--wait"))  # type: ignore[arg-type]
    assert code == 1
    assert "run 2 started" not in capsys.readouterr().out


async def test_run_prints_the_conversation_id_on_stderr_and_only_the_answer_on_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = Recorder([{"type": "agent_start"}, {"type": "agent_end", "messages": [assistant("stop")]}])

    async def start(cls: Any, client: Any, settings: Any, **options: Any) -> Recorder:
        return recorder

    class Settings:
        def workflow_url(self, cid: str) -> str:
            return f"http://ui/{cid}"

    monkeypatch.setattr(starter.Conversation, "start", classmethod(start))
    assert await starter.cmd_run(None, Settings(), parse("run", "hi")) == 0  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert "conversation c1: http://ui/c1" in err and "conversation c1" not in out


async def test_run_whose_conversation_ended_without_a_run_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder([])  # no agent_end: the conversation ended first

    async def result() -> None:
        return None

    recorder.result = result  # type: ignore[attr-defined]

    async def start(cls: Any, client: Any, settings: Any, **options: Any) -> Recorder:
        return recorder

    class Settings:
        def workflow_url(self, cid: str) -> str:
            return ""

    monkeypatch.setattr(starter.Conversation, "start", classmethod(start))
    with pytest.raises(starter.UserError, match="ended without an answer"):
        await starter.cmd_run(None, Settings(), parse("run", "hi"))  # type: ignore[arg-type]


def test_a_reader_that_went_away_is_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """`watch ID --json | head`: the closed pipe is not an error."""

    async def broken(args: argparse.Namespace) -> int:
        raise BrokenPipeError

    def exit_(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(starter, "run_command", broken)
    monkeypatch.setattr(starter.os, "_exit", exit_)
    with pytest.raises(SystemExit) as raised:
        starter.main(["state", "c1"])
    assert raised.value.code == 0


# --- counts and what others named ---------------------------------------------------------------


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_list_refuses_a_limit_below_1(capsys: pytest.CaptureFixture[str], limit: str) -> None:
    """The SDK stops before the first row for a limit below 1: the command
    said there were no conversations while there were."""
    with pytest.raises(SystemExit) as raised:
        parse("list", "--limit", limit)
    assert raised.value.code == 2


@pytest.mark.parametrize("command", ["start", "run", "chat"])
def test_a_max_turns_below_1_is_refused_before_the_conversation_starts(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The workflow refuses maxTurns 0 as its start input (the conversation
    fails at once), after `start` printed its id and exited 0."""
    argv = [command, "hi"] if command == "run" else [command]
    with pytest.raises(SystemExit) as raised:
        parse(*argv, "--max-turns", "0")
    assert raised.value.code == 2


async def test_list_prints_no_terminal_control_sequences(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model name is whatever any client configured (`configure --model`),
    kept as the AgentModel search attribute: `list` wrote it to the terminal
    as it came, escape sequences and all (errors, `watch` and the chat take
    them out with terminal_safe)."""

    async def listing(client: Any, **filters: Any) -> AsyncIterator[ConversationSummary]:
        yield ConversationSummary("c\x1b[2J1", datetime.now(UTC), "idle", "m\x1b]0;owned\x07", 1, 2, 0.1)

    monkeypatch.setattr(starter, "list_conversations", listing)
    assert await starter.cmd_list(None, None, parse("list")) == 0  # type: ignore[arg-type]
    assert "\x1b" not in capsys.readouterr().out


async def test_messages_prints_the_whole_transcript_as_json_oldest_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workflows.models import UserMessage

    class Transcript:
        async def messages(self) -> list[Any]:
            return [UserMessage(content="first", timestamp=1), UserMessage(content="second", timestamp=2)]

    monkeypatch.setattr(starter.Conversation, "attach", classmethod(lambda cls, client, cid: Transcript()))
    assert await starter.cmd_messages(None, None, parse("messages", "c1")) == 0  # type: ignore[arg-type]
    assert json.loads(capsys.readouterr().out) == [
        {"role": "user", "content": "first", "timestamp": 1},
        {"role": "user", "content": "second", "timestamp": 2},
    ]


async def test_reset_says_what_it_cleared(conversation: Recorder, capsys: pytest.CaptureFixture[str]) -> None:
    async def reset() -> None:
        conversation.sent.append(("reset",))

    conversation.reset = reset  # type: ignore[attr-defined]
    assert await starter.cmd_reset(None, None, parse("reset", "c1")) == 0  # type: ignore[arg-type]
    assert conversation.sent == [("reset",)]
    assert capsys.readouterr().out == "reset c1: transcript, queues, usage and counters cleared\n"


async def test_chat_starts_a_new_conversation_with_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    async def chat(client: Any, settings: Any, cid: Any, options: dict[str, Any]) -> int:
        seen.append((cid, options))
        return 0

    monkeypatch.setattr(starter, "chat", chat)
    args = parse("chat", "--id", "new", "--model", "m", "--thinking", "high", "--tools", "echo")
    assert await starter.cmd_chat(None, None, args) == 0  # type: ignore[arg-type]
    assert seen == [("new", {"model": "m", "thinking_level": "high", "tools": ["echo"]})]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_command without a server: connecting gives a placeholder client."""

    async def connect(settings: Any, runtime: Any = None) -> Any:
        return object()

    monkeypatch.setattr(starter, "connect", connect)
    monkeypatch.setattr(starter, "_quiet_runtime", lambda settings: None)


def failing_with(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    async def command(*_: Any) -> int:
        raise error

    monkeypatch.setitem(starter.COMMANDS, "state", command)


async def test_a_conversation_that_failed_is_one_sentence_with_its_cause(
    offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError

    failing_with(monkeypatch, WorkflowFailureError(cause=ApplicationError("the start input was refused")))
    with pytest.raises(starter.UserError) as raised:
        await starter.run_command(parse("state", "c1"))
    assert str(raised.value) == "The conversation failed: the start input was refused"


async def test_a_refusal_by_the_server_is_one_sentence(
    offline: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from temporalio.service import RPCError, RPCStatusCode

    failing_with(monkeypatch, RPCError("namespace default is not found", RPCStatusCode.NOT_FOUND, b""))
    with pytest.raises(starter.UserError, match=r"^namespace default is not found$"):
        await starter.run_command(parse("state", "c1"))
