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

CURRENT = "agent-2026-12-n"
"""Marks a run started with every patch in force."""

_FIRST = frozenset(
    {
        "recorded-tool-declarations",
        "wait-for-cancelled-tools",
        "instant-abort",
        "idle-switch",
        "linger-for-subscribers",
        "search-attributes",
        "no-switch-while-aborting",
    }
)

_B = _FIRST | {"search-attributes-by-time"}
_C = _B | {"hold-switch-for-idle-waiters"}
_D = _C | {"abort-before-run-start", "strict-start-input", "continue-after-app-message"}
_E = _D | {"closed-when-idle", "tool-argument-bytes", "stream-events-as-pi"}
_F = _E | {"abort-over-stop"}
_G = _F | {"tool-batch-in-parts"}
_H = _G | {"drop-carried-publishers"}
_I = _H | {"await-aborted-model-call"}
_J = _I | {"abortable-hooks"}
_K = _J | {"approval-timeout-follows-configure"}
_L = _K | {
    "strict-override-flags",
    "search-attribute-counters-now",
    "carried-counters-time",
    "start-input-safe-integers",
}

_M = _L | {
    "approval-without-reason",
    "hooks-see-batch-start",
    "abort-before-follow-ups",
    "carry-not-retried",
    "save-local-results-before-switch",
}

PREVIOUS: dict[str, frozenset[str]] = {
    "agent-2026-12-m": _M,
    "agent-2026-12-l": _L,
    "agent-2026-12-k": _K,
    "agent-2026-12-j": _J,
    "agent-2026-12-i": _I,
    "agent-2026-12-h": _H,
    "agent-2026-12-g": _G,
    "agent-2026-12-f": _F,
    "agent-2026-12-e": _E,
    "agent-2026-12-d": _D,
    "agent-2026-12-c": _C,
    "agent-2026-12-b": _B,
    "agent-2026-12": _FIRST,
}
"""Earlier values of ``CURRENT``, each with the patches it stood for: a run
that recorded one has those, and answers any later patch as its history
says (it has none of them)."""


class Versions:
    def __init__(self) -> None:
        self._current = False
        self._implied: frozenset[str] = frozenset()

    def start(self) -> None:
        """Call once, at the start of ``run``, before any other command. A
        new run records one marker (``CURRENT``); replaying, a marker the
        history lacks is not recorded, so an older run finds its own."""
        self._current = workflow.patched(CURRENT)
        if self._current:
            return
        for marker, patches in PREVIOUS.items():
            if workflow.patched(marker):
                self._implied = patches
                return

    @property
    def current(self) -> bool:
        """The run was started by this version (it recorded ``CURRENT``): a
        path only it takes needs no patch id of its own, and asking this
        records nothing (safe where a command may not be made)."""
        return self._current

    def marked(self, patch_id: str) -> bool:
        """The run has ``patch_id`` by its combined marker (``CURRENT`` or one
        in ``PREVIOUS``). Asks no marker, so it is safe where a command may
        not be made (a signal handler); False before ``start``, and for a
        patch only its own marker stands for."""
        return self._current or patch_id in self._implied

    def has(self, patch_id: str) -> bool:
        return self._current or patch_id in self._implied or workflow.patched(patch_id)
