"""The terminal chat: type while the agent's answer streams.

Two tasks run side by side: one follows the conversation's event stream and
renders it with rich, the other reads lines with prompt_toolkit. What the
renderer prints goes above the input line (``patch_stdout``); the line still
streaming is shown just above the prompt (``AbovePromptWriter``), so typing
and streaming never draw over each other.

Tool calls that wait for a person's approval are listed as they arrive (and
on attach, from the state); while any wait, a bare ``y`` or ``n [reason]``
decides the oldest one, which the prompt names.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TextIO, cast

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import ANSI, AnyFormattedText, FormattedText, merge_formatted_text
from prompt_toolkit.input import DummyInput
from prompt_toolkit.patch_stdout import patch_stdout
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text
from temporalio.client import Client
from temporalio.service import RPCError

from client import (
    AgentMessage,
    Conversation,
    ConversationEnded,
    ConversationExists,
    ConversationNotFound,
    PendingApproval,
    Refused,
    SessionState,
    StoppedWaiting,
)
from console.above_prompt import AbovePromptWriter
from console.render import EventRenderer, output_console, shell_word, skipped_note, terminal_safe
from runtime.settings import Settings

HELP = """\
Type a message to start a run; while a run is active (the prompt reads
`steer ›`) it steers it (injected before the next model call).
  /followup TEXT         queue TEXT for when the agent would otherwise stop
  /abort                 abort the active run (or Ctrl-C)
  /stop                  end the active run after the current turn
  /model [NAME]          show or change the model (from the next model call)
  /system [TEXT]         show or change the system prompt
  /thinking [LEVEL]      show or change the thinking level (off, minimal, low, medium, high, xhigh)
  /tools [a,b]           show or change the tools the model may call
  /clear [steering|followUp|all]   take queued messages back into the input line
                         (follow-ups as a /followup line, after the steering ones)
  /reset                 clear transcript, queues and usage (not during a run)
  y | n [REASON]         decide the oldest tool call waiting for approval
  /approve [CALL_ID]     approve a waiting tool call (default: the oldest)
  /reject [CALL_ID] [REASON]   reject it; the model sees the reason
  /state                 settings, queues, approvals, turns, usage and cost
  /help                  this help
  /quit                  leave; the conversation stays alive (or Ctrl-D)"""

_PROMPT = FormattedText([("bold", "› ")])  # Enter starts a run
_STEER_PROMPT = FormattedText([("bold magenta", "steer › ")])  # Enter steers the active run
_CONVERSATION_ENDED = "The conversation has ended."  # the stream's end, told as it ended
_BUSY = ("running", "awaiting-approval")
_QUEUES = {"steering": "steering", "followup": "followUp", "follow-up": "followUp", "all": "all"}
_YES = re.compile(r"(?i)y|yes")
_NO = re.compile(r"(?i)(?:n|no)(?:\s+(?P<reason>.*))?")


async def chat(
    client: Client, settings: Settings, conversation_id: str | None, options: dict[str, Any]
) -> int:
    """Chat with conversation ``conversation_id``, starting it (with start
    ``options``, snake_case) when no conversation has that id yet, or a new
    one when it is ``None``. Re-attaching prints the transcript, then goes on
    live from where the transcript ends. Returns the exit code: 1 when the
    event stream failed for good, else 0."""
    conversation_id = conversation_id or f"chat-{uuid.uuid4().hex[:8]}"
    conversation, state, transcript = await _attach_or_start(client, settings, conversation_id, options)
    return await ChatSession(conversation).run(state, transcript)


async def _attach_or_start(
    client: Client, settings: Settings, conversation_id: str, options: dict[str, Any]
) -> tuple[Conversation, SessionState | None, list[AgentMessage]]:
    """The conversation, its state and transcript; one that does not exist
    yet is started (users name their chats) and has neither."""
    conversation = Conversation.attach(client, conversation_id)
    try:
        state, transcript = await conversation.snapshot()
        _say_options_not_applied(conversation_id, options)
        return conversation, state, transcript
    except ConversationEnded as err:
        # One by that id ended with nothing to show (before any worker took
        # it): the new one takes its id, said so, not silently.
        print(terminal_safe(f"note: {err} Starting a new one with that id."), file=sys.stderr)
    except ConversationNotFound:
        pass
    try:
        await Conversation.start(client, settings, id=conversation_id, **options)
    except ConversationExists:  # another chat started it meanwhile: join it
        return conversation, *await conversation.snapshot()
    return conversation, None, []


_OPTION_FLAGS = {
    "model": "--model",
    "system_prompt": "--system",
    "thinking_level": "--thinking",
    "tools": "--tools",
    "max_turns": "--max-turns",
    "approval_timeout_seconds": "--approval-timeout",
}


def _say_options_not_applied(conversation_id: str, options: dict[str, Any]) -> None:
    """Start options given for a conversation that exists set nothing: say
    so (they were dropped silently, and `/model` then showed the old model:
    a new user's audit)."""
    if options:
        flags = ", ".join(_OPTION_FLAGS.get(name, name) for name in options)
        print(
            terminal_safe(
                f"note: {conversation_id} exists, so {flags} (for a new conversation) changed nothing; "
                f"change its settings with /model, /system, /tools or `starter.py configure`."
            ),
            file=sys.stderr,
        )


async def _piped_line() -> str:
    """The next line of a piped or redirected input, without its newline
    (the last one may have none); bytes that are not UTF-8 read as U+FFFD.
    ``EOFError`` at its end."""
    raw = await asyncio.to_thread(sys.stdin.buffer.readline)
    if not raw:
        raise EOFError
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


class ChatSession:
    """One terminal attached to one conversation."""

    def __init__(self, conversation: Conversation) -> None:
        self._conversation = conversation
        # Lines from a pipe or a file are read as they are: prompt_toolkit's
        # editor read a file redirected to it as no input at all, and took
        # memory that grew with the square of a piped line's length (1.3 GB
        # for 50 KB; an operator audit). Its session is kept for the screen
        # only then (with no input of its own, it does not warn of it).
        self._piped = not sys.stdin.isatty()
        self._input: PromptSession[str] = (
            PromptSession(erase_when_done=True, input=DummyInput())
            if self._piped
            else PromptSession(erase_when_done=True)
        )
        self._writer: AbovePromptWriter | None = None
        self._renderer: EventRenderer | None = None
        self._notes = output_console()  # prints to sys.stdout as it is at the time: the patched one
        self._aborting = False
        self._run_active = False  # as the events tell it: the prompt says whether Enter steers
        self._shown_up_to = 0  # the offset of the next event to show
        self._sent = False  # a line was sent from here
        self._approvals: dict[str, PendingApproval] = {}  # oldest first
        # The last call shown waiting that stopped waiting with no decision
        # from here (decided elsewhere, timed out, its run ended): a bare
        # y/n typed next was meant for it, not for the model.
        self._no_longer_waiting: PendingApproval | None = None
        # Text for the next input lines, one at a time: what /clear took back,
        # or a line the server did not take.
        self._restore: list[str] = []
        self._commands: dict[str, Callable[[str], Awaitable[None]]] = {
            "/followup": self._follow_up,
            "/abort": self._abort,
            "/stop": self._stop,
            "/model": self._model,
            "/system": self._system,
            "/thinking": self._thinking,
            "/tools": self._tools,
            "/clear": self._clear,
            "/reset": self._reset,
            "/approve": self._approve,
            "/reject": self._reject,
            "/state": self._show_state,
            "/help": self._help,
        }

    async def _message_count(self) -> int | None:
        """How many messages the ended conversation holds, for the fork hint;
        None when no worker answers soon (the hint goes without it)."""
        try:
            async with asyncio.timeout(3):
                return (await self._conversation.state()).message_count
        except Exception:  # a hint, not worth a failure
            return None

    async def run(self, state: SessionState | None, transcript: list[AgentMessage]) -> int:
        """Chat until the user leaves or the conversation ends; 1 when the
        event stream failed for good (the chat cannot go on), else 0."""
        ended: str | None = None
        conversation_id = self._conversation.id
        # Output that is no terminal (a pipe, a log) is not cut to a width:
        # lines were cut at 80 columns, mid-word (a new user's audit).
        terminal = sys.stdout.isatty()
        try:
            with patch_stdout(raw=True):
                self._writer = AbovePromptWriter(
                    sys.stdout,
                    on_tail_change=self._input.app.invalidate,
                    columns=(lambda: shutil.get_terminal_size().columns)
                    if terminal
                    else (lambda: sys.maxsize),
                )
                self._renderer = EventRenderer(
                    Console(file=cast(TextIO, self._writer), soft_wrap=not terminal)
                )
                self._say(f"conversation {conversation_id} · /help lists the commands")
                self._run_active = state is not None and state.status in _BUSY
                self._renderer.render_transcript([m.model_dump(mode="json") for m in transcript])
                if state is not None and state.streaming_message is not None:
                    # The answer streaming now began before state.event_offset.
                    self._renderer.resume_message(state.streaming_message.model_dump(mode="json"))
                for approval in state.pending_approvals if state else []:
                    self._observe({"type": "tool_approval_request", **approval.model_dump(mode="json")})
                ended = await self._run_tasks(state.event_offset if state else 0)
                self._writer.end_line()
        finally:
            if ended is None and await self._conversation.has_ended():
                # The user left (piped `/quit`, read before the stream said
                # so) from a conversation that had ended: not "goes on".
                ended = _CONVERSATION_ENDED
            if ended == _CONVERSATION_ENDED:
                # How (closed, failed and why, terminated), as `watch` says it,
                # and how to go on: attaching again shows the same end.
                print(terminal_safe(await self._conversation.how_it_ended()))
                count = await self._message_count()
                of = f" (of its {count})" if count is not None else ""
                print(f"Go on from its first N messages{of} in a new conversation with:")
                print(terminal_safe(f"  python starter.py fork {shell_word(conversation_id)} --at N"))
            else:
                if ended is not None:
                    print(terminal_safe(ended))
                print("Left the chat; the conversation goes on. Re-attach with:")
                print(terminal_safe(f"  python starter.py chat --id {shell_word(conversation_id)}"))
        return 0 if ended in (None, _CONVERSATION_ENDED) else 1

    async def _run_tasks(self, offset: int) -> str | None:
        """Render and read side by side; whichever ends first ends the chat.
        Returns why the stream ended, or ``None`` when the user left."""
        stream = asyncio.create_task(self._render_events(offset))
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

    async def _render_events(self, offset: int) -> str:
        """Render the stream until the conversation ends; never raises."""
        try:
            async for at, event in self._conversation.events(offset, on_skipped=self._skipped):
                self._observe(event)
                self._shown_up_to = at + 1
        except Exception as err:  # the chat ends with the reason, not a traceback
            return f"The event stream failed: {getattr(err, 'message', None) or err}"
        return _CONVERSATION_ENDED

    def _skipped(self, first: int, next_offset: int) -> None:
        self._say(skipped_note(first, next_offset))

    def _observe(self, event: dict[str, Any]) -> None:
        """Render an event; keep whether a run is active and which calls
        wait for approval."""
        assert self._renderer is not None
        self._renderer.render(event)
        kind = event.get("type")
        if kind == "agent_start":
            self._run_active = True
        elif kind == "tool_approval_request":
            try:
                approval = PendingApproval.model_validate(event)
            except ValidationError:  # not as the workflow publishes it (the renderer noted it)
                return
            self._approvals[approval.tool_call_id] = approval
            first = len(self._approvals) == 1
            self._say("  y approves, n [reason] rejects" + ("" if first else " (after the ones before it)"))
        elif kind == "tool_execution_end":
            gone = self._approvals.pop(event.get("toolCallId", ""), None)
            self._no_longer_waiting = gone or self._no_longer_waiting
        elif kind == "agent_end":
            self._run_active = False
            if self._approvals:
                self._no_longer_waiting = next(reversed(self._approvals.values()))
            self._approvals.clear()
        self._input.app.invalidate()

    # --- input ---------------------------------------------------------------

    async def _read_lines(self) -> None:
        """Read lines and act on them until the user leaves."""
        while True:
            line: str | None
            default = self._restore.pop(0) if self._restore else ""
            try:
                if self._piped:
                    line = await _piped_line()
                else:
                    line = await self._input.prompt_async(self._prompt_message, default=default)
            except EOFError:
                if self._piped:
                    # The end of what was piped: its answers are shown before
                    # the chat leaves (it left at once, the answers unseen).
                    await self._answered_or_waiting_for_approval()
                    await self._shown_to_its_end()
                    if self._approvals:
                        waiting = ", ".join(self._approvals)
                        self._say(
                            f"Tool call(s) {waiting} wait for approval: python starter.py approve "
                            f"{shell_word(self._conversation.id)} CALL_ID [--reject] decides one.",
                            "yellow",
                        )
                return
            except KeyboardInterrupt:
                line = None
            try:
                if not await self._act_until_ctrl_c(line):
                    return
            except (Refused, StoppedWaiting) as err:
                self._say(f"✗ {err}", "red")
            except RPCError as err:
                # The server did not take it (unreachable, most often): the
                # line was lost (an audit). It goes back into the input line,
                # not sent again by itself: what it means (a prompt, a steer,
                # a decision) depends on the conversation when it is sent.
                unsent = (line or "").strip()
                if unsent and not self._piped:
                    self._restore.insert(0, unsent)
                    self._say(
                        f"✗ {err.message}: not sent; it is back in the input line (Enter sends it again)",
                        "red",
                    )
                else:
                    self._say(f"✗ {err.message}{': not sent' if unsent else ''}", "red")

    async def _act_until_ctrl_c(self, line: str | None) -> bool:
        """``_act``, which Ctrl-C stops without leaving the chat (it left
        the chat, an audit): a request waiting for a worker is waited for no
        more (what it sent is kept), and the next Ctrl-C leaves. Acting on a
        Ctrl-C is not stopped: a second one leaves, as before."""
        if line is None or self._piped or threading.current_thread() is not threading.main_thread():
            return await self._act(line)
        loop = asyncio.get_running_loop()
        interrupted = False

        async def act() -> bool:
            try:
                return await self._act(line)
            except asyncio.CancelledError as err:
                if interrupted and isinstance(err.__cause__, StoppedWaiting):
                    raise err.__cause__ from None  # says what was sent and kept
                raise

        acting = asyncio.ensure_future(act())

        def stop_waiting(*_: Any) -> None:
            nonlocal interrupted
            interrupted = acting.cancel()
            loop.call_soon_threadsafe(lambda: None)  # wakes the loop up from its wait for I/O

        previous = signal.signal(signal.SIGINT, stop_waiting)
        try:
            return await acting
        except (StoppedWaiting, asyncio.CancelledError) as err:
            current = asyncio.current_task()
            if not interrupted or (current is not None and current.cancelling()):
                raise  # the server stopped answering, or the chat is ending
            self._aborting = True  # the next Ctrl-C leaves
            if isinstance(err, StoppedWaiting):
                said = str(err)
            else:
                # A read (the state, asked before a line is sent) was waited
                # for: the line was not sent, and is not lost either.
                said = "Stopped waiting: not sent; it is back in the input line."
                self._restore.insert(0, line.strip())
            self._say(f"✗ {said} (Ctrl-C again leaves the chat)", "red")
            return True
        finally:
            signal.signal(signal.SIGINT, previous)

    async def _answered_or_waiting_for_approval(self) -> None:
        """Until no run is active, or one waits for a person's decision: no
        line is left to give it (a piped ``delete it`` without its ``y``
        kept the chat waiting for good, an audit)."""
        idle = asyncio.ensure_future(self._conversation.wait_for_idle())
        try:
            while not idle.done() and not self._approvals:
                await asyncio.wait([idle], timeout=0.1)
        finally:
            if not idle.done():
                idle.cancel()
            with contextlib.suppress(Refused, StoppedWaiting, RPCError, asyncio.CancelledError):
                await idle

    async def _shown_to_its_end(self, within: float = 10.0) -> None:
        """Until the renderer, which reads a little behind the conversation
        (a subscriber's batches), has shown every event published so far."""
        if not self._sent:
            return
        try:
            published = (await self._conversation.state()).event_offset
        except (Refused, StoppedWaiting, RPCError):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self._shown_up_to < published and loop.time() < deadline:
            await asyncio.sleep(0.05)

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
            if self._approvals and await self._decide_oldest(line):
                return True
            gone, self._no_longer_waiting = self._no_longer_waiting, None
            if gone is not None and (_YES.fullmatch(line) or _NO.fullmatch(line)):
                self._say(
                    f"No tool call is waiting for approval: {gone.tool_name} ({gone.tool_call_id}) no longer "
                    f"waits. Enter {line} again to send it to the model.",
                    "yellow",
                )
                return True
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
        """The input prompt, below the line being streamed (if any): ``steer ›``
        while a run is active (Enter steers it), ``›`` when Enter starts one;
        while a tool call waits for approval, it names the one ``y``/``n`` decides."""
        prompt: AnyFormattedText = _STEER_PROMPT if self._run_active else _PROMPT
        if self._approvals:
            oldest = next(iter(self._approvals.values()))
            more = f", +{len(self._approvals) - 1} more" if len(self._approvals) > 1 else ""
            question = f"approve {oldest.tool_name} ({oldest.tool_call_id}{more})? y/n › "
            prompt = FormattedText([("bold yellow", question)])
        tail = self._writer.tail if self._writer is not None else ""
        return merge_formatted_text([ANSI(tail), "\n", prompt]) if tail else prompt

    async def _interrupt(self) -> bool:
        """Ctrl-C aborts the active run; a second one, or one while idle,
        leaves. Returns whether to leave."""
        if self._aborting:
            return True
        self._aborting = True  # the next Ctrl-C leaves, whatever happens to this one
        state = await self._state()
        if state.status not in _BUSY:
            return True
        await self._conversation.abort()
        self._say("aborting the run (Ctrl-C again leaves the chat)", "yellow")
        self._say_still_queued(state)
        return False

    # --- runs and queues ---------------------------------------------------------------

    def _say_still_queued(self, state: SessionState) -> None:
        """What an abort leaves queued, which the next run would take in
        unseen (an audit: queued messages silently took over the next prompt)."""
        queued = state.steering_queue + state.follow_up_queue
        if queued:
            self._say(f"{_count(queued, 'message')} still queued (/clear takes them back)", "yellow")

    async def _send(self, text: str) -> None:
        """Steer the active run, or start a run with ``text``."""
        self._sent = True
        if not await self._is_running():
            try:
                await self._conversation.send_prompt(text)
                return
            except Refused:
                # Another client started a run since the look (two chats
                # pressing Enter at once): typed during a run, the text steers
                # it (it was refused, and lost, an audit).
                if not await self._is_running():
                    raise
        await self._conversation.steer(text)
        self._say(f"» steering: {text}", "magenta")

    async def _follow_up(self, text: str) -> None:
        if not text:
            self._say("Usage: /followup TEXT", "yellow")
            return
        await self._conversation.follow_up(text)
        self._say(f"» follow-up queued: {text}", "magenta")

    async def _abort(self, _: str) -> None:
        state = await self._state()
        if state.status not in _BUSY:
            self._say("No run is active.")
            return
        await self._conversation.abort()
        self._say("aborting the run", "yellow")
        self._say_still_queued(state)

    async def _stop(self, _: str) -> None:
        if not await self._is_running():
            self._say("No run is active.")
            return
        await self._conversation.stop_after_turn()
        self._say("the run ends after the current turn")

    async def _clear(self, argument: str) -> None:
        """Take queued messages out of the queues and back into the input
        line, a queue at a time (joined, they were resent as one steer, the
        follow-ups' kind lost): the steering messages as a line that Enter
        sends as typed, then the follow-ups as a ``/followup`` line."""
        which = _QUEUES.get((argument or "all").lower())
        if which is None:
            self._say("Usage: /clear [steering|followUp|all]", "yellow")
            return
        taken: list[str] = []
        for queue in ("steering", "followUp") if which == "all" else (which,):
            removed = await self._conversation.clear_queues(queue)
            if not removed:
                continue
            text = " ".join(_message_text(message) for message in removed)  # the input line is single-line
            if queue == "steering":
                self._restore.append(text)
                taken.append(_count(len(removed), "steering message"))
            else:
                self._restore.append(f"/followup {text}")
                taken.append(f"{_count(len(removed), 'follow-up')} (as /followup)")
        if not taken:
            self._say("Nothing was queued.")
            return
        said = " and ".join(
            [f"{taken[0]} back into the input line", *(f"{t} into the next one" for t in taken[1:])]
        )
        self._say(f"took {said}: edit, then Enter sends each line as one message")

    async def _reset(self, _: str) -> None:
        await self._conversation.reset()
        self._say("The conversation was reset: transcript, queues, usage and counters are cleared.")

    # --- settings ------------------------------------------------------------------------

    async def _model(self, name: str) -> None:
        if not name:
            self._say(f"model: {(await self._state()).model}")
            return
        settings = await self._conversation.configure(model=name)
        self._say(f"model: {settings.model} (from the next model call)")

    async def _system(self, text: str) -> None:
        if not text:
            self._say(f"system prompt: {(await self._state()).system_prompt or '(none)'}")
            return
        await self._conversation.configure(system_prompt=text)
        self._say("system prompt changed (from the next model call)")

    async def _thinking(self, level: str) -> None:
        if not level:
            self._say(f"thinking: {(await self._state()).thinking_level}")
            return
        settings = await self._conversation.configure(thinking_level=level)
        self._say(f"thinking: {settings.thinking_level} (from the next model call)")

    async def _tools(self, names: str) -> None:
        if not names:
            self._say(f"tools: {', '.join((await self._state()).tools or []) or '(none)'}")
            return
        chosen = [name.strip() for name in names.split(",") if name.strip()]
        settings = await self._conversation.configure(tools=chosen)
        self._say(f"tools: {', '.join(settings.tools or []) or '(none)'} (from the next model call)")

    async def _show_state(self, _: str) -> None:
        self._say(_describe(await self._state()))

    async def _help(self, _: str) -> None:
        self._say(HELP)

    # --- approvals --------------------------------------------------------------------------

    async def _decide_oldest(self, line: str) -> bool:
        """``y`` or ``n [reason]`` decides the oldest waiting call; False
        when the line is neither (it is a message)."""
        oldest = next(iter(self._approvals))
        if _YES.fullmatch(line):
            await self._decide(oldest, True, None)
            return True
        no = _NO.fullmatch(line)
        if no:
            await self._decide(oldest, False, no.group("reason") or None)
            return True
        return False

    async def _approve(self, argument: str) -> None:
        call_id = argument.split(maxsplit=1)[0] if argument else self._oldest()
        if call_id:
            await self._decide(call_id, True, None)

    async def _reject(self, argument: str) -> None:
        named, _, reason = argument.partition(" ")
        call_id = named or self._oldest()
        if call_id:
            await self._decide(call_id, False, reason.strip() or None)

    def _oldest(self) -> str | None:
        if not self._approvals:
            self._say("No tool call is waiting for approval.")
            return None
        return next(iter(self._approvals))

    async def _decide(self, call_id: str, approved: bool, reason: str | None) -> None:
        pending = self._approvals.get(call_id)
        try:
            await self._conversation.approve(call_id, approved, reason)
        except (Refused, StoppedWaiting):  # decided elsewhere, or this decision is on its way
            self._approvals.pop(call_id, None)
            raise
        # Any other failure (the server unreachable) decided nothing: the call
        # still waits here, so the next y/n goes to it, not to the model.
        self._approvals.pop(call_id, None)
        name = f"{pending.tool_name} ({call_id})" if pending else call_id
        if approved:
            self._say(f"✓ approved {name}", "green")
        else:
            self._say(f"✗ rejected {name}{f': {reason}' if reason else ''}", "yellow")

    # --- helpers ------------------------------------------------------------------

    async def _state(self) -> SessionState:
        return await self._conversation.state()

    async def _is_running(self) -> bool:
        return (await self._state()).status in _BUSY

    def _say(self, text: str, style: str = "dim") -> None:
        """A line of the chat's own, above the prompt and above any line
        still streaming (which goes on undisturbed below it)."""
        self._notes.print(Text(terminal_safe(text), style=style))  # refusals quote what others sent


def _message_text(message: AgentMessage) -> str:
    content = getattr(message, "content", "")
    if isinstance(content, str):
        return content
    return " ".join(getattr(block, "text", "") for block in content if getattr(block, "text", ""))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _describe(state: SessionState) -> str:
    """``/state``: the session, the settings in force, queues, approvals, usage."""
    tools = ", ".join(state.tools or []) or "(none)"
    lines = [
        f"{state.status} · streaming: {'yes' if state.is_streaming else 'no'}"
        f" · {_count(state.turns, 'turn')} in {_count(state.runs, 'run')}"
        f" · {_count(state.message_count, 'message')}",
        f"model: {state.model} · thinking: {state.thinking_level} · tools: {tools} ({state.tool_execution})",
        f"system prompt: {state.system_prompt or '(none)'}",
        f"queued: {state.steering_queue} steering ({state.steering_mode}),"
        f" {state.follow_up_queue} follow-up ({state.follow_up_mode})",
    ]
    for approval in state.pending_approvals:
        lines.append(f"waiting for approval: {approval.tool_name} · call {approval.tool_call_id}")
    limits = [
        text
        for value, text in (
            (state.max_turns, f"{state.max_turns} turns a run"),
            (state.max_total_tokens, f"{state.max_total_tokens} tokens"),
            (state.max_cost, f"${state.max_cost}"),
            (state.approval_timeout_seconds, f"approvals time out after {state.approval_timeout_seconds} s"),
        )
        if value is not None
    ]
    if limits:
        lines.append("limits: " + " · ".join(limits))
    lines.append(f"usage: {state.usage.total_tokens:,} tokens · ${state.usage.cost.total:.4f}")
    if state.error_message:
        lines.append(f"last error: {state.error_message}")
    return "\n".join(lines)
