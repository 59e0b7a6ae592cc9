"""Typed input and output of the OpenAI Agents SDK row's workflow."""

from __future__ import annotations

from pydantic import BaseModel

EVENTS_TOPIC = "events"
RUN_END = "run_end"  # the workflow's own last event on the topic: the subscriber stops there


class ConversationRequest(BaseModel):
    model: str
    prompt: str
    stream: bool
    max_turns: int


class ConversationResult(BaseModel):
    turns: int
    answer: str
