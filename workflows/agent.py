"""``AgentWorkflow``: one conversation (pi's ``Agent``) as a Temporal workflow.

The shell around pi's loop (``workflows/loop.py``): it supplies the loop's
callables (model and tool activities, the queues, the event stream), owns
the session between runs, continues as new when the history grows, and
answers the signals, updates and queries of the public contract (SPEC §7-9).
Everything here is deterministic: no I/O, wall clock or randomness
(timestamps come from ``workflow.now()``), and nothing is read from the
worker process: what the worker contributes (hooks, argument shims) is
bound in by ``workflows/bindings.py`` when the worker is built.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError

if TYPE_CHECKING:
    from datetime import datetime

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError
    from pydantic.alias_generators import to_camel

    from workflows.arguments import MAX_NESTING, nesting_depth
    from workflows.bindings import WorkflowBindings
    from workflows.calls import RECORDED_TOOLS_PATCH, SIGNAL_LIMIT, STREAM_AS_PI_PATCH, ActivityCalls
    from workflows.contract import (
        AgentSettings,
        ApprovalRequest,
        PendingApproval,
        PendingRun,
        PromptResult,
        SessionCarry,
        SessionInput,
        SessionResult,
        SessionSettings,
        SessionState,
        SettingsInForce,
        WaitForIdleResult,
        past_safe_integer,
        start_input_problem,
    )
    from workflows.inputs import (
        InputError,
        check_prompts,
        clean_json,
        json_type,
        no_arguments,
        prompt_message,
        prompt_messages,
        refusal,
        single_argument,
        validation_text,
    )
    from workflows.loop import (
        AgentContext,
        ApprovalDecision,
        HookAborted,
        LoopConfig,
        PreparedToolCall,
        run_agent_loop,
        run_loop,
    )
    from workflows.models import (
        AgentMessage,
        AssistantMessage,
        ToolApprovalRequestEvent,
        ToolCall,
        TurnEndEvent,
        WaitingCall,
        WireModel,
    )
    from workflows.queues import MessageQueue
    from workflows.session import ContinueRefused, Session
    from workflows.stream import SUBSCRIBER_GRACE, UNTRACKED_GRACE, EventStream
    from workflows.versions import Versions

MAX_MODEL_NAME_CHARS = 10_000
"""The longest model name ``configure`` takes (refused by its validator)."""
MAX_REASON_CHARS = 10_000
"""The longest approval reason ``approve_tool`` takes (refused by its validator)."""
# Stream items kept when continuing as new; older offsets read from the
# oldest item kept.
STREAM_ITEMS_CARRIED = 2000
IDLE_ITEMS_CARRIED = 200
# History length past which an idle conversation continues as new.
IDLE_SWITCH_EVENTS = 500
IDLE_SWITCH_PATCH = "idle-switch"
DROP_CARRIED_PUBLISHERS_PATCH = "drop-carried-publishers"
"""What aborted model calls' publishers send after continue-as-new is
dropped (only by a combined marker: it is asked in a signal handler)."""
# Continue as new at the next turn boundary once this many signals came in
# (every event batch an activity publishes is one; the limit is 10,000).
SIGNALS_BEFORE_SWITCH = SIGNAL_LIMIT // 2
# A message's own nesting plus the input and transcript around it.
START_INPUT_NESTING = MAX_NESTING + 8
LINGER_PATCH = "linger-for-subscribers"
SEARCH_ATTRIBUTES_PATCH = "search-attributes"
# During a run, the turn, token and cost attributes are refreshed at a turn
# boundary at most this often (workflow time); before the patch below, every
# SEARCH_ATTRIBUTE_TURNS turns.
SEARCH_ATTRIBUTE_INTERVAL = timedelta(seconds=10)
MIN_TIMER = timedelta(milliseconds=1)
SEARCH_ATTRIBUTES_BY_TIME_PATCH = "search-attributes-by-time"
SEARCH_ATTRIBUTE_TURNS = 10
SEARCH_ATTRIBUTE_KEYS: dict[str, Any] = {
    "AgentStatus": SearchAttributeKey.for_keyword("AgentStatus"),
    "AgentModel": SearchAttributeKey.for_keyword("AgentModel"),
    "AgentTurns": SearchAttributeKey.for_int("AgentTurns"),
    "AgentTotalTokens": SearchAttributeKey.for_int("AgentTotalTokens"),
    "AgentCost": SearchAttributeKey.for_float("AgentCost"),
}
ABORT_AT_BOUNDARY_PATCH = "no-switch-while-aborting"
# While a wait_for_idle caller waits, a run due to continue as new at a turn
# boundary goes on instead and switches once idle (SPEC: continue-as-new
# after all handlers finish), unless its history grows past these (well
# under Temporal's 51,200 events and 50 MB) or the signal limit nears.
HOLD_SWITCH_PATCH = "hold-switch-for-idle-waiters"
HOLD_SWITCH_MAX_EVENTS = 20_000
HOLD_SWITCH_MAX_BYTES = 20 * 1024 * 1024
# An abort or stop_after_turn that comes after a prompt is accepted but
# before its run begins (signal-with-start, or while the worker records its
# defaults) applies to that run; before this patch it was dropped.
SIGNALS_BEFORE_START_PATCH = "abort-before-run-start"
# A start input key the workflow does not know (a misspelt `sytemPrompt`),
# or a setting of the wrong JSON type (`"maxTurns": true`), fails the start
# with one sentence; before this patch the key was ignored, the value coerced.
STRICT_START_INPUT_PATCH = "strict-start-input"
# `continue` (or a message arriving while idle) after an application
# message runs the model as after a user message, as pi's continue() does;
# before this patch it was treated as an assistant message.
CONTINUE_AFTER_APP_PATCH = "continue-after-app-message"
# A conversation that completes through closeWhenIdle is `closed` (its
# AgentStatus upserted, the `state` query's status), as one ended by
# `close`; before this patch it stayed `idle`.
CLOSED_WHEN_IDLE_PATCH = "closed-when-idle"
# An abort during a turn's tools ends the run with its aborted message even
# when the turn would have stopped the run anyway (stop_after_turn, maxTurns,
# a budget); before this patch the run ended there as a normal turn.
ABORT_OVER_STOP_PATCH = "abort-over-stop"
# A tool batch of thousands of calls is prepared, started and given its
# results in parts of TOOL_CALLS_PER_PART, each part in a workflow task of
# its own (a 1 ms timer between them); before this patch all in one, which
# past ~10,000 calls outlasted the SDK's 2 s deadlock check on every attempt.
TOOL_BATCH_IN_PARTS_PATCH = "tool-batch-in-parts"
# A hook's await (before_tool_call, after_tool_call, should_stop_after_turn)
# ends at an abort: its task is cancelled and the call is aborted; before
# this patch the abort waited for the hook, forever for one that never ends.
ABORTABLE_HOOKS_PATCH = "abortable-hooks"
# A call waiting for approval follows ``configure`` of approvalTimeoutSeconds:
# its deadline is counted again from its request (at once if that has passed;
# never when the setting is cleared). Before this patch a wait kept the
# timeout in force when it began, so a timeout set while calls waited did not
# reach them.
APPROVAL_TIMEOUT_FOLLOWS_PATCH = "approval-timeout-follows-configure"
# A hook's ``RequireApproval(None)`` waits for a person. Before this patch the
# call ran without asking. Asked only when a hook returns one (by its own
# marker, not the combined one), so no other run records anything.
APPROVAL_WITHOUT_REASON_PATCH = "approval-without-reason"
# An ``after_tool_call`` override whose ``is_error`` or ``terminate`` is not a
# bool makes the call's result an error. Before this patch the value's truth
# was taken (``terminate="false"`` ended the run). Asked only for such a value
# (a run started by this version has it by its combined marker).
STRICT_OVERRIDE_FLAGS_PATCH = "strict-override-flags"
HOOKS_SEE_BATCH_START_PATCH = "hooks-see-batch-start"
CARRY_NOT_RETRIED_PATCH = "carry-not-retried"
ABORT_BEFORE_FOLLOW_UPS_PATCH = "abort-before-follow-ups"
# A reset, and a conversation's end, upsert the counters they changed at once.
# Before this patch they waited for the interval's next turn boundary, which
# neither has: after a reset AgentCost kept the old cost, and a close during a
# run left AgentTurns short of the turns that ended after it. Asked only when
# counters would otherwise be left behind.
COUNTERS_NOW_PATCH = "search-attribute-counters-now"
# The time of the last search-attribute upsert goes on across continue-as-new
# (the interval of the counters); before this patch each run counted it from
# its own first sync. Read by the combined marker only (no marker asked).
CARRIED_COUNTERS_TIME_PATCH = "carried-counters-time"
# Decisions that make a command wait for a durable timer instead of comparing
# workflow.now(): the counters' upsert (SEARCH_ATTRIBUTE_INTERVAL) and a
# waiting approval's deadline (a timer even when none is left). A worker
# taking a run over (a crash audit) read the previous workflow task's time
# while the task ran, where a replay of it reads the task's own: a counters
# upsert due in the replay only failed every later task (nondeterminism), and
# the conversation wedged. Read by the combined marker only (no marker asked).
CLOCK_FREE_COMMANDS_PATCH = "clock-free-commands"
# A run whose carry has no model-call time limit reads the worker's again
# (the session_defaults activity), as the conversation's first run did.
# Before this patch such a run took the workflow's 10 minutes for good: a
# conversation started before the limit was recorded, or one a worker of that
# release continued as new during a rollout (an upgrade audit). Asked only by
# such a run of this version (its own marker), so no other run records it.
MODEL_CALL_LIMIT_AGAIN_PATCH = "model-call-limit-again"
# A start input setting past 2**53 - 1 fails the start, as `configure` refuses
# it; before this patch it was taken (and `state` reported it back as given).
START_INPUT_SAFE_INTEGERS_PATCH = "start-input-safe-integers"
# A closeWhenIdle conversation left idle with queued messages (a run ended by
# an abort keeps them) completes once `clear_queues` empties the queues, as
# the README says; before this patch it stayed open until a `close` (a README
# audit). Asked only then (its own marker), so no other run records it.
CLEARED_QUEUES_COMPLETE_PATCH = "cleared-queues-complete"
# ... also once it continued as new while it waited (`continueAsNewAfterTurns`,
# the idle switch), or when `clear_queues` came as it switched: the next run
# knows a run had ended (carried). Before this patch that run stayed open (a
# review). Asked only when that carried end decides (its own marker).
CARRIED_RUN_END_PATCH = "carried-run-end"


DETAILS_ITEMS = 10
"""The running tools and the calls waiting for approval the UI's "current
details" name (the rest are counted): the text goes with every workflow
task, and a batch of thousands of calls with long ids would make it
megabytes, rebuilt at each call's start and end."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _quoted_id(call_id: str) -> str:
    """A tool call id as a refusal quotes it: an id of 200,000 characters
    came back whole (an audit)."""
    if len(call_id) <= 100:
        return repr(call_id)
    return f"{call_id[:99]!r}… ({len(call_id):,} characters)"


