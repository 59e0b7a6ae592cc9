"""Worker-side defaults a new conversation adopts (read from the worker's
environment in an activity, so the choice is recorded in history)."""

from __future__ import annotations

import os

from temporalio import activity

from workflows.contract import SessionDefaults

DEFAULT_MODEL = "gpt-4o-mini"


@activity.defn(name="session_defaults")
async def session_defaults() -> SessionDefaults:
    return SessionDefaults(model=os.environ.get("AGENT_MODEL") or DEFAULT_MODEL)
