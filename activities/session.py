"""Worker-side defaults a new conversation records in its history: the
default model and the declarations of every tool the worker has. Recorded
once (a local activity), carried across continue-as-new, so every worker
replays the conversation's decisions the same way."""

from __future__ import annotations

from temporalio import activity

from workflows.contract import SessionDefaults
from workflows.models import ToolDeclaration


class SessionActivities:
    """Register ``SessionActivities(model, tools).session_defaults``."""

    def __init__(self, model: str, tools: list[ToolDeclaration]) -> None:
        self._defaults = SessionDefaults(model=model, tools=tools)

    @activity.defn(name="session_defaults")
    async def session_defaults(self) -> SessionDefaults:
        return self._defaults
