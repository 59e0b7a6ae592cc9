"""``Conversation``: pi's ``Agent`` for scripts, over a durable conversation.

    from client import Conversation
    from runtime.connect import connect
    from runtime.settings import Settings

    settings = Settings.from_env()
    chat = await Conversation.start(await connect(settings), settings, model="gpt-4o-mini")
    messages = await chat.prompt("What is 17*23?")      # returns when the run ends
    await chat.steer("Also show your work.")            # while a run is active
    other = await chat.fork(at=1)                        # try another answer from message 1

Every method maps onto the workflow's public contract (README, "The
contract"); the starter, the console, the demo and the benchmark reach
conversations only through this module. A request the conversation
refuses raises ``Refused`` (its message is one sentence that says what to
do); a request to a conversation that does not exist, or has ended,
raises ``ConversationNotFound`` (``state``, ``messages``, ``events`` and
``fork`` still read an ended one while a worker runs on its task queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import PendingActivityState, PendingWorkflowTaskState, WorkflowTaskFailedCause
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.client import WorkflowExecution as ListedExecution
from temporalio.common import SearchAttributeKey, TypedSearchAttributes
from temporalio.contrib.workflow_streams import PollInput, PollResult
from temporalio.exceptions import TerminatedError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from runtime.connect import visibility_quoted
from runtime.settings import Settings
from workflows.contract import (
    BUSY_ERROR,
    DRAINING_ERROR,
    POLL_UPDATE,
    RUN_END_UPDATE,
    TRUNCATED_ERROR,
    AgentSettings,
    ApprovalRequest,
    PendingApproval,
    PromptResult,
    SessionInput,
    SessionResult,
    SessionState,
    SettingsInForce,
    WaitForIdleResult,
    item_payload,
    past_safe_integer,
    start_input_problem,
)
from workflows.inputs import InputError, clean_json, prompt_message, prompt_messages, validation_text
from workflows.models import EVENTS_TOPIC, AgentMessage, AssistantMessage, MessageList, ToolResultMessage

# The client, and the contract's models its methods take and return.
__all__ = [
    "AgentMessage",
    "AgentSettings",
    "Conversation",
    "ConversationExists",
    "ConversationNotFound",
    "ConversationSummary",
    "PendingApproval",
    "PromptResult",
    "Refused",
    "SessionResult",
    "SessionState",
    "StoppedWaiting",
    "WaitForIdleResult",
    "follow",
    "list_conversations",
    "start_conversation",
]

WORKFLOW_TYPE = "AgentWorkflow"
# How long the server waits for a worker that took a workflow task before
# giving it to another. This workflow's tasks take milliseconds, but a worker
# that dies while holding one (SIGKILL, OOM, node loss) stalls the
# conversation for this long; the server's default is 10 s. 4 s leaves room
# for replaying a long history on a busy worker (100 concurrent
# conversations on one worker saw no timeouts, bench/README.md).
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=4)

Message = str | dict[str, Any] | AgentMessage
QueueName = str
"""``"steering"``, ``"followUp"`` or ``"all"`` (``clear_queues``)."""


class Refused(Exception):
    """The conversation (or this client, before asking it) refused a
    request; the message is one sentence that says what to do."""


class ConversationNotFound(Refused):
    """No conversation has this id, or it has ended."""


class ConversationEnded(ConversationNotFound):
    """A conversation by this id has ended, with nothing to read of it
    (before any worker took it, say); the message says how it ended."""


# How ``ConversationNotFound`` says a conversation ended other than by completing.
_ENDINGS = {
    WorkflowExecutionStatus.COMPLETED: "was closed",  # only `close` or closeWhenIdle complete it
    WorkflowExecutionStatus.TERMINATED: "was terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed out (its execution timeout)",
    WorkflowExecutionStatus.CANCELED: "was cancelled",
}
_ENDING_TIMEOUT = timedelta(seconds=5)
_ENCODED = "Encoded failure"


def _never_ran(err: RPCError) -> bool:
    """The server's answer to a query of a run that ended (a terminate, a
    timeout) before any worker took its first task: it has published nothing."""
    return (
        err.status == RPCStatusCode.FAILED_PRECONDITION and "closed before WorkflowTaskStarted" in err.message
    )


def _readable(message: str) -> str:
    """A failure's message, or what to do when it is still encrypted (this
    client lacks the key the worker wrote it with; it said only "Encoded
    failure", found by a storage audit)."""
    if message != _ENCODED:
        return message
    return (
        "a reason encrypted with a key this client does not have (give it the workers' AGENT_ENCRYPTION_KEYS)"
    )


class StoppedWaiting(Exception):
    """A request was sent and its answer not waited for: the server keeps
    it, and the conversation applies it when a worker takes it; sending it
    again applies it twice. The server holds a request no worker has taken
    in memory only: a server restart before then drops it (a client
    review), so read ``state`` before sending it again. Raised when the
    server stops answering the wait; when the caller cancels it (Ctrl-C, a
    cancelled task, ``asyncio.timeout`` or ``asyncio.wait_for`` running
    out), the caller's own ``asyncio.CancelledError`` is raised, with a
    ``StoppedWaiting`` as its ``__cause__``, so timeouts and task groups
    work as with any awaitable."""


def _cancelled(err: BaseException) -> asyncio.CancelledError | None:
    """The caller's own cancellation inside the SDK's
    ``WorkflowUpdateRPCTimeoutOrCancelledError`` (raised in its place when
    the task waiting for an update is cancelled); None for a timeout."""
    cause = err.__cause__
    return cause if isinstance(cause, asyncio.CancelledError) else None


class ConversationExists(Refused):
    """A conversation with this id was started before (``Conversation.start``)."""


async def start_conversation(
    client: Client, workflow_id: str, input: dict[str, Any], *, task_queue: str, **options: Any
) -> WorkflowHandle[Any, SessionResult]:
    """Start an ``AgentWorkflow`` conversation (camelCase ``input``) with the
    project's workflow task timeout; ``options`` go to ``start_workflow``.
    ``Conversation.start`` is the typed way; this is for callers that hold
    a raw start input (tests replaying recorded inputs)."""
    return await client.start_workflow(
        WORKFLOW_TYPE,
        input,
        id=workflow_id,
        task_queue=task_queue,
        task_timeout=WORKFLOW_TASK_TIMEOUT,
        result_type=SessionResult,
        **options,
    )


QUERY_WAIT = timedelta(seconds=30)
"""How long one try of ``state``, ``messages`` or another query waits for a
worker to answer (the SDK's own default, said out loud): a query is
answered by a worker, at once when one runs the conversation. A query the
server refuses while another waits for the same conversation is tried
again (``_query_again``), each try as long."""

UPDATE_NOTE_AFTER = 5.0
"""Seconds an update (but ``wait_for_idle``) may wait to be answered
before ``Conversation.on_slow_update`` hears of it: the workflow answers
each at once, so a wait that long means no worker has taken it."""


WORKER_NOTE_AFTER = 5.0
"""Seconds a running conversation's next step (a workflow task, a model or
tool call) may wait to be taken before a reader of its events is told
(``Conversation.waits_for_worker``): a live worker takes one at once."""

_WORKER_CHECKS = (5.0, 10.0, 20.0, 40.0, 60.0)
"""When ``events`` looks whether the conversation waits for a worker: the
first look after this many seconds without an event, then the seconds
between looks (the last repeats), so at 5, 15, 35, 75 s, then every
minute. A quiet conversation costs one describe call a minute at most."""

_STEPS = {"stream_assistant_response": "its model call", "execute_tool": "a tool call"}


def _seconds(timestamp: Timestamp) -> float:
    """A server timestamp as seconds since the epoch (0 when unset)."""
    return timestamp.ToMilliseconds() / 1000


class _Reading:
    """When a reader of ``Conversation.events`` last had an event."""

    def __init__(self) -> None:
        self.last_event = time.monotonic()
        self.moved = asyncio.Event()

    def saw_event(self) -> None:
        self.last_event = time.monotonic()
        self.moved.set()


