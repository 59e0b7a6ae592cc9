"""What the terminal shows for the agent's events (``console.render``) and
what ``watch`` and ``run`` print around them: one behaviour per test, each
asserting the text the user sees, fed hand-made events (no server)."""

from __future__ import annotations

import importlib
import io
import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from console.render import EventRenderer, end_streamed_line, json_line, output_console
from tests.test_console import assistant, user

watch_module = importlib.import_module("console.watch")  # `console.watch` the name is the function


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def delta(kind: str, value: str, index: int = 0) -> dict[str, Any]:
    return {
        "type": "message_update",
        "assistantMessageEvent": {"type": kind, "contentIndex": index, "delta": value},
    }


def end(message: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message_end", "message": message}


def start(message: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"type": "message_start", "message": message, **fields}


def tool_end(result: Any, *, name: str = "t", call_id: str = "c1", is_error: bool = False) -> dict[str, Any]:
    return {
        "type": "tool_execution_end",
        "toolCallId": call_id,
        "toolName": name,
        "result": result,
        "isError": is_error,
    }


def progress(value: str) -> dict[str, Any]:
    return {
        "type": "tool_execution_update",
        "toolCallId": "c1",
        "toolName": "t",
        "args": {},
        "partialResult": {"content": [text(value)], "details": {}},
    }


def result_message(call_id: str, value: str) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": "echo",
        "content": [text(value)],
        "isError": False,
    }


def render(
    events: list[dict[str, Any]], renderer: EventRenderer | None = None, out: io.StringIO | None = None
) -> str:
    out = out or io.StringIO()
    renderer = renderer or EventRenderer(Console(file=out, width=5000, force_terminal=False))
    for event in events:
        renderer.render(event)
    renderer.end_line()
    return out.getvalue()


def new_renderer() -> tuple[EventRenderer, io.StringIO]:
    out = io.StringIO()
    return EventRenderer(Console(file=out, width=5000, force_terminal=False)), out


# --- watch --json ---------------------------------------------------------------------


def test_json_line_is_one_line_even_for_unicode_line_separators() -> None:
    """``watch --json`` is one event per line: a reader that splits lines
    the Unicode way (Python's str.splitlines) must not cut an event in two."""
    event = {
        "type": "message_update",
        "assistantMessageEvent": {"type": "text_delta", "delta": "a\u2028b\u2029c"},
    }

    line = json_line(event)

    assert len(line.splitlines()) == 1 and json.loads(line) == event


# --- the stream -----------------------------------------------------------------------


def test_an_event_of_another_shape_mid_stream_is_noted_on_its_own_line() -> None:
    out = render([start(assistant()), delta("text_delta", "Hel"), {"type": "message_end", "message": "bad"}])

    assert out.splitlines() == ["Hel", "(a message_end event this chat cannot show)"]


def test_an_answer_that_did_not_stream_is_printed_at_its_end() -> None:
    """A model that does not stream: its message_start and message_end, no deltas."""
    final = assistant(text("the whole answer"))

    assert render([start(assistant()), end(final)]) == "the whole answer\n"


def test_thinking_after_text_in_one_message_starts_its_own_line() -> None:
    events = [
        start(assistant()),
        delta("text_start", ""),
        delta("text_delta", "answer"),
        delta("thinking_start", "", 1),
        delta("thinking_delta", "more thought", 1),
    ]

    assert render(events).splitlines() == ["answer", "more thought"]


def test_streamed_text_that_ends_with_a_newline_gets_no_blank_line() -> None:
    final = assistant(text("Hello\n"))

    out = render([start(assistant()), delta("text_delta", "Hello\n"), end(final)])

    assert out == "Hello\n"


def test_an_empty_delta_prints_no_blank_line() -> None:
    """A model that opens a text block with an empty delta, then calls a tool."""
    call = {"type": "toolCall", "id": "c1", "name": "echo", "arguments": {}}
    final = assistant(text(""), call, stop_reason="toolUse")
    events = [start(assistant()), delta("text_start", ""), delta("text_delta", ""), end(final)]

    assert render(events) == ""


def test_a_message_joined_mid_stream_prints_thinking_and_text_on_their_own_lines() -> None:
    final = assistant({"type": "thinking", "thinking": "pondering"}, text("answer"))

    assert render([delta("text_delta", "ans"), end(final)]).splitlines() == ["pondering", "answer"]


