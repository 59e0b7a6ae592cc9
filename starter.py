"""Talk to agent conversations from the command line.

    python starter.py run "What is 2+2?"      start, stream the answer, close
    python starter.py chat [--id ID]           chat in the terminal (re-attach to ID, or start it)
    python starter.py watch ID [--json] [--from OFFSET]   print the events as they happen
    python starter.py start [--id ID] [--prompt TEXT]
    python starter.py prompt ID TEXT           start a run (refused while one is active)
    python starter.py steer ID TEXT            inject before the next model call
    python starter.py follow-up ID TEXT        handle when the agent would stop
    python starter.py abort ID | stop ID | continue ID | close ID
    python starter.py state ID | messages ID

Connects to TEMPORAL_ADDRESS (default localhost:7233), TEMPORAL_NAMESPACE and
TEMPORAL_TASK_QUEUE (default ``agent``), like the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import uuid
from typing import Any

from rich.console import Console
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from client import start_conversation
from console import EventRenderer, chat, follow, watch
from runtime.connect import ServerUnreachable, connect
from runtime.settings import Settings
from workflows.contract import PromptResult, SessionState
from workflows.models import AgentMessage, MessageList


class UserError(Exception):
    """A problem the user can fix; printed as one line."""


def session_input(args: argparse.Namespace) -> dict[str, Any]:
    """The start input from the command-line options (camelCase JSON)."""
    fields = {
        "prompt": getattr(args, "prompt", None),
        "model": args.model,
        "systemPrompt": args.system,
        "thinkingLevel": args.thinking,
        "tools": args.tools.split(",") if args.tools is not None else None,
        "maxTurns": args.max_turns,
    }
    return {k: v for k, v in fields.items() if v is not None}


async def cmd_run(client: Client, config: Settings, args: argparse.Namespace) -> int:
    workflow_id = args.id or f"run-{uuid.uuid4().hex[:8]}"
    handle = await start_conversation(
        client, workflow_id, {**session_input(args), "closeWhenIdle": True}, task_queue=config.task_queue
    )
    print(f"conversation {workflow_id}: {config.workflow_url(workflow_id)}", file=sys.stderr)
    renderer = EventRenderer(Console())
    async for _, event in follow(client, workflow_id):
        renderer.render(event)
        if event["type"] == "agent_end":
            renderer.end_line()
            return 1 if _ended_in_error(event["messages"]) else 0
    await handle.result()  # the workflow ended without a run: this raises why
    raise UserError("The conversation ended without an answer.")


def _ended_in_error(messages: list[dict[str, Any]]) -> bool:
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    return last is not None and last.get("stopReason") == "error"


async def cmd_chat(client: Client, config: Settings, args: argparse.Namespace) -> int:
    await chat(client, config, args.id, session_input(args))
    return 0


async def cmd_watch(client: Client, config: Settings, args: argparse.Namespace) -> int:
    await watch(client, args.id, as_json=args.json, from_offset=args.from_offset)
    return 0


async def cmd_start(client: Client, config: Settings, args: argparse.Namespace) -> int:
    workflow_id = args.id or f"chat-{uuid.uuid4().hex[:8]}"
    await start_conversation(client, workflow_id, session_input(args), task_queue=config.task_queue)
    print(workflow_id)
    return 0


async def cmd_prompt(client: Client, config: Settings, args: argparse.Namespace) -> int:
    result = await client.get_workflow_handle(args.id).execute_update(
        "prompt", args.text, result_type=PromptResult
    )
    print(f"run {result.run} started (events from offset {result.event_offset})")
    return 0


async def cmd_continue(client: Client, config: Settings, args: argparse.Namespace) -> int:
    result = await client.get_workflow_handle(args.id).execute_update("continue", result_type=PromptResult)
    print(f"run {result.run} started (events from offset {result.event_offset})")
    return 0


async def cmd_signal(client: Client, config: Settings, args: argparse.Namespace) -> int:
    signal, payload = SIGNALS[args.command]
    arg = args.text if payload else None
    handle = client.get_workflow_handle(args.id)
    if arg is None:
        await handle.signal(signal)
    else:
        await handle.signal(signal, arg)
    print(f"sent {signal} to {args.id}")
    return 0


async def cmd_state(client: Client, config: Settings, args: argparse.Namespace) -> int:
    state = await client.get_workflow_handle(args.id).query("state", result_type=SessionState)
    print(json.dumps(state.model_dump(), indent=2))
    return 0


async def cmd_messages(client: Client, config: Settings, args: argparse.Namespace) -> int:
    messages: list[AgentMessage] = await client.get_workflow_handle(args.id).query(
        "messages", result_type=list[AgentMessage]
    )
    print(json.dumps(MessageList.dump_python(messages, mode="json"), indent=2))
    return 0


SIGNALS: dict[str, tuple[str, bool]] = {
    "steer": ("steer", True),
    "follow-up": ("follow_up", True),
    "abort": ("abort", False),
    "stop": ("stop_after_turn", False),
    "close": ("close", False),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def settings(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--model", help="model id (default: the worker's AGENT_MODEL)")
        sub.add_argument("--system", help="system prompt")
        sub.add_argument("--thinking", choices=["off", "minimal", "low", "medium", "high", "xhigh"])
        sub.add_argument("--tools", help="comma-separated tool names (default: all the worker has)")
        sub.add_argument("--max-turns", type=int)
        sub.add_argument("--id", help="conversation id (workflow id)")

    run = commands.add_parser("run", help="start a conversation, stream its run, close it")
    run.add_argument("prompt")
    settings(run)
    settings(commands.add_parser("chat", help="chat in the terminal (--id re-attaches, or starts that id)"))
    watch = commands.add_parser("watch", help="print a conversation's events as they happen")
    watch.add_argument("id")
    watch.add_argument("--json", action="store_true", help="one JSON event per line, with its offset")
    watch.add_argument("--from", dest="from_offset", type=int, default=0, metavar="OFFSET")
    start = commands.add_parser("start", help="start a conversation and print its id")
    start.add_argument("--prompt")
    settings(start)
    for name in ("prompt", "steer", "follow-up"):
        sub = commands.add_parser(name)
        sub.add_argument("id")
        sub.add_argument("text")
    for name in ("abort", "stop", "close", "continue", "state", "messages"):
        commands.add_parser(name).add_argument("id")
    return parser


COMMANDS = {
    "run": cmd_run,
    "chat": cmd_chat,
    "watch": cmd_watch,
    "start": cmd_start,
    "prompt": cmd_prompt,
    "continue": cmd_continue,
    "state": cmd_state,
    "messages": cmd_messages,
    **{name: cmd_signal for name in SIGNALS},
}


async def run_command(args: argparse.Namespace) -> int:
    config = Settings.from_env()
    client = await connect(config)
    try:
        return await COMMANDS[args.command](client, config, args)
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        raise UserError(getattr(cause, "message", None) or str(cause)) from None
    except WorkflowFailureError as err:
        cause = err.cause
        raise UserError(f"The conversation failed: {getattr(cause, 'message', None) or cause}") from None
    except RPCError as err:
        raise UserError(err.message) from None


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = asyncio.run(run_command(args))
    except (UserError, ServerUnreachable) as err:
        print(f"error: {err}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # the reader went away (`watch ID --json | head`)
        code = 0
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)  # the SDK can crash at interpreter exit (sdk-python #300)


if __name__ == "__main__":
    main()