def _refusing(validator: Callable[..., None]) -> Callable[..., None]:
    """An update validator whose ``InputError`` refuses the update as the
    handlers' own failures do: type ``InvalidInput``, not retryable (else
    the SDK reports the exception's class, retryable)."""

    @functools.wraps(validator)
    def refuse(self: Any, *args: Any) -> None:
        try:
            validator(self, *args)
        except InputError as err:
            raise refusal(str(err)) from None

    return refuse


def _written_by_previous_run(info: workflow.Info) -> bool:
    """Whether the start input is the carry this conversation's previous run
    wrote when it continued as new: only a run can continue itself. A retry
    or a cron run also has a previous run, but is started with the client's
    input again."""
    return info.continued_run_id is not None and info.attempt == 1 and not info.cron_schedule


@workflow.defn(name="AgentWorkflow")
class AgentWorkflow:
    """One conversation. Hooks are bound by the worker (``build_worker(hooks=...)``)."""

    @workflow.init
    def __init__(self, *args: Any) -> None:
        self._bindings = WorkflowBindings()
        self._input_error: str | None = None
        self._counters_timer: asyncio.Task[None] | None = None  # CLOCK_FREE_COMMANDS_PATCH
        self._counters_due = False  # its interval has passed since the last upsert
        self._counters_clock_read = False  # this run's first search-attribute sync came
        self._strict_input_error: str | None = None  # refused only by runs with the patch
        self._huge_input_error: str | None = None  # likewise (START_INPUT_SAFE_INTEGERS_PATCH)
        self._retried_carry_error: str | None = None  # likewise (CARRY_NOT_RETRIED_PATCH)
        session_input = self._parse_start_input(args)
        carry = session_input.carry or SessionCarry()
        self._stream = EventStream(carry.stream, carry.closed_publishers)
        self._stream.track()
        self._stream.run_active = lambda: self._session.is_busy()
        settings = SessionSettings.model_validate(
            session_input.model_dump(include=set(SessionSettings.model_fields))
        )
        self._session = Session(settings, list(session_input.messages), carry, self._now_ms)
        self._versions = Versions()
        # Asks no marker: safe in a signal handler; False before `run` starts.
        self._stream.drop_carried = lambda: self._versions.marked(DROP_CARRIED_PUBLISHERS_PATCH)
        self._calls = ActivityCalls(self._session, self._stream, self._now_ms, self._versions)
        self._calls.on_change = self._update_details
        self._switching = False  # continuing as new: waiting handlers let go
        self._switch_begun = False  # _continue_as_new entered (it may wait before switching)
        self._calls_counted: tuple[AgentMessage, int] | None = None
        self._idle_waiters = 0  # wait_for_idle callers waiting for this run to end
        self._idle_switch_refused = False
        self._idle_again = False  # clear_queues emptied an idle closeWhenIdle conversation: it completes
        self._resumed_batch = carry.run is not None and carry.run.batch is not None
        if session_input.prompt is not None and self._input_error is None:
            try:
                self._session.pending = PendingRun(
                    prompts=prompt_messages(session_input.prompt, self._now_ms)
                )
            except InputError as err:
                self._input_error = str(err)

    def _parse_start_input(self, args: tuple[Any, ...]) -> SessionInput:
        """The start input, or an empty one with ``_input_error`` saying why
        not (the run then fails with that sentence)."""
        try:
            raw = single_argument(args, "AgentWorkflow", optional=True)
            if raw is None:
                raw = {}
            if not isinstance(raw, dict):
                raise InputError(
                    f'The start input must be a JSON object such as {{"prompt": "hi"}}, not {json_type(raw)}.'
                )
            info = workflow.info()
            if _written_by_previous_run(info):
                # Through the same models: the walks that guard a client's
                # input would cost ~15 ms on a long transcript at every switch
                # and every replay of it.
                return SessionInput.model_validate(raw)
            if nesting_depth(raw, START_INPUT_NESTING) > START_INPUT_NESTING:
                raise InputError(f"The start input is nested deeper than {START_INPUT_NESTING} levels.")
            session_input = SessionInput.model_validate(clean_json(raw))
            self._strict_input_error = start_input_problem(raw)
            self._huge_input_error = past_safe_integer(raw)
            if session_input.carry is not None and (info.continued_run_id is None or info.cron_schedule):
                raise InputError(
                    "`carry` is internal (it hands a conversation to its next run when it "
                    "continues as new): remove it from the start input."
                )
            if session_input.carry is not None:
                # A retry, started with the input of the run it retries: a
                # client's carry when that was the first run (a security
                # audit: another conversation's stored context sent to the
                # model, counters and budgets rewritten).
                self._retried_carry_error = (
                    f"`carry` is internal: a retried run (attempt {info.attempt}) cannot tell a carry "
                    "its conversation wrote from one a client sent, so it takes none: start "
                    "AgentWorkflow without a workflow retry policy."
                )
            return session_input
        except ValidationError as err:
            self._input_error = validation_text("The start input is invalid", err)
        except InputError as err:
            self._input_error = str(err)
        return SessionInput()

    def bind(self, bindings: WorkflowBindings) -> None:
        """Called by the worker's bindings interceptor before ``run``."""
        self._bindings = bindings

    # --- the session ----------------------------------------------------------------

    @workflow.run
    async def run(self, *args: Any) -> SessionResult:
        session = self._session
        self._versions.start()
        # A start input refused fails the conversation at once; a `state` query says `closed`.
        if self._input_error:
            raise self._refused_start(self._input_error)
        refused = (
            (self._strict_input_error if self._versions.has(STRICT_START_INPUT_PATCH) else None)
            or (self._huge_input_error if self._versions.has(START_INPUT_SAFE_INTEGERS_PATCH) else None)
            # Asked only of a retried run with a carry: no other run records it.
            or (
                self._retried_carry_error
                if self._retried_carry_error and self._versions.has(CARRY_NOT_RETRIED_PATCH)
                else None
            )
        )
        if refused:
            # None of the refused input was taken: `state` said `"maxTurns": 1`
            # of a refused `"maxTurns": true` (read leniently before the check),
            # and a refused carry's counters and transcript would show too.
            if self._retried_carry_error:
                session = self._session = Session(SessionSettings(), [], SessionCarry(), self._now_ms)
            session.settings = SessionSettings()
            raise self._refused_start(refused)
        await self._record_worker_defaults()
        recorded = session.track_subscribers
        if not (self._bindings.track_subscribers if recorded is None else recorded):
            self._stream.tracking = False  # the fallback: the linger is a plain timer
        self._update_details()
        if session.run is not None:
            await self._resume_run()
        while True:
            if self._completing_when_idle():
                await self._let_subscribers_catch_up()
                if session.is_idle_and_drained():
                    if self._versions.has(CLOSED_WHEN_IDLE_PATCH):
                        session.closing = True
                    break
                continue  # a message arrived meanwhile: it starts a run
            await workflow.wait_condition(
                lambda: (
                    session.pending is not None
                    or session.closing
                    or self._continue_as_new_due()
                    or self._idle_switch_wanted()
                    or self._idle_again
                )
            )
            if session.pending is not None:
                pending, session.pending = session.pending, None
                await self._start_run(pending)
            elif session.closing:
                await self._let_subscribers_catch_up()
                break
            elif self._idle_again:
                self._idle_again = False  # the top of the loop completes it
            elif self._continue_as_new_due() or self._versions.has(IDLE_SWITCH_PATCH):
                await self._continue_as_new(idle=True)
            else:
                self._idle_switch_refused = True  # a conversation from before idle switches
        self._update_details(counters_now=True)
        await self._calls.aborted_calls_ended()
        await self._calls.local_results_saved()
        # Release waiting stream subscribers (they drain the rest by query),
        # else their open polls would keep the conversation from completing.
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return SessionResult(messages=session.messages)

    def _completing_when_idle(self) -> bool:
        """A run has ended, nothing is queued and ``closeWhenIdle`` is set:
        the conversation completes (once its subscribers have read). A run
        that ended in an execution before this one counts from
        ``carried-run-end`` on, asked only when it decides."""
        session = self._session
        if not (session.settings.close_when_idle and session.is_idle_and_drained()):
            return False
        if session.run_ended:
            return True
        return session.run_ended_before and workflow.patched(CARRIED_RUN_END_PATCH)

    async def _record_worker_defaults(self) -> None:
        """Record the worker's tool declarations (and default model) in the
        history once per conversation; later runs carry them. Conversations
        started before declarations were recorded keep the worker's tools,
        as they did."""
        session, settings = self._session, self._session.settings
        if session.declared is None and self._versions.has(RECORDED_TOOLS_PATCH):
            defaults = await self._calls.session_defaults()
            session.declared = {tool.name: tool for tool in defaults.tools or []}
            session.search_attributes = defaults.search_attributes
            session.track_subscribers = defaults.track_subscribers
            session.model_call_timeout = defaults.model_call_timeout
            settings.model = settings.model or defaults.model
        elif (
            session.declared is not None
            and session.model_call_timeout is None
            and self._versions.current
            and workflow.patched(MODEL_CALL_LIMIT_AGAIN_PATCH)
        ):
            # Only the limit: the tools and the rest stay as the conversation recorded them.
            session.model_call_timeout = (await self._calls.session_defaults()).model_call_timeout
        elif session.declared is None:
            session.declared = dict(self._bindings.legacy_tools)
        self._refuse_unknown_tools()
        if settings.model is None:
            settings.model = (await self._calls.session_defaults()).model

    def _refuse_unknown_tools(self) -> None:
        unknown = self._session.unknown_tools(self._session.settings.tools)
        if unknown:
            declared = ", ".join(sorted(self._session.declared or {})) or "no tools"
            raise self._refused_start(
                f"Unknown tool(s) {', '.join(unknown)}: the worker declares {declared}. "
                "Load the module that defines them with `worker.py --tools pkg.module`."
            )

    def _refused_start(self, text: str) -> ApplicationError:
        """The failure that ends a conversation whose start input was
        refused; ``state`` then says ``closed`` and why (its ``errorMessage``
        was null, so a ``start`` that printed an id left no reason to find
        but in the failure: a new user's audit). Only the state changes,
        no command: a replay of such a failure answers with the reason too."""
        failure = refusal(text)
        self._session.closing = True
        self._session.error_message = failure.message
        return failure

    # --- runs -------------------------------------------------------------------------

    async def _start_run(self, pending: PendingRun) -> None:
        """pi's ``prompt()`` / ``continue()``: open a run and run the loop."""
        session = self._session
        aborted, stop = bool(pending.abort_requested), bool(pending.stop_requested)
        if (aborted or stop) and not self._versions.has(SIGNALS_BEFORE_START_PATCH):
            aborted = stop = False  # a run from before the patch dropped them: replay as recorded
        if pending.from_continue:
            try:
                pending = session.continue_plan(after_app_message=self._continues_after_app())
            except ContinueRefused as err:
                workflow.logger.warning("Not continuing: %s", err)
                return
        run = session.begin_run(aborted=aborted, stop_requested=stop)
        self._update_details()
        context = AgentContext(session.messages, session.enabled_tools(), run)
        await run_agent_loop(
            pending.prompts,
            context,
            self._loop_config(),
            queue=pending.queue,
            skip_initial_steering=pending.skip_initial_steering,
        )

    async def _resume_run(self) -> None:
        """Go on with a run that continued as new at a turn boundary."""
        session = self._session
        assert session.run is not None
        context = AgentContext(session.messages, session.enabled_tools(), session.run)
        pending = [] if session.abort_requested or session.run.batch else session.steering.poll()
        await run_loop(
            context,
            self._loop_config(),
            pending=pending,
            first_turn=False,
            has_more_tool_calls=session.run.has_more_tool_calls or session.run.batch is not None,
        )

    def _loop_config(self) -> LoopConfig:
        session, settings = self._session, self._session.settings
        return LoopConfig(
            emit=self._emit,
            now_ms=self._now_ms,
            stream_assistant_response=self._calls.stream_assistant_response,
            execute_tool=self._calls.execute_tool,
            get_steering_messages=session.steering.poll,
            get_follow_up_messages=session.follow_up.poll,
            is_aborted=lambda: session.abort_requested,
            model_name=lambda: settings.model or "",
            tool_execution=lambda: settings.tool_execution,
            should_stop_after_turn=lambda _turn: session.should_stop_after_turn(),
            hooks=self._bindings.hooks,
            prepare_arguments=self._prepare_arguments,
            request_approval=self._request_approval,
            at_turn_boundary=self._at_turn_boundary,
            total_turns=lambda: session.turns.total,
            failure_turn_end=lambda: self._versions.has(STREAM_AS_PI_PATCH),
            abort_over_stop=lambda: self._versions.has(ABORT_OVER_STOP_PATCH),
            approval_without_reason=lambda: workflow.patched(APPROVAL_WITHOUT_REASON_PATCH),
            strict_override_flags=lambda: self._versions.has(STRICT_OVERRIDE_FLAGS_PATCH),
            hooks_see_batch_start=lambda: self._versions.has(HOOKS_SEE_BATCH_START_PATCH),
            abort_before_follow_ups=lambda: self._versions.has(ABORT_BEFORE_FOLLOW_UPS_PATCH),
            until_aborted=self._until_aborted,
            pause_between_parts=self._pause_between_parts,
        )

    async def _until_aborted(self, hook: Awaitable[Any]) -> Any:
        """A hook's result, or ``HookAborted`` when the run is aborted while
        the hook waits (its task cancelled: its timers and activities with
        it). A hook that does not wait decides as before, an abort or not
        (an after_tool_call that redacts still redacts an aborted result)."""
        if not self._versions.has(ABORTABLE_HOOKS_PATCH):
            return await hook
        session = self._session
        task = asyncio.ensure_future(_outcome_of(hook))
        try:
            await asyncio.sleep(0)  # it runs to its first wait (no timer: a step of the workflow's loop)
            if not task.done():
                await workflow.wait_condition(lambda: task.done() or session.abort_requested)
        except asyncio.CancelledError:  # the workflow is cancelled: the hook with it, as when awaited
            task.cancel()
            raise
        if not task.done():
            task.cancel()
            raise HookAborted()
        result, failure = task.result()
        if failure is not None:
            raise failure  # in the caller's task, which makes it the call's error (``is_user_failure``)
        return result

    def _pause_between_parts(self) -> Awaitable[None] | None:
        """Ends this workflow task between parts of a long tool batch."""
        if not self._versions.has(TOOL_BATCH_IN_PARTS_PATCH):
            return None
        return workflow.sleep(timedelta(milliseconds=1), summary="next part of a long tool batch")

    def _prepare_arguments(self, call: ToolCall) -> dict[str, Any]:
        shim = self._bindings.argument_shims.get(call.name)
        if shim is None:
            return call.arguments
        prepared = shim(dict(call.arguments))
        if not isinstance(prepared, dict):
            raise TypeError(
                f"prepare_arguments of {call.name} returned {type(prepared).__name__}, not a dict"
            )
        return prepared

    async def _at_turn_boundary(self) -> None:
        self._update_details()
        if self._session.abort_requested and self._versions.has(ABORT_AT_BOUNDARY_PATCH):
            return  # the run ends at its next step; the flag would be lost in the switch
        if self._continue_as_new_due():
            await self._continue_as_new()

    async def _request_approval(self, prepared: PreparedToolCall) -> ApprovalDecision:
        """SPEC §9: publish the request, list it in ``state``, and wait
        durably for ``approve_tool`` (or the timeout, or an abort). While
        every open call of the batch waits like this, the conversation may
        continue as new: the next run resumes the batch and the wait."""
        session, call = self._session, prepared.call
        reason = prepared.approval or "This tool call needs approval"
        batch = session.run.batch if session.run is not None else None
        waiting = batch.waiting.get(call.id) if batch is not None else None
        timeout = session.settings.approval_timeout_seconds
        if waiting is not None and waiting.requested_ms is None:
            waiting.requested_ms = self._now_ms()
            if timeout:
                waiting.deadline_ms = waiting.requested_ms + int(timeout * 1000)
        if call.id not in session.approvals:  # announced once, also across continue-as-new
            self._emit(
                ToolApprovalRequestEvent(
                    tool_call_id=call.id, tool_name=call.name, args=prepared.args, reason=reason
                )
            )
            session.approvals[call.id] = PendingApproval(
                tool_call_id=call.id, tool_name=call.name, args=prepared.args, reason=reason
            )
            self._update_details()
        deadline = waiting.deadline_ms if waiting is not None else None
        follows = waiting is not None and self._versions.has(APPROVAL_TIMEOUT_FOLLOWS_PATCH)
        if follows:  # a wait resumed after continue-as-new, under the timeout now in force
            deadline = self._follow_approval_timeout(waiting)
        try:
            while True:
                left = None if deadline is None else max(0, deadline - self._now_ms()) / 1000
                if left is not None and self._clock_free():
                    # A timer even when no time is left: whether there is
                    # one must not hang on the clock (CLOCK_FREE_COMMANDS_PATCH).
                    left = max(left, MIN_TIMER.total_seconds())
                await workflow.wait_condition(
                    self._approval_wait_ends(call.id, follows, timeout),
                    timeout=None if left is None else timedelta(seconds=left),
                    timeout_summary=f"approval of {call.name}",
                )
                if call.id in session.decisions or session.abort_requested:
                    break
                if follows and session.settings.approval_timeout_seconds != timeout:
                    deadline = self._follow_approval_timeout(waiting)
                    timeout = session.settings.approval_timeout_seconds
                    continue
                if self._switching or self._switch_begun:
                    # Every waiting call woke for the switch at once; the first
                    # one carries the batch over (building the carry once per
                    # waiting call outlasted the deadlock check at ~600). It
                    # may still be waiting for the local tools' results to be
                    # saved: another entering then skipped that (a review).
                    await workflow.wait_condition(lambda: False)
                await self._continue_as_new()  # never returns
        except TimeoutError:
            # A decision taken as the deadline passed (a wait resumed after
            # continue-as-new with no time left times out before it looks)
            # comes too late: dropped, so that it cannot decide a later call
            # that reuses the id (servers that number calls ``call_0`` ...).
            session.decisions.pop(call.id, None)
            self._record_approval(call.name, "timeout", waiting)
            # A run from before the patch keeps the deadline it carried, also
            # when the setting was cleared since: say the timeout it waited.
            assert deadline is not None and waiting is not None and waiting.requested_ms is not None
            waited = timeout or (deadline - waiting.requested_ms) / 1000
            return ApprovalDecision(False, f"Tool call {call.name} was not approved within {waited:g} s.")
        finally:
            if not self._switching:
                session.approvals.pop(call.id, None)
                self._update_details()
        decision = session.decisions.pop(call.id, None)
        if decision is None:
            self._record_approval(call.name, "aborted", waiting)
            return ApprovalDecision(False, "Tool execution aborted while waiting for approval.")
        if decision.approved:
            self._record_approval(call.name, "approved", waiting)
            return ApprovalDecision(True)
        self._record_approval(call.name, "rejected", waiting)
        reason = (decision.reason or "").strip()  # a blank reason is none
        because = f": {reason}" if reason else "."
        return ApprovalDecision(False, f"Tool call {call.name} was rejected{because}")

    def _approval_wait_ends(self, call_id: str, follows: bool, timeout: float | None) -> Callable[[], bool]:
        """When a call's wait for approval ends: decided, aborted, a switch
        due, or (``follows``) approvalTimeoutSeconds other than ``timeout``,
        the one the wait was set with."""
        session = self._session
        return lambda: (
            call_id in session.decisions
            or session.abort_requested
            or self._switch_while_waiting()
            or (follows and session.settings.approval_timeout_seconds != timeout)
        )

    def _follow_approval_timeout(self, waiting: WaitingCall | None) -> int | None:
        """The waiting call's deadline under the approvalTimeoutSeconds now in
        force, counted from its request (kept in ``waiting``: the carry and
        the next run's wait see it)."""
        assert waiting is not None and waiting.requested_ms is not None
        timeout = self._session.settings.approval_timeout_seconds
        waiting.deadline_ms = waiting.requested_ms + int(timeout * 1000) if timeout else None
        return waiting.deadline_ms

    def _record_approval(self, tool: str, outcome: str, waiting: WaitingCall | None) -> None:
        """Metrics (replay-safe: the SDK emits nothing while replaying)."""
        meter = workflow.metric_meter().with_additional_attributes({"tool": tool, "outcome": outcome})
        meter.create_counter("agent_approvals", "Tool calls decided by a person (or not)").add(1)
        if waiting is not None and waiting.requested_ms is not None:
            waited = timedelta(milliseconds=self._now_ms() - waiting.requested_ms)
            meter.create_histogram_timedelta(
                "agent_approval_wait", "Time a call waited for a decision"
            ).record(waited)

    def _switch_while_waiting(self) -> bool:
        """Continue as new now, in the middle of a tool batch? Only when it is
        due and every open call of the batch waits for a person (no tool
        activity runs: they could not be handed over)."""
        session = self._session
        batch = session.run.batch if session.run is not None else None
        if batch is None or self._calls.running_tools() or self._switching:
            return False
        message = session.messages[batch.message_index]
        if self._versions.marked(TOOL_BATCH_IN_PARTS_PATCH):  # runs started since, by their marker
            # Asked by every waiting call's condition, each time conditions
            # are checked: going through the calls made that grow with the
            # square (2 s, the SDK's deadlock check, at ~1,200 waiting
            # calls). A call is waiting, then neither (running), then has
            # an outcome, never two at once; so the batch is settled when
            # the two counts add up to its calls.
            settled = len(batch.outcomes) + len(batch.waiting) >= self._calls_in(message)
        else:  # a run started before: its conditions as they were recorded
            calls = message.tool_calls if isinstance(message, AssistantMessage) else []
            settled = all(c.id in batch.outcomes or c.id in batch.waiting for c in calls)
        return settled and self._continue_as_new_due(in_batch=not self._resumed_batch)

    def _calls_in(self, message: AgentMessage) -> int:
        """How many distinct tool calls ``message`` has (kept for the last one asked)."""
        if self._calls_counted is None or self._calls_counted[0] is not message:
            calls = message.tool_calls if isinstance(message, AssistantMessage) else []
            self._calls_counted = (message, len({c.id for c in calls}))
        return self._calls_counted[1]

    # --- events -------------------------------------------------------------------------

    def _emit(self, event: WireModel) -> None:
        self._session.observe(event)
        self._stream.publish(event)
        if getattr(event, "type", None) == "agent_end":
            self._update_details()
        elif isinstance(event, TurnEndEvent) and event.model_turn:
            workflow.metric_meter().create_counter("agent_turns", "Model turns (calls) of runs").add(
                1, {"model": self._session.settings.model or ""}
            )

    def _now_ms(self) -> int:
        return int(workflow.now().timestamp() * 1000)

    # --- continue-as-new ------------------------------------------------------------------

    def _continue_as_new_due(self, *, in_batch: bool = False) -> bool:
        """Due when the server suggests it, after ``continueAsNewAfterTurns``
        turns of this run (``in_batch``: counting the turn whose batch waits),
        or past half the signal limit."""
        every = self._session.settings.continue_as_new_after_turns
        turns = self._session.turns.this_execution + (1 if in_batch else 0)
        due = (
            workflow.info().is_continue_as_new_suggested()
            or (every is not None and turns >= every)
            or self._stream.signals >= SIGNALS_BEFORE_SWITCH
        )
        if due and self._idle_waiters and not self._must_switch() and self._versions.has(HOLD_SWITCH_PATCH):
            return False  # once idle: the wait_for_idle callers get their answer first
        return due

    def _must_switch(self) -> bool:
        """The history is too long (or the signal limit too near) to wait
        for the run's end before continuing as new."""
        info = workflow.info()
        return (
            info.get_current_history_length() >= HOLD_SWITCH_MAX_EVENTS
            or info.get_current_history_size() >= HOLD_SWITCH_MAX_BYTES
            or self._stream.signals >= SIGNALS_BEFORE_SWITCH
        )

    def _idle_switch_wanted(self) -> bool:
        """An idle conversation with a long history continues as new at
        once: when it next gets a prompt on a worker that no longer has it
        cached, only the short new history is replayed (replay costs about
        a third of a millisecond per event)."""
        return (
            not self._idle_switch_refused
            and workflow.info().get_current_history_length() >= IDLE_SWITCH_EVENTS
        )

    async def _continue_as_new(self, *, idle: bool = False) -> None:
        """Hand the whole session to a new run (at a turn boundary or idle),
        once every aborted model call has ended and every signal and update
        handler has finished. Idle with every event read, only the last
        events are carried; idle right after a run a live subscriber has not
        read to its end (a long tool batch, then the idle switch at once),
        as many as at a turn boundary, so it reads on without a gap. Only
        the next run's input differs, not a command: no patch."""
        self._switch_begun = True
        # Not switching yet while an aborted call ends (up to a heartbeat):
        # a wait_for_idle caller told to ask again then would ask in a loop.
        await self._calls.aborted_calls_ended()
        await self._calls.local_results_saved()
        self._switching = True  # wait_for_idle callers are told to ask again
        stream, session = self._stream, self._session
        stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        caught_up = idle and stream.tracking and stream.all_read()
        carry = session.carry(
            stream.state_for_carry(IDLE_ITEMS_CARRIED if caught_up else STREAM_ITEMS_CARRIED),
            closed_publishers=stream.closed_publishers(),
        )
        next_input = SessionInput.model_validate(
            {**session.settings.model_dump(), "messages": session.messages, "carry": carry}
        )
        workflow.continue_as_new(next_input)

    async def _let_subscribers_catch_up(self) -> None:
        """Before completing, give a live subscriber (one that polled this
        run) up to SUBSCRIBER_GRACE to read the last events by its next poll.
        Without this, a subscriber that was between polls finds the workflow
        completed and reads the tail by query, which replays the whole
        history on a worker. Returns early once a poll has read to the end,
        or when a message or ``close`` arrives."""
        stream, session = self._stream, self._session
        if stream.tracking and stream.all_read():
            return
        if not self._versions.has(LINGER_PATCH):
            return  # a conversation that completed before this existed
        closing = session.closing
        try:
            await workflow.wait_condition(
                lambda: (
                    (stream.tracking and stream.all_read())
                    or session.closing != closing
                    or (not closing and not session.is_idle_and_drained())
                ),
                timeout=SUBSCRIBER_GRACE if stream.tracking else UNTRACKED_GRACE,
                timeout_summary="let subscribers read the last events",
            )
        except TimeoutError:
            pass

    # --- updates ------------------------------------------------------------------------

    @workflow.update(name="prompt")
    async def prompt(self, *args: Any) -> PromptResult:
        """Start a run with a prompt: text, a user message, or a list of them."""
        try:
            prompts = prompt_messages(single_argument(args, "prompt"), self._now_ms)
        except InputError as err:
            raise refusal(str(err)) from None
        self._session.pending = PendingRun(prompts=prompts)
        self._update_details()
        return PromptResult(run=self._session.runs + 1, event_offset=self._stream.offset())

    @prompt.validator
    @_refusing
    def _validate_prompt(self, *args: Any) -> None:
        self._session.check_accepts_run()
        # Images, blank text parts and an empty role are checked here only:
        # the validator does not run on replay, so a prompt accepted before
        # these checks replays as it ran (a steer or follow-up signal, which
        # has no validator, takes them as before).
        check_prompts(prompt_messages(single_argument(args, "prompt"), self._now_ms))

    @workflow.update(name="continue")
    async def continue_(self, *args: Any) -> PromptResult:
        """Start a run from the transcript and queues (pi's ``continue()``)."""
        try:
            self._session.pending = self._session.continue_plan(after_app_message=self._continues_after_app())
        except InputError as err:
            raise refusal(str(err)) from None
        self._update_details()
        return PromptResult(run=self._session.runs + 1, event_offset=self._stream.offset())

    @continue_.validator
    @_refusing
    def _validate_continue(self, *args: Any) -> None:
        no_arguments(args, "continue")
        self._session.check_accepts_run()
        self._session.check_continue()

    @workflow.update(name="configure")
    async def configure(self, *args: Any) -> SettingsInForce:
        """Change settings (model, system prompt, thinking level, tools, queue
        modes, limits); they apply from the next model call or queue poll
        (approvalTimeoutSeconds to the calls already waiting too)."""
        session = self._session
        # Tool names are checked against the worker's declarations, recorded
        # when the conversation starts: a configure right after the start waits for them.
        if session.declared is None:
            await workflow.wait_condition(lambda: session.declared is not None)
        try:
            patch, fields = self._parse_configure(args)
        except InputError as err:
            raise refusal(str(err)) from None
        settings = self._session.configure(patch, fields)
        self._update_details()
        return settings

    @configure.validator
    @_refusing
    def _validate_configure(self, *args: Any) -> None:
        self._parse_configure(args, strict=True)

    def _parse_configure(
        self, args: tuple[Any, ...], *, strict: bool = False
    ) -> tuple[AgentSettings, set[str]]:
        """The settings patch and the fields it sets. ``strict`` (the
        validator: a new update) also refuses values lax validation would
        coerce (``"maxTurns": true``); the handler stays lenient, so an update
        accepted before that check replays as it ran."""
        payload = single_argument(args, "configure")
        if not isinstance(payload, dict):
            # An empty object is a partial settings object too (SPEC §8): it
            # changes nothing and answers with the settings in force.
            raise InputError(
                'configure takes an object of the settings to change, e.g. {"model": "gpt-4o"}, '
                f"not {json_type(payload)}."
            )
        known = {name: name for name in AgentSettings.model_fields} | {
            field.alias: name for name, field in AgentSettings.model_fields.items() if field.alias
        }
        unknown = [key for key in payload if key not in known]
        if unknown:
            raise InputError(
                f"Unknown setting(s) {', '.join(map(str, unknown))}: configure takes "
                f"{', '.join(sorted(f.alias or n for n, f in AgentSettings.model_fields.items()))}."
            )
        if strict:
            # Both spellings of one setting: one would be dropped unseen
            # (the camelCase one wins). Refused by the validator only, so a
            # configure accepted before this check replays as it ran.
            twice = [
                (field.alias, name)
                for name, field in AgentSettings.model_fields.items()
                if field.alias and field.alias != name and field.alias in payload and name in payload
            ]
            if twice:
                alias, name = twice[0]
                raise InputError(f"`{alias}` is given twice, also as `{name}`: give it once.")
            # JSON has no Infinity or NaN, yet Python's and others' encoders
            # write them: an infinite maxCost was taken as no limit, and NaN
            # was refused as "not greater than 0".
            unbounded = [
                (key, value)
                for key, value in payload.items()
                if isinstance(value, float) and not math.isfinite(value)
            ]
            if unbounded:
                key, value = unbounded[0]
                raise InputError(
                    f"`{key}` must be a finite number, not {json.dumps(value)} (null sets no limit)."
                )
            huge = past_safe_integer(payload)
            if huge:
                raise InputError(huge)
            model = payload.get("model")
            if isinstance(model, str) and len(model) > MAX_MODEL_NAME_CHARS:
                # Sent with every model call, reported by `state` and every
                # `configure`: one of 300,000 characters was taken.
                raise InputError(
                    f"The model name is {len(model):,} characters long: a model's id is at most "
                    f"{MAX_MODEL_NAME_CHARS:,}."
                )
        try:
            patch = AgentSettings.model_validate(clean_json(payload))
            if strict:
                AgentSettings.model_validate_json(json.dumps(clean_json(payload)), strict=True)
        except ValidationError as err:
            raise InputError(validation_text("The settings are invalid", err)) from None
        fields = {known[key] for key in payload}
        if "tools" in fields and self._session.declared is not None:
            unknown_tools = self._session.unknown_tools(patch.tools)
            if unknown_tools:
                declared = ", ".join(sorted(self._session.declared or {})) or "none"
                raise InputError(
                    f"Unknown tool(s) {', '.join(unknown_tools)}: this conversation's worker "
                    f"declared {declared}."
                )
        if "model" in fields and not (patch.model or "").strip():
            raise InputError("The model name is empty: name a model, e.g. gpt-4o-mini.")
        return patch, fields

    @workflow.update(name="clear_queues")
    async def clear_queues(self, *args: Any) -> list[AgentMessage]:
        """Remove the queued steering and/or follow-up messages (``steering``,
        ``followUp`` or ``all``); returns them, oldest first."""
        which = single_argument(args, "clear_queues", optional=True) or "all"
        removed = self._session.clear_queues(which)
        self._update_details()
        if (
            removed
            and self._completing_when_idle()
            and not self._session.closing
            and workflow.patched(CLEARED_QUEUES_COMPLETE_PATCH)
        ):
            self._idle_again = True
        return removed

    @clear_queues.validator
    @_refusing
    def _validate_clear_queues(self, *args: Any) -> None:
        # No argument (or null) clears both; anything else must be one of the
        # three names (an empty string or false is refused, not read as "all").
        which = single_argument(args, "clear_queues", optional=True)
        if which is not None and (not isinstance(which, str) or which not in ("steering", "followUp", "all")):
            raise InputError(f'clear_queues takes "steering", "followUp" or "all", not {which!r}.')

    @workflow.update(name="reset")
    async def reset(self, *args: Any) -> SessionState:
        """pi's ``reset()``: clear transcript, queues, usage, error and counters."""
        self._session.reset()
        self._update_details(counters_now=True)
        return self.state()

    @reset.validator
    @_refusing
    def _validate_reset(self, *args: Any) -> None:
        no_arguments(args, "reset")
        if self._session.closing:
            raise InputError("The conversation is closed: start a new one.")
        if self._session.is_busy():
            raise InputError("A run is active: abort it (or wait for it to end) before reset.")

    @workflow.update(name="wait_for_idle", unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON)
    async def wait_for_idle(self, *args: Any) -> WaitForIdleResult:
        """pi's ``waitForIdle()``: returns when no run is active. A run due to
        continue as new meanwhile waits for its end (``HOLD_SWITCH_PATCH``),
        unless its history is too long to: then the caller is told to ask
        again."""
        session = self._session
        self._idle_waiters += 1
        try:
            await workflow.wait_condition(lambda: not session.is_busy() or self._switching)
        finally:
            self._idle_waiters -= 1
        if session.is_busy():
            raise ApplicationError(
                "The conversation is continuing as new: call wait_for_idle again.",
                type="ContinuedAsNew",
            )
        return session.idle_result()

    @wait_for_idle.validator
    @_refusing
    def _validate_wait_for_idle(self, *args: Any) -> None:
        no_arguments(args, "wait_for_idle")

    @workflow.update(name="approve_tool")
    async def approve_tool(self, *args: Any) -> ApprovalRequest:
        """Decide a tool call that waits for approval (SPEC §9)."""
        try:
            decision = self._parse_approval(args)
        except InputError as err:
            raise refusal(str(err)) from None
        self._session.decisions[decision.tool_call_id] = decision
        return decision

    @approve_tool.validator
    @_refusing
    def _validate_approve_tool(self, *args: Any) -> None:
        # Stricter than the handler (a validator does not run on replay, so a
        # decision accepted before stays accepted): this is a safety gate, and
        # "approved": "yes" or a misspelt key must not be read as a decision.
        payload = args[0] if len(args) == 1 else None
        if len(args) == 1 and not isinstance(payload, dict):
            raise InputError(
                'approve_tool takes an object, {"toolCallId": "...", "approved": true or false}, '
                f"not {json_type(payload)}."
            )
        if isinstance(payload, dict):
            reason = payload.get("reason")
            if isinstance(reason, str) and len(reason) > MAX_REASON_CHARS:
                # A reason of a megabyte was applied, and its echo, the
                # update's result, went to the payload store: a client
                # without the storage settings got an error back, and a
                # second try was refused as decided (a contract check).
                raise InputError(
                    f"The reason is {len(reason):,} characters long: give one of at most "
                    f"{MAX_REASON_CHARS:,} (the model reads it in the call's result)."
                )
            known = {name for field in ApprovalRequest.model_fields for name in (field, to_camel(field))}
            unknown = sorted(str(key) for key in payload if key not in known)
            if unknown:
                raise InputError(
                    f"Unknown approve_tool key(s) {', '.join(unknown)}: "
                    "it takes toolCallId, approved and reason."
                )
            for field in ApprovalRequest.model_fields:
                if field in payload and to_camel(field) in payload and field != to_camel(field):
                    # Which call to decide must not hang on which spelling wins.
                    raise InputError(f"`{to_camel(field)}` is given twice, also as `{field}`: give it once.")
            if not isinstance(payload.get("approved"), bool):
                raise InputError('approve_tool takes "approved": true or false (a JSON boolean).')
        self._refuse_a_late_decision(self._parse_approval(args).tool_call_id)

    def _refuse_a_late_decision(self, call_id: str) -> None:
        """A decision that would come after the call's wait ended, in the
        activation that ends it (the worker was away): past its timeout
        (the timer fired before the decision was sent, yet the handler ran
        first and the tool ran: a durability audit), or after an abort (it
        was accepted and had no effect). The validator only: it does not
        run on replay, so a decision accepted before stays accepted."""
        session = self._session
        batch = session.run.batch if session.run is not None else None
        waiting = batch.waiting.get(call_id) if batch is not None else None
        if waiting is not None and waiting.deadline_ms is not None and self._now_ms() >= waiting.deadline_ms:
            raise InputError(
                f"Tool call {_quoted_id(call_id)} is past its approval timeout: it is not approved, "
                "whatever is decided now."
            )
        if session.abort_requested:
            raise InputError(f"The run is being aborted: tool call {_quoted_id(call_id)} will not run.")

    def _parse_approval(self, args: tuple[Any, ...]) -> ApprovalRequest:
        # Cleaned as every other argument is: a reason with a lone surrogate
        # was accepted, then the handler's result could not be written and
        # every workflow task failed until the server dropped the update,
        # the decision lost (a robustness audit).
        payload = clean_json(single_argument(args, "approve_tool"))
        try:
            decision = ApprovalRequest.model_validate(payload)
        except ValidationError as err:
            raise InputError(
                validation_text('approve_tool takes {"toolCallId": "...", "approved": true|false}', err)
            ) from None
        session = self._session
        if decision.tool_call_id not in session.approvals or decision.tool_call_id in session.decisions:
            raise InputError(f"No tool call {_quoted_id(decision.tool_call_id)} is waiting for approval.")
        return decision

    # --- signals --------------------------------------------------------------------------

    @workflow.signal(name="steer")
    def steer(self, *args: Any) -> None:
        """Queue a message injected before the next LLM call."""
        self._enqueue(self._session.steering, args, "steer")

    @workflow.signal(name="follow_up")
    def follow_up(self, *args: Any) -> None:
        """Queue a message handled when the agent would otherwise stop."""
        self._enqueue(self._session.follow_up, args, "follow_up")

    def _continues_after_app(self) -> bool:
        """Whether ``continue`` after an application message answers it (pi)
        rather than treating it as an assistant message (before the patch)."""
        return not self._session.last_is_app_message() or self._versions.has(CONTINUE_AFTER_APP_PATCH)

    def _enqueue(self, queue: MessageQueue, args: tuple[Any, ...], signal: str) -> None:
        if self._session.closing:
            workflow.logger.warning("Dropped `%s`: the conversation is closed.", signal)
            return
        try:
            message = prompt_message(single_argument(args, signal), self._now_ms)
        except InputError as err:
            workflow.logger.warning("Dropped an invalid `%s` signal: %s", signal, err)
            return
        self._session.enqueue(queue, message)
        self._update_details()

    @workflow.signal(name="abort")
    def abort(self, *args: Any) -> None:
        """Abort the active run (cancels the LLM call, running tools and
        approval waits), or an accepted one not begun yet (it begins
        aborted: the prompt is kept, the model is not called); does
        nothing while idle."""
        if self._session.request_abort():
            self._calls.cancel_all()

    @workflow.signal(name="stop_after_turn")
    def stop_after_turn(self, *args: Any) -> None:
        """End the active run at the next turn boundary (ignored while idle)."""
        self._session.request_stop_after_turn()

    @workflow.signal(name="close")
    def close(self, *args: Any) -> None:
        """End the conversation (an active run is aborted first)."""
        self._session.closing = True
        self.abort()

    # --- queries ---------------------------------------------------------------------------

    @workflow.query(name="state")
    def state(self, *args: Any) -> SessionState:
        # Asked before the first task recorded the worker's declarations (a
        # query right after the start): the tools are those this worker
        # declares, and the model its default, which is what it records, not
        # none. A query writes no history, so reading the worker's here
        # changes no replay.
        state = self._session.state(
            self._stream.offset(), self._streaming_message(), self._bindings.legacy_tools
        )
        if state.model is None and not self._session.closing:
            state.model = self._bindings.default_model
        return state

    @workflow.query(name="messages")
    def messages(self, *args: Any) -> list[AgentMessage]:
        return self._session.messages

    def _streaming_message(self) -> AssistantMessage | None:
        if not self._calls.streaming:
            return None
        return self._stream.streamed_message(tool_arguments=True)

    def _update_details(self, *, counters_now: bool = False) -> None:
        """The Temporal UI's "current details" of this conversation, and its
        search attributes (each upserted when its value changed;
        ``counters_now``: the counters too, without waiting for the interval)."""
        session = self._session
        self._sync_search_attributes(counters_now=counters_now)
        lines = [
            f"**{session.status()}** · model `{session.settings.model}` · turn {session.turns.total} "
            f"· run {session.runs}",
            f"queued: {len(session.steering)} steering, {len(session.follow_up)} follow-up",
            f"usage: {session.usage.total_tokens} tokens, ${session.usage.cost.total:.4f}",
        ]
        if self._calls.streaming:
            lines.append("streaming the model's answer")
        running = self._calls.running_tools()
        if running:
            shown = ", ".join(_cut(name, 80) for name in running[:DETAILS_ITEMS])
            more = f" and {len(running) - DETAILS_ITEMS} more" if len(running) > DETAILS_ITEMS else ""
            lines.append(f"running tools: {shown}{more}")
        for approval in itertools.islice(session.approvals.values(), DETAILS_ITEMS):
            lines.append(
                f"waiting for approval of `{_cut(approval.tool_name, 80)}` "
                f"(call {_cut(approval.tool_call_id, 80)}): {_cut(approval.reason, 300)}. "
                "Decide with update approve_tool."
            )
        if len(session.approvals) > DETAILS_ITEMS:
            lines.append(
                f"and {len(session.approvals) - DETAILS_ITEMS} more calls waiting for approval "
                "(the `state` query's pendingApprovals lists them all)"
            )
        workflow.set_current_details("\n\n".join(lines))

    def _sync_search_attributes(self, *, counters_now: bool = False) -> None:
        """Upsert the search attributes when the status or the model changes
        (with the counters as they are then), and the counters alone at most
        every SEARCH_ATTRIBUTE_INTERVAL of a long run: each upsert is a
        command, a billable action and a visibility write, so a fast agent's
        turns do not each pay for one, and a slow one's counters are never
        more than that interval (and a turn) behind."""
        session = self._session
        if not session.search_attributes:
            return  # the server lacks them (recorded when the conversation started)
        if (
            not session.closing
            and self._completing_when_idle()
            and self._versions.has(CLOSED_WHEN_IDLE_PATCH)
        ):
            return  # its close upserts `closed` with the counters: one upsert, not `idle` then `closed`
        values = session.search_attribute_values()
        published = session.published
        changed = {name: value for name, value in values.items() if published.get(name) != value}
        if not changed:
            return
        now = workflow.now()
        if "AgentStatus" not in changed and "AgentModel" not in changed and self._clock_free():
            if not self._counters_due and not (counters_now and self._versions.has(COUNTERS_NOW_PATCH)):
                self._start_counters_timer(now)
                return
        elif not self._counters_clock_read:
            # Carried, the interval goes on across continue-as-new: counted
            # again from each run's start, a run continued as new every few
            # seconds never published its counters (an audit). A run from
            # before (its marker says) counts from its first sync as it did,
            # even if a newer worker carried it the time. Asks no marker: this
            # runs in signal handlers too (and before `run`: not marked yet).
            self._counters_clock_read = True
            if not self._versions.marked(CARRIED_COUNTERS_TIME_PATCH):
                session.published_at = None
        if session.published_at is None:
            session.published_at = now  # the conversation's first run, or a run from before
        if "AgentStatus" not in changed and "AgentModel" not in changed and not self._clock_free():
            if self._versions.has(SEARCH_ATTRIBUTES_BY_TIME_PATCH):
                due = now - session.published_at >= SEARCH_ATTRIBUTE_INTERVAL
            else:
                due = values["AgentTurns"] - int(published.get("AgentTurns", 0)) >= SEARCH_ATTRIBUTE_TURNS
            if not due and not (counters_now and self._versions.has(COUNTERS_NOW_PATCH)):
                return
        if not self._versions.has(SEARCH_ATTRIBUTES_PATCH):
            return
        workflow.upsert_search_attributes(
            [SEARCH_ATTRIBUTE_KEYS[name].value_set(v) for name, v in changed.items()]
        )
        session.published.update(changed)
        session.published_at = now
        self._counters_due = False
        if self._counters_timer is not None:
            self._counters_timer.cancel()  # everything is published: nothing to wait for
            self._counters_timer = None

    def _clock_free(self) -> bool:
        return self._versions.marked(CLOCK_FREE_COMMANDS_PATCH)

    def _start_counters_timer(self, now: datetime) -> None:
        """A timer after which the changed counters may be upserted,
        SEARCH_ATTRIBUTE_INTERVAL after the last upsert (carried across
        continue-as-new, so a run continued as new every few seconds still
        publishes them). Whether there is one depends on state alone; its
        length on the clock, which no replay checks."""
        if self._counters_timer is not None:
            return
        published_at = self._session.published_at
        left = SEARCH_ATTRIBUTE_INTERVAL - (now - published_at) if published_at else SEARCH_ATTRIBUTE_INTERVAL
        self._counters_timer = asyncio.create_task(self._counters_after(max(left, MIN_TIMER)))

    async def _counters_after(self, left: timedelta) -> None:
        """The interval has passed: the counters go with the next sync (a
        tool's or the model call's start or end, a turn's end, a status
        change), not now. A workflow task of the timer's alone makes no
        command: one that did (the upsert) was ordered after an update the
        same task took in by the worker that ran it, and before it by a
        replay, when that worker had taken the task over from a killed one
        (temporalio 1.35.0; a crash audit: nondeterminism, a wedge)."""
        await workflow.sleep(left, summary="the counters' search attributes")
        self._counters_timer = None
        self._counters_due = True


async def _outcome_of(hook: Awaitable[Any]) -> tuple[Any, BaseException | None]:
    """A hook's result, or what it raised, as a value: raised out of a task
    of its own, a ``SystemExit`` or ``KeyboardInterrupt`` would leave the
    workflow's event loop, and the activation would never complete."""
    try:
        return await hook, None
    except BaseException as err:  # re-raised by the caller
        return None, err


__all__ = ["AgentWorkflow"]
