"""pi's agent loop (``runLoop`` of pi-agent-core 0.73.1, ``agent-loop.ts``)
as plain functions over an explicit context and config.

Reads top to bottom like pi: ``run_agent_loop`` (a run started by prompts),
``run_loop`` (the double loop), ``stream_assistant_response`` (one model
answer), then tool execution in named steps: ``prepare_tool_call``,
``execute_prepared_tool_call``, ``finalize_executed_tool_call``.

Nothing here knows Temporal: the model call, the tool call, the queues,
the clock and the event sink are callables in ``LoopConfig``. The workflow
supplies activities and its stream; tests supply in-memory fakes.
Deterministic as long as those callables are.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from workflows.arguments import ToolArgumentsError, clean_text, require_sendable, validate_tool_arguments
from workflows.hooks import (
    AgentHooks,
    BlockToolCall,
    RequireApproval,
    ToolCallContext,
    ToolResultOverride,
    TurnContext,
    failure_text,
    is_user_failure,
)
from workflows.models import (
    AgentEndEvent,
    AgentMessage,
    AgentStartEvent,
    AssistantMessage,
    MessageEndEvent,
    MessageStartEvent,
    QueueName,
    RunState,
    TextContent,
    ToolBatch,
    ToolCall,
    ToolDeclaration,
    ToolExecutionEndEvent,
    ToolExecutionStartEvent,
    ToolOutcome,
    ToolResultMessage,
    TurnEndEvent,
    TurnStartEvent,
    UserContent,
    WaitingCall,
    WireModel,
    text_result,
)

ToolExecutionMode = Literal["parallel", "sequential"]

ABORTED_TEXT = "Tool execution aborted"
REQUEST_ABORTED = "Request was aborted"


@dataclass
class ModelAnswer:
    """One assistant message from the model, as the model callable returns it."""

    message: AssistantMessage
    streamed: bool = False
    """Its ``message_start`` was already published (the model streamed)."""
    argument_errors: dict[str, str] = field(default_factory=dict)
    """Tool call id -> why its arguments are not valid JSON."""


@dataclass
class AgentContext:
    """What the loop works on. ``messages`` is the conversation's transcript
    (the loop appends to it); ``tools`` the tools this conversation may call
    (the shell may swap them between turns); ``run`` where the run is,
    including the tool batch in progress (``run.batch``), which the shell
    may carry across continue-as-new while calls wait for approval."""

    messages: list[AgentMessage]
    tools: Mapping[str, ToolDeclaration]
    run: RunState
    argument_errors: dict[str, str] = field(default_factory=dict)


@dataclass
class PreparedToolCall:
    """A call that passed preparation and may run."""

    call: ToolCall
    tool: ToolDeclaration
    args: dict[str, Any]
    approval: str | None = None
    """Why a person must approve the call first (None: no approval needed)."""


@dataclass
class ApprovalDecision:
    approved: bool
    text: str = ""
    """Why not, as the error result says it (rejection, timeout, abort)."""


@dataclass
class LoopConfig:
    """The loop's dependencies, explicit (pi's ``AgentLoopConfig``)."""

    emit: Callable[[WireModel], None]
    now_ms: Callable[[], int]
    stream_assistant_response: Callable[[AgentContext], Awaitable[ModelAnswer]]
    """Call the model once. Must not raise: a failure is an assistant message
    with ``stopReason`` ``error`` (or ``aborted``)."""
    execute_tool: Callable[[PreparedToolCall], Awaitable[ToolOutcome]]
    """Run one prepared call. Must not raise: a failure is an error outcome,
    and a call that has not started when the run is aborted gets
    ``error_outcome(ABORTED_TEXT)``."""
    get_steering_messages: Callable[[], list[AgentMessage]]
    get_follow_up_messages: Callable[[], list[AgentMessage]]
    is_aborted: Callable[[], bool]
    model_name: Callable[[], str]
    tool_execution: Callable[[], ToolExecutionMode] = lambda: "parallel"
    should_stop_after_turn: Callable[[TurnContext], bool | Awaitable[bool]] = lambda _: False
    """The shell's own reasons to stop (stop_after_turn, budgets); the
    hooks' ``should_stop_after_turn`` is asked after it."""
    hooks: AgentHooks = field(default_factory=AgentHooks)
    prepare_arguments: Callable[[ToolCall], dict[str, Any]] = lambda call: call.arguments
    """A tool's compatibility shim over raw arguments, before validation."""
    request_approval: Callable[[PreparedToolCall], Awaitable[ApprovalDecision]] | None = None
    """Wait for a person's decision on a call (the call is listed in
    ``context.run.batch.waiting`` meanwhile)."""
    at_turn_boundary: Callable[[], Awaitable[None]] | None = None
    """Awaited after each turn that goes on (the shell may continue as new here)."""
    total_turns: Callable[[], int] = lambda: 0
    failure_turn_end: Callable[[], bool] = lambda: True
    """A run ended by a failing hook emits its failure message's ``turn_end``
    (pi's ``handleRunFailure``); False replays a run recorded before it did."""
    abort_over_stop: Callable[[], bool] = lambda: True
    """An abort during a turn's tools ends the run with its aborted message
    even when the turn would stop the run anyway (``stop_after_turn``,
    ``maxTurns``, a budget, the hook); False replays a run recorded before,
    which ended there as a normal turn."""
    approval_without_reason: Callable[[], bool] = lambda: True
    """A hook's ``RequireApproval`` without a reason waits for a person (with
    the default reason); False replays a run recorded before, whose call ran
    without asking."""
    hooks_see_batch_start: Callable[[], bool] = lambda: True
    """A tool-call hook of a sequential batch sees the transcript up to the
    batch's assistant message, as pi's context holds it until the batch
    ends; False replays a run recorded before, whose hooks also saw the
    results of the batch's earlier calls. Asked only when there are some."""
    abort_before_follow_ups: Callable[[], bool] = lambda: True
    """An abort taken when the agent would stop (at a turn boundary, as the
    run switched to continue-as-new) ends the run with its aborted message,
    the follow-up queue kept (SPEC 6); False replays a run recorded before,
    which gave a follow-up to the aborted turn. Asked only when aborted."""
    strict_override_flags: Callable[[], bool] = lambda: True
    """A ``ToolResultOverride`` whose ``is_error`` or ``terminate`` is not a
    bool (or None) makes the call's result an error naming it; False
    replays a run recorded before, which took the value's truth
    (``terminate="false"`` ended the run). Asked only for such a value."""
    until_aborted: Callable[[Awaitable[Any]], Awaitable[Any]] | None = None
    """Awaits what a hook returned that must be awaited, or raises
    ``HookAborted`` when the run is aborted first (the hook's task is
    cancelled): a hook that waits forever cannot hold an abort. None awaits
    it to its end (a run recorded before an abort could end such a wait)."""
    pause_between_parts: Callable[[], Awaitable[None] | None] = lambda: None
    """Awaited (when not None) after every ``TOOL_CALLS_PER_PART`` calls a
    batch prepares, starts or adds results for: a host whose unit of work
    has a time limit (a workflow task's 2 s deadlock check) ends it there,
    so a batch of thousands of calls is worked on in parts."""


