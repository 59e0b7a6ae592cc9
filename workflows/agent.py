"""``AgentWorkflow``: one conversation, running pi-agent-core's agent loop.

The loop (``_run_loop``) reads top to bottom like pi's ``runLoop``; the LLM
call and each tool call are activities; every event goes to the workflow
stream's ``events`` topic. Everything here is deterministic: no I/O, wall
clock or randomness (timestamps come from ``workflow.now()``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError
    from temporalio.contrib.workflow_streams import PollInput, PollResult, WorkflowStream

    from activities.tools import (
        ToolArgumentsError,
        ToolSpec,
        registered_tools,
        validate_arguments,
    )
    from workflows.contract import (
        LlmRequest,
        LlmResult,
        PromptResult,
        RunState,
        SessionCarry,
        SessionDefaults,
        SessionInput,
        SessionResult,
        SessionSettings,
        SessionState,
        ToolOutcome,
        ToolRequest,
    )
    from workflows.hooks import BlockToolCall, ToolCallContext, ToolResultOverride, TurnContext
    from workflows.models import (
        EVENTS_TOPIC,
        AgentEndEvent,
        AgentMessage,
        AgentStartEvent,
        AssistantMessage,
        CustomMessage,
        MessageAdapter,
        MessageEndEvent,
        MessageStartEvent,
        ToolCall,
        ToolExecutionEndEvent,
        ToolExecutionStartEvent,
        ToolResultMessage,
        TurnEndEvent,
        TurnStartEvent,
        UserMessage,
        WireModel,
        text_result,
    )
    from workflows.queues import MessageQueue

LLM_ACTIVITY = "stream_assistant_response"
TOOL_ACTIVITY = "execute_tool"
DEFAULTS_ACTIVITY = "session_defaults"

LLM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
TOOL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)
# Activities heartbeat twice a second; a worker that dies is noticed after this.
HEARTBEAT_TIMEOUT = timedelta(seconds=3)
# Stream items kept when continuing as new; older offsets read from the
# oldest item kept.
STREAM_ITEMS_CARRIED = 2000
# The stream's long-poll update (registered by WorkflowStream; wrapped here).
STREAM_POLL_UPDATE = "__temporal_workflow_stream_poll"
# How long a conversation that is about to complete waits for its live
# subscribers to read the last events (a subscriber polls again within its
# cooldown, 100 ms by default). Past it, or with no subscriber, it completes
# and late readers drain the rest by query (which replays the history).
SUBSCRIBER_GRACE = timedelta(seconds=1)
LINGER_PATCH = "linger-for-subscribers"


@dataclass
class _RunRequest:
    """What the session's main loop starts next."""

    prompts: list[AgentMessage]
    skip_initial_steering: bool = False
    from_continue: bool = False


@dataclass
class _PreparedCall:
    call: ToolCall
    spec: ToolSpec | None
    args: dict[str, Any]
    immediate: ToolOutcome | None = None


@dataclass
class _ToolBatch:
    results: list[ToolResultMessage]
    terminate: bool


class _ContinueRefused(ValueError):
    pass


