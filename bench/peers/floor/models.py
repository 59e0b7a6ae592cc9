"""Typed inputs and outputs of the floor's workflow and activities. Messages
are the OpenAI Chat Completions dicts, as the model takes them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ConversationRequest(BaseModel):
    model: str
    prompt: str


class ConversationResult(BaseModel):
    turns: int
    answer: str


class ModelRequest(BaseModel):
    model: str
    messages: list[dict[str, Any]]  # the whole transcript, every time
    tools: list[dict[str, Any]]


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: str  # JSON, as the model sent it


class ModelReply(BaseModel):
    message: dict[str, Any]  # the assistant message, to append to the transcript
    tool_calls: list[ToolCall]


class ToolResult(BaseModel):
    tool_call_id: str
    content: str