TOOL_CALLS_PER_PART = 500


class HookAborted(Exception):
    """The run was aborted while a hook was awaited (``LoopConfig.until_aborted``)."""


# --- a run ------------------------------------------------------------------------


async def run_agent_loop(
    prompts: list[AgentMessage],
    context: AgentContext,
    config: LoopConfig,
    *,
    queue: QueueName | None = None,
    skip_initial_steering: bool = False,
) -> None:
    """pi's ``runAgentLoop`` (and ``runAgentLoopContinue`` when ``prompts``
    is empty): open the run, add the prompts, run the loop. ``queue`` says
    the prompts were drained from a queue (``continue()``)."""
    config.emit(AgentStartEvent())
    config.emit(TurnStartEvent())
    for prompt in prompts:
        _add_message(context, config, prompt, queue=queue)
    # A run that begins aborted (the abort came before it did) leaves the
    # steering queue as an abort mid-run does (SPEC 6: queued messages stay).
    pending = [] if skip_initial_steering or config.is_aborted() else config.get_steering_messages()
    await run_loop(context, config, pending=pending, pending_queue="steering")


async def run_loop(
    context: AgentContext,
    config: LoopConfig,
    *,
    pending: list[AgentMessage],
    pending_queue: QueueName = "steering",
    first_turn: bool = True,
    has_more_tool_calls: bool = True,
) -> None:
    """pi's ``runLoop``. The inner loop runs turns while the model calls
    tools or steering messages wait; the outer loop picks up follow-ups
    when the agent would otherwise stop. ``first_turn=False`` resumes a run
    at a turn boundary (after continue-as-new), or in the tool batch
    ``context.run.batch`` if there is one."""
    run = context.run
    while True:
        while has_more_tool_calls or pending:
            if run.batch is not None:
                # Resume the tool batch a continue-as-new interrupted.
                message = context.messages[run.batch.message_index]
                assert isinstance(message, AssistantMessage)
            else:
                if first_turn:
                    first_turn = False
                else:
                    config.emit(TurnStartEvent())
                for message in pending:
                    _add_message(context, config, message, queue=pending_queue)
                pending = []

                message = await stream_assistant_response(context, config)
                run.turns += 1
                if message.stop_reason in ("error", "aborted"):
                    config.emit(TurnEndEvent(message=message, tool_results=[]))
                    _end_run(context, config)
                    return

            tool_results: list[ToolResultMessage] = []
            has_more_tool_calls = False
            if message.tool_calls:
                results, terminate = await execute_tool_calls(context, config, message)
                tool_results = results
                has_more_tool_calls = not terminate
            config.emit(TurnEndEvent(message=message, tool_results=tool_results))

            if config.is_aborted() and config.abort_over_stop():
                # SPEC 6: the run ends with an aborted message (the next turn
                # makes it without calling the model), whatever else would stop it.
                stop, has_more_tool_calls = False, True
            else:
                try:
                    stop = await _should_stop_after_turn(context, config, message, tool_results)
                except HookAborted:
                    stop, has_more_tool_calls = False, True  # the next turn makes the aborted message
                except BaseException as err:
                    if not is_user_failure(err):
                        raise
                    # A hook's failure ends the run, never the conversation.
                    _fail_run(context, config, f"should_stop_after_turn failed: {failure_text(err)}")
                    return
            if stop:
                _end_run(context, config)
                return
            run.has_more_tool_calls = has_more_tool_calls
            if config.at_turn_boundary is not None:
                await config.at_turn_boundary()
            pending = [] if config.is_aborted() else config.get_steering_messages()
            pending_queue = "steering"

        if config.is_aborted() and config.abort_before_follow_ups():
            # SPEC 6: the follow-ups stay queued; the next turn makes the
            # aborted message without calling the model.
            pending, has_more_tool_calls = [], True
            continue
        pending = config.get_follow_up_messages()
        pending_queue = "followUp"
        if not pending:
            break
        has_more_tool_calls = True
    _end_run(context, config)


