"""Pydantic models of one scripted response (a *step*) and its optional fault.

A step describes exactly one answer of the scripted model: the text, reasoning
and tool calls to stream, how to chunk and pace them, and an optional fault that
replaces or interrupts the normal answer. Unknown fields are rejected so that a
typo in a test script fails loudly instead of being silently ignored.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    """Base model that forbids unknown fields."""

    model_config = ConfigDict(extra="forbid")


class ScriptToolCall(_Strict):
    """One function call the model emits.

    `arguments` is JSON-encoded when it is an object; a string is sent verbatim,
    which lets tests deliver invalid JSON to the agent.
    """

    id: str | None = None
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)

    def arguments_json(self) -> str:
        """The arguments exactly as they go on the wire."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


class ScriptUsage(_Strict):
    """Token counts to report instead of the server's rough estimate."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None


class StatusFault(_Strict):
    """Answer with an HTTP error in OpenAI's error shape instead of a completion.

    `{"kind": "429"}` is accepted as shorthand for `{"kind": "status", "status": 429}`.
    """

    kind: Literal["status"] = "status"
    status: int = Field(default=500, ge=400, le=599)
    retry_after: float | None = None
    message: str | None = None
    type: str | None = None
    code: str | None = None
    body: str | None = None
    """A raw body to send instead of OpenAI's JSON error (an HTML page from
    a proxy, a framework's `404 page not found`), as `text/html` when it
    starts with `<`, else `text/plain`."""

    @model_validator(mode="before")
    @classmethod
    def _expand_status_shorthand(cls, data: Any) -> Any:
        """Turn `{"kind": "<status>"}` into `{"kind": "status", "status": <status>}`."""
        if isinstance(data, dict) and str(data.get("kind", "")).isdigit():
            return {**data, "kind": "status", "status": int(data["kind"])}
        return data


class StallFault(_Strict):
    """Stream `after_chunks` chunks, go silent for `seconds`, then continue normally."""

    kind: Literal["stall"]
    after_chunks: int = Field(default=1, ge=0)
    seconds: float = Field(default=30.0, ge=0)


class DropFault(_Strict):
    """Stream `after_chunks` chunks, then cut the connection without `[DONE]`."""

    kind: Literal["drop"]
    after_chunks: int = Field(default=1, ge=0)


class MalformedFault(_Strict):
    """Stream `after_chunks` chunks, then send `data: {not json` and cut the connection."""

    kind: Literal["malformed"]
    after_chunks: int = Field(default=1, ge=0)


class ErrorEventFault(_Strict):
    """Stream `after_chunks` chunks, then an error as an event of the stream
    (`data: {"error": {...}}`, as vLLM and OpenRouter send one mid-answer),
    then `[DONE]`."""

    kind: Literal["error_event"]
    after_chunks: int = Field(default=1, ge=0)
    message: str = "scripted error mid-stream"
    code: int | str | None = None
    type: str | None = None


class RawFault(_Strict):
    """Answer 200 with exactly `body` (the step's `content_type`), then hold
    the connection open for `hold_seconds` before closing it: a server's
    own shape of a stream, byte for byte (llama.cpp's `error:` lines, a
    stream without a finish reason, an error that is no event)."""

    kind: Literal["raw"]
    body: str
    hold_seconds: float = Field(default=0.0, ge=0)


Fault = Annotated[
    StatusFault | StallFault | DropFault | MalformedFault | ErrorEventFault | RawFault,
    Field(union_mode="left_to_right"),
]


class ScriptStep(_Strict):
    """One scripted model response.

    Chunk counting for faults includes the opening role chunk, so
    `after_chunks=1` cuts right after `{"role": "assistant"}`.
    """

    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[ScriptToolCall] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: ScriptUsage | None = None
    chunk_chars: int = Field(default=4, ge=1)
    delay_ms: float = Field(default=0.0, ge=0)
    first_delay_ms: float = Field(default=0.0, ge=0)
    fault: Fault | None = None
    whole: bool = False
    """Answer with the whole completion as JSON even when asked to stream
    (servers that do not stream)."""
    content_type: str = "text/event-stream"
    """The stream's Content-Type (some servers and proxies label an event
    stream `application/json`)."""

    def resolved_finish_reason(self) -> str:
        """The scripted finish reason, else `tool_calls` or `stop` depending on content."""
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"

    def pieces(self, value: str) -> list[str]:
        """Split `value` into `chunk_chars`-sized deltas."""
        size = self.chunk_chars
        return [value[i : i + size] for i in range(0, len(value), size)]