def test_a_retry_note_says_why_the_call_failed() -> None:
    out = render([{"type": "message_retry", "attempt": 2, "reason": "429 rate limited"}])

    assert out == "↻ model call failed (429 rate limited): retrying (attempt 2)\n"


def test_a_tool_run_again_is_noted_with_its_attempt_and_why() -> None:
    out = render(
        [
            {"type": "tool_execution_start", "toolName": "deploy", "args": {}},
            {
                "type": "tool_execution_retry",
                "toolCallId": "c1",
                "toolName": "deploy",
                "attempt": 2,
                "reason": "its worker stopped, or it ran out of time",
            },
        ]
    )

    assert out.splitlines()[-1] == (
        "↻ deploy runs again (its worker stopped, or it ran out of time): attempt 2, from the start"
    )


def test_an_application_message_is_noted_by_its_role() -> None:
    out = render([start({"role": "bookmark", "label": "x"}), end({"role": "bookmark", "label": "x"})])

    assert out == "· bookmark message\n"


# --- who said it --------------------------------------------------------------------------


def test_the_prompt_of_a_later_run_is_a_prompt_not_a_steer() -> None:
    first = [{"type": "agent_start"}, start(user("one")), start(assistant()), end(assistant(text("ok")))]
    second = [{"type": "agent_end", "messages": []}, {"type": "agent_start"}, start(user("two"))]

    assert render([*first, *second]).splitlines()[-1] == "» two"


def test_a_user_message_right_after_a_replayed_transcript_is_a_steer() -> None:
    renderer, out = new_renderer()
    renderer.render_transcript([user("hi"), assistant(text("working"))])

    render([start(user("also this"))], renderer, out)

    assert out.getvalue().splitlines()[-1] == "» steer: also this"


def test_a_user_message_with_text_and_an_image_shows_both() -> None:
    content = [text("look at"), {"type": "image", "data": "AAAA", "mimeType": "image/png"}]

    assert render([start({"role": "user", "content": content})]) == "» look at [image]\n"


# --- stop reasons ---------------------------------------------------------------------


def test_a_failed_model_call_without_a_message_says_it_failed() -> None:
    assert render([end(assistant(stop_reason="error"))]) == "✗ The model call failed.\n"


def test_an_aborted_answer_without_a_message_says_it_was_aborted() -> None:
    assert render([end(assistant(stop_reason="aborted"))]) == "⚠ Request was aborted\n"


def test_an_answer_cut_at_the_token_limit_says_so() -> None:
    out = render([end(assistant(text("half an ans"), stop_reason="length"))])

    assert out == "half an ans\n⚠ The answer hit the output token limit.\n"


# --- tool calls and results -----------------------------------------------------------


def test_tool_arguments_exactly_at_the_limit_are_not_cut() -> None:
    value = "x" * (120 - len('a=""'))  # the line's arguments are exactly 120 characters

    out = render(
        [{"type": "tool_execution_start", "toolCallId": "c1", "toolName": "t", "args": {"a": value}}]
    )

    assert out == f'⚙ t(a="{value}")\n'


def test_tool_progress_shows_its_first_non_blank_line() -> None:
    assert render([progress("\n\n  step 2/4\n")]) == "  ⋯ step 2/4\n"


def test_tool_progress_shows_only_its_first_line() -> None:
    assert render([progress("step 2/4\ndetails\nmore")]) == "  ⋯ step 2/4\n"


def test_a_long_tool_progress_line_is_cut() -> None:
    out = render([progress("y" * 1000)])

    assert out == "  ⋯ " + "y" * 399 + "…\n"


def test_an_approval_request_with_very_long_arguments_is_cut_at_2000_characters() -> None:
    event = {
        "type": "tool_approval_request",
        "toolCallId": "c1",
        "toolName": "t",
        "args": "z" * 5000,
        "reason": "r",
    }
    out = io.StringIO()

    render([event], EventRenderer(Console(file=out, width=5000, force_terminal=False)), out)

    first = out.getvalue().splitlines()[0]
    assert first == "⏸ approval needed: t(" + '"' + "z" * 1998 + "…)"


def test_an_approval_request_without_a_reason_says_the_call_needs_approval() -> None:
    event = {"type": "tool_approval_request", "toolCallId": "c1", "toolName": "t", "args": {}}

    assert render([event]).splitlines()[1] == "  This tool call needs approval · call c1"