async def _should_stop_after_turn(
    context: AgentContext,
    config: LoopConfig,
    message: AssistantMessage,
    tool_results: list[ToolResultMessage],
) -> bool:
    turn = TurnContext(message, tool_results, context.run.turns, config.total_turns())
    if await _hook_result(config, config.should_stop_after_turn(turn)):
        return True
    decision = await _hook_result(config, config.hooks.should_stop_after_turn(turn))
    if not isinstance(decision, bool):
        raise TypeError(f"it returned {type(decision).__name__}, not a bool")
    return decision


def _end_run(context: AgentContext, config: LoopConfig) -> None:
    config.emit(AgentEndEvent(messages=context.messages[context.run.started_at_message :]))


def _fail_run(context: AgentContext, config: LoopConfig, text: str) -> None:
    """pi's ``handleRunFailure``: the run ends with an error message, its
    ``turn_end`` (where a client reads the error, as pi's state does) and
    ``agent_end``. No model was called: it counts as no turn."""
    message = _assistant_message(config, "error", text)
    _add_message(context, config, message)
    if config.failure_turn_end():
        config.emit(TurnEndEvent(message=message, tool_results=[], model_turn=False))
    _end_run(context, config)


# --- one assistant message ----------------------------------------------------------


async def stream_assistant_response(context: AgentContext, config: LoopConfig) -> AssistantMessage:
    """Get the next assistant message and add it to the transcript. After an
    abort the run ends with an aborted message made without calling the
    model again (pi bug #8658 calls it)."""
    if config.is_aborted():
        message = _assistant_message(config, "aborted", REQUEST_ABORTED)
        _add_message(context, config, message)
        return message
    answer = await config.stream_assistant_response(context)
    context.argument_errors = answer.argument_errors
    _add_message(context, config, answer.message, announce=not answer.streamed)
    return answer.message