class Conversation:
    """One durable conversation (a workflow execution), as pi's ``Agent``."""

    on_slow_update: ClassVar[Callable[[str], None] | None] = None
    """Told, in one sentence, when a request has waited ``UPDATE_NOTE_AFTER``
    seconds for a worker (none is running, or all are down): it is kept,
    and applies when one takes it; and, while ``events`` are read, when the
    conversation's next step waits for a worker (``waits_for_worker``).
    Set on the class; the CLI prints it. None says nothing."""

    def __init__(self, client: Client, conversation_id: str) -> None:
        self.client = client
        self.id = conversation_id
        self.handle: WorkflowHandle[Any, SessionResult] = client.get_workflow_handle(
            conversation_id, result_type=SessionResult
        )

    # --- start and attach -------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        client: Client,
        settings: Settings,
        *,
        id: str | None = None,
        prompt: Message | list[Message] | None = None,
        messages: list[AgentMessage] | None = None,
        **options: Any,
    ) -> Conversation:
        """Start a conversation on ``settings.task_queue``; ``options`` are
        start settings in snake_case (``model``, ``system_prompt``,
        ``thinking_level``, ``tools``, ``close_when_idle``, ...), as the start
        input takes them. Raises ``ConversationExists`` while a conversation
        with that id runs; the id of an ended one is taken again: a new,
        empty conversation starts under it (the ended one stays readable by
        its run id until the namespace's retention removes it)."""
        return await cls._start(client, settings.task_queue, id, prompt, messages, options)

    @classmethod
    async def _start(
        cls,
        client: Client,
        task_queue: str,
        id: str | None,
        prompt: Message | list[Message] | None,
        messages: list[AgentMessage] | None,
        options: dict[str, Any],
    ) -> Conversation:
        if id is not None and not id.strip():  # it made up an id without a word (a diff review)
            raise Refused("A conversation's id cannot be empty: give one, or None for a new one.")
        conversation_id = id or f"chat-{uuid.uuid4().hex[:8]}"
        input: dict[str, Any] = {_camel(k): v for k, v in options.items() if v is not None}
        if prompt is not None:
            input["prompt"] = _wire(prompt)
        if messages:
            input["messages"] = MessageList.dump_python(messages, mode="json")
        # As the workflow will read it (the converter's JSON: a set as a list,
        # an enum as its value), which would fail the conversation at once.
        raw = to_jsonable_python(input)
        # The workflow also refuses an integer setting past 2**53 - 1 (a
        # JavaScript reader of `state` would read another number back).
        problem = start_input_problem(raw) or past_safe_integer(raw)
        if problem is None:
            try:  # the prompt, read as the workflow reads it: parsed, then checked
                parsed = SessionInput.model_validate(clean_json(raw)).prompt
                if parsed is not None:
                    prompt_messages(parsed, lambda: 0)
            except ValidationError as err:
                problem = validation_text("The start input is invalid", err)
            except InputError as err:
                problem = str(err)
        if problem is not None:
            raise Refused(problem)
        try:
            await start_conversation(client, conversation_id, input, task_queue=task_queue)
        except WorkflowAlreadyStartedError:
            raise ConversationExists(
                f"A conversation with the id {conversation_id} exists already: chat with it "
                f"(python starter.py chat --id {conversation_id}) or choose another id."
            ) from None
        return cls(client, conversation_id)

    @classmethod
    def attach(cls, client: Client, conversation_id: str) -> Conversation:
        """The conversation ``conversation_id`` (no call is made)."""
        return cls(client, conversation_id)

    async def exists(self) -> bool:
        try:
            await self.handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    async def _update(self, name: str, *args: Any, result_type: Any = None) -> Any:
        """An update, made again when the server aborted it because the
        workflow task carrying it failed (nothing of it was applied): a
        signal that lands while the conversation continues as new fails that
        task, and the workflow goes on. Any other refusal (the server's
        update limit, an unreachable server after the SDK's own retries) is
        the caller's at once, as is a task that keeps failing after
        ``MAX_RETRIES`` tries."""
        if name == "wait_for_idle":  # a wait alone: its cancellation withdraws nothing
            try:
                return await self._execute_update(name, args, result_type)
            except WorkflowUpdateRPCTimeoutOrCancelledError as err:
                if (cancelled := _cancelled(err)) is not None:
                    raise cancelled from None
                raise Refused(f"Conversation {self.id} did not answer {name}: ask again.") from None
        note = None
        if Conversation.on_slow_update is not None:
            note = asyncio.get_running_loop().create_task(self._note_when_slow(name))
        try:
            return await self._execute_update(name, args, result_type)
        except WorkflowUpdateRPCTimeoutOrCancelledError as err:
            stopped = StoppedWaiting(
                f"Stopped waiting for {name}: what was sent is kept, and applies when a worker takes it "
                "(unless the Temporal server restarts first: see `state` before sending it again)."
            )
            if (cancelled := _cancelled(err)) is not None:
                raise cancelled from stopped  # exactly asyncio's type: timeout() and TaskGroup check it
            raise stopped from None
        finally:
            if note is not None:
                note.cancel()

    async def _execute_update(self, name: str, args: tuple[Any, ...], result_type: Any) -> Any:
        update_id = f"{name}-{uuid.uuid4()}"
        failures = 0
        while True:
            try:
                return await self.handle.execute_update(name, *args, id=update_id, result_type=result_type)
            except RPCError as err:
                aborted = (
                    err.status == RPCStatusCode.FAILED_PRECONDITION and "workflow task" in str(err).lower()
                )
                # Sent as the run continues as new or completes: the next run
                # takes it (this reached the caller as a raw RPCError, a crash audit).
                closing = err.status == RPCStatusCode.RESOURCE_EXHAUSTED and "workflow is closing" in str(err)
                if aborted and failures >= MAX_RETRIES and _task_failing(err):
                    sentence = await self._failing_task_sentence(
                        f"cannot take `{name}` now", f" (`{name}` was not taken: send it again then)"
                    )
                    raise Refused(sentence) from err
                if closing and failures >= MAX_RETRIES:
                    raise Refused(
                        f"The conversation kept closing its run while `{name}` was sent ({MAX_RETRIES + 1} "
                        f"tries): `{name}` was not taken; send it again."
                    ) from err
                if not (aborted or closing) or failures >= MAX_RETRIES:
                    raise
                await asyncio.sleep(_backoff(failures))
                failures += 1

    async def waits_for_worker(self, after: float = WORKER_NOTE_AFTER) -> str | None:
        """One sentence when this running conversation's next step (a
        workflow task, its model call or a tool call) has waited more than
        ``after`` seconds for a worker to take it: every worker on its task
        queue is gone (killed, or none started), or all are busy. None while
        nothing waits (a model call streaming, a call waiting for approval,
        an idle conversation), once it has ended, or when the server does
        not say. Compares the server's times with this machine's clock."""
        try:
            described = await self.handle.describe(rpc_timeout=_ENDING_TIMEOUT)
        except Exception:
            return None
        if described.status != WorkflowExecutionStatus.RUNNING:
            return None
        raw = described.raw_description
        now = time.time()
        task_queue = described.task_queue
        waiting: list[tuple[float, str, str]] = []  # (since, what, task queue)
        task = raw.pending_workflow_task
        if task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED:
            waiting.append((_seconds(task.scheduled_time), "its next workflow task", task_queue))
        for call in raw.pending_activities:
            if call.state != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED or call.paused:
                continue
            since = max(_seconds(call.scheduled_time), _seconds(call.next_attempt_schedule_time))
            what = _STEPS.get(call.activity_type.name, f"activity {call.activity_type.name}")
            if call.attempt > 1:
                what += f" (attempt {call.attempt})"
            waiting.append((since, what, call.activity_options.task_queue.name or task_queue))
        late = [(since, what, queue) for since, what, queue in waiting if since and now - since > after]
        if not late:
            return None
        since, what, queue = min(late)
        return (
            f"{self.id} waits for a worker on task queue {queue!r}: {what} has not been taken for "
            f"{now - since:.0f} s: no worker runs there, or all are busy. The conversation goes on when "
            "one takes it."
        )

    async def _note_while_no_worker(self, reading: _Reading) -> None:
        """Tell ``on_slow_update`` once that the conversation whose events
        are read waits for a worker (``waits_for_worker``), looked at only
        while no event comes (``_WORKER_CHECKS``), and again after it went
        on. A reader of a conversation whose only worker died was told
        nothing (a durability audit)."""
        said = False
        checks = 0
        while True:
            quiet = time.monotonic() - reading.last_event
            if quiet < _WORKER_CHECKS[0]:
                checks, said = 0, False  # it went on: a stall after this is told again
                await asyncio.sleep(_WORKER_CHECKS[0] - quiet)
                continue
            sentence = await self.waits_for_worker()
            say = Conversation.on_slow_update
            if sentence is None:
                said = False
            elif not said and say is not None:
                said = True
                with contextlib.suppress(Exception):  # a failing callback must not end the looks
                    say(sentence)
            checks += 1
            reading.moved.clear()
            next_look = _WORKER_CHECKS[min(checks, len(_WORKER_CHECKS) - 1)]
            # asyncio.timeout, not wait_for: on Python 3.11 a cancel landing
            # as wait_for's own timeout fired was lost, and `starter.py run`
            # then hung at exit, cancelling this task forever (a README audit).
            with contextlib.suppress(TimeoutError):  # an event starts the looks over
                async with asyncio.timeout(next_look):
                    await reading.moved.wait()

    async def _note_when_slow(self, name: str, *, query: bool = False) -> None:
        """Tell ``on_slow_update`` once that ``name`` waits for a worker (a
        killed worker's requests waited with no word, a durability audit;
        so did a query: ``chat`` attached to such a conversation said
        nothing for 30 s, then "Timeout expired")."""
        await asyncio.sleep(UPDATE_NOTE_AFTER)
        described = await self._described()
        name_of_queue = described.task_queue if described is not None else None
        task_queue = repr(name_of_queue) if name_of_queue is not None else "its task queue"
        attempt = described.raw_description.pending_workflow_task.attempt if described is not None else 0
        say = Conversation.on_slow_update
        if say is None:
            return
        if attempt > 1:
            # Not "is one running?": one is, and fails the conversation's
            # workflow task (a README audit: a worker without its hooks).
            sentence = (
                f"{name} has waited {UPDATE_NOTE_AFTER:g} s: the conversation's workflow task is failing on "
                f"the worker (attempt {attempt}), and nothing is taken until it passes; why follows if it "
                "goes on failing."
            )
        elif query:
            sentence = (
                f"{name} has waited {UPDATE_NOTE_AFTER:g} s for a worker on {task_queue} to answer it: "
                "is one running?"
            )
        else:
            sentence = (
                f"{name} has waited {UPDATE_NOTE_AFTER:g} s for a worker on {task_queue}: is one running? "
                "It is kept and applies when one takes it (stopping this wait does not withdraw it)."
            )
        with contextlib.suppress(Exception):  # a failing callback is the caller's, not the request's
            say(sentence)

    async def _task_queue_name(self) -> str | None:
        """The conversation's task queue; None when the server does not say."""
        described = await self._described()
        return described.task_queue if described is not None else None

    async def _described(self) -> WorkflowExecutionDescription | None:
        """The conversation's description; None when the server does not say."""
        try:
            return await self.handle.describe(rpc_timeout=_ENDING_TIMEOUT)
        except Exception:
            return None

    # --- runs ---------------------------------------------------------------------------

    async def prompt(self, message: Message | list[Message], *, wait: bool = True) -> list[AgentMessage]:
        """pi's ``prompt()``: start a run with a message, a text, or a list
        of them (all added before the first model call); refused while a run
        is active. With ``wait``, return the run's new messages when it ends;
        without, return at once (an empty list; ``send_prompt`` says where
        the run's events start)."""
        started = await self.send_prompt(message)
        return await self._run_messages(started) if wait else []

    async def continue_(self, *, wait: bool = True) -> list[AgentMessage]:
        """pi's ``continue()``: run from the transcript and the queues."""
        started = await self.send_continue()
        return await self._run_messages(started) if wait else []

    async def send_prompt(self, message: Message | list[Message]) -> PromptResult:
        """Start a run and return once it is accepted: its number and the
        event offset its events start at (``run_events``)."""
        async with self._refusals():
            return await self._update("prompt", _wire(message), result_type=PromptResult)

    async def send_continue(self) -> PromptResult:
        """``continue_`` without waiting: the run's number and event offset."""
        async with self._refusals():
            return await self._update("continue", result_type=PromptResult)

    async def run_events(
        self, started: PromptResult, *, on_skipped: Callable[[int, int], None] | None = None
    ) -> AsyncGenerator[tuple[int, dict[str, Any]], None]:
        """``(offset, event)`` of the run ``started`` names, up to and
        including its ``agent_end`` (fewer when the conversation ends first).
        Runs never overlap, so the first ``agent_end`` from its offset is its own.
        A reader behind by more than a continue-as-new carries may miss it:
        a second ``agent_start`` is then the next run's, and this run's
        events end before it; and when the events no longer kept reach past
        its offset (where its ``agent_start`` was published), the first
        ``agent_start`` read is another run's too."""
        begun = own_start_lost = False

        def skipped(first: int, next_kept: int) -> None:
            nonlocal own_start_lost
            own_start_lost = own_start_lost or first <= started.event_offset < next_kept
            if on_skipped is not None:
                on_skipped(first, next_kept)

        # Closed on return, so that its reading (and its watch for a missing
        # worker) ends with the run's events, not when it is collected.
        async with contextlib.aclosing(self.events(started.event_offset, on_skipped=skipped)) as events:
            async for offset, event in events:
                if event.get("type") == "agent_start":
                    if begun or own_start_lost:
                        return  # this run's end (or its start) was not kept
                    begun = True
                yield offset, event
                if event.get("type") == "agent_end" and isinstance(event.get("messages"), list):
                    return

    async def _run_messages(self, started: PromptResult) -> list[AgentMessage]:
        async with contextlib.aclosing(self.run_events(started)) as events:
            async for _, event in events:
                if event.get("type") == "agent_end":
                    with contextlib.suppress(ValidationError):  # else not the workflow's (forged): none
                        return MessageList.validate_python(event["messages"])
        # No agent_end: the conversation ended first (terminated by the server
        # past its history limit, say), where this returned [] as if the run
        # had made no message; or its end was not kept (see run_events).
        ended = await self._how_it_ended(running="", unknown="")
        if ended:
            raise ConversationEnded(
                f"Conversation {self.id} {ended} before run {started.run} ended: its transcript so far is "
                f"in the `messages` query (python starter.py messages {self.id})."
            )
        return []

    async def steer(self, message: Message) -> None:
        """Inject a message after the current tool batch, before the next model
        call (starts a run when the conversation is idle)."""
        wire = _signal_message(message)
        async with self._refusals():
            await self.handle.signal("steer", wire)

    async def follow_up(self, message: Message) -> None:
        """Queue a message for when the agent would otherwise stop (starts a
        run when the conversation is idle)."""
        wire = _signal_message(message)
        async with self._refusals():
            await self.handle.signal("follow_up", wire)

    async def abort(self) -> None:
        """Abort the active run (the model call, running tools, approval waits)."""
        async with self._refusals():
            await self.handle.signal("abort")

    async def stop_after_turn(self) -> None:
        """End the active run at the next turn boundary."""
        async with self._refusals():
            await self.handle.signal("stop_after_turn")

    async def close(self) -> None:
        """End the conversation (an active run is aborted first)."""
        async with self._refusals():
            await self.handle.signal("close")

    async def wait_for_idle(self) -> WaitForIdleResult:
        """pi's ``waitForIdle()``: returns when no run is active (asked again
        when the conversation continued as new, or was reset, meanwhile)."""
        async with self._refusals():
            switches = 0
            while True:
                try:
                    return await self._update("wait_for_idle", result_type=WaitForIdleResult)
                except WorkflowUpdateFailedError as err:
                    cause = getattr(err.cause, "type", None)
                    # The run it waited on ended before answering: continued as
                    # new, or reset by a worker's repair (runtime/repair.py) and
                    # going on in a new run, which has the wait again.
                    if cause not in ("ContinuedAsNew", "AcceptedUpdateCompletedWorkflow"):
                        raise
                    if cause == "AcceptedUpdateCompletedWorkflow" and await self.has_ended():
                        # Terminated, timed out, closed meanwhile: said as
                        # `prompt(wait=True)` says it (it was a bare Refused
                        # quoting the SDK, a client review).
                        ended = await self._how_it_ended()
                        raise ConversationEnded(
                            f"Conversation {self.id} {ended} before it was idle."
                        ) from None
                if switches:  # the run still switching: not in a loop of updates
                    await asyncio.sleep(_backoff(switches - 1))
                switches += 1

    # --- approvals ----------------------------------------------------------------------

    async def approve(self, tool_call_id: str, approved: bool = True, reason: str | None = None) -> None:
        """Decide a tool call that waits for approval (``state().pending_approvals``,
        or a ``tool_approval_request`` event); refused for an id that is not waiting."""
        if not isinstance(approved, bool):  # "no" would read as true, "too risky" fail validation
            raise Refused(f"approved is True or False, not {approved!r} (a reason goes in reason=...).")
        request = ApprovalRequest(tool_call_id=tool_call_id, approved=approved, reason=reason)
        async with self._refusals():
            await self._update("approve_tool", request.model_dump())

    async def reject(self, tool_call_id: str, reason: str | None = None) -> None:
        """Refuse a tool call that waits for approval; the model sees ``reason``."""
        await self.approve(tool_call_id, approved=False, reason=reason)

    # --- settings and state -----------------------------------------------------------------

    async def configure(self, **settings: Any) -> SettingsInForce:
        """pi's setters in one call (snake_case: ``model``, ``system_prompt``,
        ``thinking_level``, ``tools``, ``tool_execution``, ``steering_mode``,
        ``follow_up_mode``, ``max_turns``, ...), applied from the next model
        call; returns the settings now in force."""
        patch = {_camel(k): v for k, v in settings.items()}
        async with self._refusals():
            return await self._update("configure", patch, result_type=SettingsInForce)

    async def clear_queues(self, which: QueueName = "all") -> list[AgentMessage]:
        """pi's ``clearSteeringQueue`` / ``clearFollowUpQueue`` / ``clearAllQueues``
        (``"steering"``, ``"followUp"``, ``"all"``); returns the removed
        messages, oldest first, to hand back to an editor."""
        async with self._refusals():
            return await self._update("clear_queues", which, result_type=list[AgentMessage])

    async def reset(self) -> SessionState:
        """pi's ``reset()``: transcript, queues, usage, error and counters
        cleared; refused while a run is active."""
        async with self._refusals():
            return await self._update("reset", result_type=SessionState)

    async def state(self) -> SessionState:
        """Status, settings in force, queues, pending approvals, counters,
        usage (the transcript is ``messages``). ``closed`` for a conversation
        that has ended however it did: one terminated mid-run (by the server
        past its history limit, or by an operator) answered ``running`` for
        good, as its history left it."""
        async with self._refusals():
            state: SessionState = await self._query("state", SessionState)
        if state.status != "closed" and await self.has_ended():
            ended = {"status": "closed", "is_streaming": False, "streaming_message": None}
            state = state.model_copy(update=ended)
        return state

    async def how_it_ended(self) -> str:
        """One sentence on how the conversation ended: closed, failed (with
        its reason, read through this client's converter), terminated, ...;
        "The conversation has not ended." while it runs."""
        return f"The conversation {await self._how_it_ended(running='has not ended')}."

    async def ended_on_task_queue(self) -> str | None:
        """The task queue of a conversation that has ended, whose events a
        worker there must replay to be read; None while it runs, or when the
        server does not say."""
        ended = await self._ended()
        return ended.task_queue if ended is not None else None

    async def has_ended(self) -> bool:
        """The conversation's latest run has ended (False when that cannot be told)."""
        return await self._ended() is not None

    async def _ended(self) -> WorkflowExecutionDescription | None:
        """The latest run's description if it has ended; None while it runs,
        or when the server does not say."""
        try:
            described = await self.handle.describe(rpc_timeout=_ENDING_TIMEOUT)
        except Exception:
            return None
        if described.status in (None, WorkflowExecutionStatus.RUNNING):
            return None
        return described

    async def messages(self) -> list[AgentMessage]:
        """The transcript."""
        async with self._refusals():
            return await self._query("messages", list[AgentMessage])  # type: ignore[no-any-return]

    async def _query(self, name: str, result_type: Any) -> Any:
        """A query, asked again while the server holds one for this
        conversation already (``RESOURCE_EXHAUSTED`` "consistent query
        buffer is full": a workflow task is in flight and other clients
        asked first; seen with several clients polling ``state``)."""
        note = None
        if Conversation.on_slow_update is not None:
            note = asyncio.get_running_loop().create_task(self._note_when_slow(name, query=True))
        try:
            return await self._query_again(name, result_type)
        except RPCError as err:
            # The server says "no poller seen for task queue recently" at
            # once when its workers have been gone a while (an operator
            # audit: the README's sentence was never printed then).
            gone = "no poller seen" in (err.message or "")
            if err.status not in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED) and not gone:
                raise
            # Nothing answered it in time: a query is answered by a worker.
            task_queue = await self._task_queue_name()
            where = f"task queue {task_queue!r}" if task_queue is not None else "its task queue"
            raise Refused(
                f"Conversation {self.id} did not answer `{name}` within {QUERY_WAIT.total_seconds():g} s: "
                f"no worker on {where} answered (none runs there, or all are busy). Start one, then "
                "ask again."
            ) from err
        finally:
            if note is not None:
                note.cancel()

    async def _failing_task_sentence(self, what: str, resend: str = "") -> str:
        """Why the conversation's workflow task fails, in one sentence: the
        server's raw "Workflow Task in failed state" said nothing of what to
        do (a README audit: a worker without the hooks the conversation ran
        with replayed it differently, and the sentence blamed a blocking tool).
        ``resend`` ends it for a request that was not taken."""
        cause, message = await self._last_task_failure()
        if cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR:
            return (
                f"Conversation {self.id} {what}: a worker replays its history differently from how it "
                "ran (nondeterminism). Every worker on its task queue must run the same workflow code, tool "
                "modules and hooks: start the workers it ran on again, or stop the one that differs; it "
                f"goes on then{resend}."
            )
        if cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_BAD_UPDATE_WORKFLOW_EXECUTION_MESSAGE:
            return (
                f"Conversation {self.id} {what}: the SDK core's update fault (sdk-rust #888) wedged it after "
                "a worker was killed. A worker resets it to its last completed workflow task within about "
                "a minute (AGENT_REPAIR_WEDGED, on by default; README, What can go wrong): it goes on "
                f"then{resend}."
            )
        if cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_PAYLOADS_TOO_LARGE:
            return (
                f"Conversation {self.id} {what}: a payload its next step sends is over Temporal's payload "
                "limit (2 MB by default; the worker's log names it). Either its transcript outgrew workers "
                "that keep every payload in the history (AGENT_STORAGE=off: start them with a payload "
                "store, AGENT_STORAGE=file or s3://..., and give its clients the same; it goes on then, "
                "nothing lost), or another client "
                "sent an update that large as plain JSON (it goes on once the server drops it, within "
                f"about 20 s){resend}."
            )
        why = f": {message.rstrip('.')}" if message else " (the worker's log says why)"
        return (
            f"Conversation {self.id} {what}: its workflow task is failing{why}. A tool that blocks "
            "the worker's event loop, or a hook past the 2 s deadlock limit, does this. Ask again once "
            f"it is fixed{resend}."
        )

    async def _last_task_failure(self) -> tuple[int | None, str]:
        """The cause and first line of the last WorkflowTaskFailed event in
        the last events of the history, read from its end."""
        try:
            response = await self.client.workflow_service.get_workflow_execution_history_reverse(
                GetWorkflowExecutionHistoryReverseRequest(
                    namespace=self.client.namespace,
                    execution=WorkflowExecution(workflow_id=self.id),
                    maximum_page_size=50,
                ),
                timeout=_ENDING_TIMEOUT,
            )
        except Exception:
            return None, ""
        for event in response.history.events:
            if event.HasField("workflow_task_failed_event_attributes"):
                failed = event.workflow_task_failed_event_attributes
                message = failed.failure.message
                if failed.failure.HasField("encoded_attributes"):  # "Encoded failure": ours, with keys
                    with contextlib.suppress(Exception):
                        message = str(await self.client.data_converter.decode_failure(failed.failure))
                return failed.cause, " ".join(message.split("\n")[0].split())[:300]
        return None, ""

    async def _query_again(self, name: str, result_type: Any) -> Any:
        failures = 0
        while True:
            try:
                return await self.handle.query(name, result_type=result_type, rpc_timeout=QUERY_WAIT)
            except WorkflowQueryFailedError as err:
                if not _replayed_differently(err) or failures >= _FAILING_TASK_RETRIES:
                    raise
                await asyncio.sleep(_backoff(failures))
                failures += 1
            except RPCError as err:
                failing = _task_failing(err)
                if failing and failures >= _FAILING_TASK_RETRIES:
                    raise Refused(await self._failing_task_sentence("cannot answer now")) from err
                if not (failing or err.status == RPCStatusCode.RESOURCE_EXHAUSTED) or failures >= MAX_RETRIES:
                    raise
                await asyncio.sleep(_backoff(failures))
                failures += 1

    async def snapshot(self) -> tuple[SessionState, list[AgentMessage]]:
        """The state and the transcript it describes: ``state.event_offset``
        is where the events that follow this transcript start. (Messages are
        only ever appended, so the first ``state.message_count`` messages of a
        later ``messages`` query are the ones the state counted.)"""
        state = await self.state()
        messages = await self.messages()
        return state, messages[: state.message_count]

    async def result(self) -> SessionResult:
        """The transcript, once the conversation is closed. A run ended by a
        reset (the worker's repair, an operator's ``temporal workflow
        reset``) is followed to the run that goes on, as continue-as-new
        is (it raised ``TerminatedError`` while the conversation went on: a
        client review); a conversation that failed or was terminated raises
        the SDK's ``WorkflowFailureError``."""
        async with self._refusals():
            while True:
                try:
                    return await self.handle.result()
                except WorkflowFailureError as err:
                    if not isinstance(err.cause, TerminatedError) or not await self._reset_goes_on():
                        raise

    async def _reset_goes_on(self) -> bool:
        """The latest run was started by a reset and has not ended."""
        try:
            described = await self.handle.describe(rpc_timeout=_ENDING_TIMEOUT)
        except Exception:
            return False
        return described.status == WorkflowExecutionStatus.RUNNING

    async def history(self) -> WorkflowHistory:
        """The workflow's Temporal history (what the server stores for it)."""
        async with self._refusals():
            return await self.handle.fetch_history()

    async def fork(self, at: int, *, id: str | None = None, **options: Any) -> Conversation:
        """A new conversation from the first ``at`` messages of this one, on
        the same task queue and with its settings (``options`` override them,
        snake_case): try another answer from any point. The new conversation
        starts idle; prompt or continue it. Refused when ``at`` is out of
        range or would cut between tool calls and their results."""
        state, messages = await self.snapshot()
        _check_fork_point(messages, at)
        # All of them, the tools the model may call included: a fork never
        # offers the model a tool its original had switched off (a worker
        # lacking one of them refuses the fork's start, saying which).
        current = state.model_dump(include=set(AgentSettings.model_fields), by_alias=False)
        async with self._refusals():
            task_queue = (await self.handle.describe()).task_queue
        return await Conversation._start(
            self.client,
            task_queue,
            id or f"{self.id}-fork-{uuid.uuid4().hex[:4]}",
            None,
            messages[:at],
            {**current, **options},
        )

    # --- events -----------------------------------------------------------------------------

    async def events(
        self,
        from_offset: int = 0,
        *,
        cooldown_ms: int = 200,
        on_skipped: Callable[[int, int], None] | None = None,
    ) -> AsyncGenerator[tuple[int, dict[str, Any]], None]:
        """``(offset, event)`` from ``from_offset`` on, reconnecting, until the
        conversation ends; ``on_skipped(first, next)`` when events from
        ``first`` were no longer kept; see ``follow``."""
        reading = _Reading()
        note = None
        if Conversation.on_slow_update is not None:
            note = asyncio.get_running_loop().create_task(self._note_while_no_worker(reading))
        try:
            async with self._refusals():
                async for item in follow(
                    self.client, self.id, from_offset, cooldown_ms=cooldown_ms, on_skipped=on_skipped
                ):
                    reading.saw_event()
                    yield item
        finally:
            if note is not None:
                note.cancel()

    @asynccontextmanager
    async def _refusals(self) -> AsyncIterator[None]:
        """Turn the server's refusals into ``Refused`` with the sentence to show."""
        try:
            yield
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            message = getattr(cause, "message", None) or str(cause)
            if message == _ENCODED:
                message = f"Refused, for {_readable(message)}."
            raise Refused(message) from err
        except WorkflowQueryFailedError as err:
            # A worker could not replay the history to answer (a conversation
            # that failed because a worker could not read its start input; a
            # worker without a key the history needs): one line, not a traceback.
            detail = " ".join(str(err.message).split())[:300]
            ended = await self._how_it_ended(running="")
            where = f"{self.id} {ended}" if ended else self.id
            if detail == _ENCODED:  # encrypted by the worker: its log has the sentence
                detail = "the worker's log says why"
            elif ended:  # no worker will go on with it: not "goes on once the worker can read it"
                detail = detail.split("; the conversation goes on once")[0]
            raise Refused(f"Conversation {where}; a worker could not read its state: {detail}") from err
        except RPCError as err:
            if _never_ran(err):
                raise ConversationEnded(
                    f"Conversation {self.id} {await self._how_it_ended()} before any worker took it: it has "
                    "no state or messages; start a new one."
                ) from err
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            if "completed" in err.message:
                ended = await self._how_it_ended()
                if ended.startswith("failed"):
                    # Only a refused start input fails a conversation (or a
                    # retried run's carry, refused and emptied): no transcript
                    # to fork (an operator audit).
                    raise ConversationEnded(f"Conversation {self.id} {ended}: start a new one.") from err
                raise ConversationEnded(
                    f"Conversation {self.id} {ended}: start a new one, or fork "
                    f"this one (python starter.py fork {self.id} --at N)."
                ) from err
            raise ConversationNotFound(
                f"No conversation has the id {self.id}: check it, or start one (python starter.py start)."
            ) from err

    async def _how_it_ended(self, running: str = "has ended", unknown: str = "has ended") -> str:
        """``has ended``, or how it did when not by completing: a failed
        conversation's reason is read here, through this client's converter
        (with encryption on, the UI and the CLI show only "Encoded failure");
        ``running`` when it has not ended, ``unknown`` when the server does not say."""
        try:
            try:
                status = (await self.handle.describe(rpc_timeout=_ENDING_TIMEOUT)).status
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    # A mistyped id read "has ended" (a client review).
                    return "does not exist (no conversation has this id)"
                raise
            if status == WorkflowExecutionStatus.RUNNING:
                return running
            if status == WorkflowExecutionStatus.FAILED:
                try:
                    await self.handle.result(follow_runs=False, rpc_timeout=_ENDING_TIMEOUT)
                except WorkflowFailureError as failed:
                    reason = _readable(getattr(failed.cause, "message", None) or str(failed.cause))
                    return f"failed ({reason.rstrip('.')})"
        except Exception:  # the sentence without its detail
            return unknown
        return _ENDINGS.get(status, "has ended") if status is not None else "has ended"