def test_a_tool_result_without_output_says_so() -> None:
    assert render([tool_end({"content": [], "details": {}})]) == "  ✓ t: (no output)\n"


def test_a_multi_line_tool_result_indents_its_further_lines() -> None:
    out = render([tool_end({"content": [text("line 1\nline 2\nline 3")]})])

    assert out == "  ✓ t: line 1\n    line 2\n    line 3\n"


def test_a_tool_result_ending_with_a_newline_is_not_marked_as_cut() -> None:
    assert render([tool_end({"content": [text("done\n")]})]) == "  ✓ t: done\n"


def test_a_tool_result_longer_than_eight_lines_is_cut_with_a_mark() -> None:
    lines = [f"line {n}" for n in range(1, 12)]

    out = render([tool_end({"content": [text("\n".join(lines))]})])

    assert out.splitlines() == ["  ✓ t: line 1", *[f"    line {n}" for n in range(2, 8)], "    line 8 …"]


def test_a_tool_result_longer_than_400_characters_is_cut_with_a_mark() -> None:
    out = render([tool_end({"content": [text("w" * 1000)]})])

    assert out == "  ✓ t: " + "w" * 400 + " …\n"


def test_a_tool_result_with_only_details_shows_the_details() -> None:
    out = render([tool_end({"content": [], "details": {"exitCode": 0}})])

    assert out == '  ✓ t: {"exitCode": 0}\n'


def test_a_tool_result_with_blank_text_shows_its_details() -> None:
    out = render([tool_end({"content": [text("  \n")], "details": {"exitCode": 3}})])

    assert out == '  ✓ t: {"exitCode": 3}\n'


def test_a_tool_result_image_shows_as_a_placeholder() -> None:
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}

    assert render([tool_end({"content": [text("a chart:"), image]})]) == "  ✓ t: a chart:\n    [image]\n"


def test_a_result_shown_in_a_replayed_transcript_is_not_shown_again_by_its_message() -> None:
    renderer, out = new_renderer()
    renderer.render_transcript([result_message("c1", "echo: x")])

    render([end(result_message("c1", "echo: x"))], renderer, out)

    assert out.getvalue() == "  ✓ echo: echo: x\n"


def test_a_later_run_reusing_a_call_id_shows_its_result_when_its_end_was_missed() -> None:
    """Call ids are the model's: a later run may reuse one. Its result is
    shown by its message when its tool_execution_end was not read."""
    events = [
        {"type": "agent_start"},
        tool_end({"content": [text("echo: first")]}, name="echo"),
        {"type": "agent_end", "messages": []},
        {"type": "agent_start"},
        end(result_message("c1", "echo: second")),
    ]

    assert render(events).splitlines()[-1] == "  ✓ echo: echo: second"


# --- the summary ------------------------------------------------------------------------


def summary_of(*usages: dict[str, Any]) -> str:
    messages = [
        {"role": "assistant", "content": [], "usage": usage, "stopReason": "stop"} for usage in usages
    ]
    return render([{"type": "agent_end", "messages": messages}])


def test_the_summary_groups_token_thousands() -> None:
    assert summary_of({"totalTokens": 1234, "cost": {"total": 0.0}}) == "· 1 turn · 1,234 tokens\n"


def test_the_summary_shows_the_cost_of_the_run() -> None:
    out = summary_of(
        {"totalTokens": 10, "cost": {"total": 0.0007}}, {"totalTokens": 5, "cost": {"total": 0.0005}}
    )

    assert out == "· 2 turns · 15 tokens · $0.0012\n"


# --- watch ------------------------------------------------------------------------------


class Streamed:
    """A conversation whose events stream ``Hel``, then skip offsets 2 to 4."""

    id = "conv"

    async def ended_on_task_queue(self) -> None:
        return None

    async def how_it_ended(self) -> str:
        return "The conversation was closed."

    async def events(self, from_offset: int, on_skipped: Any = None) -> Any:
        yield 0, start(assistant())
        yield 1, delta("text_delta", "Hel")
        on_skipped(2, 5)


