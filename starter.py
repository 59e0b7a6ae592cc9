"""Talk to agent conversations from the command line.

    python starter.py run "What is 2+2?"      start, stream the answer, close
    python starter.py chat [--id ID]           chat in the terminal (re-attach to ID, or start it)
    python starter.py watch ID [--json] [--from OFFSET]   print the events as they happen
    python starter.py start [--id ID] [--prompt TEXT]
    python starter.py prompt ID TEXT [--wait]  start a run (refused while one is active)
    python starter.py steer ID TEXT            inject before the next model call
    python starter.py follow-up ID TEXT        handle when the agent would stop
    python starter.py abort ID | stop ID | continue ID [--wait] | close ID
    python starter.py approve ID CALL_ID [--reject] [--reason TEXT]
    python starter.py configure ID [--model M] [--system S] [--thinking L] [--tools a,b] ...
    python starter.py clear ID [steering|followUp|all]   print the removed messages (JSON)
    python starter.py reset ID | wait ID | fork ID --at N [--id NEW]
    python starter.py state ID | messages ID
    python starter.py list [--status S] [--model M] [--limit N]   the conversations, running ones first

Connects to TEMPORAL_ADDRESS (default localhost:7233), TEMPORAL_NAMESPACE and
TEMPORAL_TASK_QUEUE (default ``agent``), like the worker. A request the
conversation refuses prints one line on stderr and exits with 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import unicodedata
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.exceptions import ApplicationError
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError

from client import (
    LISTED_STATUSES,
    AgentMessage,
    Conversation,
    PromptResult,
    Refused,
    StoppedWaiting,
    list_conversations,
)
from console import EventRenderer, approval_hint, chat, skipped_note, watch
from console.render import end_streamed_line, output_console, terminal_safe
from runtime.connect import ServerUnreachable, connect
from runtime.settings import Settings, SettingsError
from workflows.arguments import clean_text

THINKING_LEVELS = ["off", "minimal", "low", "medium", "high", "xhigh"]


class UserError(Exception):
    """A problem the user can fix; printed as one line."""


def start_options(args: argparse.Namespace) -> dict[str, Any]:
    """The start settings from the command-line options (snake_case)."""
    fields = {
        "model": args.model,
        "system_prompt": args.system,
        "thinking_level": args.thinking,
        "tools": _names(args.tools),
        "max_turns": args.max_turns,
        "approval_timeout_seconds": args.approval_timeout,
    }
    # "none" at the start is the default: no limit.
    return {k: v for k, v in fields.items() if v is not None and v is not NO_LIMIT}


def _names(raw: str | None) -> list[str] | None:
    return None if raw is None else [name.strip() for name in raw.split(",") if name.strip()]


# --- runs -------------------------------------------------------------------------------------


async def cmd_run(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    conversation = await Conversation.start(
        client,
        settings,
        id=args.id or f"run-{uuid.uuid4().hex[:8]}",
        prompt=args.prompt,
        close_when_idle=True,
        **start_options(args),
    )
    print(f"conversation {conversation.id}: {settings.workflow_url(conversation.id)}", file=sys.stderr)
    # The start's prompt is the first run.
    try:
        code = await _stream_run(conversation, conversation.events(on_skipped=_say_skipped))
    except asyncio.CancelledError:
        # Ctrl-C stops what `run` started, as the chat's first Ctrl-C does:
        # it left the run going, billed, unseen (an operator audit). The
        # answer cut short ends its line (piped, it had no last newline).
        end_streamed_line()
        try:
            await asyncio.wait_for(conversation.abort(), 10)
            said = f"aborted the run; conversation {conversation.id} closes itself"
        except Exception as err:
            said = f"the run goes on: abort it with python starter.py abort {conversation.id} ({err})"
        _note(said)
        raise
    if code is None:
        await conversation.result()  # the workflow ended without a run: this raises why
        raise UserError("The conversation ended without an answer.")
    return code


async def cmd_prompt(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    conversation = Conversation.attach(client, args.id)
    return await _started(conversation, await conversation.send_prompt(args.text), args.wait)


async def cmd_continue(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    conversation = Conversation.attach(client, args.id)
    return await _started(conversation, await conversation.send_continue(), args.wait)


async def _started(conversation: Conversation, started: PromptResult, wait: bool) -> int:
    """Say which run started; with ``wait``, stream it to its end."""
    if not wait:
        print(f"run {started.run} started (events from offset {started.event_offset})")
        return 0
    code = await _stream_run(conversation, conversation.run_events(started, on_skipped=_say_skipped))
    if code is None:
        raise UserError(f"Conversation {conversation.id} ended before run {started.run} did.")
    return code


def _say_skipped(first: int, next_offset: int) -> None:
    print(skipped_note(first, next_offset), file=sys.stderr, flush=True)


async def _stream_run(
    conversation: Conversation, events: AsyncIterator[tuple[int, dict[str, Any]]]
) -> int | None:
    """Render events up to the first ``agent_end``: 1 when that run ended in
    error, 0 otherwise, None when the conversation ended before a run did."""
    console = output_console()
    renderer = EventRenderer(console)
    async for _, event in events:
        renderer.render(event)
        if event["type"] == "tool_approval_request":
            console.print(approval_hint(conversation.id, str(event.get("toolCallId", ""))))
        if event["type"] == "agent_end":
            renderer.end_line()
            return 1 if _ended_in_error(event["messages"]) else 0
    renderer.end_line()
    return None


def _ended_in_error(messages: list[dict[str, Any]]) -> bool:
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    return last is not None and last.get("stopReason") == "error"


async def cmd_wait(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    conversation = Conversation.attach(client, args.id)
    idle = await conversation.wait_for_idle()
    print(json.dumps({"runs": idle.runs, "stopReason": idle.stop_reason}), flush=True)
    if idle.stop_reason != "error":
        return 0
    # Why, as `prompt --wait` says it (the JSON alone sent users to `state`).
    error = (await conversation.state()).error_message
    if error:
        print(f"✗ {terminal_safe(error)}", file=sys.stderr)
    return 1


# --- live clients ------------------------------------------------------------------------------


async def cmd_chat(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    return await chat(client, settings, args.id, start_options(args))


async def cmd_watch(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    await watch(Conversation.attach(client, args.id), as_json=args.json, from_offset=args.from_offset)
    return 0


# --- the conversation's lifecycle --------------------------------------------------------------


async def cmd_start(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    conversation = await Conversation.start(
        client, settings, id=args.id, prompt=args.prompt, **start_options(args)
    )
    print(conversation.id)
    return 0


async def cmd_fork(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    fork = await Conversation.attach(client, args.id).fork(args.at, id=args.new_id)
    print(fork.id)
    return 0


async def cmd_reset(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    await Conversation.attach(client, args.id).reset()
    print(f"reset {args.id}: transcript, queues, usage and counters cleared")
    return 0


async def cmd_signal(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    conversation = Conversation.attach(client, args.id)
    sends = {
        "steer": lambda: conversation.steer(args.text),
        "follow-up": lambda: conversation.follow_up(args.text),
        "abort": conversation.abort,
        "stop": conversation.stop_after_turn,
        "close": conversation.close,
    }
    await sends[args.command]()
    print(f"sent {SIGNALS[args.command]} to {args.id}")
    return 0


SIGNALS = {
    "steer": "steer",
    "follow-up": "follow_up",
    "abort": "abort",
    "stop": "stop_after_turn",
    "close": "close",
}


# --- settings, queues, approvals -------------------------------------------------------------


async def cmd_configure(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    changes = {
        "model": args.model,
        "system_prompt": args.system,
        "thinking_level": args.thinking,
        "tools": _names(args.tools),
        "tool_execution": args.tool_execution,
        "steering_mode": args.steering_mode,
        "follow_up_mode": args.follow_up_mode,
        "max_turns": args.max_turns,
        "max_total_tokens": args.max_total_tokens,
        "max_cost": args.max_cost,
        "approval_timeout_seconds": args.approval_timeout,
    }
    # No option: change nothing and print those in force; "none": null, no limit.
    changes = {k: (None if v is NO_LIMIT else v) for k, v in changes.items() if v is not None}
    in_force = await Conversation.attach(client, args.id).configure(**changes)
    print(json.dumps(in_force.model_dump(mode="json"), indent=2))
    return 0


async def cmd_clear(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    removed = await Conversation.attach(client, args.id).clear_queues(args.which)
    print(json.dumps([m.model_dump(mode="json") for m in removed], indent=2))
    return 0


async def cmd_approve(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    conversation = Conversation.attach(client, args.id)
    await conversation.approve(args.call_id, approved=not args.reject, reason=args.reason)
    print(f"{'rejected' if args.reject else 'approved'} {args.call_id}")
    return 0


async def cmd_state(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    state = await Conversation.attach(client, args.id).state()
    print(json.dumps(state.model_dump(mode="json"), indent=2))
    return 0


async def cmd_messages(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    messages: list[AgentMessage] = await Conversation.attach(client, args.id).messages()
    print(json.dumps([m.model_dump(mode="json") for m in messages], indent=2))
    return 0


async def cmd_list(client: Client, settings: Settings, args: argparse.Namespace) -> int:
    rows = [
        (
            terminal_safe(found.id),  # anyone may start or configure a conversation
            found.status or "-",
            terminal_safe(found.model or "-"),
            # None: the server keeps no Agent* search attributes (not zero).
            "- turns" if found.turns is None else f"{found.turns} turn{'' if found.turns == 1 else 's'}",
            "- tokens" if found.total_tokens is None else f"{found.total_tokens:,} tokens",
            "$-" if found.cost is None else f"${found.cost:.4f}",
            found.started.astimezone().strftime("%Y-%m-%d %H:%M"),
        )
        async for found in list_conversations(client, status=args.status, model=args.model, limit=args.limit)
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("No conversations found.", file=sys.stderr)
    return 0


# --- the command line --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def agent_settings(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--model", help="model id (default: the worker's AGENT_MODEL)")
        sub.add_argument("--system", help="system prompt")
        sub.add_argument("--thinking", choices=THINKING_LEVELS)
        sub.add_argument("--tools", help="comma-separated tool names (default: all the worker has)")
        sub.add_argument(
            "--max-turns",
            type=_or_none(_count),
            metavar="N",
            help="most model calls in one run (none: no limit)",
        )
        sub.add_argument(
            "--approval-timeout",
            type=_or_none(_seconds),
            metavar="SECONDS",
            help="reject calls undecided this long after they asked (configure: those waiting now "
            "too; none: wait for good, the default)",
        )

    def start_settings(sub: argparse.ArgumentParser) -> None:
        agent_settings(sub)
        sub.add_argument("--id", type=_new_id, help="conversation id (workflow id)")

    run = commands.add_parser("run", help="start a conversation, stream its run, close it")
    run.add_argument("prompt")
    start_settings(run)
    start_settings(
        commands.add_parser("chat", help="chat in the terminal (--id re-attaches, or starts that id)")
    )
    watch = commands.add_parser("watch", help="print a conversation's events as they happen")
    watch.add_argument("id")
    watch.add_argument("--json", action="store_true", help="one JSON event per line, with its offset")
    watch.add_argument("--from", dest="from_offset", type=_offset, default=0, metavar="OFFSET")
    start = commands.add_parser("start", help="start a conversation and print its id")
    start.add_argument("--prompt")
    start_settings(start)

    for name, text in (
        ("prompt", "start a run with TEXT"),
        ("continue", "run from the transcript and queues"),
    ):
        sub = commands.add_parser(name, help=f"{text} (refused while a run is active)")
        sub.add_argument("id")
        if name == "prompt":
            sub.add_argument("text")
        sub.add_argument(
            "--wait", action="store_true", help="stream the run to its end; exit 1 if it ended in error"
        )
    for name, text in (
        ("steer", "queue TEXT for the run's next model call (or start a run when idle)"),
        ("follow-up", "queue TEXT for when the run would end (or start a run when idle)"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("id")
        sub.add_argument("text")
    for name, text in (
        ("abort", "abort the active run"),
        ("stop", "end the active run after its current turn"),
        ("close", "end the conversation (an active run is aborted first)"),
        ("state", "print the state query (JSON)"),
        ("messages", "print the transcript (JSON)"),
    ):
        commands.add_parser(name, help=text).add_argument("id")

    configure = commands.add_parser(
        "configure", help="change settings from the next model call; print those in force"
    )
    configure.add_argument("id")
    agent_settings(configure)
    configure.add_argument("--tool-execution", choices=["parallel", "sequential"])
    configure.add_argument("--steering-mode", choices=["one-at-a-time", "all"])
    configure.add_argument("--follow-up-mode", choices=["one-at-a-time", "all"])
    configure.add_argument(
        "--max-total-tokens",
        type=_or_none(_count),
        metavar="N",
        help="token budget of the conversation (none: no limit)",
    )
    configure.add_argument(
        "--max-cost",
        type=_or_none(float),
        metavar="USD",
        help="cost budget of the conversation (none: no limit)",
    )

    clear = commands.add_parser("clear", help="remove queued messages; print them (JSON, oldest first)")
    clear.add_argument("id")
    clear.add_argument("which", nargs="?", default="all", choices=["steering", "followUp", "all"])
    commands.add_parser("reset", help="clear transcript, queues, usage (refused during a run)").add_argument(
        "id"
    )
    commands.add_parser(
        "wait", help="wait until no run is active; print runs and stopReason (exit 1: it ended in error)"
    ).add_argument("id")
    fork = commands.add_parser("fork", help="a new conversation from the first N messages; print its id")
    fork.add_argument("id")
    fork.add_argument("--at", type=_kept, required=True, metavar="N", help="messages to keep")
    fork.add_argument("--id", dest="new_id", type=_new_id, metavar="NEW", help="the new conversation's id")
    listing = commands.add_parser(
        "list", help="the conversations: running ones newest first, then ended ones by when they ended"
    )
    listing.add_argument("--status", choices=LISTED_STATUSES)
    listing.add_argument("--model")
    listing.add_argument("--limit", type=_count, default=50)
    approve = commands.add_parser("approve", help="decide a tool call that waits for approval")
    approve.add_argument("id")
    approve.add_argument("call_id")
    approve.add_argument("--reject", action="store_true", help="refuse the call instead")
    approve.add_argument("--reason", help="why (the model sees it)")
    return parser


COMMANDS = {
    "run": cmd_run,
    "chat": cmd_chat,
    "watch": cmd_watch,
    "start": cmd_start,
    "prompt": cmd_prompt,
    "continue": cmd_continue,
    "wait": cmd_wait,
    "configure": cmd_configure,
    "clear": cmd_clear,
    "reset": cmd_reset,
    "fork": cmd_fork,
    "approve": cmd_approve,
    "list": cmd_list,
    "state": cmd_state,
    "messages": cmd_messages,
    **{name: cmd_signal for name in SIGNALS},
}


def _note(sentence: str) -> None:
    if sys.stdout.isatty() and sys.stderr.isatty():  # one screen: not in the middle of a streamed word
        end_streamed_line()
    print(f"note: {sentence}", file=sys.stderr, flush=True)


class _ServerLostNote(logging.Handler):
    """The SDK core's warnings (a call to the server retried while it is
    down) as one sentence, once, instead of its log lines among the
    events: a connected `watch` printed 35 of them in a minute's outage (a
    durability audit)."""

    def __init__(self, address: str) -> None:
        super().__init__(logging.WARNING)
        self._address = address
        self._said = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self._said and "retried" in record.getMessage():
            self._said = True
            _note(f"the Temporal server at {self._address} does not answer; retrying until it does.")


def _quiet_runtime(settings: Settings) -> Runtime:
    """A runtime whose core warnings reach ``_ServerLostNote``, not the terminal."""
    logger = logging.getLogger("starter.sdk-core")
    logger.propagate = False
    logger.addHandler(_ServerLostNote(settings.address))
    forwarding = LogForwardingConfig(logger=logger, append_target_to_name=False)
    logging_config = LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"), forwarding=forwarding
    )
    return Runtime(telemetry=TelemetryConfig(logging=logging_config))


async def run_command(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    client = await connect(settings, runtime=_quiet_runtime(settings))
    Conversation.on_slow_update = _note
    try:
        return await COMMANDS[args.command](client, settings, args)
    except asyncio.CancelledError as err:
        if not isinstance(err.__cause__, StoppedWaiting):
            raise
        print(f"note: {err.__cause__}", file=sys.stderr)  # Ctrl-C while a request waited for a worker
        return 130
    except (Refused, StoppedWaiting) as err:
        raise UserError(str(err)) from None
    except WorkflowFailureError as err:
        cause = err.cause
        raise UserError(f"The conversation failed: {getattr(cause, 'message', None) or cause}") from None
    except RPCError as err:
        raise UserError(err.message) from None
    except OSError as err:
        if not _in_payload_store(err, settings):
            raise
        raise UserError(
            f"The payload store cannot be written ({err.strerror}): point AGENT_STORAGE_DIR "
            f"(now {settings.storage_dir}) or AGENT_DATA_DIR at a directory this user can write."
        ) from None
    except RuntimeError as err:
        if "StorageDriver" not in str(err):  # the SDK's storage drivers name themselves
            raise
        why = f" ({err.__cause__})" if err.__cause__ else ""
        raise UserError(f"{str(err).rstrip('.')}{why}: check AGENT_STORAGE and the AWS_* settings.") from None
    except ApplicationError as err:
        if err.type != "PayloadRefused":
            raise
        # An answer this process cannot decode (encrypted with a key it does
        # not have): what was sent did reach the conversation.
        raise UserError(
            f"The conversation's answer could not be read here (what was sent was delivered): {err.message}"
        ) from None


def _in_payload_store(err: OSError, settings: Settings) -> bool:
    """``err`` is about the payload store's directory (a large message is
    stored there before it is sent)."""
    if settings.storage != "file" or not isinstance(err.filename, str):
        return False
    where = Path(err.filename)
    return (
        settings.storage_dir == where
        or settings.storage_dir in where.parents
        or where in settings.storage_dir.parents
    )


def _whole(what: str, least: int) -> Callable[[str], int]:
    """An argparse type: a whole number, ``least`` or more, refused in
    ``what``'s words ("an offset is 0 or more, not -5")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} is a whole number, not {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{what} is {least} or more, not {value}")
        return value

    return parse


