"""Wire models: pi-agent-core's messages, content blocks and events.

JSON uses pi's camelCase names (so pi clients and session files can read what
we write); Python attributes are snake_case. Fields that are ``None`` are left
out of the JSON, as pi leaves optional fields out, except in the views a
reader looks keys up in (``keep_nulls``: the ``state`` query, the settings
in force, ``wait_for_idle``'s result), which write them as ``null``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    field_validator,
)
from pydantic.alias_generators import to_camel


def _is_none(value: Any) -> bool:
    return value is None


class WireModel(BaseModel):
    """Base of every model that crosses a process boundary. Optional fields
    (default ``None``) are left out of the JSON while they are ``None``,
    unless the class sets ``keep_nulls``."""

    keep_nulls: ClassVar[bool] = False
    """Write optional fields as ``null`` instead of leaving them out: a view
    whose keys a reader looks up (``state["streamingMessage"]``)."""
    uncompressed: ClassVar[bool] = False
    """A control payload (the ``state`` query, the settings in force, a
    prompt's receipt): the payload converter marks it so that the codec
    never compresses it: under the storage threshold it is plain JSON, read
    by a client without the codec (SPEC section 10)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Per-field exclude_if runs in pydantic's serializer; a model-level
        # wrap serializer (a Python call per model) cost 6x as much per event.
        super().__pydantic_init_subclass__(**kwargs)
        cls._exclude_none_fields()

    @classmethod
    def model_rebuild(cls, **kwargs: Any) -> bool | None:
        # A rebuild (forward references resolved) makes its fields afresh.
        rebuilt = super().model_rebuild(**kwargs)
        cls._exclude_none_fields()
        return rebuilt

    @classmethod
    def _exclude_none_fields(cls) -> None:
        # Inherited fields come with the parent's choice: a view that keeps
        # nulls undoes it (its fields are its own copies).
        wanted = None if cls.keep_nulls else _is_none
        changed = [
            field
            for field in cls.model_fields.values()
            if field.default is None
            and field.exclude_if in (None, _is_none)
            and field.exclude_if is not wanted
        ]
        for field in changed:
            field.exclude_if = wanted
        if changed:
            BaseModel.model_rebuild.__func__(cls, force=True, raise_errors=False)  # type: ignore[attr-defined]


# --- content blocks --------------------------------------------------------


class TextContent(WireModel):
    type: Literal["text"] = "text"
    text: str
    text_signature: str | None = None


class ThinkingContent(WireModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    thinking_signature: str | None = None
    redacted: bool | None = None


class ImageContent(WireModel):
    """An image as base64 ``data`` with its ``mimeType``."""

    type: Literal["image"] = "image"
    data: str
    mime_type: str


class ToolCall(WireModel):
    type: Literal["toolCall"] = "toolCall"
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


UserContent = Annotated[TextContent | ImageContent, Field(discriminator="type")]
AssistantContent = Annotated[TextContent | ThinkingContent | ToolCall, Field(discriminator="type")]


# --- messages ---------------------------------------------------------------


class Cost(WireModel):
    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    total: float = 0.0


class Usage(WireModel):
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total_tokens: int = 0
    cost: Cost = Field(default_factory=Cost)

    def plus(self, other: Usage) -> Usage:
        """Sum of two usages (for session totals)."""
        return Usage(
            input=self.input + other.input,
            output=self.output + other.output,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            total_tokens=self.total_tokens + other.total_tokens,
            cost=Cost(
                input=self.cost.input + other.cost.input,
                output=self.cost.output + other.cost.output,
                cache_read=self.cost.cache_read + other.cost.cache_read,
                cache_write=self.cost.cache_write + other.cost.cache_write,
                total=self.cost.total + other.cost.total,
            ),
        )


StopReason = Literal["stop", "length", "toolUse", "error", "aborted"]
QueueName = Literal["steering", "followUp"]
QueueMode = Literal["one-at-a-time", "all"]


class UserMessage(WireModel):
    role: Literal["user"] = "user"
    content: str | list[UserContent]
    timestamp: int = 0


class AssistantMessage(WireModel):
    role: Literal["assistant"] = "assistant"
    content: list[AssistantContent] = Field(default_factory=list)
    api: str = "openai-completions"
    provider: str = "openai"
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    stop_reason: StopReason = "stop"
    error_message: str | None = None
    timestamp: int = 0

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for c in self.content if isinstance(c, ToolCall)]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.content if isinstance(c, TextContent))


class ToolResultMessage(WireModel):
    role: Literal["toolResult"] = "toolResult"
    tool_call_id: str
    tool_name: str
    content: list[UserContent] = Field(default_factory=list)
    details: Any = None
    is_error: bool = False
    timestamp: int = 0


class CustomMessage(WireModel):
    """An application message (any other role): kept, not sent to the model."""

    model_config = ConfigDict(extra="allow")
    role: str


def _message_tag(value: Any) -> str:
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    return role if role in ("user", "assistant", "toolResult") else "custom"


AgentMessage = Annotated[
    Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[ToolResultMessage, Tag("toolResult")]
    | Annotated[CustomMessage, Tag("custom")],
    Discriminator(_message_tag),
]
MessageList = TypeAdapter(list[AgentMessage])
MessageAdapter: TypeAdapter[Any] = TypeAdapter(AgentMessage)


def text_result(text: str) -> list[UserContent]:
    return [TextContent(text=text)]


# --- tools -------------------------------------------------------------------


