"""Print a conversation's events as they happen, for people or for programs."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from rich.console import Console
from rich.text import Text

from client import UPDATE_NOTE_AFTER, Conversation
from console.render import EventRenderer, json_line, output_console, shell_word, skipped_note, terminal_safe


async def watch(conversation: Conversation, *, as_json: bool, from_offset: int = 0) -> None:
    """Print events from ``from_offset`` until the workflow completes (or
    Ctrl-C): rendered, or as one JSON object per line with its ``offset``."""
    console = output_console()
    renderer = EventRenderer(console)

    def skipped(first: int, next_offset: int) -> None:
        if not as_json:
            renderer.end_line()
        print(skipped_note(first, next_offset, from_offset), file=sys.stderr, flush=True)

    loop = asyncio.get_running_loop()
    notes = [
        loop.create_task(_say_when_no_worker_answers(conversation)),
        loop.create_task(_say_when_past_the_end(conversation, from_offset)),
    ]
    try:
        async for offset, event in conversation.events(from_offset, on_skipped=skipped):
            for note in notes:
                note.cancel()
            _show(event, offset, as_json, renderer, console, conversation)
    finally:
        for note in notes:
            note.cancel()
    if as_json:  # stdout stays one JSON object per line
        print(terminal_safe(await conversation.how_it_ended()), file=sys.stderr, flush=True)
    else:
        renderer.end_line()
        console.print(Text(terminal_safe(await conversation.how_it_ended()), style="dim"))


def _show(
    event: dict[str, Any],
    offset: int,
    as_json: bool,
    renderer: EventRenderer,
    console: Console,
    conversation: Conversation,
) -> None:
    if as_json:
        line = {"offset": offset, **event}
        line["offset"] = offset  # the stream's offset, whatever the event itself carries
        print(json_line(line), flush=True)
        return
    renderer.render(event)
    if event.get("type") == "tool_approval_request":
        console.print(approval_hint(conversation.id, event.get("toolCallId", "")))


NO_WORKER_NOTE_AFTER = 5.0
"""Seconds without an event from a conversation that has ended before
``watch`` says it waits for a worker (it printed nothing for good)."""


async def _say_when_no_worker_answers(conversation: Conversation) -> None:
    """An ended conversation's events are read by a query a worker answers
    (replaying its history): with no worker on its task queue nothing
    comes. Said once on stderr, then the read goes on waiting."""
    task_queue = await conversation.ended_on_task_queue()
    if task_queue is None:
        return  # a live conversation may well be quiet
    await asyncio.sleep(NO_WORKER_NOTE_AFTER)
    print(
        f"note: nothing read yet: the conversation has ended, and reading its events needs a worker on "
        f"task queue {task_queue!r} to replay it; waiting for one.",
        file=sys.stderr,
        flush=True,
    )


PAST_THE_END_NOTE_AFTER = 1.0
"""Seconds without an event before ``watch --from N`` asks whether N is
past the conversation's last event."""


async def _say_when_past_the_end(conversation: Conversation, from_offset: int) -> None:
    """``--from`` past the last event waits for events to come, which a
    mistyped offset waited for silently (a new user's audit). Said once on
    stderr when the conversation's next offset is below it; the read goes on."""
    if from_offset <= 0:
        return
    await asyncio.sleep(PAST_THE_END_NOTE_AFTER)
    try:
        # Within the client's own note on a slow query (UPDATE_NOTE_AFTER):
        # that note would be about `state`, which the user did not ask for.
        state = await asyncio.wait_for(conversation.state(), UPDATE_NOTE_AFTER / 2)
    except Exception:  # no worker, an ended conversation: other notes say so
        return
    if state.event_offset < from_offset:
        last = state.event_offset - 1
        so_far = f"its last event so far is {last}" if last >= 0 else "it has no event yet"
        print(
            f"note: waiting for event {from_offset}: {so_far} (watch --from 0 shows them all).",
            file=sys.stderr,
            flush=True,
        )


def approval_hint(conversation_id: str, call_id: str) -> Text:
    """How to decide a waiting call from another terminal (printed by watch and run)."""
    return Text(
        terminal_safe(
            f"  decide: python starter.py approve {shell_word(conversation_id)} "
            f"{shell_word(call_id)} [--reject]"
        ),
        style="dim",
    )
