"""The session's public contract: start input, update/query results, and
what the workflow exchanges with its activities.

Every model accepts pi-style camelCase JSON (from the Temporal CLI or UI) as
well as snake_case Python keyword arguments.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.workflow_streams import WorkflowStreamState

from workflows.inputs import MAX_SAFE_INTEGER, clean_json, validation_text
from workflows.models import (
    AgentMessage,
    AssistantMessage,
    QueueMode,
    QueueName,
    RunState,
    StopReason,
    ToolCall,
    ToolDeclaration,
    ToolOutcome,
    Usage,
    WireModel,
)

# The event stream's wire protocol (``workflows/stream.py``; the Workflow
# Streams clients use the same names).
PUBLISH_SIGNAL = "__temporal_workflow_stream_publish"
POLL_UPDATE = "__temporal_workflow_stream_poll"
OFFSET_QUERY = "__temporal_workflow_stream_offset"
# This project's addition: an update that returns when the run in progress
# has ended (``EventStream.track``).
RUN_END_UPDATE = "__agent_stream_run_end"
DRAINING_ERROR = "StreamDraining"
TRUNCATED_ERROR = "TruncatedOffset"
BUSY_ERROR = "StreamBusy"


def item_payload(data: str) -> Payload:
    """The payload of a poll result's item (sent base64-encoded)."""
    return Payload.FromString(base64.b64decode(data))


ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh"]
ToolExecutionMode = Literal["parallel", "sequential"]
Status = Literal["idle", "running", "awaiting-approval", "closed"]

SEARCH_ATTRIBUTES: dict[str, str] = {
    "AgentStatus": "Keyword",
    "AgentModel": "Keyword",
    "AgentTurns": "Int",
    "AgentTotalTokens": "Int",
    "AgentCost": "Double",
}
"""The custom search attributes a conversation keeps up to date (name ->
Temporal type), when the server it runs on has them registered."""


# The longest wait a timer can be set for here (Python's timedelta: 999,999,999
# days); a longer approvalTimeoutSeconds failed every workflow task at the wait.
MAX_APPROVAL_TIMEOUT_SECONDS = 999_999_999 * 86_400


class AgentSettings(WireModel):
    """What ``configure`` may change at any time (pi's Agent setters)."""

    system_prompt: str | None = None
    model: str | None = Field(default=None, min_length=1)
    thinking_level: ThinkingLevel = "off"
    tools: list[str] | None = None
    """Names of the tools the model may call (None: every tool the worker declared)."""
    tool_execution: ToolExecutionMode = "parallel"
    steering_mode: QueueMode = "one-at-a-time"
    follow_up_mode: QueueMode = "one-at-a-time"
    max_turns: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, gt=0)
    approval_timeout_seconds: float | None = Field(default=None, gt=0, le=MAX_APPROVAL_TIMEOUT_SECONDS)
    """At most MAX_APPROVAL_TIMEOUT_SECONDS (a longer one could never be set)."""


class SettingsInForce(AgentSettings):
    """The settings a conversation runs with now (``configure``'s result, and
    part of ``state``): every key present, ``null`` where unset."""

    keep_nulls = True
    uncompressed = True


class SessionSettings(AgentSettings):
    """What a conversation runs with; every field is optional in the JSON."""

    close_when_idle: bool = False
    continue_as_new_after_turns: int | None = Field(default=None, ge=1)
    stream_batch_ms: int = Field(default=100, ge=1, le=10_000)
    """How long activities batch token deltas before publishing them (the
    first token of a message is always sent at once)."""


class SessionInput(SessionSettings):
    """Start input of ``AgentWorkflow``."""

    prompt: str | AgentMessage | list[str | AgentMessage] | None = None
    messages: list[AgentMessage] = Field(default_factory=list)
    carry: SessionCarry | None = None
    """Internal: the state a continue-as-new hands over. Refused on a start."""


class PendingRun(WireModel):
    """A run accepted but not started yet (a prompt, or a message that
    arrived while idle), carried if the session continues as new first."""

    prompts: list[AgentMessage] = Field(default_factory=list)
    skip_initial_steering: bool = False
    from_continue: bool = False
    queue: QueueName | None = None
    abort_requested: bool | None = None
    """``abort`` came before the run began: it begins aborted."""
    stop_requested: bool | None = None
    """``stop_after_turn`` came before the run began: it ends after a turn."""