async def test_watch_starts_a_skipped_events_note_on_its_own_line(monkeypatch: Any) -> None:
    """The note goes to stderr; on a terminal it follows the streamed text, so that line is ended first."""
    import sys

    screen = io.StringIO()
    monkeypatch.setattr(
        watch_module, "output_console", lambda: Console(file=screen, width=5000, force_terminal=False)
    )
    monkeypatch.setattr(sys, "stderr", screen)

    await watch_module.watch(Streamed(), as_json=False, from_offset=0)  # type: ignore[arg-type]

    assert screen.getvalue().splitlines()[:2] == [
        "Hel",
        "note: events 2 to 4 are no longer kept (the conversation continued as new and carried "
        "only its latest events before they were read); reading from 5.",
    ]


async def test_watch_says_how_it_ended_on_its_own_line_after_streamed_text(monkeypatch: Any) -> None:

    class Cut(Streamed):
        async def events(self, from_offset: int, on_skipped: Any = None) -> Any:
            yield 0, start(assistant())
            yield 1, delta("text_delta", "Hel")

    screen = io.StringIO()
    monkeypatch.setattr(
        watch_module, "output_console", lambda: Console(file=screen, width=5000, force_terminal=False)
    )

    await watch_module.watch(Cut(), as_json=False)  # type: ignore[arg-type]

    assert screen.getvalue() == "Hel\nThe conversation was closed.\n"


class Slow:
    """A conversation (ended on ``task_queue``, or live) whose events are
    ``first`` at once, then nothing for ``quiet`` seconds."""

    id = "conv"

    def __init__(self, task_queue: str | None, first: list[dict[str, Any]], quiet: float) -> None:
        self.task_queue, self.first, self.quiet = task_queue, first, quiet

    async def ended_on_task_queue(self) -> str | None:
        return self.task_queue

    async def how_it_ended(self) -> str:
        return "The conversation was closed."

    async def events(self, from_offset: int, on_skipped: Any = None) -> Any:
        import asyncio

        for offset, event in enumerate(self.first):
            yield offset, event
        await asyncio.sleep(self.quiet)


async def watched_stderr(monkeypatch: Any, capsys: Any, conversation: Slow) -> str:

    monkeypatch.setattr(watch_module, "NO_WORKER_NOTE_AFTER", 0.05)
    await watch_module.watch(conversation, as_json=True)  # type: ignore[arg-type]
    return capsys.readouterr().err


async def test_watch_of_a_quiet_live_conversation_does_not_say_it_waits_for_a_worker(
    monkeypatch: Any, capsys: Any
) -> None:
    err = await watched_stderr(monkeypatch, capsys, Slow(None, [], quiet=0.3))

    assert err == "The conversation was closed.\n"


async def test_watch_says_nothing_of_workers_once_an_ended_conversations_events_come(
    monkeypatch: Any, capsys: Any
) -> None:
    err = await watched_stderr(monkeypatch, capsys, Slow("agent", [{"type": "turn_start"}], quiet=0.3))

    assert err == "The conversation was closed.\n"


@pytest.mark.parametrize(
    ("next_offset", "said"),
    [
        (42, "note: waiting for event 99999: its last event so far is 41 (watch --from 0 shows them all).\n"),
        (0, "note: waiting for event 99999: it has no event yet (watch --from 0 shows them all).\n"),
        (100_000, ""),  # the events up to it exist: nothing to say
    ],
)
async def test_watch_from_past_the_last_event_says_so(
    monkeypatch: Any, capsys: Any, next_offset: int, said: str
) -> None:
    """``watch --from 99999`` (a mistyped offset) waited silently for
    events to come (a new user's audit)."""

    class Quiet(Slow):
        async def state(self) -> Any:
            return SimpleNamespace(event_offset=next_offset)

        async def events(self, from_offset: int, on_skipped: Any = None) -> Any:
            assert from_offset == 99999
            async for item in super().events(from_offset, on_skipped):
                yield item

    monkeypatch.setattr(watch_module, "PAST_THE_END_NOTE_AFTER", 0.05)
    await watch_module.watch(Quiet(None, [], quiet=0.3), as_json=True, from_offset=99999)  # type: ignore[arg-type]
    assert capsys.readouterr().err == said + "The conversation was closed.\n"


# --- watch and run ---------------------------------------------------------------------

HOSTILE_ID = "c1\x1b[2J\x1b]0;pwned\x1b\\"  # clear the screen, set the window title