@dataclass(frozen=True)
class ConversationSummary:
    """One conversation as the server's visibility store lists it (its
    search attributes; None where the server does not keep them)."""

    id: str
    started: datetime
    status: str | None
    model: str | None
    turns: int | None
    total_tokens: int | None
    cost: float | None


_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
_MODEL = SearchAttributeKey.for_keyword("AgentModel")
_TURNS = SearchAttributeKey.for_int("AgentTurns")
_TOKENS = SearchAttributeKey.for_int("AgentTotalTokens")
_COST = SearchAttributeKey.for_float("AgentCost")


# How ``list_conversations`` shows a conversation that ended without closing
# (keyed by the execution's status, which the server may leave out: None),
# and the name of that status in a visibility query (to filter by it).
_LISTED_AS: dict[WorkflowExecutionStatus, tuple[str, str]] = {
    WorkflowExecutionStatus.FAILED: ("failed", "Failed"),
    WorkflowExecutionStatus.TERMINATED: ("terminated", "Terminated"),
    WorkflowExecutionStatus.TIMED_OUT: ("timed-out", "TimedOut"),
    WorkflowExecutionStatus.CANCELED: ("cancelled", "Canceled"),
}
_LISTED_ENDINGS: dict[WorkflowExecutionStatus | None, str | None] = {
    status: listed for status, (listed, _) in _LISTED_AS.items()
}
_ENDING_STATUSES: dict[str, str] = dict(_LISTED_AS.values())
LISTED_STATUSES = ("idle", "running", "awaiting-approval", "closed", *_ENDING_STATUSES)


