"""Print a conversation's events (and stored transcripts) on a terminal.

The renderer keeps just enough state to print each token once: whether the
cursor is in the middle of a streamed line, whether the message being
streamed was seen from its start, and whether the run has answered yet.
A user message's ``message_start`` says which queue injected it
(``"queue": "steering"`` or ``"followUp"``); from a workflow that does not
say, a user message after the run answered counts as steering.

Everything an event carries was written by a model, a tool or another
client, so before anything is printed, terminal control sequences are
taken out of it (``terminal_safe``): a model must not be able to move the
cursor, rewrite what was printed, set the window title, plant a hyperlink
or answer-back, or reorder text with bidirectional overrides.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any

from rich.console import Console
from rich.text import Text

ARGS_CHARS = 120
APPROVAL_ARGS_CHARS = 2000
RESULT_LINES = 8

_THINKING = "dim italic"
_TOOL = "cyan"
_NOTE = "dim"
_PROMPT = "bold"
_INJECTED = "bold magenta"
_QUEUE_LABELS = {"steering": "steer", "followUp": "follow-up"}
_ERROR = "red"
_WARNING = "yellow"


def shell_word(text: str) -> str:
    """``text`` (an id) as one word a user can paste into a shell, with no
    terminal control sequence: an id with spaces pasted unquoted failed with
    "unrecognized arguments" (a new user's audit)."""
    return shlex.quote(terminal_safe(text))


def output_console() -> Console:
    """A console on ``sys.stdout`` (as it is at each print). Output that is
    no terminal (a pipe, a log file, CI) is not wrapped: rich would cut
    every line at 80 columns, some mid-word, mangling logs and what
    scripts read (a new user's audit)."""
    return Console(soft_wrap=not sys.stdout.isatty())


_CONTROLS = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: cursor, colours, erase, ...
    r"|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC ... BEL or ST
    r"|\x1b[ -/]*[0-~]?"  # any other escape sequence
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # C0 controls but tab and newline, DEL, C1 controls (\x9b is CSI)
    r"|[\u202a-\u202e\u2066-\u2069]"  # bidirectional embeddings, overrides and isolates
)
# What json_line writes as \u escapes: JSON allows raw C1 and bidi characters, terminals act on them.
_JSON_UNSAFE = re.compile(r"[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` without terminal control sequences and control characters
    (newline and tab stay)."""
    return _CONTROLS.sub("", text)


def _safe(value: Any) -> Any:
    """Every string in an event (keys too: tool arguments come from the model) made terminal-safe."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, dict):
        return {_safe(key): _safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_safe(item) for item in value]
    return value


def skipped_note(first: int, next_offset: int, asked_from: int | None = None) -> str:
    """What a reader says when events ``first`` to ``next_offset - 1`` were no
    longer kept (``client.follow``'s ``on_skipped``); ``asked_from``: the
    offset it was asked to read from, when these are the first events."""
    if asked_from is not None and first == asked_from:
        # A long conversation keeps only its latest events across continue-as-new.
        return f"note: events before offset {next_offset} are no longer kept; reading from {next_offset}."
    return (
        f"note: events {first} to {next_offset - 1} are no longer kept (the conversation continued as "
        f"new and carried only its latest events before they were read); reading from {next_offset}."
    )


def json_line(event: dict[str, Any]) -> str:
    """One event as one line of JSON (``--json`` output); characters a
    terminal would act on are escaped (``\\u009b``), the data unchanged."""
    line = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", line)


_streaming_line: EventRenderer | None = None
"""The renderer whose streamed tokens left their line open, if any."""


def end_streamed_line() -> None:
    """End the line streamed tokens left open, so that a note printed now
    (a missing worker, a lost server) starts a line of its own instead of
    cutting a word of the answer in two."""
    if _streaming_line is not None:
        _streaming_line.end_line()


class EventRenderer:
    """Prints events as they arrive: tokens inline as they stream, thinking
    dimmed, tool calls with their progress and results, retries and errors
    as notes, and a one-line summary when a run ends."""

    def __init__(self, console: Console, *, show_thinking: bool = True, max_result_chars: int = 400) -> None:
        self._console = console
        self._show_thinking = show_thinking
        self._max_result_chars = max_result_chars
        self._line_open = False  # tokens printed, their line not ended yet
        self._streaming = False  # the current assistant message was seen from its start
        self._streamed = False  # ...and some of it was printed from its deltas
        self._answered = False  # the run has an answer: user messages now are steering
        # Tool calls whose result this renderer showed (by tool_execution_end, or in a transcript).
        self._results_shown: set[str] = set()

    def render(self, event: dict[str, Any]) -> None:
        """Print one event; types this renderer does not know are ignored,
        and one of a known type but another shape (anyone who may signal a
        conversation can publish on its stream) gets a dim note instead of
        ending the chat."""
        if not isinstance(event, dict):
            return
        handler = getattr(self, f"_on_{event.get('type')}", None)
        if handler is None:
            return
        try:
            handler(_safe(event))
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            self.end_line()
            self._console.print(f"[dim](a {event.get('type')} event this chat cannot show)[/dim]")

    def render_transcript(self, messages: list[dict[str, Any]]) -> None:
        """Print stored messages, as the live events would have shown them."""
        previous: str | None = None
        for message in _safe(messages):
            role = message.get("role")
            if role == "user":
                self._user(message, "steering" if previous == "toolResult" else None)
            elif role == "assistant":
                self._content(message, with_tool_calls=True)
                self._stop_reason(message)
            elif role == "toolResult":
                self._result(message.get("toolName", "?"), message, bool(message.get("isError")))
                self._results_shown.add(str(message.get("toolCallId")))
            else:
                self._custom(message)
            previous = role
        # What follows a transcript is live: a user message before the next
        # run starts (``agent_start``) can only be a steering one.
        self._answered = True

    def resume_message(self, message: dict[str, Any]) -> None:
        """Print what an assistant message still streaming has so far (the
        ``state`` query's ``streamingMessage``), its last line left open:
        the deltas that follow go on from it. Without this a chat attached
        mid-answer showed none of it until the answer ended (a user audit)."""
        self.end_line()
        self._streaming, self._streamed = True, False
        # A tool call is shown when it runs (tool_execution_start).
        self._content(_safe(message), with_tool_calls=False, close=False)

    def end_line(self) -> None:
        """Finish a line left open by streamed tokens."""
        global _streaming_line
        if self._line_open:
            self._console.print()
            self._line_open = False
        if _streaming_line is self:
            _streaming_line = None

    # --- event handlers ----------------------------------------------------

    def _on_agent_start(self, event: dict[str, Any]) -> None:
        self._answered = False
        self._results_shown.clear()  # call ids are the model's: a later run may reuse one

    def _on_message_start(self, event: dict[str, Any]) -> None:
        message = event["message"]
        role = message.get("role")
        if role == "assistant":
            self.end_line()
            self._streaming, self._streamed = True, False
        elif role == "user":
            queue = event.get("queue") or ("steering" if self._answered else None)
            self._user(message, queue)
        elif role != "toolResult":  # tool results are shown by tool_execution_end
            self._custom(message)

    def _on_message_update(self, event: dict[str, Any]) -> None:
        if not self._streaming:
            return  # joined mid-message: it is printed whole at its end
        update = event["assistantMessageEvent"]
        kind = update.get("type")
        if kind in ("text_start", "thinking_start"):
            self.end_line()
        elif kind == "text_delta":
            self._stream(update.get("delta", ""), "")
        elif kind == "thinking_delta" and self._show_thinking:
            self._stream(update.get("delta", ""), _THINKING)

    def _on_message_end(self, event: dict[str, Any]) -> None:
        message = event["message"]
        if message.get("role") == "toolResult" and str(message.get("toolCallId")) not in self._results_shown:
            # Its tool_execution_end came before this renderer joined (a chat
            # re-attached while another call of the batch waited for approval).
            self._result(message.get("toolName", "?"), message, bool(message.get("isError")))
            return
        if message.get("role") != "assistant":
            return
        if not self._streamed:
            self._content(message, with_tool_calls=False)
        self._stop_reason(message)
        self._streaming = self._streamed = False
        self._answered = True

    def _on_message_retry(self, event: dict[str, Any]) -> None:
        reason = f" ({event['reason']})" if event.get("reason") else ""
        discarded = "the partial answer above is discarded; " if self._streamed else ""
        self._note(f"↻ model call failed{reason}: {discarded}retrying (attempt {event.get('attempt')})")
        self._streaming = self._streamed = False

    def _on_tool_execution_start(self, event: dict[str, Any]) -> None:
        self._tool_call(event.get("toolName", "?"), event.get("args"))

    def _on_tool_execution_update(self, event: dict[str, Any]) -> None:
        text = _result_text(event.get("partialResult")).strip()
        if text:
            self._note(f"  ⋯ {_shorten(text.splitlines()[0], self._max_result_chars)}")

    def _on_tool_execution_retry(self, event: dict[str, Any]) -> None:
        reason = f" ({event['reason']})" if event.get("reason") else ""
        self._note(
            f"↻ {event.get('toolName', '?')} runs again{reason}: attempt {event.get('attempt')}, "
            "from the start"
        )

    def _on_tool_approval_request(self, event: dict[str, Any]) -> None:
        """A call waits for a person, who decides on its arguments: show
        them whole (up to a limit), with the reason and the call id."""
        args = event.get("args")
        if isinstance(args, dict):
            text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
        else:
            text = json.dumps(args, ensure_ascii=False, default=str)
        line = Text(f"⏸ approval needed: {event.get('toolName', '?')}({_shorten(text, APPROVAL_ARGS_CHARS)})")
        line.stylize(_WARNING)
        line.append(
            f"\n  {event.get('reason') or 'This tool call needs approval'} · call {event.get('toolCallId')}"
        )
        self._line(line)

    def _on_tool_execution_end(self, event: dict[str, Any]) -> None:
        self._result(event.get("toolName", "?"), event.get("result"), bool(event.get("isError")))
        self._results_shown.add(str(event.get("toolCallId")))

    def _on_agent_end(self, event: dict[str, Any]) -> None:
        self._note(_summary(event.get("messages", [])))

    # --- pieces ----------------------------------------------------------------

    def _stream(self, text: str, style: str) -> None:
        """Print tokens where the cursor is; the terminal wraps them."""
        if not text:
            return
        global _streaming_line
        self._console.print(Text(text, style=style), end="", soft_wrap=True)
        self._line_open = not text.endswith("\n")
        _streaming_line = self if self._line_open else None
        self._streamed = True

    def _note(self, text: str) -> None:
        """A dim line of the renderer's own (progress, retries, summaries)."""
        self._line(Text(text, style=_NOTE))

    def _line(self, text: Text) -> None:
        self.end_line()
        self._console.print(text)

    def _user(self, message: dict[str, Any], queue: str | None) -> None:
        """A prompt, or a message a queue injected (``steering``, ``followUp``)."""
        text = _user_text(message.get("content"))
        label = _QUEUE_LABELS.get(queue, queue) if queue else None
        if label:
            self._line(Text(f"» {label}: {text}", style=_INJECTED))
        else:
            self._line(Text(f"» {text}", style=_PROMPT))

    def _custom(self, message: dict[str, Any]) -> None:
        self._note(f"· {message.get('role')} message")

    def _content(self, message: dict[str, Any], *, with_tool_calls: bool, close: bool = True) -> None:
        """An assistant message's blocks, in order, from the message itself;
        ``close``: its last line ended (else left open for more deltas)."""
        for block in message.get("content") or []:
            kind = block.get("type")
            if kind == "thinking" and self._show_thinking:
                self.end_line()
                self._stream(block.get("thinking", ""), _THINKING)
            elif kind == "text":
                self.end_line()
                self._stream(block.get("text", ""), "")
            elif kind == "toolCall" and with_tool_calls:
                self._tool_call(block.get("name", "?"), block.get("arguments"))
        if close:
            self.end_line()

    def _tool_call(self, name: str, args: Any) -> None:
        self._line(Text(f"⚙ {name}({_format_args(args)})", style=_TOOL))

    def _result(self, tool_name: str, result: Any, is_error: bool) -> None:
        text = _clip(_result_text(result) or "(no output)", self._max_result_chars)
        first, *rest = text.splitlines() or [""]
        line = Text(f"  {'✗' if is_error else '✓'} {tool_name}: ", style=_ERROR if is_error else "green")
        line.append(first, style=_ERROR if is_error else _NOTE)
        for more in rest:
            line.append(f"\n    {more}", style=_ERROR if is_error else _NOTE)
        self._line(line)

    def _stop_reason(self, message: dict[str, Any]) -> None:
        self.end_line()
        reason, error = message.get("stopReason"), message.get("errorMessage")
        if reason == "error":
            self._line(Text(f"✗ {error or 'The model call failed.'}", style=_ERROR))
        elif reason == "aborted":
            self._line(Text(f"⚠ {error or 'Request was aborted'}", style=_WARNING))
        elif reason == "length":
            self._line(Text("⚠ The answer hit the output token limit.", style=_WARNING))


# --- text helpers ---------------------------------------------------------------


def _user_text(content: Any) -> str:
    return content if isinstance(content, str) else " ".join(_block_texts(content))


def _result_text(result: Any) -> str:
    """The text of a ``{content, details}`` result: its text blocks, else its details."""
    if not isinstance(result, dict):
        return "" if result is None else str(result)
    text = "\n".join(_block_texts(result.get("content")))
    if not text.strip() and result.get("details"):
        text = json.dumps(result["details"], ensure_ascii=False, default=str)
    return text


def _block_texts(blocks: Any) -> list[str]:
    """The text of each text block; ``[image]`` for an image."""
    texts = []
    for block in blocks or []:
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "image":
            texts.append("[image]")
    return texts


def _format_args(args: Any) -> str:
    if isinstance(args, dict):
        text = ", ".join(f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in args.items())
    else:
        text = json.dumps(args, ensure_ascii=False, default=str)
    return _shorten(text, ARGS_CHARS)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clip(text: str, limit: int) -> str:
    """The first lines of ``text``, at most ``limit`` characters."""
    text = text.strip()
    clipped = "\n".join(text.splitlines()[:RESULT_LINES])[:limit]
    return clipped if clipped == text else clipped.rstrip() + " …"


def _summary(messages: list[dict[str, Any]]) -> str:
    """``· 2 turns · 1,234 tokens · $0.0012`` from the run's assistant messages."""
    answers = [m for m in messages if m.get("role") == "assistant"]
    usages = [m.get("usage") or {} for m in answers]
    tokens = sum(u.get("totalTokens", 0) for u in usages)
    cost = sum((u.get("cost") or {}).get("total", 0.0) for u in usages)
    parts = [f"{len(answers)} turn{'' if len(answers) == 1 else 's'}"]
    if tokens:
        parts.append(f"{tokens:,} tokens")
    if cost:
        parts.append(f"${cost:.4f}")
    return "· " + " · ".join(parts)
