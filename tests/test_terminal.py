"""Model and tool text cannot drive the user's terminal (issue 12): the
console prints events and transcripts without control sequences, and
``watch --json`` escapes what a terminal would act on."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from console.render import EventRenderer, json_line, terminal_safe

HOSTILE = (
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b]0;pwned\x07"  # window title
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"  # hyperlink
    "\x9b31m"  # C1 CSI
    "\x1bP+q544e\x1b\\"  # DCS: ask the terminal to answer back
    "\u202etxt.exe"  # right-to-left override
    "\r\x08\x07\x00"  # carriage return, backspace, bell, NUL
)


def rendered(events: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    renderer = EventRenderer(Console(file=out, width=200, force_terminal=False))
    for event in events:
        renderer.render(event)
    renderer.end_line()
    return out.getvalue()


def assert_inert(output: str) -> None:
    for forbidden in ("\x1b", "\x9b", "\x07", "\x08", "\x00", "\r", "\u202e"):
        assert forbidden not in output, (forbidden, output)


def test_terminal_safe_keeps_text_newlines_and_tabs() -> None:
    assert terminal_safe(f"a\tb\nc{HOSTILE}d") == "a\tb\ncclick31mtxt.exed"


def test_model_and_tool_text_cannot_drive_the_terminal() -> None:
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": f"answer {HOSTILE}"}],
        "stopReason": "error",
        "errorMessage": f"failed {HOSTILE}",
        "usage": {},
    }
    events: list[dict[str, Any]] = [
        {"type": "agent_start"},
        {"type": "message_start", "message": {"role": "user", "content": f"hi {HOSTILE}"}},
        {"type": "message_start", "message": {"role": "assistant", "content": []}},
        {"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "delta": HOSTILE[:3]}},
        {"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "delta": HOSTILE[3:]}},
        {"type": "message_end", "message": message},
        {"type": "tool_execution_start", "toolName": f"t{HOSTILE}", "args": {HOSTILE: HOSTILE}},
        {
            "type": "tool_execution_update",
            "toolName": "t",
            "partialResult": {"content": [{"type": "text", "text": HOSTILE}]},
        },
        {
            "type": "tool_execution_end",
            "toolName": "t",
            "result": {"content": [{"type": "text", "text": HOSTILE}]},
            "isError": True,
        },
        {"type": "message_retry", "attempt": 2, "reason": HOSTILE},
        {"type": "tool_execution_retry", "toolName": HOSTILE, "attempt": HOSTILE, "reason": HOSTILE},
    ]

    output = rendered(events)

    assert_inert(output)
    assert "✗ failed" in output and "» hi" in output and "⚙ t" in output


def test_a_stored_transcript_cannot_drive_the_terminal() -> None:
    out = io.StringIO()
    EventRenderer(Console(file=out, width=200, force_terminal=False)).render_transcript(
        [
            {"role": "user", "content": HOSTILE},
            {"role": "assistant", "content": [{"type": "text", "text": HOSTILE}], "stopReason": "stop"},
            {"role": "toolResult", "toolName": HOSTILE, "content": [{"type": "text", "text": HOSTILE}]},
        ]
    )

    assert_inert(out.getvalue())


def test_json_lines_escape_what_a_terminal_would_act_on_and_keep_the_data() -> None:
    event = {"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "delta": HOSTILE}}

    line = json_line(event)

    assert_inert(line)
    assert json.loads(line) == event
