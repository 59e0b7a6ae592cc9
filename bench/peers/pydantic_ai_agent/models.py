"""Typed input and output of the pydantic-ai row's workflows."""

from __future__ import annotations

from pydantic import BaseModel

EVENTS_TOPIC = "events"


class ConversationRequest(BaseModel):
    model: str
    prompt: str


class ConversationResult(BaseModel):
    turns: int
    answer: str