# --- tool calls -----------------------------------------------------------------------


async def execute_tool_calls(
    context: AgentContext, config: LoopConfig, message: AssistantMessage
) -> tuple[list[ToolResultMessage], bool]:
    """pi's ``executeToolCalls``: the batch's result messages (source order)
    and whether the loop should stop after it (every result said so). The
    batch's progress is kept in ``context.run.batch`` until it ends."""
    calls = message.tool_calls
    if message.stop_reason == "length":
        return await _refuse_truncated_calls(context, config, calls), False
    run = context.run
    resumed = run.batch is not None
    if run.batch is None:
        sequential = config.tool_execution() == "sequential" or any(
            tool.execution_mode == "sequential"
            for tool in (context.tools.get(c.name) for c in calls)
            if tool is not None
        )
        run.batch = ToolBatch(message_index=_index_of(context.messages, message), sequential=sequential)
    batch = run.batch
    outcomes: list[ToolOutcome] = []
    results: list[ToolResultMessage] = []
    if batch.sequential:
        for index, call in enumerate(calls):
            await _pause_every_part(config, index)
            settled = batch.outcomes.get(call.id)
            if settled is not None:  # before a continue-as-new: its result is in the transcript
                outcomes.append(settled)
                results.append(_result_in_transcript(context, batch, call.id))
                continue
            prepared = _waiting_call(context, call, batch) or await prepare_tool_call(
                context, config, message, call
            )
            outcome = (
                prepared
                if isinstance(prepared, ToolOutcome)
                else await execute_prepared_tool_call(context, config, message, prepared)
            )
            outcomes.append(outcome)
            results.append(_add_tool_result(context, config, call, outcome))
    else:
        preparations: list[PreparedToolCall | ToolOutcome] = []
        for index, call in enumerate(calls):
            await _pause_every_part(config, index)
            if resumed and call.id in batch.outcomes:
                preparations.append(batch.outcomes[call.id])
            else:
                waiting = _waiting_call(context, call, batch)
                preparations.append(waiting or await prepare_tool_call(context, config, message, call))
        outcomes = await _execute_in_parts(context, config, message, preparations)
        # Ends arrived in completion order; results land in source order.
        results = await _add_tool_results(context, config, calls, outcomes)
    run.batch = None
    return results, bool(outcomes) and all(o.terminate for o in outcomes)


def _hook_messages(context: AgentContext, config: LoopConfig) -> list[AgentMessage]:
    """The transcript a tool-call hook is handed (a copy: a hook that
    appends to it or clears it must not change the transcript): up to the
    batch's assistant message, as pi's context holds it until the batch
    ends, without the results of a sequential batch's earlier calls."""
    batch = context.run.batch
    if (
        batch is not None
        and len(context.messages) > batch.message_index + 1
        and config.hooks_see_batch_start()
    ):
        return context.messages[: batch.message_index + 1]
    return list(context.messages)


def _index_of(messages: list[AgentMessage], message: AgentMessage) -> int:
    """Where ``message`` is in the transcript (the last message, normally)."""
    return next(i for i in range(len(messages) - 1, -1, -1) if messages[i] is message)


def _waiting_call(context: AgentContext, call: ToolCall, batch: ToolBatch) -> PreparedToolCall | None:
    """A call that was waiting for approval when the run continued as new."""
    waiting = batch.waiting.get(call.id)
    if waiting is None:
        return None
    tool = context.tools.get(call.name) or ToolDeclaration(name=call.name)
    return PreparedToolCall(call, tool, waiting.args, waiting.reason)