async def list_conversations(
    client: Client, *, status: str | None = None, model: str | None = None, limit: int = 50
) -> AsyncIterator[ConversationSummary]:
    """Conversations with ``status`` (``idle``, ``running``,
    ``awaiting-approval``, ``closed``, or how one ended without closing:
    ``failed``, ``terminated``, ``timed-out``, ``cancelled``) and ``model`` when given, in the
    server's order: running ones first, newest first, then ended ones, the
    last to end first (a SQL visibility store takes no ``ORDER BY``). The
    list is the server's visibility store: it may lag a second behind.

    One entry per conversation: its current run (a conversation that
    continued as new has earlier runs too). A conversation that ended
    without closing has the status of its end (``failed``, ``terminated``,
    ``timed-out``, ``cancelled``): its ``AgentStatus`` is where it stopped."""
    clauses = [f"WorkflowType = {visibility_quoted(WORKFLOW_TYPE)}", "ExecutionStatus != 'ContinuedAsNew'"]
    ending = _ENDING_STATUSES.get(status or "")
    if ending is not None:  # ended without closing: by the execution's status, whatever AgentStatus says
        clauses.append(f"ExecutionStatus = '{ending}'")
    elif status is not None:
        clauses.append(f"AgentStatus = {visibility_quoted(status)}")
        clauses.append("ExecutionStatus = " + ("'Completed'" if status == "closed" else "'Running'"))
    if model is not None:
        clauses.append(f"AgentModel = {visibility_quoted(model)}")
    listed: set[str] = set()
    try:
        async for execution in client.list_workflows(" AND ".join(clauses), limit=limit):
            if execution.id in listed or await _reset_away(client, execution):
                continue  # one entry per conversation: a run it was reset from is not it
            listed.add(execution.id)
            found: TypedSearchAttributes = execution.typed_search_attributes
            yield ConversationSummary(
                id=execution.id,
                started=execution.start_time,
                status=_LISTED_ENDINGS.get(execution.status, found.get(_STATUS)),
                model=found.get(_MODEL),
                turns=found.get(_TURNS),
                total_tokens=found.get(_TOKENS),
                cost=found.get(_COST),
            )
    except RPCError as err:
        if err.status != RPCStatusCode.INVALID_ARGUMENT or (status is None and model is None):
            raise
        raise Refused(
            "This server does not keep the Agent* search attributes, so it cannot filter by status "
            "or model: register them (the worker prints the command at start-up) or list without filters."
        ) from err


