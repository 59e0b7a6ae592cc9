"""Scripted OpenAI-compatible Chat Completions server for tests, the benchmark and the offline demo."""

from .demo_brain import respond
from .script import (
    DropFault,
    ErrorEventFault,
    MalformedFault,
    ScriptStep,
    ScriptToolCall,
    ScriptUsage,
    StallFault,
    StatusFault,
)
from .server import DEMO_MODEL, ScriptedModelServer, ScriptStore, create_app, serve

__all__ = [
    "DEMO_MODEL",
    "DropFault",
    "ErrorEventFault",
    "MalformedFault",
    "ScriptStep",
    "ScriptStore",
    "ScriptToolCall",
    "ScriptUsage",
    "ScriptedModelServer",
    "StallFault",
    "StatusFault",
    "create_app",
    "respond",
    "serve",
]