def _result_in_transcript(context: AgentContext, batch: ToolBatch, call_id: str) -> ToolResultMessage:
    for message in context.messages[batch.message_index + 1 :]:
        if isinstance(message, ToolResultMessage) and message.tool_call_id == call_id:
            return message
    raise LookupError(f"no result for settled tool call {call_id}")


async def prepare_tool_call(
    context: AgentContext, config: LoopConfig, message: AssistantMessage, call: ToolCall
) -> PreparedToolCall | ToolOutcome:
    """Emit the call's start and decide whether it may run: a ``ToolOutcome``
    is an immediate (error) result, whose end is emitted at once."""
    config.emit(ToolExecutionStartEvent(tool_call_id=call.id, tool_name=call.name, args=call.arguments))
    outcome = await _prepare(context, config, message, call)
    if isinstance(outcome, ToolOutcome):
        _settle(context, call, outcome)
        _emit_tool_end(config, call, outcome)
    return outcome


async def _prepare(
    context: AgentContext, config: LoopConfig, message: AssistantMessage, call: ToolCall
) -> PreparedToolCall | ToolOutcome:
    if config.is_aborted():
        # SPEC 6: every unfinished call, whatever else is wrong with it (an
        # unknown tool, arguments that are not JSON).
        return error_outcome(ABORTED_TEXT)
    tool = context.tools.get(call.name)
    if tool is None:
        return error_outcome(f"Tool {call.name} not found")
    parse_error = context.argument_errors.get(call.id)
    if parse_error is not None:
        return error_outcome(f"The arguments of tool {call.name} are not valid JSON: {parse_error}")
    try:
        args = validate_tool_arguments(tool, config.prepare_arguments(call))
        # A shim may add what the schema leaves open: a value no payload can
        # carry would fail every workflow task that sends the call on.
        require_sendable(args, f"prepare_arguments of {call.name} returned arguments")
        decision = await _hook_result(
            config,
            # A copy of the list: a hook that appends to it or clears it
            # must not change the transcript (a hooks audit saw both).
            config.hooks.before_tool_call(
                ToolCallContext(message, call, args, _hook_messages(context, config))
            ),
        )
    except ToolArgumentsError as err:
        return error_outcome(str(err))
    except HookAborted:
        return error_outcome(ABORTED_TEXT)
    except BaseException as err:
        if not is_user_failure(err):
            raise
        return error_outcome(failure_text(err))  # a shim's or hook's failure is the call's error result
    if isinstance(decision, BlockToolCall | RequireApproval) and not isinstance(decision.reason, str | None):
        # Not a failure to raise later, where it would fail every workflow task.
        return error_outcome(
            f"before_tool_call returned {type(decision).__name__} with a reason of type "
            f"{type(decision.reason).__name__}; the reason must be text."
        )
    if isinstance(decision, BlockToolCall):
        return error_outcome(decision.reason or "Tool execution was blocked")
    if decision is not None and not isinstance(decision, RequireApproval):
        return error_outcome(
            f"before_tool_call returned {type(decision).__name__}; expected BlockToolCall, "
            "RequireApproval or None."
        )
    reason = decision.reason if isinstance(decision, RequireApproval) else None
    approval = None if reason is None else clean_text(reason)  # shown in events: UTF-8 only
    if isinstance(decision, RequireApproval) and approval is None and not tool.requires_approval:
        if config.approval_without_reason():
            approval = RequireApproval.reason  # asked for approval: never run without it
    if approval is None and tool.requires_approval:
        approval = f"{tool.label or tool.name} needs approval"
    return PreparedToolCall(call, tool, args, approval)