class Ended:
    """A conversation that yields ``events`` and then says how it ended."""

    id = "conv"

    def __init__(self, events: list[dict[str, Any]], ending: str = "The conversation was closed.") -> None:
        self._events, self._ending = events, ending

    async def ended_on_task_queue(self) -> None:
        return None

    async def how_it_ended(self) -> str:
        return self._ending

    async def events(self, from_offset: int, on_skipped: Any = None) -> Any:
        for offset, event in enumerate(self._events, start=from_offset):
            yield offset, event


async def watched(monkeypatch: pytest.MonkeyPatch, conversation: Ended, *, as_json: bool = False) -> str:
    out = io.StringIO()
    monkeypatch.setattr(
        watch_module, "output_console", lambda: Console(file=out, width=200, force_terminal=True)
    )
    await watch_module.watch(conversation, as_json=as_json)  # type: ignore[arg-type]
    return out.getvalue()


async def test_watch_approval_hint_cannot_drive_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    request = {"type": "tool_approval_request", "toolCallId": HOSTILE_ID, "toolName": "t", "args": {}}

    out = await watched(monkeypatch, Ended([request]))

    assert "approve conv c1 [--reject]" in out and "\x1b[2J" not in out and "\x1b]" not in out


async def test_watch_says_how_a_conversation_failed_whose_reason_looks_like_markup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A start input key is quoted in the failure (``Unknown start input key(s) [/x]: ...``)."""
    ending = "The conversation failed (Unknown start input key(s) [/x]: the start input takes ...)."

    out = await watched(monkeypatch, Ended([], ending))

    assert "Unknown start input key(s) [/x]" in out


async def test_watch_ending_cannot_drive_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    ending = "The conversation failed (Unknown start input key(s) \x1b[2J: the start input takes ...)."

    out = await watched(monkeypatch, Ended([], ending))

    assert "Unknown start input key(s)" in out and "\x1b[2J" not in out


async def test_watch_json_offset_is_the_streams_even_if_an_event_carries_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await watch_module.watch(Ended([{"type": "turn_end", "offset": 999}]), as_json=True)  # type: ignore[arg-type]

    assert json.loads(capsys.readouterr().out)["offset"] == 0


async def test_run_goes_on_past_an_approval_request_of_another_shape() -> None:
    import starter

    class Conv:
        id = "conv"

    async def events() -> Any:
        yield 0, {"type": "tool_approval_request"}
        yield 1, {"type": "agent_end", "messages": []}

    assert await starter._stream_run(Conv(), events()) == 0  # type: ignore[arg-type]


def test_a_chat_note_quoting_what_others_sent_cannot_drive_the_terminal() -> None:
    """A refusal the chat shows quotes what was sent (a start input key, a message)."""
    from console.chat import ChatSession

    chat = ChatSession(None)  # type: ignore[arg-type]  # no conversation is reached
    screen = io.StringIO()
    chat._notes = Console(file=screen, force_terminal=True)

    chat._say(f"✗ Refused: {HOSTILE_ID}", "red")

    assert "Refused: c1" in screen.getvalue()
    assert "\x1b[2J" not in screen.getvalue() and "\x1b]" not in screen.getvalue()


def test_a_note_printed_while_tokens_stream_starts_a_line_of_its_own() -> None:
    """``starter.py run`` printed a note (a missing worker, a lost server)
    where the cursor was: "Slow slow snote: ..." (a README audit). The
    streamed line is ended first, once: a second note adds no blank line."""
    out = io.StringIO()
    renderer = EventRenderer(Console(file=out, width=5000, force_terminal=False))
    for event in (start(assistant("stop")), delta("text_start", ""), delta("text_delta", "Slow slow s")):
        renderer.render(event)
    end_streamed_line()
    out.write("note: waiting\n")  # as stderr would, on the same screen
    end_streamed_line()
    renderer.render(delta("text_delta", "low"))
    renderer.end_line()
    assert out.getvalue() == "Slow slow s\nnote: waiting\nlow\n"


def test_output_that_is_no_terminal_is_not_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped to a file or a CI log, rich cut every line at 80 columns, some
    mid-word ("ta" / "lk"): logs and what scripts read were mangled (a new
    user's audit). A terminal's output is still wrapped by words."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    long_line = " ".join(f"word{i}" for i in range(60))
    renderer = EventRenderer(output_console())
    renderer.render({"type": "message_start", "message": {"role": "user", "content": long_line}})
    renderer.render({"type": "agent_end", "messages": []})
    assert long_line in out.getvalue()