class SessionCarry(WireModel):
    """State handed to the next run by continue-as-new (internal)."""

    steering: list[AgentMessage] = Field(default_factory=list)
    follow_up: list[AgentMessage] = Field(default_factory=list)
    steering_arrivals: list[int] = Field(default_factory=list)
    follow_up_arrivals: list[int] = Field(default_factory=list)
    arrivals: int = 0
    """How many messages were ever queued (numbers the next arrival)."""
    total_turns: int = 0
    usage: Usage = Field(default_factory=Usage)
    runs: int = 0
    run: RunState | None = None
    context_ref: str | None = None
    context_length: int = 0
    stream: WorkflowStreamState | None = None
    closed_publishers: list[str] = Field(default_factory=list)
    """Publishers of aborted model calls: what they still send is dropped."""
    continued_runs: int = 0
    tools: list[ToolDeclaration] | None = None
    """The tool declarations recorded when the conversation started."""
    abort_requested: bool = False
    closing: bool = False
    run_ended: bool = False
    """A run ended and no other started since (a ``closeWhenIdle``
    conversation completes once nothing is queued); False in a carry
    written before it was carried."""
    pending: PendingRun | None = None
    error_message: str | None = None
    last_stop_reason: StopReason | None = None
    last_run_start: int = 0
    approvals: list[PendingApproval] = Field(default_factory=list)
    """Tool calls waiting for approval (their run continues in the next run)."""
    decisions: list[ApprovalRequest] = Field(default_factory=list)
    """Decisions that arrived while the conversation was continuing as new."""
    track_subscribers: bool | None = None
    """As recorded in ``SessionDefaults`` (None: none recorded)."""
    model_call_timeout: float | None = None
    """As recorded in ``SessionDefaults`` (None: none recorded)."""
    search_attributes: bool = False
    published: dict[str, Any] = Field(default_factory=dict)
    """The search attribute values last upserted."""
    published_at: datetime | None = None
    """When they were (workflow time; None: not yet, or carried by a
    version that did not carry it)."""


class SessionDefaults(WireModel):
    """What a conversation records from the worker when it starts: the
    default model, every tool the worker declares, and whether the server
    has the search attributes registered (upserting one it lacks would fail
    every workflow task)."""

    model: str
    tools: list[ToolDeclaration] | None = None
    search_attributes: bool = False
    track_subscribers: bool | None = None
    """False: the worker does not track the stream's subscribers (its SDK
    fallbacks are on), so a completing conversation lingers by a plain
    timer. Recorded rather than read from the worker, because it decides
    a command: every worker replays the conversation as it ran. None (a
    recording made before it existed): the replaying worker's own choice,
    as then."""
    model_call_timeout: float | None = None
    """Seconds one attempt of a model call may take (AGENT_MODEL_CALL_TIMEOUT).
    Recorded, because it is a command's timeout; None (recorded before it
    existed): 10 minutes, as then."""


class PromptResult(WireModel):
    """Returned by the ``prompt`` and ``continue`` updates once the run is
    accepted: subscribe to the ``events`` topic from ``event_offset`` to see
    exactly this run's events."""

    uncompressed = True

    run: int
    event_offset: int


class WaitForIdleResult(WireModel):
    """Returned by ``wait_for_idle`` (pi's ``waitForIdle()``)."""

    keep_nulls = True

    runs: int
    stop_reason: StopReason | None = None
    """How the last run ended (None: no run yet)."""
    messages: list[AgentMessage] = Field(default_factory=list)
    """The last run's new messages."""


class PendingApproval(WireModel):
    """A tool call waiting for a person's decision."""

    tool_call_id: str
    tool_name: str
    args: Any
    reason: str


class ApprovalRequest(WireModel):
    """The argument of ``approve_tool``."""

    tool_call_id: str
    approved: bool
    reason: str | None = None


class SessionState(SettingsInForce):
    """Result of the ``state`` query: the session and the settings in force
    (every key present, ``null`` where unset)."""

    status: Status
    is_streaming: bool
    """A run is active (from ``agent_start`` to ``agent_end``, tool batches included)."""
    streaming_message: AssistantMessage | None = None
    """The assistant message the model is streaming right now, as far as it got."""
    pending_tool_calls: list[str]
    pending_approvals: list[PendingApproval] = Field(default_factory=list)
    error_message: str | None = None
    message_count: int
    steering_queue: int
    follow_up_queue: int
    turns: int
    runs: int
    usage: Usage
    model: str | None = None
    event_offset: int


class SessionResult(WireModel):
    """What a closed conversation completes with."""

    messages: list[AgentMessage]


# --- workflow <-> activities ----------------------------------------------------