@workflow.defn(name="AgentWorkflow")
class AgentWorkflow:
    """One conversation. Subclass it to override the hooks
    (``before_tool_call``, ``after_tool_call``, ``should_stop_after_turn``)."""

    @workflow.init
    def __init__(self, input: dict[str, Any] | None = None) -> None:
        self._input_error: str | None = None
        try:
            session = SessionInput.model_validate(input or {})
        except ValidationError as err:
            self._input_error = _validation_text("The start input is invalid", err)
            session = SessionInput()
        carry = session.carry or SessionCarry()
        self._stream = WorkflowStream(prior_state=carry.stream)
        self._events = self._stream.topic(EVENTS_TOPIC)
        # The stream's own poll handler, wrapped to see how far live
        # subscribers have read (see _let_subscribers_catch_up).
        self._stream_polled = False
        self._stream_delivered = 0
        workflow.set_update_handler(
            STREAM_POLL_UPDATE, self._on_stream_poll, validator=self._stream._validate_poll
        )
        self._settings = SessionSettings.model_validate(
            session.model_dump(include=set(SessionSettings.model_fields))
        )
        self._messages: list[AgentMessage] = list(session.messages)
        self._steering = MessageQueue(self._settings.steering_mode, carry.steering)
        self._follow_up = MessageQueue(self._settings.follow_up_mode, carry.follow_up)
        self._total_turns = carry.total_turns
        self._usage = carry.usage
        self._runs = carry.runs
        self._continued_runs = carry.continued_runs
        self._run: RunState | None = carry.run
        self._context_ref = carry.context_ref
        self._context_length = carry.context_length
        self._requested: _RunRequest | None = None
        self._abort_requested = False
        self._closing = False
        self._error_message: str | None = None
        self._llm_handle: workflow.ActivityHandle[LlmResult] | None = None
        self._tool_handles: dict[str, workflow.ActivityHandle[ToolOutcome]] = {}
        self._activity_ids: set[str] = set()
        self._turns_this_execution = 0
        self._run_ended = False  # a run ended and no other started since
        self._argument_errors: dict[str, str] = {}
        if session.prompt is not None and self._input_error is None:
            try:
                self._requested = _RunRequest([self._as_prompt_message(session.prompt)])
            except ValueError as err:
                self._input_error = str(err)

    # --- the session ----------------------------------------------------------

    @workflow.run
    async def run(self, input: dict[str, Any] | None = None) -> SessionResult:
        if self._input_error:
            raise ApplicationError(self._input_error, type="InvalidInput", non_retryable=True)
        self._tools = self._enabled_tools()
        if self._settings.model is None:
            defaults = await workflow.execute_local_activity(
                DEFAULTS_ACTIVITY, result_type=SessionDefaults, start_to_close_timeout=timedelta(seconds=10)
            )
            self._settings.model = defaults.model
        self._update_details()
        if self._run is not None:
            await self._resume_run(self._run)
        while True:
            if self._run_ended and self._settings.close_when_idle and self._is_idle_and_drained():
                await self._let_subscribers_catch_up()
                if self._is_idle_and_drained():
                    break
                continue  # a message arrived meanwhile: it starts a run
            await workflow.wait_condition(
                lambda: self._requested is not None or self._closing or self._continue_as_new_due()
            )
            if self._requested is not None:
                request, self._requested = self._requested, None
                await self._start_run(request)
            elif self._closing:
                await self._let_subscribers_catch_up()
                break
            else:
                await self._continue_as_new()
        self._update_details()
        # Release waiting stream subscribers (they drain the rest by query),
        # else their open polls would keep the conversation from completing.
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return SessionResult(messages=self._messages)

    def _enabled_tools(self) -> dict[str, ToolSpec]:
        available = registered_tools()
        names = self._settings.tools if self._settings.tools is not None else sorted(available)
        unknown = [n for n in names if n not in available]
        if unknown:
            raise ApplicationError(
                f"Unknown tool(s) {', '.join(unknown)}: the worker registers "
                f"{', '.join(sorted(available)) or 'no tools'}. Load the module that "
                "defines them with `worker.py --tools pkg.module`.",
                type="InvalidInput",
                non_retryable=True,
            )
        return {n: available[n] for n in names}

    @property
    def _model(self) -> str:
        return self._settings.model or ""

    def _is_busy(self) -> bool:
        return self._run is not None or self._requested is not None

    def _is_idle_and_drained(self) -> bool:
        return not self._is_busy() and not self._steering and not self._follow_up

    # --- runs -----------------------------------------------------------------

    async def _start_run(self, request: _RunRequest) -> None:
        """pi's ``run(prompts)`` / ``continue()``: emit the run's opening
        events, add the prompts, then run the loop."""
        if request.from_continue:
            try:
                request = self._continue_plan()
            except _ContinueRefused as err:
                workflow.logger.warning("Not continuing: %s", err)
                return
        self._runs += 1
        self._run_ended = False
        self._abort_requested = False
        self._error_message = None
        self._run = RunState(started_at_message=len(self._messages))
        self._emit(AgentStartEvent())
        self._emit(TurnStartEvent())
        for message in request.prompts:
            self._add_message(message)
        pending = [] if request.skip_initial_steering else self._steering.poll()
        await self._run_loop(pending, first_turn=True, has_more_tool_calls=True)

    async def _resume_run(self, run: RunState) -> None:
        """Go on with a run that continued as new at a turn boundary."""
        pending = [] if self._abort_requested else self._steering.poll()
        await self._run_loop(pending, first_turn=False, has_more_tool_calls=run.has_more_tool_calls)

    async def _run_loop(
        self, pending: list[AgentMessage], *, first_turn: bool, has_more_tool_calls: bool
    ) -> None:
        """pi's ``runLoop``: the inner loop runs turns while the model calls
        tools or steering messages wait; the outer loop picks up follow-ups
        when the agent would otherwise stop."""
        run = self._run
        assert run is not None
        while True:
            while has_more_tool_calls or pending:
                if first_turn:
                    first_turn = False
                else:
                    self._emit(TurnStartEvent())
                for message in pending:
                    self._add_message(message)
                pending = []

                message = await self._next_assistant_message()
                run.turns += 1
                self._total_turns += 1
                self._turns_this_execution += 1
                if message.stop_reason in ("error", "aborted"):
                    self._emit(TurnEndEvent(message=message, tool_results=[]))
                    self._end_run()
                    return

                tool_results: list[ToolResultMessage] = []
                has_more_tool_calls = False
                if message.tool_calls:
                    batch = await self._execute_tool_calls(message)
                    tool_results = batch.results
                    has_more_tool_calls = not batch.terminate
                self._emit(TurnEndEvent(message=message, tool_results=tool_results))

                if await self._stop_after_turn(message, tool_results):
                    self._end_run()
                    return
                run.has_more_tool_calls = has_more_tool_calls
                self._update_details()
                if self._continue_as_new_due():
                    await self._continue_as_new()
                pending = [] if self._abort_requested else self._steering.poll()

            pending = self._follow_up.poll()
            if not pending:
                break
        self._end_run()

    def _end_run(self) -> None:
        run = self._run
        assert run is not None
        self._emit(AgentEndEvent(messages=self._messages[run.started_at_message :]))
        self._run = None
        self._run_ended = True
        self._abort_requested = False
        self._update_details()

    async def _stop_after_turn(
        self, message: AssistantMessage, tool_results: list[ToolResultMessage]
    ) -> bool:
        run = self._run
        assert run is not None
        settings = self._settings
        if run.stop_requested:
            return True
        if settings.max_turns is not None and run.turns >= settings.max_turns:
            return True
        if settings.max_total_tokens is not None and self._usage.total_tokens >= settings.max_total_tokens:
            return True
        if settings.max_cost is not None and self._usage.cost.total >= settings.max_cost:
            return True
        context = TurnContext(message, tool_results, run.turns, self._total_turns)
        return bool(await _maybe_await(self.should_stop_after_turn(context)))

    def _continue_plan(self) -> _RunRequest:
        """pi's ``continue()``: what a run started without a prompt runs."""
        last = self._messages[-1] if self._messages else None
        if last is not None and last.role in ("user", "toolResult"):
            return _RunRequest(prompts=[])
        steering = self._steering.poll()
        if steering:
            return _RunRequest(prompts=steering, skip_initial_steering=True)
        follow_up = self._follow_up.poll()
        if follow_up:
            return _RunRequest(prompts=follow_up)
        if last is None:
            raise _ContinueRefused("There is nothing to continue: send a prompt first.")
        raise _ContinueRefused(
            "Cannot continue from an assistant message: nothing is queued. "
            "Send a prompt, or queue a steer or follow-up message."
        )

    # --- one assistant message --------------------------------------------------

    async def _next_assistant_message(self) -> AssistantMessage:
        """Get the next assistant message from the model (one activity), or an
        aborted one without calling the model when an abort is pending."""
        if self._abort_requested:
            message = self._assistant_message("aborted", "Request was aborted")
            self._emit(MessageStartEvent(message=message))
            self._add_message(message, announce=False)
            return message
        self._argument_errors = {}
        try:
            result = await self._call_model()
            message, streamed = result.message, result.streamed
            self._argument_errors = result.argument_errors
        except ActivityError as err:
            if self._abort_requested:
                message = self._assistant_message("aborted", "Request was aborted")
            else:
                message = self._assistant_message("error", _failure_text(err))
            streamed = False
            result = None
        finally:
            self._llm_handle = None
        if result is not None:
            self._publish_activity_events(result.events)
        if message.stop_reason == "error":
            self._error_message = message.error_message
        if not streamed:
            self._emit(MessageStartEvent(message=message))
        self._usage = self._usage.plus(message.usage)
        self._add_message(message, announce=False)
        if result is not None and result.context_ref is not None:
            self._context_ref, self._context_length = result.context_ref, len(self._messages)
        return message

    async def _call_model(self) -> LlmResult:
        """One ``stream_assistant_response`` activity. The context goes as
        the stored manifest plus the messages added since (constant history
        per turn); if the store lost it, once more with everything inline."""
        for inline in (self._context_ref is None, True):
            start = 0 if inline else self._context_length
            request = LlmRequest(
                model=self._model,
                system_prompt=self._settings.system_prompt,
                thinking_level=self._settings.thinking_level,
                tool_names=list(self._tools),
                messages=self._messages[start:],
                context_ref=None if inline else self._context_ref,
                context_length=start,
                turn=self._total_turns + 1,
                stream_batch_ms=self._settings.stream_batch_ms,
            )
            self._llm_handle = workflow.start_activity(
                LLM_ACTIVITY,
                request,
                result_type=LlmResult,
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=LLM_RETRY,
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"llm: {self._model} turn {request.turn}",
            )
            self._update_details()
            try:
                return await self._llm_handle
            except ActivityError as err:
                missing = isinstance(err.cause, ApplicationError) and err.cause.type == "ContextMissing"
                if inline or not missing or self._abort_requested:
                    raise
                workflow.logger.warning("Stored context is missing; sending it inline: %s", err.cause)
                self._context_ref, self._context_length = None, 0
        raise AssertionError("unreachable")

    def _assistant_message(self, stop_reason: str, error: str) -> AssistantMessage:
        return AssistantMessage.model_validate(
            {
                "model": self._model,
                "stopReason": stop_reason,
                "errorMessage": error,
                "timestamp": self._now_ms(),
            }
        )

    # --- tool calls ---------------------------------------------------------------

    async def _execute_tool_calls(self, message: AssistantMessage) -> _ToolBatch:
        """Run the message's tool calls (pi's ``executeToolCalls``)."""
        calls = message.tool_calls
        if message.stop_reason == "length":
            return self._refuse_truncated_calls(calls)
        sequential = self._settings.tool_execution == "sequential" or any(
            spec.execution_mode == "sequential"
            for spec in (self._tools.get(c.name) for c in calls)
            if spec is not None
        )
        outcomes: list[ToolOutcome] = []
        results: list[ToolResultMessage] = []
        if sequential:
            for call in calls:
                prepared = await self._prepare_tool_call(message, call)
                outcome = prepared.immediate or await self._execute_prepared(message, prepared)
                outcomes.append(outcome)
                results.append(self._add_tool_result(call, outcome))
        else:
            prepared_calls = [await self._prepare_tool_call(message, c) for c in calls]
            outcomes = list(
                await asyncio.gather(
                    *(
                        _ready(p.immediate) if p.immediate else self._execute_prepared(message, p)
                        for p in prepared_calls
                    )
                )
            )
            # Ends arrived in completion order; results land in source order.
            results = [self._add_tool_result(c, o) for c, o in zip(calls, outcomes, strict=True)]
        return _ToolBatch(results, terminate=bool(outcomes) and all(o.terminate for o in outcomes))

    def _refuse_truncated_calls(self, calls: list[ToolCall]) -> _ToolBatch:
        """Tool calls of a message cut off by the token limit may be
        incomplete: none runs; the model is told to issue them again."""
        outcomes = []
        for call in calls:
            self._emit(
                ToolExecutionStartEvent(tool_call_id=call.id, tool_name=call.name, args=call.arguments)
            )
            outcome = _error_outcome(
                f"Tool call {call.name} was not executed: the response hit the output "
                "token limit, so its arguments may be incomplete. Issue the call again, "
                "with shorter arguments if needed."
            )
            self._emit_tool_end(call, outcome)
            outcomes.append(outcome)
        results = [self._add_tool_result(c, o) for c, o in zip(calls, outcomes, strict=True)]
        return _ToolBatch(results, terminate=False)

    async def _prepare_tool_call(self, message: AssistantMessage, call: ToolCall) -> _PreparedCall:
        """Emit the start event and decide whether the call may run; an
        immediate (error) result emits its end event at once."""
        self._emit(ToolExecutionStartEvent(tool_call_id=call.id, tool_name=call.name, args=call.arguments))
        prepared = _PreparedCall(call, self._tools.get(call.name), call.arguments)
        parse_error = self._argument_errors.get(call.id)
        if prepared.spec is None:
            prepared.immediate = _error_outcome(f"Tool {call.name} not found")
        elif parse_error is not None:
            prepared.immediate = _error_outcome(
                f"The arguments of tool {call.name} are not valid JSON: {parse_error}"
            )
        elif self._abort_requested:
            prepared.immediate = _error_outcome("Tool execution aborted")
        else:
            try:
                prepared.args = validate_arguments(prepared.spec, call.arguments)
            except ToolArgumentsError as err:
                prepared.immediate = _error_outcome(str(err))
        if prepared.immediate is None:
            decision = await _maybe_await(
                self.before_tool_call(ToolCallContext(message, call, prepared.args))
            )
            if isinstance(decision, BlockToolCall):
                prepared.immediate = _error_outcome(decision.reason)
        if prepared.immediate is not None:
            self._emit_tool_end(call, prepared.immediate)
        return prepared

    async def _execute_prepared(self, message: AssistantMessage, prepared: _PreparedCall) -> ToolOutcome:
        """Run one tool call as an activity, apply ``after_tool_call`` and
        emit its end event."""
        call, spec = prepared.call, prepared.spec
        assert spec is not None
        activity_id = self._tool_activity_id(call.id)
        outcome: ToolOutcome
        if self._abort_requested:
            outcome = _error_outcome("Tool execution aborted")
        else:
            handle = workflow.start_activity(
                TOOL_ACTIVITY,
                ToolRequest(
                    tool_call=ToolCall(id=call.id, name=call.name, arguments=prepared.args),
                    stream_batch_ms=self._settings.stream_batch_ms,
                ),
                result_type=ToolOutcome,
                activity_id=activity_id,
                start_to_close_timeout=spec.timeout,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=TOOL_RETRY,
                summary=_tool_summary(call.name, prepared.args),
            )
            self._tool_handles[call.id] = handle
            self._update_details()
            try:
                outcome = await handle
                self._publish_activity_events(outcome.events)
                outcome = outcome.model_copy(update={"events": []})
            except (ActivityError, asyncio.CancelledError) as err:
                if not self._abort_requested and isinstance(err, asyncio.CancelledError):
                    raise
                outcome = _error_outcome(
                    "Tool execution aborted" if self._abort_requested else _failure_text(err)
                )
            finally:
                self._tool_handles.pop(call.id, None)
        outcome = await self._finalize_outcome(message, prepared, outcome)
        self._emit_tool_end(call, outcome)
        return outcome

    async def _finalize_outcome(
        self, message: AssistantMessage, prepared: _PreparedCall, outcome: ToolOutcome
    ) -> ToolOutcome:
        try:
            override = await _maybe_await(
                self.after_tool_call(ToolCallContext(message, prepared.call, prepared.args), outcome)
            )
        except Exception as err:  # a hook's failure becomes the call's error result
            return _error_outcome(str(err) or type(err).__name__)
        if not isinstance(override, ToolResultOverride):
            return outcome
        return ToolOutcome(
            content=outcome.content if override.content is None else override.content,
            details=outcome.details if override.details is None else override.details,
            is_error=outcome.is_error if override.is_error is None else override.is_error,
            terminate=outcome.terminate if override.terminate is None else override.terminate,
        )

    def _tool_activity_id(self, tool_call_id: str) -> str:
        """The activity id of a tool call derives from its id (the tool sees
        it as its idempotency key); a repeated id gets a suffix."""
        base = f"tool-{tool_call_id}"
        activity_id, n = base, 1
        while activity_id in self._activity_ids:
            n += 1
            activity_id = f"{base}-{n}"
        self._activity_ids.add(activity_id)
        return activity_id

    def _add_tool_result(self, call: ToolCall, outcome: ToolOutcome) -> ToolResultMessage:
        """The call's result message, appended to the transcript."""
        message = ToolResultMessage(
            tool_call_id=call.id,
            tool_name=call.name,
            content=outcome.content,
            details=outcome.details,
            is_error=outcome.is_error,
            timestamp=self._now_ms(),
        )
        self._add_message(message)
        return message

    def _emit_tool_end(self, call: ToolCall, outcome: ToolOutcome) -> None:
        self._emit(
            ToolExecutionEndEvent(
                tool_call_id=call.id,
                tool_name=call.name,
                result={"content": outcome.content, "details": outcome.details},
                is_error=outcome.is_error,
            )
        )

    # --- hooks (override in a subclass; deterministic, may be async) ----------------

    def before_tool_call(self, context: ToolCallContext) -> BlockToolCall | None:
        """Return ``BlockToolCall(reason)`` to stop a call from running."""
        return None

    def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> ToolResultOverride | None:
        """Return a ``ToolResultOverride`` to replace fields of the result."""
        return None

    def should_stop_after_turn(self, context: TurnContext) -> bool:
        """Return True to end the run after this turn (queues are not polled)."""
        return False

    # --- messages and events --------------------------------------------------------

    def _emit(self, event: WireModel) -> None:
        self._events.publish(event)

    def _publish_activity_events(self, events: list[dict[str, Any]]) -> None:
        """Events an activity returned instead of sending (its unsent tail):
        they go on the stream before the workflow's reaction to the result."""
        for event in events:
            self._events.publish(event)

    def _add_message(self, message: AgentMessage, *, announce: bool = True) -> None:
        """Append to the transcript; ``announce`` emits ``message_start`` too
        (an assistant message's start was emitted while it streamed)."""
        if announce:
            self._emit(MessageStartEvent(message=message))
        self._emit(MessageEndEvent(message=message))
        self._messages.append(message)

    def _now_ms(self) -> int:
        return int(workflow.now().timestamp() * 1000)

    def _as_prompt_message(self, payload: Any) -> AgentMessage:
        """A prompt, steer or follow-up payload as a message: a non-empty
        string, or a user (or application) message object."""
        if isinstance(payload, str):
            if not payload.strip():
                raise ValueError("The message text is empty: send some text.")
            return UserMessage(content=payload, timestamp=self._now_ms())
        try:
            message = payload if isinstance(payload, WireModel) else MessageAdapter.validate_python(payload)
        except ValidationError as err:
            raise ValueError(
                _validation_text(
                    'Expected a string or a message like {"role": "user", "content": "..."}', err
                )
            ) from None
        if isinstance(message, UserMessage):
            if _is_empty(message.content):
                raise ValueError("The message has no content: send some text or an image.")
            if not message.timestamp:
                message = message.model_copy(update={"timestamp": self._now_ms()})
            return message
        if isinstance(message, CustomMessage):
            return message
        raise ValueError(
            f"A {getattr(message, 'role', '?')} message cannot be sent: "
            'send text or a user message ({"role": "user", ...}).'
        )

    # --- continue-as-new ------------------------------------------------------------

    def _continue_as_new_due(self) -> bool:
        every = self._settings.continue_as_new_after_turns
        return workflow.info().is_continue_as_new_suggested() or (
            every is not None and self._turns_this_execution >= every
        )

    async def _continue_as_new(self) -> None:
        """Hand the whole session to a new run (at a turn boundary or idle),
        once every signal and update handler has finished."""
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._stream.truncate(max(0, self._stream_offset() - STREAM_ITEMS_CARRIED))
        carry = SessionCarry(
            steering=self._steering.snapshot(),
            follow_up=self._follow_up.snapshot(),
            total_turns=self._total_turns,
            usage=self._usage,
            runs=self._runs,
            run=self._run,
            context_ref=self._context_ref,
            context_length=self._context_length,
            stream=self._stream.get_state(),
            continued_runs=self._continued_runs + 1,
        )
        next_input = SessionInput.model_validate(
            {**self._settings.model_dump(), "messages": self._messages, "carry": carry}
        )
        if self._requested is not None:
            # A prompt accepted during the switch: queue it so it is not lost.
            for message in self._requested.prompts:
                next_input.carry.steering.append(message)  # type: ignore[union-attr]
        workflow.continue_as_new(next_input)

    async def _on_stream_poll(self, payload: PollInput) -> PollResult:
        self._stream_polled = True
        result = await self._stream._on_poll(payload)
        self._stream_delivered = max(self._stream_delivered, result.next_offset)
        return result

    async def _let_subscribers_catch_up(self) -> None:
        """Before completing, give a live subscriber (one that polled this
        run) up to SUBSCRIBER_GRACE to read the last events by its next poll.
        Without this, a subscriber that was between polls finds the workflow
        completed and reads the tail by query, which replays the whole
        history on a worker (0.4 ms per history event here; seconds for a
        long conversation). Returns early once a poll has read to the end,
        or when a message or ``close`` arrives."""
        if not self._stream_polled or self._stream_delivered >= self._stream_offset():
            return
        if not workflow.patched(LINGER_PATCH):
            return  # a conversation that completed before this existed
        closing = self._closing
        try:
            await workflow.wait_condition(
                lambda: (
                    self._stream_delivered >= self._stream_offset()
                    or self._closing != closing
                    or (not closing and not self._is_idle_and_drained())
                ),
                timeout=SUBSCRIBER_GRACE,
                timeout_summary="let subscribers read the last events",
            )
        except TimeoutError:
            pass

    def _stream_offset(self) -> int:
        # The stream's global offset (its `__temporal_workflow_stream_offset` query).
        return self._stream._on_offset()

    # --- signals, updates, queries --------------------------------------------------

    @workflow.update(name="prompt")
    async def prompt(self, payload: Any) -> PromptResult:
        """Start a run with a prompt (text or a user message)."""
        self._requested = _RunRequest([self._as_prompt_message(payload)])
        return PromptResult(run=self._runs + 1, event_offset=self._stream_offset())

    @prompt.validator
    def _validate_prompt(self, payload: Any) -> None:
        self._refuse_when_busy_or_closed()
        self._as_prompt_message(payload)

    @workflow.update(name="continue")
    async def continue_(self) -> PromptResult:
        """Start a run from the transcript and queues (pi's ``continue()``)."""
        self._requested = self._continue_plan()
        return PromptResult(run=self._runs + 1, event_offset=self._stream_offset())

    @continue_.validator
    def _validate_continue(self) -> None:
        self._refuse_when_busy_or_closed()
        last = self._messages[-1] if self._messages else None
        if last is not None and last.role in ("user", "toolResult"):
            return
        if not self._steering and not self._follow_up:
            raise ValueError(
                "There is nothing to continue: send a prompt first."
                if last is None
                else "Cannot continue from an assistant message: nothing is queued. "
                "Send a prompt, or queue a steer or follow-up message."
            )

    def _refuse_when_busy_or_closed(self) -> None:
        if self._closing:
            raise ValueError("The conversation is closed: start a new one.")
        if self._is_busy():
            raise ValueError(
                "A run is already active: send `steer` or `follow_up` instead, or wait for the run to end."
            )

    @workflow.signal(name="steer")
    def steer(self, payload: Any) -> None:
        """Queue a message injected before the next LLM call."""
        self._enqueue(self._steering, payload, "steer")

    @workflow.signal(name="follow_up")
    def follow_up(self, payload: Any) -> None:
        """Queue a message handled when the agent would otherwise stop."""
        self._enqueue(self._follow_up, payload, "follow_up")

    def _enqueue(self, queue: MessageQueue, payload: Any, signal: str) -> None:
        if self._closing:
            workflow.logger.warning("Dropped `%s`: the conversation is closed.", signal)
            return
        try:
            message = self._as_prompt_message(payload)
        except ValueError as err:
            workflow.logger.warning("Dropped an invalid `%s` signal: %s", signal, err)
            return
        queue.push(message)
        if not self._is_busy():
            # A message that arrives while idle starts a run, as continue() would.
            self._requested = _RunRequest(prompts=[], from_continue=True)
        self._update_details()

    @workflow.signal(name="abort")
    def abort(self) -> None:
        """Abort the active run (cancels the LLM call or running tools)."""
        if self._run is None:
            return
        self._abort_requested = True
        if self._llm_handle is not None:
            self._llm_handle.cancel()
        for handle in self._tool_handles.values():
            handle.cancel()

    @workflow.signal(name="stop_after_turn")
    def stop_after_turn(self) -> None:
        """End the active run at the next turn boundary (ignored while idle)."""
        if self._run is not None:
            self._run.stop_requested = True

    @workflow.signal(name="close")
    def close(self) -> None:
        """End the conversation (an active run is aborted first)."""
        self._closing = True
        self.abort()

    @workflow.query(name="state")
    def state(self) -> SessionState:
        return SessionState(
            status="closed" if self._closing else ("running" if self._is_busy() else "idle"),
            is_streaming=self._llm_handle is not None,
            pending_tool_calls=list(self._tool_handles),
            error_message=self._error_message,
            message_count=len(self._messages),
            steering_queue=len(self._steering),
            follow_up_queue=len(self._follow_up),
            turns=self._total_turns,
            runs=self._runs,
            usage=self._usage,
            model=self._model,
            event_offset=self._stream_offset(),
        )

    @workflow.query(name="messages")
    def messages(self) -> list[AgentMessage]:
        return self._messages

    def _update_details(self) -> None:
        """The Temporal UI's "current details" of this conversation."""
        status = "closed" if self._closing else ("running" if self._is_busy() else "idle")
        lines = [
            f"**{status}** · model `{self._model}` · turn {self._total_turns} · run {self._runs}",
            f"queued: {len(self._steering)} steering, {len(self._follow_up)} follow-up",
            f"usage: {self._usage.total_tokens} tokens, ${self._usage.cost.total:.4f}",
        ]
        if self._llm_handle is not None:
            lines.append("streaming the model's answer")
        if self._tool_handles:
            lines.append(f"running tools: {', '.join(self._tool_handles)}")
        workflow.set_current_details("\n\n".join(lines))


# --- helpers -------------------------------------------------------------------------


def _error_outcome(text: str) -> ToolOutcome:
    return ToolOutcome(content=text_result(text), details={}, is_error=True)


async def _ready(outcome: ToolOutcome) -> ToolOutcome:
    return outcome


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _is_empty(content: Any) -> bool:
    if isinstance(content, str):
        return not content.strip()
    return not content


def _failure_text(err: BaseException) -> str:
    """The innermost useful message of an activity failure."""
    messages = []
    current: BaseException | None = err
    while current is not None:
        if isinstance(current, FailureError) and current.message and not isinstance(current, ActivityError):
            messages.append(current.message)
        current = current.__cause__
    return messages[-1] if messages else str(err) or type(err).__name__


def _validation_text(prefix: str, err: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in err.errors()[:5]
    )
    return f"{prefix} ({problems})."


def _tool_summary(name: str, args: dict[str, Any]) -> str:
    """``tool: read_file path=src/x.py`` for the Temporal UI."""
    parts = []
    for key, value in args.items():
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        parts.append(f"{key}={text if len(text) <= 40 else text[:37] + '...'}")
    summary = f"tool: {name} {' '.join(parts)}".strip()
    return summary if len(summary) <= 200 else summary[:197] + "..."
