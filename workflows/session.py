"""The conversation's state between and during runs (pi's ``Agent`` state),
and what each message from outside does to it.

Pure: no Temporal import. The workflow shell owns one ``Session``, feeds it
every event the loop emits (``observe``, as pi's Agent processes its own
events), and asks it what to do with each signal and update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from workflows.contract import (
    AgentSettings,
    ApprovalRequest,
    PendingApproval,
    PendingRun,
    SessionCarry,
    SessionSettings,
    SessionState,
    SettingsInForce,
    Status,
    WaitForIdleResult,
)
from workflows.inputs import MAX_SAFE_INTEGER, InputError
from workflows.models import (
    AgentMessage,
    AssistantMessage,
    RunState,
    StopReason,
    ToolDeclaration,
    Usage,
)
from workflows.queues import MessageQueue

QueueSelector = str  # "steering" | "followUp" | "all"


# The most a search attribute holds of what a model reports: an Int attribute is
# an int64 read through JSON (float64) and the cost a Double; a value past these
# would fail the upsert, and with it every workflow task of the conversation
# (MAX_SAFE_INTEGER, from workflows.inputs, for the Int ones).
MAX_COST = 1e15
# A Keyword attribute holds at most 2 KB of JSON: a longer model name made the
# server refuse the upsert and terminate the conversation. Names are cut to
# this many characters (each at most 12 bytes of JSON, as an escaped pair).
MAX_KEYWORD_CHARS = 150


class ContinueRefused(InputError):
    pass


@dataclass
class TurnCounters:
    total: int = 0
    this_execution: int = 0


class Session:
    """Transcript, queues, settings, counters and the run in progress."""

    def __init__(
        self,
        settings: SessionSettings,
        messages: list[AgentMessage],
        carry: SessionCarry,
        now_ms: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.messages = messages
        self.now_ms = now_ms
        self.steering = MessageQueue(settings.steering_mode, carry.steering, carry.steering_arrivals)
        self.follow_up = MessageQueue(settings.follow_up_mode, carry.follow_up, carry.follow_up_arrivals)
        self.arrivals = carry.arrivals
        self.turns = TurnCounters(total=carry.total_turns)
        self.usage = carry.usage
        self.runs = carry.runs
        self.run: RunState | None = carry.run
        self.pending: PendingRun | None = carry.pending
        self.abort_requested = carry.abort_requested
        self.closing = carry.closing
        self.error_message = carry.error_message
        self.last_stop_reason: StopReason | None = carry.last_stop_reason
        self.last_run_start = carry.last_run_start
        self.declared: dict[str, ToolDeclaration] | None = (
            {t.name: t for t in carry.tools} if carry.tools is not None else None
        )
        self.context_ref = carry.context_ref
        self.context_length = carry.context_length
        self.continued_runs = carry.continued_runs
        self.run_ended = False  # a run ended and no other started since
        # ... in a run before this one (carried): a closeWhenIdle conversation
        # an abort left idle with messages queued may continue as new while it
        # waits, and its next run did not complete once ``clear_queues``
        # dropped them (a review). It counts only behind a patch (a worker of
        # the release before runs it as False: an upgrade audit).
        self.run_ended_before = carry.run_ended
        # Calls started and not ended; a batch resumed after continue-as-new
        # has only calls waiting for approval open (they count as pending).
        batch = carry.run.batch if carry.run is not None else None
        self.running_tools: list[str] = list(batch.waiting) if batch is not None else []
        self.approvals: dict[str, PendingApproval] = {a.tool_call_id: a for a in carry.approvals}
        self.decisions: dict[str, ApprovalRequest] = {d.tool_call_id: d for d in carry.decisions}
        self.search_attributes = carry.search_attributes
        # Whether the stream's subscribers are tracked, as the conversation
        # recorded when it started (SessionDefaults.track_subscribers).
        self.track_subscribers: bool | None = carry.track_subscribers
        self.model_call_timeout: float | None = carry.model_call_timeout
        self.published: dict[str, Any] = dict(carry.published)
        self.published_at: datetime | None = carry.published_at

    # --- status -------------------------------------------------------------------

    def is_busy(self) -> bool:
        return self.run is not None or self.pending is not None

    def is_idle_and_drained(self) -> bool:
        return not self.is_busy() and not self.steering and not self.follow_up

    def status(self) -> Status:
        if self.closing:
            return "closed"
        if self.approvals:
            return "awaiting-approval"
        return "running" if self.is_busy() else "idle"

    def enabled_tools(
        self, declared_before: Mapping[str, ToolDeclaration] | None = None
    ) -> dict[str, ToolDeclaration]:
        """The tools the model may call now (the settings' names, or all
        declared). ``declared_before``: what to take for the declarations
        while they are not recorded yet (a query at the start)."""
        declared = self.declared if self.declared is not None else (declared_before or {})
        names = self.settings.tools if self.settings.tools is not None else sorted(declared)
        return {n: declared[n] for n in names if n in declared}

    def unknown_tools(self, names: list[str] | None) -> list[str]:
        declared = self.declared or {}
        return [n for n in names or [] if n not in declared]

    # --- runs ---------------------------------------------------------------------

    def begin_run(self, *, aborted: bool = False, stop_requested: bool = False) -> RunState:
        """Open a run (``aborted``/``stop_requested``: those signals came
        while it was accepted but not begun)."""
        self.runs += 1
        self.run_ended = self.run_ended_before = False
        self.abort_requested = aborted
        self.error_message = None
        self.last_run_start = len(self.messages)
        self.run = RunState(started_at_message=len(self.messages), stop_requested=stop_requested)
        return self.run

    def observe(self, event: Any) -> None:
        """Keep the state in step with an event the loop emits (pi's
        ``Agent.processEvents``)."""
        kind = getattr(event, "type", None)
        if kind == "message_end":
            message = event.message
            if isinstance(message, AssistantMessage):
                self.usage = self.usage.plus(message.usage)
                if message.stop_reason in ("error", "aborted"):
                    self.error_message = message.error_message
        elif kind == "turn_end" and event.model_turn:
            self.turns.total += 1
            self.turns.this_execution += 1
        elif kind == "tool_execution_start":
            self.running_tools.append(event.tool_call_id)
        elif kind == "tool_execution_end":
            if event.tool_call_id in self.running_tools:
                self.running_tools.remove(event.tool_call_id)
        elif kind == "agent_end":
            self._end_run()

    def _end_run(self) -> None:
        last = next(
            (m for m in reversed(self.messages[self.last_run_start :]) if isinstance(m, AssistantMessage)),
            None,
        )
        self.last_stop_reason = last.stop_reason if last is not None else None
        self.run = None
        self.run_ended = True
        self.abort_requested = False
        self.running_tools = []

    def should_stop_after_turn(self) -> bool:
        """The session's own reasons to end a run after a turn."""
        run, settings = self.run, self.settings
        if run is None:
            return False
        return (
            run.stop_requested
            or (settings.max_turns is not None and run.turns >= settings.max_turns)
            or (
                settings.max_total_tokens is not None and self.usage.total_tokens >= settings.max_total_tokens
            )
            or (settings.max_cost is not None and self.usage.cost.total >= settings.max_cost)
        )

    def last_is_app_message(self) -> bool:
        """The transcript ends with an application message (any other role)."""
        return bool(self.messages) and self.messages[-1].role not in ("user", "toolResult", "assistant")

    def continue_plan(self, *, after_app_message: bool = True) -> PendingRun:
        """pi's ``continue()``: what a run started without a prompt runs.
        Only an assistant message last needs a queued message; after any
        other (an application message too, unless ``after_app_message`` is
        off: conversations from before that change) the model answers."""
        last = self.messages[-1] if self.messages else None
        if last is not None and (
            last.role in ("user", "toolResult") or (after_app_message and last.role != "assistant")
        ):
            return PendingRun()
        steering = self.steering.poll()
        if steering:
            return PendingRun(prompts=steering, skip_initial_steering=True, queue="steering")
        follow_up = self.follow_up.poll()
        if follow_up:
            return PendingRun(prompts=follow_up, queue="followUp")
        raise ContinueRefused(self._nothing_to_continue(last))

    def check_continue(self) -> None:
        """Refuse ``continue`` when ``continue_plan`` would."""
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role != "assistant":
            return
        if not self.steering and not self.follow_up:
            raise ContinueRefused(self._nothing_to_continue(last))

    @staticmethod
    def _nothing_to_continue(last: AgentMessage | None) -> str:
        if last is None:
            return "There is nothing to continue: send a prompt first."
        what = "an assistant message" if last.role == "assistant" else f"a `{last.role}` message"
        return (
            f"Cannot continue from {what}: nothing is queued. "
            "Send a prompt, or queue a steer or follow-up message."
        )

    # --- messages from outside ------------------------------------------------------

    def check_accepts_run(self) -> None:
        if self.closing:
            raise InputError("The conversation is closed: start a new one.")
        if self.is_busy():
            raise InputError(
                "A run is already active: send `steer` or `follow_up` instead, or wait for the run to end."
            )

    def enqueue(self, queue: MessageQueue, message: AgentMessage) -> None:
        self.arrivals += 1
        queue.push(message, self.arrivals)
        if not self.is_busy():
            # A message that arrives while idle starts a run, as continue() would.
            self.pending = PendingRun(from_continue=True)

    def request_abort(self) -> bool:
        """Mark the active run aborted (or the accepted one not begun yet:
        it begins aborted); False when no run is active, nothing to cancel."""
        if self.run is None:
            if self.pending is not None:
                self.pending.abort_requested = True
            return False
        self.abort_requested = True
        return True

    def request_stop_after_turn(self) -> None:
        """End the active run (or the accepted one not begun yet) after its
        current turn; nothing while idle."""
        if self.run is not None:
            self.run.stop_requested = True
        elif self.pending is not None:
            self.pending.stop_requested = True

    def configure(self, patch: AgentSettings, fields: set[str]) -> SettingsInForce:
        """Apply the fields a ``configure`` update set; the settings now in force."""
        for name in fields:
            setattr(self.settings, name, getattr(patch, name))
        self.steering.mode = self.settings.steering_mode
        self.follow_up.mode = self.settings.follow_up_mode
        return self.settings_in_force()

    def settings_in_force(
        self, declared_before: Mapping[str, ToolDeclaration] | None = None
    ) -> SettingsInForce:
        """The settings now in force (``tools``: the names the model may call)."""
        settings = SettingsInForce.model_validate(
            self.settings.model_dump(include=set(AgentSettings.model_fields))
        )
        settings.tools = list(self.enabled_tools(declared_before))
        return settings

    def clear_queues(self, which: QueueSelector) -> list[AgentMessage]:
        cleared: list[tuple[int, AgentMessage]] = []
        if which in ("steering", "all"):
            cleared += self.steering.clear()
        if which in ("followUp", "all"):
            cleared += self.follow_up.clear()
        cleared.sort(key=lambda pair: pair[0])  # in the order they arrived, across both queues
        removed = [message for _, message in cleared]
        if (
            self.pending is not None
            and self.pending.from_continue
            and not self.steering
            and not self.follow_up
        ):
            self.pending = None  # the run those messages would have started
        return removed

    def reset(self) -> None:
        """pi's ``reset()``: transcript, queues, usage, error and counters cleared."""
        self.messages.clear()
        self.steering.clear()
        self.follow_up.clear()
        self.usage = Usage()
        self.error_message = None
        self.turns = TurnCounters()
        self.runs = 0
        self.last_stop_reason = None
        self.last_run_start = 0
        self.context_ref, self.context_length = None, 0
        self.run_ended = self.run_ended_before = False

    def idle_result(self) -> WaitForIdleResult:
        return WaitForIdleResult(
            runs=self.runs,
            stop_reason=self.last_stop_reason,
            messages=self.messages[self.last_run_start :] if self.runs else [],
        )

    # --- views --------------------------------------------------------------------------

    def state(
        self,
        event_offset: int,
        streaming_message: AssistantMessage | None,
        declared_before: Mapping[str, ToolDeclaration] | None = None,
    ) -> SessionState:
        return SessionState.model_validate(
            {
                **self.settings_in_force(declared_before).model_dump(),
                "status": self.status(),
                "isStreaming": self.run is not None,
                "streamingMessage": streaming_message,
                "pendingToolCalls": list(self.running_tools),
                "pendingApprovals": list(self.approvals.values()),
                "errorMessage": self.error_message,
                "messageCount": len(self.messages),
                "steeringQueue": len(self.steering),
                "followUpQueue": len(self.follow_up),
                "turns": self.turns.total,
                "runs": self.runs,
                "usage": self.usage,
                "eventOffset": event_offset,
            }
        )

    def carry(self, stream_state: Any, *, closed_publishers: list[str]) -> SessionCarry:
        return SessionCarry(
            closed_publishers=closed_publishers,
            steering=self.steering.snapshot(),
            follow_up=self.follow_up.snapshot(),
            steering_arrivals=self.steering.arrivals,
            follow_up_arrivals=self.follow_up.arrivals,
            arrivals=self.arrivals,
            total_turns=self.turns.total,
            usage=self.usage,
            runs=self.runs,
            run=self.run,
            context_ref=self.context_ref,
            context_length=self.context_length,
            stream=stream_state,
            continued_runs=self.continued_runs + 1,
            tools=list(self.declared.values()) if self.declared is not None else None,
            abort_requested=self.abort_requested,
            closing=self.closing,
            run_ended=self.run_ended or self.run_ended_before,
            pending=self.pending,
            error_message=self.error_message,
            last_stop_reason=self.last_stop_reason,
            last_run_start=self.last_run_start,
            approvals=list(self.approvals.values()),
            decisions=list(self.decisions.values()),
            search_attributes=self.search_attributes,
            published=self.published,
            published_at=self.published_at,
            track_subscribers=self.track_subscribers,
            model_call_timeout=self.model_call_timeout,
        )

    def search_attribute_values(self) -> dict[str, Any]:
        """What the conversation's search attributes should say now."""
        return {
            "AgentStatus": self.status(),
            "AgentModel": (self.settings.model or "")[:MAX_KEYWORD_CHARS],
            "AgentTurns": self.turns.total,
            # A model may report any usage: values an Int/Double attribute refuses would fail the upsert.
            "AgentTotalTokens": max(0, min(self.usage.total_tokens, MAX_SAFE_INTEGER)),
            "AgentCost": round(min(self.usage.cost.total, MAX_COST), 6) if self.usage.cost.total > 0 else 0.0,
        }
