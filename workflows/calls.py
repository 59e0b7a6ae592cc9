"""The loop's model and tool calls, as Temporal activities.

``ActivityCalls`` supplies ``LoopConfig.stream_assistant_response`` and
``LoopConfig.execute_tool``: it starts the activities with their retry
policies, timeouts and summaries, sends the model its context by
reference, cancels what runs when the run is aborted, and turns every
failure into a message the loop can use (pi's loop never raises).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from workflows.contract import LlmRequest, LlmResult, SessionDefaults, ToolRequest
    from workflows.loop import ABORTED_TEXT, AgentContext, ModelAnswer, PreparedToolCall, error_outcome
    from workflows.models import AssistantMessage, ToolCall, ToolOutcome
    from workflows.session import Session
    from workflows.stream import EventStream
    from workflows.versions import Versions

LLM_ACTIVITY = "stream_assistant_response"
TOOL_ACTIVITY = "execute_tool"
DEFAULTS_ACTIVITY = "session_defaults"

LLM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
DEFAULT_MODEL_CALL_SECONDS = 600
"""A model call's time limit in conversations that recorded none (started
before AGENT_MODEL_CALL_TIMEOUT existed)."""
TOOL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)
# Activities heartbeat twice a second; a worker that dies is noticed after this.
HEARTBEAT_TIMEOUT = timedelta(seconds=3)
# Temporal refuses more than 2,000 pending activities per workflow (and a
# workflow task completion is limited in size): a batch with more tool
# calls runs at most this many at once, the next starting as one ends (a
# worker runs 200 activities at a time by default, so more would only wait
# on the server).
MAX_TOOL_ACTIVITIES_AT_ONCE = 200
# A workflow task's completion travels in one gRPC message (4 MB at most):
# the arguments of the tool activities running at once are kept under this
# (a call past it alone still runs), so one answer with megabytes of tool
# arguments is scheduled over several workflow tasks instead of getting the
# conversation terminated (GrpcMessageTooLarge). Before this patch they were
# all scheduled at once.
MAX_TOOL_ARGUMENT_BYTES_AT_ONCE = 1_000_000
TOOL_ARGUMENT_BYTES_PATCH = "tool-argument-bytes"
SAVE_LOCAL_RESULTS_PATCH = "save-local-results-before-switch"
# Activity ids above ~1,000 bytes are refused; long tool-call ids are cut
# and made unique by a digest.
MAX_ID_CHARS = 200
# Temporal refuses more than 10,000 signals per execution, and every event
# batch an activity publishes is one: the budget handed to each call.
SIGNAL_LIMIT = 10_000
SIGNAL_RESERVE = 1_000  # for users' signals (abort, close, steer) near the end

# The worker's defaults come by a plain activity, not a local one. A local
# activity in a run's first workflow task met a fault of the SDK's core
# (temporalio 1.35): a `state` query answered while the task ran made the
# core record the activity's marker in that task but hand its result to
# the workflow only in the next one, after the updates (a subscriber's
# reads) that came meanwhile. What followed it (the first search attributes,
# or the first model call) was then recorded after those updates were
# accepted, and every replay failed on nondeterminism: the conversation
# wedged at its next worker (3 in 10 conversations queried and read at
# once, in a contract audit). The same fault in another form (sdk-rust
# #888) is what runtime/repair.py mends. Its own marker, asked only where
# the defaults are read: a run of the release before took them by a local
# activity, and replays so.
DEFAULTS_BY_ACTIVITY_PATCH = "defaults-by-activity"
DEFAULTS_TIMEOUT = timedelta(seconds=10)

RECORDED_TOOLS_PATCH = "recorded-tool-declarations"
# Aborted tools are cancelled and waited for (before: cancelled and left
# running), so no tool goes on after its result says "aborted".
WAIT_CANCEL_PATCH = "wait-for-cancelled-tools"
INSTANT_ABORT_PATCH = "instant-abort"
# An aborted model call is still answered at once, but the run does not
# continue as new or complete until the call has ended (the activity hears
# of the abort at its next heartbeat): before, its last event batches could
# land during the workflow task that switched, which the server then failed
# (UnhandledCommand) and ran again.
AWAIT_ABORTED_CALL_PATCH = "await-aborted-model-call"
# Events where their count changed (so that an execution replayed from
# before keeps the offsets its subscribers hold): a run ended by a failing
# hook has its failure message's turn_end (pi's handleRunFailure emits only
# agent_end; here every run's last message ends a turn, as subscribers
# expect, and the SPEC asks only for the message and agent_end); a model call whose
# last attempt broke off mid-answer ends the message it streamed; a retry
# drops the partial message (an abort then has a message_start of its own).
STREAM_AS_PI_PATCH = "stream-events-as-pi"


class _Aborted(Exception):
    """The model call was aborted; its activity has not ended yet."""


class ActivityCalls:
    """Model and tool calls of one workflow execution."""

    def __init__(
        self, session: Session, stream: EventStream, now_ms: Callable[[], int], versions: Versions
    ) -> None:
        self._session = session
        self._versions = versions
        self._stream = stream
        self._now_ms = now_ms
        self._llm: workflow.ActivityHandle[LlmResult] | None = None
        self._tools: dict[str, workflow.ActivityHandle[ToolOutcome]] = {}
        self._local_tools: set[str] = set()  # the ids in ``_tools`` run as local activities
        self._activity_ids: set[str] = set()
        self._wave = asyncio.Semaphore(MAX_TOOL_ACTIVITIES_AT_ONCE)
        self._argument_bytes = 0  # of the tool activities running
        self._instant_abort = False
        self._aborted_calls: list[workflow.ActivityHandle[LlmResult]] = []  # cancelled, not yet ended
        # The signals each call started may still send (twice its budget of
        # event batches, for its retries), held until it ends.
        self._granted: list[tuple[workflow.ActivityHandle[Any], int]] = []
        self.on_change: Callable[[], None] = lambda: None
        self._local_results_unsaved = False  # a local tool ended since the last model call began

    @property
    def streaming(self) -> bool:
        return self._llm is not None

    def running_tools(self) -> list[str]:
        return list(self._tools)

    def cancel_all(self) -> None:
        """Cancel the model call and every running tool (an abort)."""
        if self._llm is not None:
            self._llm.cancel()
        for handle in self._tools.values():
            handle.cancel()

    async def aborted_calls_ended(self) -> None:
        """Wait until every aborted model call has ended (cancelled at its
        next heartbeat, or timed out on a dead worker): before continuing
        as new or completing, so no event batch of theirs lands during that
        workflow task."""
        calls, self._aborted_calls = self._aborted_calls, []
        if calls:
            await workflow.wait_condition(lambda: all(call.done() for call in calls))
            await asyncio.gather(*calls, return_exceptions=True)  # their cancellations, read

    async def local_results_saved(self) -> None:
        """Before continuing as new or completing: when a local tool has
        ended since the last model call began (maybe in this workflow task),
        end the task first (a 1 ms timer), so the tools' results are in the
        history. Progress a local tool sent still arriving made the server
        refuse the switch (UnhandledCommand); the task's local results went
        with it, the tools ran again and sent more, and a conversation went
        round like that for minutes, refusing every update (a crash audit)."""
        if not self._local_results_unsaved:
            return
        self._local_results_unsaved = False
        if self._versions.has(SAVE_LOCAL_RESULTS_PATCH):
            await workflow.sleep(timedelta(milliseconds=1), summary="the local tools' results saved")

    # --- the session's defaults -------------------------------------------------------

    async def session_defaults(self) -> SessionDefaults:
        """The worker's default model and tool declarations, recorded in history."""
        if workflow.patched(DEFAULTS_BY_ACTIVITY_PATCH):
            return await workflow.execute_activity(
                DEFAULTS_ACTIVITY,
                result_type=SessionDefaults,
                start_to_close_timeout=DEFAULTS_TIMEOUT,
                summary="the worker's defaults: model, tool declarations, settings",
            )
        return await workflow.execute_local_activity(
            DEFAULTS_ACTIVITY, result_type=SessionDefaults, start_to_close_timeout=DEFAULTS_TIMEOUT
        )

    # --- the model ----------------------------------------------------------------------

    async def stream_assistant_response(self, context: AgentContext) -> ModelAnswer:
        """One ``stream_assistant_response`` activity; a failure becomes an
        assistant message with ``stopReason`` ``error`` (``aborted`` after
        an abort)."""
        session = self._session
        context.tools = session.enabled_tools()  # configure applies from the next call
        self._stream.model_call_started()
        try:
            result = await self._call_model(context)
        except _Aborted:
            return self._aborted_answer()
        except ActivityError as err:
            if session.abort_requested:
                return self._aborted_answer()
            # What had streamed stays, as in pi (the provider's partial output
            # ends with stopReason "error"): one message_start, one message_end.
            streamed = self._stream.streamed_message() if self._versions.has(STREAM_AS_PI_PATCH) else None
            return self._ended_answer(streamed, "error", self._model_failure_text(err))
        finally:
            self._llm = None
            self._stream.model_call_ended(aborted=session.abort_requested)
            self.on_change()
        for event in result.events:
            self._stream.publish(event)
        if result.context_ref is not None:
            session.context_ref, session.context_length = result.context_ref, len(context.messages) + 1
        return ModelAnswer(result.message, result.streamed, result.argument_errors)

    def _model_failure_text(self, err: ActivityError) -> str:
        """What a model call's failure says; its time limit, by name."""
        current: BaseException | None = err
        while current is not None:
            if isinstance(current, TemporalTimeoutError) and current.type == TimeoutType.START_TO_CLOSE:
                limit = self._session.model_call_timeout or DEFAULT_MODEL_CALL_SECONDS
                return (
                    f"The model call ran past its time limit of {limit:g} s (the worker's "
                    "AGENT_MODEL_CALL_TIMEOUT, recorded when the conversation started) and was "
                    "given up after its last attempt."
                )
            current = current.__cause__
        return activity_failure_text(err)

    async def _call_model(self, context: AgentContext) -> LlmResult:
        """The context goes as the stored manifest plus the messages added
        since (constant history per turn); if the store lost it, once more
        with everything inline."""
        session, settings = self._session, self._session.settings
        for inline in (session.context_ref is None, True):
            start = 0 if inline else session.context_length
            request = LlmRequest(
                model=settings.model or "",
                system_prompt=settings.system_prompt,
                thinking_level=settings.thinking_level,
                tool_names=list(context.tools),
                messages=context.messages[start:],
                context_ref=None if inline else session.context_ref,
                context_length=start,
                turn=session.turns.total + 1,
                stream_batch_ms=settings.stream_batch_ms,
                max_batches=self._batch_budget(),
                stream_call=self._stream.model_call,
            )
            # An abort answers at once with what had streamed, instead of
            # waiting for the activity to hear of it (up to a heartbeat).
            self._instant_abort = self._versions.has(INSTANT_ABORT_PATCH)
            # ... and the call, cancelled, is waited for before the run switches.
            awaited = self._instant_abort and self._versions.has(AWAIT_ABORTED_CALL_PATCH)
            self._local_results_unsaved = False  # saved with the task that schedules the call
            self._llm = workflow.start_activity(
                LLM_ACTIVITY,
                request,
                result_type=LlmResult,
                start_to_close_timeout=timedelta(
                    seconds=session.model_call_timeout or DEFAULT_MODEL_CALL_SECONDS
                ),
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=LLM_RETRY,
                cancellation_type=(
                    workflow.ActivityCancellationType.TRY_CANCEL
                    if self._instant_abort and not awaited
                    else workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
                ),
                summary=f"llm: {request.model} turn {request.turn}",
            )
            self._grant(self._llm, request.max_batches)
            self.on_change()
            try:
                if awaited:
                    return await self._answer_or_abort(self._llm)
                return await self._llm
            except ActivityError as err:
                missing = isinstance(err.cause, ApplicationError) and err.cause.type == "ContextMissing"
                if inline or not missing or session.abort_requested:
                    raise
                workflow.logger.warning("Stored context is missing; sending it inline: %s", err.cause)
                session.context_ref, session.context_length = None, 0
        raise AssertionError("unreachable")

    async def _answer_or_abort(self, call: workflow.ActivityHandle[LlmResult]) -> LlmResult:
        """The call's result, or, at an abort, ``_Aborted`` at once: the
        call goes on until it hears of the cancellation and is waited for by
        ``aborted_calls_ended``."""
        if self._session.abort_requested:  # before the call began (no loop path makes one then)
            return await call  # as before this path: the abort cancelled nothing of it
        await workflow.wait_condition(lambda: call.done() or self._session.abort_requested)
        if not call.done():
            self._aborted_calls.append(call)
            raise _Aborted()
        return call.result()

    def _aborted_answer(self) -> ModelAnswer:
        """The aborted message: what the model had streamed to subscribers."""
        streamed = (
            self._stream.streamed_message(retry_drops=self._versions.has(STREAM_AS_PI_PATCH))
            if self._instant_abort
            else None
        )
        return self._ended_answer(streamed, "aborted", "Request was aborted")

    def _ended_answer(self, streamed: AssistantMessage | None, stop_reason: str, error: str) -> ModelAnswer:
        """A model call ended without its answer: the message that had
        streamed (its tool calls dropped: they would be left without
        results), else a new one."""
        if streamed is None:
            return ModelAnswer(self._assistant_message(stop_reason, error))
        message = streamed.model_copy(
            update={
                "content": [c for c in streamed.content if not isinstance(c, ToolCall)],
                "model": streamed.model or self._session.settings.model or "",
                "stop_reason": stop_reason,
                "error_message": error,
                # Stamped once, when the request was made (as pi's): the
                # message_start subscribers saw and the end are one message.
                "timestamp": streamed.timestamp or self._now_ms(),
            }
        )
        return ModelAnswer(message, streamed=True)

    def _assistant_message(self, stop_reason: str, error: str) -> AssistantMessage:
        return AssistantMessage.model_validate(
            {
                "model": self._session.settings.model or "",
                "stopReason": stop_reason,
                "errorMessage": error,
                "timestamp": self._now_ms(),
            }
        )

    # --- tools --------------------------------------------------------------------------

    async def execute_tool(self, prepared: PreparedToolCall) -> ToolOutcome:
        """One ``execute_tool`` activity (at most ``MAX_TOOL_ACTIVITIES_AT_ONCE``
        run at a time); a failure or an abort becomes an error outcome."""
        activity_id, key = self._ids(prepared.call.id)
        async with self._wave:
            if self._session.abort_requested:
                return error_outcome(ABORTED_TEXT)
            size = self._size_of_arguments(prepared)
            # Asked again on waking: every call waiting wakes in the same
            # activation once bytes are freed, and each must still fit after
            # those before it took theirs.
            while not self._fits(size):
                await workflow.wait_condition(lambda: self._fits(size) or self._session.abort_requested)
                if self._session.abort_requested:
                    return error_outcome(ABORTED_TEXT)
            self._argument_bytes += size
            try:
                return await self._run_tool(prepared, activity_id, key)
            finally:
                self._argument_bytes -= size

    def _size_of_arguments(self, prepared: PreparedToolCall) -> int:
        """What the call's arguments add to the workflow task that schedules
        it (a local activity's are not sent: 0)."""
        if prepared.tool.local or not self._versions.has(TOOL_ARGUMENT_BYTES_PATCH):
            return 0
        return len(json.dumps(prepared.args, default=str))

    def _fits(self, size: int) -> bool:
        return self._argument_bytes == 0 or self._argument_bytes + size <= MAX_TOOL_ARGUMENT_BYTES_AT_ONCE

    async def _run_tool(self, prepared: PreparedToolCall, activity_id: str, key: str) -> ToolOutcome:
        call, tool = prepared.call, prepared.tool
        request = ToolRequest(
            tool_call=ToolCall(id=call.id, name=call.name, arguments=prepared.args),
            stream_batch_ms=self._session.settings.stream_batch_ms,
            idempotency_key=key,
            # A share that leaves room for the calls of the batch that start
            # after it: the k-th call running at once gets 1/(2(k+1)) of what
            # is left, and all of them together never more than all of it.
            # A local tool sends no signal (its events go with its result):
            # it is given none and takes no share.
            max_batches=0 if tool.local else self._batch_budget(share=self._signalling_tools() + 2),
            raw_arguments=_raw_arguments(prepared),
        )
        cancellation = (
            workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
            if self._versions.has(WAIT_CANCEL_PATCH)
            else workflow.ActivityCancellationType.TRY_CANCEL
        )
        timeout = timedelta(seconds=tool.timeout_seconds)
        summary = tool_summary(call.name, prepared.args)
        handle: workflow.ActivityHandle[ToolOutcome]
        if tool.local:
            # The fast path: run in this workflow task, on this worker, with
            # no server round trip; no heartbeats and no row of its own in the UI.
            handle = workflow.start_local_activity(
                TOOL_ACTIVITY,
                request,
                result_type=ToolOutcome,
                activity_id=activity_id,
                start_to_close_timeout=timeout,
                retry_policy=TOOL_RETRY,
                cancellation_type=cancellation,
                summary=summary,
            )
        else:
            handle = workflow.start_activity(
                TOOL_ACTIVITY,
                request,
                result_type=ToolOutcome,
                activity_id=activity_id,
                start_to_close_timeout=timeout,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=TOOL_RETRY,
                cancellation_type=cancellation,
                summary=summary,
            )
        self._tools[call.id] = handle
        if tool.local:
            self._local_tools.add(call.id)
        self._grant(handle, request.max_batches)
        self.on_change()
        try:
            outcome = await handle
        except (FailureError, asyncio.CancelledError) as err:
            # An activity task's failure arrives as an ActivityError; a
            # local activity's as its bare cause (an ApplicationError),
            # which, let through, failed the whole conversation (a
            # robustness audit).
            if isinstance(err, asyncio.CancelledError) and not self._session.abort_requested:
                raise
            aborted = self._session.abort_requested
            return error_outcome(ABORTED_TEXT if aborted else _tool_failure_text(err))
        finally:
            self._tools.pop(call.id, None)
            if tool.local:
                self._local_tools.discard(call.id)
                self._local_results_unsaved = True
            self.on_change()
        for event in outcome.events:
            self._stream.publish(event)
        return outcome.model_copy(update={"events": []})

    def _ids(self, tool_call_id: str) -> tuple[str, str]:
        """The activity id of a tool call derives from its id (readable in
        the UI); a repeated id gets a suffix, a long one a digest. The
        idempotency key adds the execution's number, so a model that reuses
        ids (``call_0`` every turn) never repeats a key across continue-as-new."""
        base = f"tool-{tool_call_id}"
        if len(base) > MAX_ID_CHARS:
            digest = hashlib.sha256(tool_call_id.encode("utf-8", "replace")).hexdigest()[:16]
            base = f"{base[: MAX_ID_CHARS - 17]}-{digest}"
        activity_id, n = base, 1
        while activity_id in self._activity_ids:
            n += 1
            activity_id = f"{base}-{n}"
        self._activity_ids.add(activity_id)
        workflow_id, execution = workflow.info().workflow_id, self._session.continued_runs
        key = f"{workflow_id}/{activity_id}" if execution == 0 else f"{workflow_id}/{execution}/{activity_id}"
        return activity_id, key

    def _signalling_tools(self) -> int:
        """The tool calls running that may send event batches as signals."""
        return len(self._tools) - len(self._local_tools)

    def _batch_budget(self, share: int = 1) -> int:
        """How many event batches one call may publish: ``1/share`` of what
        is left of this execution's signal allowance once the signals taken
        and those still granted to running calls are counted, halved for
        its retries (``activities.events.attempt_budget``). 0 when nothing
        is left: its events then go back with its result. (Before, each
        call's share ignored what the others running had been given: twelve
        calls reporting progress together were granted more than the
        allowance, used up the execution's 10,000 signals, and then
        ``abort`` and ``close`` were refused.)"""
        self._granted = [(handle, n) for handle, n in self._granted if not handle.done()]
        left = SIGNAL_LIMIT - SIGNAL_RESERVE - self._stream.signals - sum(n for _, n in self._granted)
        return max(0, left // (2 * share))

    def _grant(self, handle: workflow.ActivityHandle[Any], max_batches: int | None) -> None:
        if max_batches:
            self._granted.append((handle, 2 * max_batches))


# --- helpers ----------------------------------------------------------------------------


MAX_RAW_ARGUMENT_BYTES = 2_000
"""The arguments as the model sent them travel with a call whose
preparation changed them only up to this size; past it
``tool_execution_update`` shows the prepared ones. Not counted in
``MAX_TOOL_ARGUMENT_BYTES_AT_ONCE`` (which replayed runs decided by): 200
calls at once add at most 400 KB to the 4 MB a workflow task may send."""


def _raw_arguments(prepared: PreparedToolCall) -> dict[str, Any] | None:
    """The call's arguments as the model sent them, when preparation
    changed them (``1`` and ``1.0`` compare equal but read differently)."""
    raw = prepared.call.arguments
    if prepared.args is raw:
        return None
    shown = json.dumps(raw, sort_keys=True, default=str)
    if len(shown) > MAX_RAW_ARGUMENT_BYTES or shown == json.dumps(prepared.args, sort_keys=True, default=str):
        return None
    return raw


def activity_failure_text(err: BaseException) -> str:
    """The innermost useful message of an activity failure (a user's
    exception is worded by ``hooks.failure_text``)."""
    messages = []
    current: BaseException | None = err
    while current is not None:
        if isinstance(current, FailureError) and current.message and not isinstance(current, ActivityError):
            messages.append(current.message)
        current = current.__cause__
    return messages[-1] if messages else str(err) or type(err).__name__


def _tool_failure_text(err: BaseException) -> str:
    """A tool activity's failure as its result says it; a heartbeat timeout
    with what usually causes it (the bare "activity Heartbeat timeout" left
    a tool author guessing; a robustness audit)."""
    current: BaseException | None = err
    while current is not None:
        if isinstance(current, TemporalTimeoutError) and current.type == TimeoutType.HEARTBEAT:
            return (
                f"The tool stopped heartbeating for {HEARTBEAT_TIMEOUT.total_seconds():g} s and was given "
                f"up (tried {TOOL_RETRY.maximum_attempts} times): it blocks the worker's event loop "
                "(time.sleep, blocking I/O: run such work with asyncio.to_thread), or its worker died."
            )
        current = current.__cause__
    return activity_failure_text(err)


def tool_summary(name: str, args: dict[str, Any]) -> str:
    """``tool: read_file path=src/x.py`` for the Temporal UI."""
    parts = []
    for key, value in args.items():
        # default=str: a shim's datetime reaches the tool as text, and is shown so here.
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
        parts.append(f"{key}={text if len(text) <= 40 else text[:37] + '...'}")
    summary = f"tool: {name} {' '.join(parts)}".strip()
    return summary if len(summary) <= 200 else summary[:197] + "..."
