"""Publishing events from inside an activity to its workflow's stream.

The workflow publishes the lifecycle events itself; activities add what only
they see (token deltas, tool progress). Both land on the same ``events``
topic as one ordered stream.

Cost scales with batches, not tokens: within a batch, consecutive deltas of
the same content block are merged into one delta, and whatever is still
unsent when the activity ends is returned with its result (``tail``) for the
workflow to publish, so a fast answer costs no signal at all. The first
token of a message is sent after ``FIRST_FLUSH_MS`` so that it reaches the
screen quickly.

Each batch is a signal, and Temporal takes at most 10,000 signals per
workflow execution: a publisher is given a budget of batches
(``max_batches``, from the workflow). It spends half at the configured
interval, then doubles the interval for each half of what is left, so a
stream of any length stays within budget and keeps streaming, more coarsely.
Should the execution refuse a signal all the same (others' signals used up
its 10,000), the publisher stops and what it had not delivered goes back
with the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from types import TracebackType
from typing import Any

from temporalio import activity
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.service import RPCError, RPCStatusCode

from workflows.models import EVENTS_TOPIC, MODEL_CALL_TOPIC, WireModel

logger = logging.getLogger(__name__)

FIRST_FLUSH_MS = 10
# How the server refuses a signal past an execution's 10,000.
SIGNAL_LIMIT_REFUSAL = "exceeded workflow execution limit for signal events"
_MERGEABLE = {"text_delta", "thinking_delta", "toolcall_delta"}


def attempt_budget(max_batches: int | None, attempt: int) -> int | None:
    """The event batches (signals) one attempt of a call may send:
    ``max_batches`` halved for each retry, so that its attempts together
    stay within about twice it, at least one while any is given; 0 sends
    none (everything goes back with the result); None, no bound."""
    if max_batches is None:
        return None
    if max_batches <= 0:
        return 0
    return max(1, max_batches >> (attempt - 1))


def run_stream_client() -> WorkflowStreamClient:
    """The stream client of the workflow run that scheduled this activity.

    Pinned to the run, not the workflow id: a call that outlives its run
    (aborted just before the run continued as new) must not stream into the
    next one. Signals to an ended run are refused (NOT_FOUND), and the
    publisher stops."""
    info, client = activity.info(), activity.client()
    handle = client.get_workflow_handle(info.workflow_id or "", run_id=info.workflow_run_id)
    return WorkflowStreamClient(handle, client=client)


class ActivityEventPublisher:
    """Batches events to the parent workflow's ``events`` topic.

    Use as ``async with ActivityEventPublisher(batch_ms) as events:``; after
    the block, ``tail`` holds the events not sent yet, in order. The flush
    loop is ours rather than the stream client's background flusher: on
    Python 3.11 cancelling that flusher can stall in ``asyncio.wait_for`` for
    seconds, long enough to miss heartbeats. Ours is stopped by a flag.
    """

    def __init__(self, batch_ms: int, max_batches: int | None = None, *, call: str | None = None) -> None:
        """``call``: the model call's mark (``LlmRequest.stream_call``), sent
        with the first batch."""
        # The stream client is made for the first batch sent (most tool calls
        # and short answers send none), in the activity's context as it is
        # now: a first event may be published from a task or callback outside
        # it (a tool's executor thread, say), where the flush loop starts.
        self._context = contextvars.copy_context()
        # The activity's event loop and its thread: a tool may report from a
        # thread of its own (``asyncio.to_thread``, as the README advises for
        # blocking work), where there is no running loop and asyncio's
        # objects must not be touched (its report failed the tool).
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._thread = threading.get_ident()
        self._stream: WorkflowStreamClient | None = None
        self._run_ended = False
        self._call = call
        self._base_interval = max(batch_ms, 1) / 1000
        self._interval = self._base_interval
        self._budget = max_batches
        self.batches = 0
        self._unsent: list[dict[str, Any]] = []  # handed to the stream client, not yet delivered
        self._refused = False  # the execution takes no more signals
        self._buffer: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._urgent = False
        self._closing = False
        self._closed = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.tail: list[dict[str, Any]] = []
        # After the block: events handed to the stream client whose signal
        # failed (not refused for good: it would have retried them on its
        # next round, which a closed publisher does not have).
        self.undelivered: list[dict[str, Any]] = []

    async def __aenter__(self) -> ActivityEventPublisher:
        return self  # the flush loop starts with the first event (most tool calls publish none)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True
        self._closed.set()
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task  # lets a batch being sent arrive first
        if isinstance(exc, Exception) and self._buffer and not self._refused and self._budget != 0:
            # A failing attempt has no result to carry its tail: send it now,
            # or subscribers miss what it said (its ``message_retry``); not
            # with no budget at all (the execution is near its signal limit).
            await self._send()
        # Refused for good, the batches handed to the stream client go back
        # with the result too (another failure may have been delivered).
        refused = self._unsent if self._refused else []
        self.undelivered = [] if self._refused else list(self._unsent)
        self.tail, self._buffer, self._unsent = [*refused, *self._buffer], [], []

    def publish(self, event: WireModel, *, flush: bool = False) -> None:
        """Buffer ``event``; ``flush`` sends the batch soon (first token, progress)."""
        self._buffer_event(event.model_dump(mode="json"), flush)

    def publish_delta(self, delta: dict[str, Any], *, flush: bool = False) -> None:
        """``publish(MessageUpdateEvent(assistant_message_event=delta))`` for a
        delta that is JSON already (the stream's, one per chunk), without
        building and dumping the model."""
        self._buffer_event({"type": "message_update", "assistantMessageEvent": dict(delta)}, flush)

    def _buffer_event(self, event: dict[str, Any], flush: bool) -> None:
        if self._loop is not None and threading.get_ident() != self._thread:
            # From another thread: buffered on the loop's, in order (a call
            # queued before the thread's work is seen to end).
            self._loop.call_soon_threadsafe(self._buffer_event, event, flush)
            return
        if self._budget == 0:  # held for the result, where a call's latest progress will do
            _replace_progress(self._buffer, event)
            return
        _append_merged(self._buffer, event)
        if self._loop_task is None and not self._closing:
            self._loop_task = asyncio.get_running_loop().create_task(self._flush_loop())
        if flush:
            self._urgent = True
            self._wake.set()

    async def _flush_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval)
            if self._closing:
                return
            if self._urgent:
                # A moment for the rest of a fast answer to join the first
                # token; cut short when the activity ends meanwhile (its
                # result carries the batch then).
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), timeout=FIRST_FLUSH_MS / 1000)
                if self._closing:
                    return
            self._wake.clear()
            self._urgent = False
            if self._budget is not None and self.batches >= self._budget:
                return  # out of budget: the rest goes with the result
            await self._send()
            if self._run_ended or self._refused:
                return  # nobody reads on, or no signal more is taken
            self._pace()

    def _pace(self) -> None:
        """Double the interval each time half of the remaining budget is spent."""
        if self._budget is None:
            return
        left, halvings = self._budget, 0
        while self.batches >= self._budget - left // 2 and left > 1:
            left //= 2
            halvings += 1
        self._interval = self._base_interval * 2**halvings

    async def _send(self) -> None:
        batch, self._buffer = self._buffer, []
        if self._run_ended:
            return
        if self._stream is None:
            self._stream = self._context.run(run_stream_client)
        stream = self._stream
        if batch:
            self.batches += 1
            if self._call is not None:  # the first batch says which call it is of
                stream.topic(MODEL_CALL_TOPIC).publish(self._call)
                self._call = None
        topic = stream.topic(EVENTS_TOPIC)
        for event in batch:
            topic.publish(event)
        self._unsent.extend(batch)
        try:
            await stream.flush()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                self._run_ended = True
                logger.info("The run this call published to has ended; its later events are dropped")
                return
            if SIGNAL_LIMIT_REFUSAL in str(err):
                # Someone else's signals used up the execution's 10,000
                # (its own budget keeps a call within them): what is left
                # goes back with the result, which needs no signal.
                self._refused = True
                logger.warning("The workflow takes no more signals; this call's events go with its result")
                return
            # kept pending by the client; retried next round
            logger.warning("Publishing events failed, will retry: %s", err)
        else:
            self._unsent.clear()


def _replace_progress(buffer: list[dict[str, Any]], event: dict[str, Any]) -> None:
    """Append ``event``; a tool call's progress replaces its progress just
    before it (each is the whole partial result so far)."""
    if (
        event.get("type") == "tool_execution_update"
        and buffer
        and buffer[-1].get("type") == "tool_execution_update"
        and buffer[-1].get("toolCallId") == event.get("toolCallId")
    ):
        buffer[-1] = event
        return
    _append_merged(buffer, event)


def _append_merged(buffer: list[dict[str, Any]], event: dict[str, Any]) -> None:
    """Append ``event``, merging a delta into the previous one of the same block."""
    if event.get("type") == "message_update" and buffer and buffer[-1].get("type") == "message_update":
        new, last = event["assistantMessageEvent"], buffer[-1]["assistantMessageEvent"]
        if (
            new.get("type") in _MERGEABLE
            and new.get("type") == last.get("type")
            and new.get("contentIndex") == last.get("contentIndex")
        ):
            last["delta"] = last.get("delta", "") + new.get("delta", "")
            return
    buffer.append(event)