async def _reset_away(client: Client, execution: ListedExecution) -> bool:
    """A terminated run whose conversation goes on in another (a reset:
    a worker's repair, runtime/repair.py, or an operator's)."""
    if execution.status != WorkflowExecutionStatus.TERMINATED:
        return False
    try:
        current = await client.get_workflow_handle(execution.id).describe()
    except RPCError:
        return False
    return current.run_id != execution.run_id


def _check_fork_point(messages: list[AgentMessage], at: int) -> None:
    """Refuse a fork point outside the transcript, or one that would leave
    a tool call without its result (the model would refuse the transcript)."""
    if not 0 <= at <= len(messages):
        raise Refused(f"The transcript has {len(messages)} messages: fork at 0 to {len(messages)}.")
    for index, message in enumerate(messages[:at]):
        if not isinstance(message, AssistantMessage) or not message.tool_calls:
            continue
        waiting = {call.id for call in message.tool_calls}
        answered_at = index + 1
        while waiting and answered_at < len(messages):
            result = messages[answered_at]
            if isinstance(result, ToolResultMessage):
                waiting.discard(result.tool_call_id)
            answered_at += 1
        if waiting:
            raise Refused(
                f"Message {index + 1} calls tools that have not answered yet: fork at {index}, "
                "or wait for the run to end (wait_for_idle)."
            )
        if answered_at > at:
            raise Refused(
                f"Message {index + 1} calls tools whose results are messages {index + 2} to "
                f"{answered_at}: fork at {index} or at {answered_at}."
            )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _signal_message(message: Message) -> Any:
    """A steer or follow-up as sent, checked here as the workflow reads it:
    a signal cannot refuse, so the workflow drops one it cannot read (an
    empty text, say) with only a line in the worker's log. ``Refused`` with
    that line's sentence instead."""
    wire = _wire(message)
    try:
        prompt_message(clean_json(to_jsonable_python(wire)), lambda: 0)
    except InputError as err:
        raise Refused(str(err)) from None
    return wire