class LlmRequest(WireModel):
    """Input of the ``stream_assistant_response`` activity."""

    model: str
    system_prompt: str | None = None
    thinking_level: ThinkingLevel = "off"
    tool_names: list[str] = Field(default_factory=list)
    messages: list[AgentMessage]
    """The messages after ``context_ref`` (all of them when it is None)."""
    context_ref: str | None = None
    """Digest of a stored manifest naming the first ``context_length`` messages."""
    context_length: int = 0
    turn: int
    stream_batch_ms: int = 100
    max_batches: int | None = None
    """The most event batches (signals) this call may publish; the rest
    is returned with the result."""
    stream_call: str | None = None
    """This call's mark: every attempt sends it (topic ``MODEL_CALL_TOPIC``)
    with its first batch of events, so that the workflow drops what an
    attempt of a call that has ended (aborted) still publishes."""


class LlmResult(WireModel):
    """Output of ``stream_assistant_response``: the assembled message, and
    whether its ``message_start`` was already published by the activity."""

    message: AssistantMessage
    streamed: bool
    context_ref: str | None = None
    """Manifest of the whole context including ``message`` (None: not stored)."""
    events: list[dict[str, Any]] = Field(default_factory=list)
    """Stream events the activity did not send itself; the workflow publishes them."""
    argument_errors: dict[str, str] = Field(default_factory=dict)
    """Tool call id -> JSON parse error, for calls whose arguments were not valid JSON."""


class ToolRequest(WireModel):
    """Input of the ``execute_tool`` activity (arguments already validated)."""

    tool_call: ToolCall
    stream_batch_ms: int = 100
    idempotency_key: str | None = None
    """Unique per call in the conversation, across continue-as-new (None:
    derived from the workflow and activity ids, as before)."""
    max_batches: int | None = None
    raw_arguments: dict[str, Any] | None = None
    """The arguments as the model sent them, when preparation changed them
    (a shim, coercion, a default filled in): ``tool_execution_update``
    carries these, as pi's does and as ``tool_execution_start`` did (None:
    the same as ``tool_call.arguments``)."""


SessionCarry.model_rebuild()
SessionInput.model_rebuild()


def _keys(model: type[SessionSettings]) -> frozenset[str]:
    """The keys ``model`` reads: camelCase aliases and snake_case names."""
    return frozenset(key for name, f in model.model_fields.items() for key in (name, f.alias) if key)


_START_KEYS = _keys(SessionInput)
_SETTINGS_KEYS = _keys(SessionSettings)
# What a refusal lists: the camelCase keys, without the internal `carry`.
_START_KEYS_TOLD = ", ".join(
    sorted(f.alias or name for name, f in SessionInput.model_fields.items() if name != "carry")
)


def start_input_problem(raw: dict[str, Any]) -> str | None:
    """Why a start input the models accept is still refused: a key the
    workflow does not know (a misspelt ``sytemPrompt``), or a setting of the
    wrong JSON type that lax validation would coerce (``"maxTurns": true``
    read as 1, ``"10"`` as 10), or out of range (``"maxTurns": 0``). The
    workflow refuses such a start (the conversation fails); the client asks
    first, so a script or the CLI hears it before anything starts."""
    unknown = [str(key) for key in raw if key not in _START_KEYS]
    if unknown:
        return f"Unknown start input key(s) {', '.join(unknown)}: the start input takes {_START_KEYS_TOLD}."
    settings = {key: value for key, value in raw.items() if key in _SETTINGS_KEYS}
    try:
        SessionSettings.model_validate_json(json.dumps(clean_json(settings)), strict=True)
    except ValidationError as err:
        return validation_text("The start input is invalid", err)
    return None


def past_safe_integer(settings: dict[str, Any]) -> str | None:
    """Why a setting's number is refused: past 2**53 - 1 an integer is read
    inexactly by JSON readers of other languages (JavaScript's), so `state`
    would report another limit back; None when none is. (Every integer
    setting is at least 1: one below is refused by its own check.)"""
    for key, value in settings.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_SAFE_INTEGER:
            return (
                f"`{key}` must be at most {MAX_SAFE_INTEGER} (2**53 - 1, the largest integer every "
                "JSON reader reads exactly; null sets no limit)."
            )
    return None


__all__ = [
    "AgentSettings",
    "ApprovalRequest",
    "LlmRequest",
    "LlmResult",
    "PendingApproval",
    "PendingRun",
    "PromptResult",
    "QueueMode",
    "RunState",
    "SessionCarry",
    "SessionDefaults",
    "SessionInput",
    "SessionResult",
    "SessionSettings",
    "SessionState",
    "SettingsInForce",
    "ThinkingLevel",
    "ToolDeclaration",
    "ToolExecutionMode",
    "ToolOutcome",
    "WaitForIdleResult",
    "past_safe_integer",
    "start_input_problem",
]
