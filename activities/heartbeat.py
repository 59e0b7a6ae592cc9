"""Heartbeating while an activity body runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity
from temporalio.exceptions import ApplicationError

HEARTBEAT_EVERY = 0.5


@contextlib.asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    """Heartbeat twice a second while the body runs, so a dead worker or an
    abort is noticed within seconds even while the body waits (a silent
    model, a slow tool).

    The first beat comes after ``HEARTBEAT_EVERY``, not at the start: a body
    that ends sooner (a quick tool, a short answer) sends none. Each
    heartbeat the worker sends is a call to the server that updates the
    activity's state: three per tool round at the start of each activity,
    measured at about a millisecond of server CPU per turn (bench/README.md).
    The heartbeat timeout is counted from the activity's start either way.

    Not in a local activity (a tool on the fast path): Temporal takes no
    heartbeats from one (the workflow task that runs it is what times out),
    and in temporalio 1.35 a heartbeat the SDK sends after a local activity
    has completed (it sends them from a task of its own, a moment after
    ``activity.heartbeat()``) blocks the worker's event loop for good in
    ``record_activity_heartbeat``: seen in a benchmark, every conversation
    on that worker stalled."""
    if activity.info().is_local:
        yield
        return

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def retry_reason(info: activity.Info) -> str:
    """Why the attempt before this one failed, as its ``message_retry`` or
    ``tool_execution_retry`` says: the reason that attempt sent in its last
    heartbeat, ``(attempt, reason[, announced])``, as a failing model call
    does; or, when it sent none, that it did not report."""
    details = info.heartbeat_details
    if len(details) in (2, 3) and details[0] == info.attempt - 1 and isinstance(details[1], str):
        return details[1]
    return "its worker stopped, or it ran out of time"


def retry_announced(info: activity.Info) -> bool:
    """The attempt before this one published this attempt's retry event
    itself as it failed (its last heartbeat ``(attempt, reason, True)``)."""
    details = info.heartbeat_details
    return len(details) == 3 and details[0] == info.attempt - 1 and details[2] is True


def will_retry(failure: ApplicationError, info: activity.Info) -> bool:
    """Temporal will run the activity again after ``failure``: it is
    retryable, by its own flag and the retry policy's error types, and the
    policy has attempts left (a local activity's retries are the workflow
    task's: not counted here). An abort may still cancel that retry."""
    policy = info.retry_policy
    if info.is_local or failure.non_retryable or policy is None:
        return False
    if failure.type is not None and failure.type in (policy.non_retryable_error_types or ()):
        return False
    return policy.maximum_attempts == 0 or info.attempt < policy.maximum_attempts