async def execute_prepared_tool_call(
    context: AgentContext, config: LoopConfig, message: AssistantMessage, prepared: PreparedToolCall
) -> ToolOutcome:
    """Wait for approval if needed, run the call, apply ``after_tool_call``
    and emit its end."""
    outcome: ToolOutcome | None = None
    call, batch = prepared.call, context.run.batch
    if prepared.approval is not None:
        if config.request_approval is None:
            outcome = error_outcome("This tool call needs approval, and this agent cannot ask for it.")
        else:
            if batch is not None and call.id not in batch.waiting:
                batch.waiting[call.id] = WaitingCall(args=prepared.args, reason=prepared.approval)
            decision = await config.request_approval(prepared)
            if batch is not None:
                batch.waiting.pop(call.id, None)
            if not decision.approved:
                outcome = error_outcome(decision.text)
    if outcome is None:
        outcome = await config.execute_tool(prepared)
    outcome = await finalize_executed_tool_call(context, config, message, prepared, outcome)
    _settle(context, call, outcome)
    _emit_tool_end(config, call, outcome)
    return outcome


def _settle(context: AgentContext, call: ToolCall, outcome: ToolOutcome) -> None:
    """Record a finalized call in the batch in progress."""
    if context.run.batch is not None:
        context.run.batch.outcomes[call.id] = outcome


async def finalize_executed_tool_call(
    context: AgentContext,
    config: LoopConfig,
    message: AssistantMessage,
    prepared: PreparedToolCall,
    outcome: ToolOutcome,
) -> ToolOutcome:
    """pi's ``finalizeExecutedToolCall``: ``after_tool_call`` may replace
    fields of the result; if it raises, the result becomes an error."""
    call_context = ToolCallContext(message, prepared.call, prepared.args, _hook_messages(context, config))
    try:
        # Copies, as for before_tool_call: a change goes through ToolResultOverride.
        seen = outcome.model_copy(deep=True)
        override = await _hook_result(config, config.hooks.after_tool_call(call_context, seen))
        if override is None:
            return outcome
        if not isinstance(override, ToolResultOverride):
            raise TypeError(
                f"after_tool_call returned {type(override).__name__}; expected ToolResultOverride or None."
            )
        if override.details is not None:
            require_sendable(override.details, "after_tool_call returned details")
        for field in ("is_error", "terminate"):
            flag = getattr(override, field)
            if flag is not None and not isinstance(flag, bool) and config.strict_override_flags():
                # The value itself only when short and plain: an object's repr
                # holds its address (another text on replay), a long one megabytes.
                shown = repr(flag) if isinstance(flag, (str, int, float)) and len(repr(flag)) <= 40 else None
                raise TypeError(
                    f"after_tool_call returned ToolResultOverride({field}="
                    f"{shown or 'a ' + type(flag).__name__}); expected True, False or None."
                )
        return ToolOutcome(
            content=outcome.content if override.content is None else _as_content(override.content),
            details=outcome.details if override.details is None else override.details,
            is_error=outcome.is_error if override.is_error is None else bool(override.is_error),
            terminate=outcome.terminate if override.terminate is None else bool(override.terminate),
        )
    except HookAborted:
        # Unfinished: the hook that may change the result (redact it) did not decide.
        return error_outcome(ABORTED_TEXT)
    except BaseException as err:
        if not is_user_failure(err):
            raise
        return error_outcome(failure_text(err))  # a hook's failure becomes the call's error result


async def _pause_every_part(config: LoopConfig, index: int) -> None:
    """The host's pause before call ``index`` of a batch, once a part is done."""
    if index and index % TOOL_CALLS_PER_PART == 0:
        pause = config.pause_between_parts()
        if pause is not None:
            await pause


async def _execute_in_parts(
    context: AgentContext,
    config: LoopConfig,
    message: AssistantMessage,
    preparations: list[PreparedToolCall | ToolOutcome],
) -> list[ToolOutcome]:
    """Run the batch's prepared calls concurrently (pi's parallel mode),
    started in source order with the host's pause after each part: starting
    a call (its approval request, its activity) is work too."""
    tasks: list[asyncio.Future[ToolOutcome]] = []
    try:
        for index, prepared in enumerate(preparations):
            await _pause_every_part(config, index)
            tasks.append(
                asyncio.ensure_future(
                    _ready(prepared)
                    if isinstance(prepared, ToolOutcome)
                    else execute_prepared_tool_call(context, config, message, prepared)
                )
            )
    except BaseException:  # cancelled during a pause: the started calls go too, as gather's would
        for task in tasks:
            task.cancel()
        raise
    return list(await asyncio.gather(*tasks))


