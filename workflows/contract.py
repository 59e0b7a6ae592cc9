"""The session's public contract: start input, update/query results, and
what the workflow exchanges with its activities.

Every model accepts pi-style camelCase JSON (from the Temporal CLI or UI) as
well as snake_case Python keyword arguments.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator
from temporalio.contrib.workflow_streams import WorkflowStreamState

from workflows.models import (
    AgentMessage,
    AssistantMessage,
    ToolCall,
    Usage,
    UserContent,
    WireModel,
)

ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh"]
QueueMode = Literal["one-at-a-time", "all"]
ToolExecutionMode = Literal["parallel", "sequential"]


class SessionSettings(WireModel):
    """What a conversation runs with; every field is optional in the JSON."""

    system_prompt: str | None = None
    model: str | None = None
    thinking_level: ThinkingLevel = "off"
    tools: list[str] | None = None
    tool_execution: ToolExecutionMode = "parallel"
    steering_mode: QueueMode = "one-at-a-time"
    follow_up_mode: QueueMode = "one-at-a-time"
    max_turns: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, gt=0)
    close_when_idle: bool = False
    continue_as_new_after_turns: int | None = Field(default=None, ge=1)
    stream_batch_ms: int = Field(default=100, ge=1, le=10_000)
    """How long activities batch token deltas before publishing them (the
    first token of a message is always sent at once)."""


class SessionInput(SessionSettings):
    """Start input of ``AgentWorkflow``."""

    prompt: str | AgentMessage | None = None
    messages: list[AgentMessage] = Field(default_factory=list)
    carry: SessionCarry | None = None


class RunState(WireModel):
    """Where a run is, at a turn boundary: enough to resume it in a new run
    of the workflow after continue-as-new."""

    started_at_message: int
    turns: int = 0
    has_more_tool_calls: bool = False
    stop_requested: bool = False


class SessionCarry(WireModel):
    """State handed to the next run by continue-as-new (internal)."""

    steering: list[AgentMessage] = Field(default_factory=list)
    follow_up: list[AgentMessage] = Field(default_factory=list)
    total_turns: int = 0
    usage: Usage = Field(default_factory=Usage)
    runs: int = 0
    run: RunState | None = None
    context_ref: str | None = None
    context_length: int = 0
    stream: WorkflowStreamState | None = None
    continued_runs: int = 0


class SessionDefaults(WireModel):
    """Defaults taken from the worker when a conversation starts."""

    model: str


class PromptResult(WireModel):
    """Returned by the ``prompt`` and ``continue`` updates once the run is
    accepted: subscribe to the ``events`` topic from ``event_offset`` to see
    exactly this run's events."""

    run: int
    event_offset: int


class SessionState(WireModel):
    """Result of the ``state`` query."""

    status: Literal["idle", "running", "closed"]
    is_streaming: bool
    pending_tool_calls: list[str]
    error_message: str | None = None
    message_count: int
    steering_queue: int
    follow_up_queue: int
    turns: int
    runs: int
    usage: Usage
    model: str
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


class ToolOutcome(WireModel):
    """A finalized tool result, before it becomes a ``ToolResultMessage``."""

    content: list[UserContent]
    details: Any = None
    is_error: bool = False
    terminate: bool = False
    events: list[dict[str, Any]] = Field(default_factory=list)
    """Stream events the tool activity did not send itself (progress); the
    workflow publishes them. Not part of the result the model or hooks see."""

    @field_validator("details", mode="before")
    @classmethod
    def _details_default(cls, value: Any) -> Any:
        return {} if value is None else value


SessionInput.model_rebuild()