def _wire(message: Message | list[Message]) -> Any:
    if isinstance(message, list):
        return [_wire(m) for m in message]
    if isinstance(message, (str, dict)):
        return message
    if not isinstance(message, BaseModel):
        raise Refused(
            f"A message is a text, a message object or a dict of one, not {type(message).__name__}."
        )
    return message.model_dump(mode="json")


# --- following the event stream -------------------------------------------------------------

# Errors a poll can meet while the workflow is healthy, after which polling
# again from the same offset is right:
# - FAILED_PRECONDITION "...update due to unexpected workflow task failure":
#   the server failed the workflow task that carried the poll, most often
#   because a signal arrived while it was completing a continue-as-new
#   (cause UnhandledCommand); the task is retried and the workflow goes on.
# - UNAVAILABLE "workflow update was aborted" and other transport blips.
# - "Timeout expired" (DEADLINE_EXCEEDED, or CANCELLED as the client's own
#   deadline reports it): a read (a query) no worker answered in time, while
#   workers were killed and started (a crash audit's reader stopped there,
#   mid-conversation; twice).
_TRANSIENT = (RPCStatusCode.FAILED_PRECONDITION, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)


def _transient(err: RPCError) -> bool:
    return err.status in _TRANSIENT or (
        err.status == RPCStatusCode.CANCELLED and "timeout expired" in (err.message or "").lower()
    )


# Retries in a row without a new event before the error is the caller's:
# 0.1 s doubling to 2 s, about 25 s in all.
MAX_RETRIES = 15