class ToolDeclaration(WireModel):
    """What the workflow knows of a tool: recorded in the conversation's
    history when it starts (never looked up in the worker's registry), so
    every worker replays the conversation's decisions the same way."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    """The arguments' JSON schema (validated in the workflow)."""
    execution_mode: Literal["sequential", "parallel"] | None = None
    """``sequential`` makes every batch that calls this tool sequential."""
    timeout_seconds: float = 300.0
    requires_approval: bool = False
    local: bool = False
    """Run as a local activity, in the workflow task that scheduled it."""
    label: str | None = None


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


class WaitingCall(WireModel):
    """A prepared tool call waiting for a person's decision."""

    args: dict[str, Any]
    reason: str
    deadline_ms: int | None = None
    """When the wait times out (``approvalTimeoutSeconds``), ms since the epoch."""
    requested_ms: int | None = None
    """When the approval was asked for (for the wait-time metric)."""


class ToolBatch(WireModel):
    """A tool batch in progress: what the loop has settled so far. Carried
    when a conversation continues as new while calls wait for approval, so
    the new run resumes the batch where it was."""

    message_index: int
    """The assistant message whose tool calls these are."""
    sequential: bool
    outcomes: dict[str, ToolOutcome] = Field(default_factory=dict)
    """Finalized calls (their ``tool_execution_end`` was emitted)."""
    waiting: dict[str, WaitingCall] = Field(default_factory=dict)


class RunState(WireModel):
    """Where a run is, at a turn boundary (or in a tool batch whose open
    calls all wait for approval): enough to resume it in a new run of the
    workflow after continue-as-new."""

    started_at_message: int
    turns: int = 0
    has_more_tool_calls: bool = False
    stop_requested: bool = False
    batch: ToolBatch | None = None


# --- events -------------------------------------------------------------------


class AgentStartEvent(WireModel):
    type: Literal["agent_start"] = "agent_start"


class AgentEndEvent(WireModel):
    type: Literal["agent_end"] = "agent_end"
    messages: list[AgentMessage]


class TurnStartEvent(WireModel):
    type: Literal["turn_start"] = "turn_start"


class TurnEndEvent(WireModel):
    type: Literal["turn_end"] = "turn_end"
    message: AgentMessage
    tool_results: list[ToolResultMessage]
    model_turn: bool = Field(default=True, exclude=True)
    """False for the ``turn_end`` of a failure message that ends a run
    (pi's ``handleRunFailure``): on the stream like any, not counted as a
    model turn. Never on the wire."""


class MessageStartEvent(WireModel):
    """Start of a message. For an assistant message streamed by the model it
    carries the (empty) partial message and the LLM attempt number; for a
    user message taken from a queue, which queue (``steering`` or
    ``followUp``) it came from."""

    type: Literal["message_start"] = "message_start"
    message: AgentMessage
    attempt: int | None = None
    queue: QueueName | None = None


class MessageUpdateEvent(WireModel):
    type: Literal["message_update"] = "message_update"
    assistant_message_event: dict[str, Any]


class MessageEndEvent(WireModel):
    type: Literal["message_end"] = "message_end"
    message: AgentMessage


class MessageRetryEvent(WireModel):
    """An LLM call is being retried: drop the partial text of the streaming
    message; attempt ``attempt`` starts over."""

    type: Literal["message_retry"] = "message_retry"
    attempt: int
    reason: str | None = None


class ToolExecutionStartEvent(WireModel):
    type: Literal["tool_execution_start"] = "tool_execution_start"
    tool_call_id: str
    tool_name: str
    args: Any


class ToolExecutionUpdateEvent(WireModel):
    type: Literal["tool_execution_update"] = "tool_execution_update"
    tool_call_id: str
    tool_name: str
    args: Any
    partial_result: Any


class ToolExecutionRetryEvent(WireModel):
    """A tool call runs again (attempt ``attempt``) because the attempt
    before it did not report: its worker stopped, or it stopped
    heartbeating. Its progress starts over, and whatever the tool did
    before may be done twice (``tool_context().idempotency_key`` is the
    same)."""

    type: Literal["tool_execution_retry"] = "tool_execution_retry"
    tool_call_id: str
    tool_name: str
    attempt: int
    reason: str | None = None


class ToolApprovalRequestEvent(WireModel):
    """A tool call waits for a person's decision (update ``approve_tool``)."""

    type: Literal["tool_approval_request"] = "tool_approval_request"
    tool_call_id: str
    tool_name: str
    args: Any
    reason: str


class ToolExecutionEndEvent(WireModel):
    type: Literal["tool_execution_end"] = "tool_execution_end"
    tool_call_id: str
    tool_name: str
    result: Any
    is_error: bool


AgentEvent = Annotated[
    AgentStartEvent
    | AgentEndEvent
    | TurnStartEvent
    | TurnEndEvent
    | MessageStartEvent
    | MessageUpdateEvent
    | MessageEndEvent
    | MessageRetryEvent
    | ToolExecutionStartEvent
    | ToolExecutionUpdateEvent
    | ToolExecutionRetryEvent
    | ToolApprovalRequestEvent
    | ToolExecutionEndEvent,
    Field(discriminator="type"),
]
EventAdapter: TypeAdapter[Any] = TypeAdapter(AgentEvent)
EVENTS_TOPIC = "events"
# A model call's activity publishes its call's mark on this topic with its
# first batch of events; the workflow takes it out (never in the log) and
# so tells a cancelled call's late events from the next call's.
MODEL_CALL_TOPIC = "__agent_model_call"