async def _add_tool_results(
    context: AgentContext, config: LoopConfig, calls: list[ToolCall], outcomes: list[ToolOutcome]
) -> list[ToolResultMessage]:
    results = []
    for index, (call, outcome) in enumerate(zip(calls, outcomes, strict=True)):
        await _pause_every_part(config, index)
        results.append(_add_tool_result(context, config, call, outcome))
    return results


async def _refuse_truncated_calls(
    context: AgentContext, config: LoopConfig, calls: list[ToolCall]
) -> list[ToolResultMessage]:
    """Tool calls of a message cut off by the token limit may be
    incomplete: none runs; the model is told to issue them again."""
    outcomes = []
    for index, call in enumerate(calls):
        await _pause_every_part(config, index)
        config.emit(ToolExecutionStartEvent(tool_call_id=call.id, tool_name=call.name, args=call.arguments))
        outcome = error_outcome(
            f"Tool call {call.name} was not executed: the response hit the output "
            "token limit, so its arguments may be incomplete. Issue the call again, "
            "with shorter arguments if needed."
        )
        _emit_tool_end(config, call, outcome)
        outcomes.append(outcome)
    return await _add_tool_results(context, config, calls, outcomes)


def _add_tool_result(
    context: AgentContext, config: LoopConfig, call: ToolCall, outcome: ToolOutcome
) -> ToolResultMessage:
    message = ToolResultMessage(
        tool_call_id=call.id,
        tool_name=call.name,
        content=outcome.content,
        details=outcome.details,
        is_error=outcome.is_error,
        timestamp=config.now_ms(),
    )
    _add_message(context, config, message)
    return message


def _emit_tool_end(config: LoopConfig, call: ToolCall, outcome: ToolOutcome) -> None:
    # pi's event carries the tool's whole result: ``details`` as its result
    # message has it (absent when the tool gave none), ``terminate`` when set.
    result: dict[str, Any] = {"content": outcome.content}
    if outcome.details is not None:
        result["details"] = outcome.details
    if outcome.terminate:
        result["terminate"] = True
    config.emit(
        ToolExecutionEndEvent(
            tool_call_id=call.id, tool_name=call.name, result=result, is_error=outcome.is_error
        )
    )


# --- helpers ---------------------------------------------------------------------------


def _add_message(
    context: AgentContext,
    config: LoopConfig,
    message: AgentMessage,
    *,
    announce: bool = True,
    queue: QueueName | None = None,
) -> None:
    """Append to the transcript; ``announce`` emits ``message_start`` too
    (a streamed assistant message's start was published while it streamed)."""
    if announce:
        config.emit(MessageStartEvent(message=message, queue=queue))
    config.emit(MessageEndEvent(message=message))
    context.messages.append(message)


def _assistant_message(config: LoopConfig, stop_reason: str, error: str) -> AssistantMessage:
    return AssistantMessage.model_validate(
        {
            "model": config.model_name(),
            "stopReason": stop_reason,
            "errorMessage": error,
            "timestamp": config.now_ms(),
        }
    )


def error_outcome(text: str) -> ToolOutcome:
    """pi's ``createErrorToolResult`` (text a hook gave, such as a block
    reason, cleaned of lone surrogates, which no payload can carry)."""
    return ToolOutcome(content=text_result(clean_text(text)), details={}, is_error=True)


def _as_content(content: str | list[UserContent]) -> list[UserContent]:
    """An override's content, validated, its text cleaned of lone surrogates."""
    if isinstance(content, str):
        return [TextContent(text=clean_text(content))]
    blocks = ToolOutcome(content=content).content  # validates each block
    return [
        b.model_copy(update={"text": clean_text(b.text)}) if isinstance(b, TextContent) else b for b in blocks
    ]


async def _ready(outcome: ToolOutcome) -> ToolOutcome:
    return outcome


async def _hook_result(config: LoopConfig, value: Any) -> Any:
    """What a hook returned, awaited when it must be (``until_aborted``)."""
    if not inspect.isawaitable(value):
        return value
    if config.until_aborted is None:
        return await value
    return await config.until_aborted(value)