def _replayed_differently(err: WorkflowQueryFailedError) -> bool:
    """A query answered by a worker whose replay of the history failed
    (nondeterminism): during a rolling upgrade, an old worker asked about a
    run the new code made. Another worker may answer it (an upgrade audit:
    readers ended while old workers still polled)."""
    return "[TMPRL1100]" in (err.message or "")


def _unanswered(err: RPCError) -> bool:
    """The server did not answer: it is down or restarting, or the
    connection broke under a call in flight (tonic's "transport error",
    status UNKNOWN). Not a refusal: a reader polls again until it answers,
    as the CLI's note promises (a chat gave up on a 12 s server restart, an
    audit)."""
    return err.status == RPCStatusCode.UNAVAILABLE or "transport error" in (err.message or "")


# A query to a conversation whose workflow task is failing (FAILED_PRECONDITION
# "Unable to query workflow due to Workflow Task in failed state") is asked
# again for ~3 s (a task retried at once may pass), then refused with a sentence.
_FAILING_TASK_RETRIES = 5


def _task_failing(err: RPCError) -> bool:
    return err.status == RPCStatusCode.FAILED_PRECONDITION and "Workflow Task in failed state" in err.message


def _backoff(failures: int) -> float:
    """Seconds before the next try after ``failures`` in a row: 0.1 doubling to 2."""
    return min(2.0, 0.1 * 2**failures)


# A query answers from the worker's cache at once; one that takes longer
# (no worker, a replay elsewhere) gives way to the long poll, which waits.
_QUERY_TIMEOUT = timedelta(seconds=5)
# Temporal takes at most 2,000 updates in one workflow run, and a run cannot
# continue as new in the middle of a tool batch: a reader that follows a
# batch of thousands of calls, reading each tool's events by update as they
# come, used them all up in about a minute (after which the conversation
# refused every update). So a reader that has sent this many updates to one
# run waits at least so many seconds between reads (the read after a wait is
# a query, no update), whatever the reads brought: (updates, seconds),
# highest first. The end of a run still comes at once (RUN_END_UPDATE).
READ_PACING: tuple[tuple[int, float], ...] = ((1500, 30.0), (1000, 5.0), (500, 1.0))
_ENDED = (
    WorkflowExecutionStatus.COMPLETED,
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.CANCELED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
)


class PollInterval:
    """A poll cooldown counted from the start of the previous poll, not from
    its end: polls are still at most one per interval, but after a long poll
    that waited for events (an idle stream, a model thinking) the next poll
    goes out at once instead of a whole interval later. ``_EventReader``
    asks ``next_wait()`` when a poll has returned: the seconds to wait
    before the next one.

    Only a stream of token deltas is worth batching: the reader tells the
    interval each event a poll brought (``saw``), and a poll that brought
    events but no ``message_update`` (a run starting, tools running, a turn
    ending) is followed at once, so the first token after them, or the end
    after a tool round, is not held back by a cooldown. A poll that brought
    nothing (the stream draining for continue-as-new) keeps the cooldown.
    """

    def __init__(self, milliseconds: float) -> None:
        self._interval = milliseconds / 1000
        self._next_poll_at = time.monotonic()  # the first poll starts now
        self._brought: bool | None = None  # since the last poll: None nothing, False no deltas, True deltas

    def saw(self, event: Any) -> None:
        delta = isinstance(event, dict) and event.get("type") == "message_update"
        self._brought = bool(self._brought) or delta

    def next_wait(self) -> float:
        now = time.monotonic()
        brought, self._brought = self._brought, None
        if brought is False:
            self._next_poll_at = now
            return 0.0
        wait = max(0.0, self._interval - (now - self._next_poll_at))
        self._next_poll_at = now + wait
        return wait


def _event_of(converter: Any, data: str) -> dict[str, Any] | None:
    """A stream item's event; None for an item that is no event (anyone who
    may signal a conversation can publish on its stream): readers skip it."""
    try:
        event = converter.from_payload(item_payload(data))
    except Exception:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("type"), str) else None


async def follow(
    client: Client,
    workflow_id: str,
    from_offset: int = 0,
    *,
    cooldown_ms: int = 200,
    on_skipped: Callable[[int, int], None] | None = None,
) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """Yield ``(offset, event)`` from ``from_offset`` on, across continue-as-new,
    until the workflow completes (then the retained events are drained first).

    Events are pi's camelCase dicts, as published. ``cooldown_ms`` is the
    least time from one poll's start to the next's (``PollInterval``). A
    caught-up subscriber long-polls (an update the workflow answers as soon
    as an event is published), so the first event of a quiet stream is not
    delayed; only polls that brought token deltas are followed by the
    cooldown, and the read after a cooldown is a query, which costs the
    workflow no history (``_EventReader``). The default, 200 ms, is two of
    the LLM activity's batches (``streamBatchMs``): reading each batch
    showed tokens no sooner to a reader while doubling the reads
    (bench/README.md).

    A poll that fails transiently (see ``_transient``, and a read a worker
    could not replay for, ``_replayed_differently``) is made again from the
    next offset not yet yielded, so no event is lost or repeated; after
    ``MAX_RETRIES`` failures in a row the error is raised, unless the server
    did not answer at all (``_unanswered``): that poll is made again, every
    2 s at most, until it does.

    Events the conversation no longer keeps cannot be read: those before
    the oldest kept (a long conversation carries its latest events across
    continue-as-new, at most 4 MB of them), also when a reader fell that
    far behind while reading. The offsets then jump: ``on_skipped(first,
    next)`` is called before the event at ``next`` with the first offset
    not read, so a reader can say so.
    """
    reader = _EventReader(client, workflow_id, from_offset, cooldown_ms)
    failures = unanswered = 0
    while True:
        try:
            async for item in reader.items():
                failures = unanswered = 0
                skipped, reader.skipped = reader.skipped, None
                if skipped is not None and on_skipped is not None:
                    on_skipped(*skipped)
                yield item
            return
        except (RPCError, WorkflowQueryFailedError) as err:
            if isinstance(err, RPCError) and _unanswered(err):  # not counted: polled until the server answers
                await asyncio.sleep(_backoff(unanswered))
                unanswered = min(unanswered + 1, MAX_RETRIES)
                continue
            transient = _transient(err) if isinstance(err, RPCError) else _replayed_differently(err)
            if not transient or failures >= MAX_RETRIES:
                raise
            await asyncio.sleep(_backoff(failures))
            failures += 1


