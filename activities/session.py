"""Worker-side defaults a new conversation records in its history: the
default model and the declarations of every tool the worker has. Recorded
once (an activity; a local one in conversations started before
``defaults-by-activity``), carried across continue-as-new, so every worker
replays the conversation's decisions the same way."""

from __future__ import annotations

from temporalio import activity

from workflows.contract import SessionDefaults
from workflows.models import ToolDeclaration


class SessionActivities:
    """Register ``SessionActivities(model, tools).session_defaults``;
    ``search_attributes`` says whether the server has the agent's search
    attributes (checked when the worker starts); ``track_subscribers``
    False forces the stream's fallback (``AGENT_SDK_FALLBACKS``);
    ``model_call_timeout`` bounds one attempt of a model call, in seconds
    (``AGENT_MODEL_CALL_TIMEOUT``; None: the workflow's 10 minutes)."""

    def __init__(
        self,
        model: str,
        tools: list[ToolDeclaration],
        *,
        search_attributes: bool = False,
        track_subscribers: bool = True,
        model_call_timeout: float | None = None,
    ) -> None:
        self._defaults = SessionDefaults(
            model=model,
            tools=tools,
            search_attributes=search_attributes,
            track_subscribers=track_subscribers,
            model_call_timeout=model_call_timeout,
        )

    @activity.defn(name="session_defaults")
    async def session_defaults(self) -> SessionDefaults:
        return self._defaults
