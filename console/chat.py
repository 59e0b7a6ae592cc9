"""The terminal chat: type while the agent's answer streams.

Two tasks run side by side: one follows the conversation's event stream and
renders it with rich, the other reads lines with prompt_toolkit. What the
renderer prints goes above the input line (``patch_stdout``); the line still
streaming is shown just above the prompt (``AbovePromptWriter``), so typing
and streaming never draw over each other.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TextIO, cast

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import ANSI, AnyFormattedText, FormattedText, merge_formatted_text
from prompt_toolkit.patch_stdout import patch_stdout
from rich.console import Console
from rich.text import Text
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from client import follow, start_conversation
from console.above_prompt import AbovePromptWriter
from console.render import EventRenderer
from runtime.settings import Settings
from workflows.contract import PromptResult, SessionState

HELP = """\
Type a message to start a run; while a run is active it steers it
(injected before the next model call).
  /followup TEXT  queue TEXT for when the agent would otherwise stop
  /abort          abort the active run (or Ctrl-C)
  /stop           end the active run after the current turn
  /state          queues, turns, token usage and cost
  /help           this help
  /quit           leave; the conversation stays alive (or Ctrl-D)"""

_PROMPT = FormattedText([("bold", "› ")])
_CONVERSATION_ENDED = "The conversation has ended."


async def chat(client: Client, config: Settings, workflow_id: str | None, settings: dict[str, Any]) -> None:
    """Chat with conversation ``workflow_id``, starting it (with ``settings``,
    camelCase) when no conversation has that id yet, or with a new one when
    it is ``None``. Re-attaching prints the transcript, then goes on live
    from where the transcript ends."""
    workflow_id = workflow_id or f"chat-{uuid.uuid4().hex[:8]}"
    transcript, offset = await _attach_or_start(client, config, workflow_id, settings)
    await ChatSession(client, workflow_id).run(transcript, offset)


async def _attach_or_start(
    client: Client, config: Settings, workflow_id: str, settings: dict[str, Any]
) -> tuple[list[dict[str, Any]], int]:
    """The transcript and offset of conversation ``workflow_id``; a
    conversation that does not exist yet is started (users name their chats)."""
    try:
        return await _snapshot(client, workflow_id)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    try:
        await start_conversation(client, workflow_id, settings, task_queue=config.task_queue)
    except WorkflowAlreadyStartedError:  # another chat started it meanwhile: join it
        return await _snapshot(client, workflow_id)
    return [], 0


async def _snapshot(client: Client, workflow_id: str) -> tuple[list[dict[str, Any]], int]:
    """The transcript and the stream offset that continues it exactly.

    One ``state`` query gives the message count and the offset together;
    messages are only ever appended, so the first ``messageCount`` messages
    of a later ``messages`` query are the ones that offset follows."""
    handle = client.get_workflow_handle(workflow_id)
    state = await handle.query("state", result_type=SessionState)
    messages: list[dict[str, Any]] = await handle.query("messages")
    return messages[: state.message_count], state.event_offset


class ChatSession:
    """One terminal attached to one conversation."""

    def __init__(self, client: Client, workflow_id: str) -> None:
        self._client = client
        self._workflow_id = workflow_id
        self._handle = client.get_workflow_handle(workflow_id)
        self._input: PromptSession[str] = PromptSession(erase_when_done=True)
        self._writer: AbovePromptWriter | None = None
        self._notes = Console()  # prints to sys.stdout as it is at the time: the patched one
        self._aborting = False
        self._commands: dict[str, Callable[[str], Awaitable[None]]] = {
            "/followup": self._follow_up,
            "/abort": self._abort,
            "/stop": self._stop,
            "/state": self._show_state,
            "/help": self._help,
        }

    async def run(self, transcript: list[dict[str, Any]], offset: int) -> None:
        """Chat until the user leaves or the conversation ends."""
        ended: str | None = None
        try:
            with patch_stdout(raw=True):
                self._writer = AbovePromptWriter(
                    sys.stdout,
                    on_tail_change=self._input.app.invalidate,
                    columns=lambda: shutil.get_terminal_size().columns,
                )
                renderer = EventRenderer(Console(file=cast(TextIO, self._writer)))
                self._say(f"conversation {self._workflow_id} · /help lists the commands")
                renderer.render_transcript(transcript)
                ended = await self._run_tasks(renderer, offset)
                self._writer.end_line()
        finally:
            if ended is not None:
                print(ended)
            if ended != _CONVERSATION_ENDED:
                print("Left the chat; the conversation goes on. Re-attach with:")
                print(f"  python starter.py chat --id {self._workflow_id}")

    async def _run_tasks(self, renderer: EventRenderer, offset: int) -> str | None:
        """Render and read side by side; whichever ends first ends the chat.
        Returns why the stream ended, or ``None`` when the user left."""
        stream = asyncio.create_task(self._render_events(renderer, offset))
        typing = asyncio.create_task(self._read_lines())
        try:
            await asyncio.wait({stream, typing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, typing):
                task.cancel()
            await asyncio.gather(stream, typing, return_exceptions=True)
        error = None if typing.cancelled() else typing.exception()
        if error is not None:
            raise error
        return None if stream.cancelled() else stream.result()

    async def _render_events(self, renderer: EventRenderer, offset: int) -> str:
        """Render the stream until the workflow completes; never raises."""
        try:
            async for _, event in follow(self._client, self._workflow_id, offset):
                renderer.render(event)
        except Exception as err:  # the chat ends with the reason, not a traceback
            return f"The event stream failed: {getattr(err, 'message', None) or err}"
        return _CONVERSATION_ENDED

    # --- input ---------------------------------------------------------------

    async def _read_lines(self) -> None:
        """Read lines and act on them until the user leaves."""
        while True:
            line: str | None
            try:
                line = await self._input.prompt_async(self._prompt_message)
            except EOFError:
                return
            except KeyboardInterrupt:
                line = None
            try:
                if not await self._act(line):
                    return
            except RPCError as err:
                self._say(f"✗ {err.message}", "red")

    async def _act(self, line: str | None) -> bool:
        """Act on a typed line (``None`` for Ctrl-C); False when the user leaves."""
        if line is None:
            return not await self._interrupt()
        self._aborting = False
        line = line.strip()
        if line == "/quit":
            return False
        if not line:
            return True
        if not line.startswith("/"):
            await self._send(line)
            return True
        name, _, argument = line.partition(" ")
        command = self._commands.get(name)
        if command is None:
            self._say(f"Unknown command {name}: /help lists the commands.", "yellow")
        else:
            await command(argument.strip())
        return True

    def _prompt_message(self) -> AnyFormattedText:
        """The input prompt, below the line being streamed (if any)."""
        tail = self._writer.tail if self._writer is not None else ""
        return merge_formatted_text([ANSI(tail), "\n", _PROMPT]) if tail else _PROMPT

    async def _interrupt(self) -> bool:
        """Ctrl-C aborts the active run; a second one, or one while idle,
        leaves. Returns whether to leave."""
        if self._aborting:
            return True
        self._aborting = True  # the next Ctrl-C leaves, whatever happens to this one
        if not await self._is_running():
            return True
        await self._handle.signal("abort")
        self._say("aborting the run (Ctrl-C again leaves the chat)", "yellow")
        return False

    # --- what a line does ---------------------------------------------------------

    async def _send(self, text: str) -> None:
        """Steer the active run, or start a run with ``text``."""
        if await self._is_running():
            await self._handle.signal("steer", text)
            self._say(f"» steering: {text}", "magenta")
            return
        try:
            await self._handle.execute_update("prompt", text, result_type=PromptResult)
        except WorkflowUpdateFailedError as err:
            self._say(f"✗ {getattr(err.cause, 'message', None) or err.cause}", "red")

    async def _follow_up(self, text: str) -> None:
        if not text:
            self._say("Usage: /followup TEXT", "yellow")
            return
        await self._handle.signal("follow_up", text)
        self._say(f"» follow-up queued: {text}", "magenta")

    async def _abort(self, _: str) -> None:
        if not await self._is_running():
            self._say("No run is active.")
            return
        await self._handle.signal("abort")
        self._say("aborting the run", "yellow")

    async def _stop(self, _: str) -> None:
        if not await self._is_running():
            self._say("No run is active.")
            return
        await self._handle.signal("stop_after_turn")
        self._say("the run ends after the current turn")

    async def _show_state(self, _: str) -> None:
        state = await self._state()
        self._say(
            f"{state.status} · model {state.model} · {state.turns} turns in {state.runs} runs"
            f" · {state.message_count} messages\n"
            f"queued: {state.steering_queue} steering, {state.follow_up_queue} follow-up\n"
            f"usage: {state.usage.total_tokens:,} tokens · ${state.usage.cost.total:.4f}"
        )

    async def _help(self, _: str) -> None:
        self._say(HELP)

    # --- helpers ------------------------------------------------------------------

    async def _state(self) -> SessionState:
        return await self._handle.query("state", result_type=SessionState)

    async def _is_running(self) -> bool:
        return (await self._state()).status == "running"

    def _say(self, text: str, style: str = "dim") -> None:
        """A line of the chat's own, above the prompt and above any line
        still streaming (which goes on undisturbed below it)."""
        self._notes.print(Text(text, style=style))