class _EventReader:
    """Reads a conversation's ``events`` topic for ``follow``, polling as the
    stream's own client does, with one change: a read that follows a
    cooldown is a query.

    A long-poll update is what a caught-up subscriber needs (it answers the
    moment an event is published), but each one is an update and a workflow
    task the server persists. After a cooldown the stream is busy (the last
    poll brought token deltas), events are waiting, and nothing needs to
    wait: a query reads them with no history event and no workflow task
    (the worker answers it from its cache). When a query finds nothing new,
    the next read is a long-poll update again. Measured (bench.peers, K=20):
    7 -> 3 updates per streamed conversation.

    A query cannot tell the workflow how far its subscriber has read, and a
    conversation about to complete waits (up to ``SUBSCRIBER_GRACE``) for
    its live subscribers to read the end: when a query brings ``agent_end``,
    an update poll from the last event read tells it, in the background (it
    returns at once; the reader does not wait for it). After ``agent_end``
    the next read is a long poll again: a query to a conversation that has
    completed would replay its history on a worker. A query that does not
    answer within ``_QUERY_TIMEOUT`` gives way to the long poll too.

    A cooldown would make the end of a run reach the subscriber up to a
    cooldown late (the end comes at any moment of it). So when a run's
    first cooldown starts, the reader also sends one update that returns
    when the run has ended (``RUN_END_UPDATE``, answered with the offset
    past its ``agent_end``, no events); if the end comes during a
    cooldown, the cooldown is cut short and the end is read at once by long
    poll (which also tells the workflow it was read). One such update per
    run; a worker without it, or a refusal, leaves the cooldowns as they
    were."""

    def __init__(self, client: Client, workflow_id: str, offset: int, cooldown_ms: int) -> None:
        self._client = client
        self._handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(workflow_id)
        self._ended: WorkflowHandle[Any, Any] | None = None  # the run that ended, once it has
        self._cooldown_ms = cooldown_ms
        self._by_query = False
        self._acks: set[asyncio.Task[None]] = set()
        self._run_end: asyncio.Task[int | None] | None = None  # waits for the run's end
        self._run_end_wanted = True  # one wait per run (again once one was released for continue-as-new)
        self._converter = client.data_converter.payload_converter
        self.offset = offset  # the next offset to yield
        # The next offset this reader has not had, kept when a truncated read
        # sets ``offset`` back to 0; and the events a read found gone since.
        self._expected = offset
        self.skipped: tuple[int, int] | None = None
        self._run_id: str | None = None  # the run the last update went to
        self.updates_in_run = 0  # updates this reader sent to that run

    async def items(self) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        interval = PollInterval(self._cooldown_ms)
        try:
            while True:
                result = await self._read()
                if result is None:
                    continue  # the read was answered otherwise (continue-as-new, truncation, end)
                if result.items and result.items[0].offset > self._expected:
                    # The stream no longer held these (carried across continue-as-new
                    # only in part): said before the next event (``on_skipped``).
                    first = self.skipped[0] if self.skipped else self._expected  # one not said yet
                    self.skipped = (first, result.items[0].offset)
                decoded = ((item.offset, _event_of(self._converter, item.data)) for item in result.items)
                batch = [(offset, event) for offset, event in decoded if offset >= self.offset and event]
                self.offset = max(self.offset, result.next_offset)
                self._expected = max(self._expected, result.next_offset)
                queried = self._by_query and self._ended is None  # else a long poll answered
                run_ended = any(event.get("type") == "agent_end" for _, event in batch)
                if queried and run_ended:
                    self._acknowledge(batch[-1][0])
                for offset, event in batch:
                    interval.saw(event)
                    if event.get("type") == "agent_start":
                        self._run_end_wanted = True
                    yield offset, event
                if result.more_ready:
                    continue  # a backlog: read on at once, the same way
                if self._ended is not None:
                    return
                wait = max(interval.next_wait(), 0.0 if run_ended else self._least_wait())
                # After a run's end the conversation may complete: a query would
                # then replay its history on a worker; the long poll learns it
                # from the server.
                self._by_query = wait > 0 and not run_ended
                if wait > 0:
                    await self._cool_down(wait, run_ended)
        finally:
            if self._run_end is not None:  # a read made again (``follow``) waits anew
                self._run_end.cancel()
                self._run_end, self._run_end_wanted = None, True

    def _least_wait(self) -> float:
        """The least wait before the next read, for the updates sent to this run (``READ_PACING``)."""
        return next((seconds for updates, seconds in READ_PACING if self.updates_in_run >= updates), 0.0)

    def _sent_update(self, run_id: str | None) -> None:
        if run_id != self._run_id:
            self._run_id, self.updates_in_run = run_id, 0
        self.updates_in_run += 1

    async def _cool_down(self, seconds: float, run_ended: bool) -> None:
        """Wait ``seconds`` before the next read, or less when the run ends
        meanwhile: then the next read is a long poll, at once."""
        if self._run_end is None and self._run_end_wanted and not run_ended:
            self._run_end_wanted = False
            self._run_end = asyncio.get_running_loop().create_task(self._wait_for_run_end(self.offset))
        if self._run_end is None:
            await asyncio.sleep(seconds)
            return
        started = time.monotonic()
        done, _ = await asyncio.wait({self._run_end}, timeout=seconds)
        if not done:
            return
        end, self._run_end = self._run_end.result(), None
        if end is not None and end > self.offset:
            self._by_query = False  # the end is not read yet: read it now
            return
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))

    async def _wait_for_run_end(self, from_offset: int) -> int | None:
        """The offset past the ``agent_end`` of the run in progress, once
        published; None when the wait was released for continue-as-new, or
        refused (no run in progress, a worker without the update)."""
        try:
            update = await self._handle.start_update(
                RUN_END_UPDATE,
                from_offset,
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                result_type=int | None,  # type: ignore[arg-type]
            )
            self._sent_update(update.workflow_run_id)
            end: int | None = await update.result()
        except WorkflowUpdateRPCTimeoutOrCancelledError as err:
            if (cancelled := _cancelled(err)) is not None:
                raise cancelled from None
            return None
        except Exception:  # refused, or the run gone: the cooldowns alone, as before
            return None
        if end is None:
            self._run_end_wanted = True  # released for continue-as-new: wait again on the next run
        return end

    def _poll(self, offset: int | None = None) -> PollInput:
        return PollInput(topics=[EVENTS_TOPIC], from_offset=self.offset if offset is None else offset)

    async def _read(self) -> PollResult | None:
        if self._ended is not None:
            try:
                return await self._ended.query(POLL_UPDATE, self._poll(), result_type=PollResult)
            except RPCError as err:
                if not _never_ran(err):
                    raise
                return PollResult(next_offset=self.offset)  # ended before its first task: no event
        if self._by_query:
            with contextlib.suppress(WorkflowQueryFailedError, RPCError):
                result = await self._handle.query(
                    POLL_UPDATE, self._poll(), result_type=PollResult, rpc_timeout=_QUERY_TIMEOUT
                )
                if result.items:
                    return result
            self._by_query = False
        return await self._long_poll()

    async def _long_poll(self) -> PollResult | None:
        """An update poll, as ``WorkflowStreamClient.subscribe`` makes it:
        None when it found the run draining for continue-as-new, continued,
        ended (the rest is then read by query from the run that ended), the
        offset truncated, or as many reads waiting as the workflow lets wait
        (``StreamBusy``: the next read is a query, after a cooldown)."""
        polled_run_id: str | None = None
        try:
            update = await self._handle.start_update(
                POLL_UPDATE, self._poll(), wait_for_stage=WorkflowUpdateStage.ACCEPTED, result_type=PollResult
            )
            polled_run_id = update.workflow_run_id
            self._sent_update(polled_run_id)
            return await update.result()
        except (WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError, RPCError) as err:
            if isinstance(err, WorkflowUpdateFailedError):
                cause = getattr(err.cause, "type", None)
                if cause == TRUNCATED_ERROR:
                    self.offset = 0  # read on from the oldest event retained
                    return None
                if cause == DRAINING_ERROR:
                    await asyncio.sleep(self._cooldown_ms / 1000)
                    return None
                if cause == BUSY_ERROR:  # other readers hold the waits: read by query after a cooldown
                    await asyncio.sleep(self._cooldown_ms / 1000)
                    self._by_query = True
                    return None
            if (cancelled := _cancelled(err)) is not None:
                raise cancelled from None
            try:
                polled = self._client.get_workflow_handle(self._handle.id, run_id=polled_run_id)
                described = await polled.describe()
            except RPCError:
                raise err from None
            if (
                described.status == WorkflowExecutionStatus.CONTINUED_AS_NEW
                or described.raw_description.workflow_extended_info.reset_run_id
            ):
                return None  # the handle follows the latest run (continued, or reset: runtime/repair.py)
            if described.run_id and described.status in _ENDED:
                self._ended = self._client.get_workflow_handle(self._handle.id, run_id=described.run_id)
                return None
            raise

    def _acknowledge(self, last: int) -> None:
        """Tell the workflow this subscriber has read through ``last``."""

        async def acknowledge() -> None:
            with contextlib.suppress(Exception):  # at worst the workflow waits out its grace
                update = await self._handle.start_update(
                    POLL_UPDATE,
                    self._poll(last),
                    wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                    result_type=PollResult,
                )
                self._sent_update(update.workflow_run_id)
                await update.result()

        task = asyncio.get_running_loop().create_task(acknowledge())
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)