NO_LIMIT: Any = object()
"""What ``none`` given for a limit parses to: null in ``configure`` (no
limit), the default at a start."""


def _or_none(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type that also takes ``none`` (or ``null``): no limit."""

    def parse_or_none(text: str) -> Any:
        return NO_LIMIT if text.strip().lower() in ("none", "null") else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value")  # argparse names it in a refusal
    return parse_or_none


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds are a number, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds are a number above 0, not {text}")
    return value


def _new_id(text: str) -> str:
    """An argparse type: the id of a conversation to start (or fork). An
    empty one started a conversation under a made-up id, and control
    characters went raw to the terminal in every hint that names it (a
    wedge audit)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an id cannot be empty: give one, or leave --id out for a new one")
    if any(unicodedata.category(c) == "Cc" for c in text):
        raise argparse.ArgumentTypeError(f"an id cannot hold control characters: {text!r}")
    return text


_offset = _whole("an offset", 0)  # an event offset
_kept = _whole("a number of messages to keep", 0)  # fork --at: refused before connecting
# 0 turns or tokens would be refused by the conversation; a listing of 0 would show nothing.
_count = _whole("a count", 1)


def _stopped_waiting(args: argparse.Namespace) -> str | None:
    """What Ctrl-C left going, for the commands that wait on a conversation
    (they exited 130 without a word; an operator audit). ``run`` says it
    itself: it aborts its run."""
    conversation = getattr(args, "id", None)
    if args.command == "watch":
        return "stopped watching; the conversation goes on."
    if args.command == "wait" or (args.command in ("prompt", "continue") and getattr(args, "wait", False)):
        return f"stopped waiting; the run goes on (python starter.py abort {conversation} stops it)."
    return None


def _cleaned(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments with what is not UTF-8 replaced by U+FFFD: Python
    reads such bytes (``$'caf\\xe9'`` in a UTF-8 terminal) as lone
    surrogates, which no payload can carry, and every command that sent
    one ended in a traceback (an operator audit)."""
    for name, value in vars(args).items():
        if isinstance(value, str):
            setattr(args, name, clean_text(value))
        elif isinstance(value, list):
            setattr(args, name, [clean_text(v) if isinstance(v, str) else v for v in value])
    return args


def main(argv: list[str] | None = None) -> None:
    args = _cleaned(build_parser().parse_args(argv))
    try:
        code = asyncio.run(run_command(args))
    except (UserError, ServerUnreachable, SettingsError) as err:
        print(f"error: {terminal_safe(str(err))}", file=sys.stderr)
        code = 2
    except (KeyboardInterrupt, WorkflowUpdateRPCTimeoutOrCancelledError):  # the latter: in an SDK call
        said = _stopped_waiting(args)
        if said:
            _note(said)
        code = 130
    except BrokenPipeError:  # the reader went away (`watch ID --json | head`)
        code = 0
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)  # the SDK can crash at interpreter exit (sdk-python #300)


if __name__ == "__main__":
    main()
