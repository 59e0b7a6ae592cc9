"""Which behaviours a conversation's run has (``workflow.patched``), at the
cost of one marker for a run started by this version.

Each change of the workflow's commands sits behind a patch id, so that a
history recorded before the change replays on its old path. A run started
by this version records just ``CURRENT`` (one marker, one search-attribute
upsert) and takes every new path; a run from before answers each patch id
as its history says. When the oldest open conversation is newer than a
patch, the patch and its old path can go (``workflow.deprecate_patch``)."""

from __future__ import annotations

from temporalio import workflow

CURRENT = "agent-2026-12"
"""Marks a run started with every patch below in force."""


class Versions:
    def __init__(self) -> None:
        self._current = False

    def start(self) -> None:
        """Call once, at the start of ``run``, before any other command."""
        self._current = workflow.patched(CURRENT)

    def has(self, patch_id: str) -> bool:
        return self._current or workflow.patched(patch_id)
