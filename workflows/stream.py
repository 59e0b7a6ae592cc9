"""The conversation's event stream (topic ``events`` of a Workflow Stream),
as the workflow sees it.

Besides publishing, the shell needs to know three things the stream does
not tell through its Python API: the current offset, how far live
subscribers have read (to let them read the last events before the
conversation completes), and how many signals and updates this execution
has taken (Temporal refuses more than 10,000 signals per execution, and
every batch an activity publishes is one). All three come through the
stream's registered handlers, looked up and wrapped with the public
``workflow.get_*_handler`` / ``set_*_handler`` API under the stream's wire
protocol names, which its clients rely on as well. If a future SDK
registers other names, ``tracking`` is False: the stream still works,
subscribers are not tracked and the linger before completing becomes a
plain short timer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError
from temporalio import workflow
from temporalio.contrib.workflow_streams import (
    PollInput,
    PollResult,
    PublishInput,
    WorkflowStream,
    WorkflowStreamState,
)
from temporalio.exceptions import ApplicationError

from workflows.arguments import MAX_NESTING, nesting_depth
from workflows.contract import (  # the stream's wire names, which its clients use too
    BUSY_ERROR,
    DRAINING_ERROR,
    OFFSET_QUERY,
    POLL_UPDATE,
    PUBLISH_SIGNAL,
    RUN_END_UPDATE,
    item_payload,
)
from workflows.inputs import refusal
from workflows.models import EVENTS_TOPIC, MODEL_CALL_TOPIC, AssistantMessage, WireModel

# Temporal admits at most 10 updates in flight per workflow (server setting
# ``history.maxInFlightUpdates``) and refuses the next ones, `prompt` and
# `approve_tool` included; a caught-up subscriber's long poll, and its wait
# for the run's end, each hold one until an event comes. So at most this
# many reads wait at once: a subscriber past them reads by query (client.py).
MAX_WAITING_READS = 5

# How long a conversation about to complete waits for its live subscribers
# to read the last events (a subscriber polls again within its cooldown,
# 200 ms by default). Without it a subscriber that was between polls reads
# the tail by query, which replays the whole history on a worker.
SUBSCRIBER_GRACE = timedelta(seconds=1)
# Without subscriber tracking: two poll cooldowns.
UNTRACKED_GRACE = timedelta(milliseconds=200)
# How many model call attempts' publishers the workflow remembers (each a few dozen bytes).
_PUBLISHERS_REMEMBERED = 256
# The most of the event stream (its items as sent, base64) a continue-as-new carries.
STREAM_BYTES_CARRIED = 4 * 1024 * 1024


class EventStream:
    """Publishes events, reports the offset, tracks subscribers and counts
    the signals and updates this execution has taken."""

    def __init__(
        self, prior_state: WorkflowStreamState | None, closed_publishers: Iterable[str] = ()
    ) -> None:
        # WorkflowStream must be built from an ``__init__`` called by
        # ``@workflow.init``: this is one.
        self._stream = WorkflowStream(prior_state=prior_state)
        self._events = self._stream.topic(EVENTS_TOPIC)
        self._offset_query: Callable[[], int] | None = workflow.get_query_handler(OFFSET_QUERY)
        self.polled = False  # a subscriber polled during this execution
        self.delivered = 0  # the furthest offset a poll has returned
        self.signals = 0
        self.updates = 0
        self.tracking = False
        self._detached = False
        self.model_call_offset: int | None = None  # where the model call in progress started
        self.model_call: str | None = None  # the mark of the model call in progress
        self._model_calls = 0  # model calls started by this execution
        self._model_publishers: dict[str, None] = {}  # in arrival order (a set's varies by process)
        # Publishers whose batches are dropped: aborted model calls'.
        self._closed_publishers: deque[str] = deque(maxlen=64)
        # Those of the run before (their late batches may reach this run),
        # dropped only by a run with DROP_CARRIED_PUBLISHERS_PATCH
        # (``drop_carried``): a run an older worker recorded published
        # them, and must replay so.
        self._carried_closed = tuple(closed_publishers)  # in order: carried on as written
        self.drop_carried: Callable[[], bool] = lambda: False  # set by the workflow
        self._publisher_calls: dict[str, str] = {}  # publisher -> the model call it marked
        self.run_active: Callable[[], bool] = lambda: False  # set by the workflow
        self._waiting_reads = 0  # polls and run-end waits in their handlers
        self._run_end: int | None = None  # the offset just past the last agent_end published

    def track(self) -> None:
        """Count the signals this execution takes and track how far live
        subscribers have read. Called once, from ``@workflow.init`` (a poll
        may come with the first activation); a handler not where the
        stream's protocol says is left as it is."""
        publish = workflow.get_signal_handler(PUBLISH_SIGNAL)
        if publish is not None:

            def on_publish(*args: Any) -> None:
                # Untyped (varargs): a signal with no argument, two or a
                # value of another shape is dropped here, not a failed task.
                self.signals += 1
                payload = _publish_input(args)
                if payload is None:
                    workflow.logger.warning("Dropped a publish signal without a PublishInput")
                    return
                publisher = payload.publisher_id
                if publisher and (
                    publisher in self._closed_publishers
                    or (publisher in self._carried_closed and self.drop_carried())
                ):
                    return  # late deltas of an aborted model call, after its aborted message
                payload = self._take_call_mark(payload)
                call = self._publisher_calls.get(publisher)
                if call is not None and call != self.model_call:
                    # An attempt of an ended (aborted) call that had sent
                    # nothing before the abort: a retry on another worker,
                    # or a first token that came just after.
                    self._closed_publishers.append(publisher)
                    return
                if publisher and self.model_call_offset is not None:
                    # While the model is called nothing else publishes: this is its activity.
                    self._model_publishers[publisher] = None
                try:
                    publish(payload)
                except Exception as err:  # items that do not decode: anyone may signal, nobody may wedge it
                    workflow.logger.warning("Dropped a publish signal whose items do not decode: %s", err)

            workflow.set_signal_handler(PUBLISH_SIGNAL, on_publish)
        poll = workflow.get_update_handler(POLL_UPDATE)
        if poll is None or self._offset_query is None:
            return
        self.tracking = True

        async def on_poll(payload: PollInput) -> PollResult:
            self.polled = True
            self.updates += 1
            with self._waiting():
                result: PollResult = await poll(payload)
            self.delivered = max(self.delivered, result.next_offset)
            return result

        def validate_poll(payload: PollInput | None = None) -> None:
            if not isinstance(payload, PollInput):  # anyone may send one: `null` must not wedge it
                raise refusal("A stream poll takes a PollInput object.")
            self._refuse_if_detached()
            if payload.from_offset >= self.offset():  # it would wait (one behind is answered at once)
                self._refuse_if_busy()

        workflow.set_update_handler(POLL_UPDATE, on_poll, validator=validate_poll)

        async def on_run_end(from_offset: int) -> int | None:
            """The offset just past the ``agent_end`` of the run in progress
            at ``from_offset``, once it is published; None when released
            for continue-as-new. Its answer carries no events (its result
            stays in the history): the subscriber reads them by poll. Why:
            a busy stream is read after cooldowns, so without it the end
            would reach a subscriber up to a cooldown late (client.py)."""
            self.updates += 1
            with self._waiting():
                await workflow.wait_condition(lambda: self._detached or (self._run_end or 0) > from_offset)
            return None if self._detached else self._run_end

        def validate_run_end(from_offset: int | None = None) -> None:
            self._refuse_if_detached()
            if not isinstance(from_offset, int) or isinstance(from_offset, bool) or from_offset < 0:
                raise refusal("from_offset must be an offset (a whole number >= 0).")
            if not self.run_active() and (self._run_end or 0) <= from_offset:
                raise ApplicationError("No run is in progress", type="NoRun")
            self._refuse_if_busy()

        # Released by ``detach_pollers``, which comes before continue-as-new and completion.
        workflow.set_update_handler(RUN_END_UPDATE, on_run_end, validator=validate_run_end)

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        """Counts a read waiting in its handler (``MAX_WAITING_READS``)."""
        self._waiting_reads += 1
        try:
            yield
        finally:
            self._waiting_reads -= 1

    def _refuse_if_busy(self) -> None:
        if self._waiting_reads >= MAX_WAITING_READS:
            raise ApplicationError(
                f"{MAX_WAITING_READS} reads of the stream are waiting already: read by query",
                type=BUSY_ERROR,
                non_retryable=True,
            )

    def _refuse_if_detached(self) -> None:
        if self._detached:
            raise ApplicationError("Workflow pollers are detached for continue-as-new", type=DRAINING_ERROR)

    def publish(self, event: WireModel | dict[str, Any]) -> None:
        self._events.publish(event)
        if getattr(event, "type", None) == "agent_end":
            self._run_end = self.offset()

    def offset(self) -> int:
        """The stream's global offset: where the next event will be."""
        if self._offset_query is not None:
            return self._offset_query()
        state = self._stream.get_state()
        return state.base_offset + len(state.log)

    def events_since(self, offset: int) -> list[dict[str, Any]]:
        """The retained events from ``offset`` on, decoded (for queries)."""
        read = workflow.get_query_handler(POLL_UPDATE)
        if read is None:
            return []
        events: list[dict[str, Any]] = []
        converter = workflow.payload_converter()
        while True:
            batch: PollResult = read(PollInput(topics=[EVENTS_TOPIC], from_offset=offset))
            for item in batch.items:
                try:
                    events.append(converter.from_payloads([item_payload(item.data)])[0])
                except Exception:  # not an event this project published (a forged signal): skipped
                    continue
            if not batch.more_ready or batch.next_offset <= offset:
                return events
            offset = batch.next_offset

    def model_call_started(self) -> None:
        self.model_call_offset = self.offset()
        self._model_calls += 1
        self.model_call = f"{workflow.info().run_id}/{self._model_calls}"
        self._model_publishers = {}

    def model_call_ended(self, *, aborted: bool = False) -> None:
        """``aborted``: the call's activity may still publish for a moment
        (until it hears of the cancel); what it sends from now is dropped."""
        if aborted:
            self._closed_publishers.extend(self._model_publishers)
        self.model_call_offset = None
        self.model_call = None
        self._model_publishers = {}

    def closed_publishers(self) -> list[str]:
        """The publishers whose batches are dropped, for the next run."""
        return [*self._carried_closed, *self._closed_publishers][-64:]

    def _take_call_mark(self, payload: PublishInput) -> PublishInput:
        """``payload`` without its model call mark (``MODEL_CALL_TOPIC``),
        noting which call its publisher belongs to."""
        marks = [entry for entry in payload.items if entry.topic == MODEL_CALL_TOPIC]
        if not marks:
            return payload
        try:
            call = workflow.payload_converter().from_payloads([item_payload(marks[-1].data)])[0]
        except Exception:  # not a mark this project sent
            call = None
        if isinstance(call, str) and payload.publisher_id:
            if len(self._publisher_calls) >= _PUBLISHERS_REMEMBERED:
                del self._publisher_calls[next(iter(self._publisher_calls))]
            self._publisher_calls[payload.publisher_id] = call
        items = [entry for entry in payload.items if entry.topic != MODEL_CALL_TOPIC]
        return dataclasses.replace(payload, items=items)

    def streamed_message(
        self, *, retry_drops: bool = True, tool_arguments: bool = False
    ) -> AssistantMessage | None:
        """The assistant message the model call in progress has published so
        far (``retry_drops=False``: a retry keeps the message of the attempt
        before, emptied, as before the stream-events-as-pi patch;
        ``tool_arguments``: with the arguments of tool calls still
        streaming read so far, for the ``state`` query)."""
        if self.model_call_offset is None:
            return None
        return partial_message(
            self.events_since(self.model_call_offset), retry_drops=retry_drops, tool_arguments=tool_arguments
        )

    def detach_pollers(self) -> None:
        """Release waiting subscribers and refuse new polls (before
        continue-as-new or completing)."""
        self._detached = True
        self._stream.detach_pollers()

    def state_for_carry(self, keep: int) -> WorkflowStreamState:
        """The stream's state, keeping the last ``keep`` events, and of
        those only the newest ``STREAM_BYTES_CARRIED`` (the last one always):
        events of tool calls with megabytes of arguments would otherwise make
        the next run's input too large to read (subscribers behind read on
        from the oldest kept)."""
        self._stream.truncate(max(0, self.offset() - keep))
        state = self._stream.get_state()
        start = len(state.log) - 1  # the last event, whatever its size
        carried = len(state.log[start].data) if state.log else 0
        while start > 0 and carried + len(state.log[start - 1].data) <= STREAM_BYTES_CARRIED:
            start -= 1
            carried += len(state.log[start].data)
        if start <= 0:
            return state
        return dataclasses.replace(state, log=state.log[start:], base_offset=state.base_offset + start)

    def all_read(self) -> bool:
        return not self.polled or self.delivered >= self.offset()


_PUBLISH_INPUT: TypeAdapter[PublishInput] = TypeAdapter(PublishInput)


def _publish_input(args: tuple[Any, ...]) -> PublishInput | None:
    """The one PublishInput of a publish signal's arguments, or None."""
    if len(args) != 1:
        return None
    value = args[0]
    if isinstance(value, PublishInput):
        return value
    if not isinstance(value, dict):
        return None
    try:
        return _PUBLISH_INPUT.validate_python(value)
    except ValidationError:
        return None


def partial_message(
    events: list[dict[str, Any]], *, retry_drops: bool = True, tool_arguments: bool = False
) -> AssistantMessage | None:
    """The assistant message being streamed, rebuilt from its deltas: the
    last assistant ``message_start`` and the updates after it (a retry
    starts the message over). None when no message is streaming. A tool
    call whose arguments are still streaming has ``{}``, or with
    ``tool_arguments`` what reads of them so far (as pi's partial message)."""
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    streaming_arguments: dict[int, str] = {}
    # Any client can signal events onto the stream: one of another shape is
    # passed over, and a message that does not validate is no message.
    for event in events:
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        if kind == "message_start":
            started = event.get("message")
            if isinstance(started, dict) and started.get("role") == "assistant":
                message, blocks, streaming_arguments = dict(started), {}, {}
        elif kind == "message_retry" and not retry_drops:
            blocks, streaming_arguments = {}, {}
        elif kind in ("message_retry", "message_end"):  # a retry drops the partial message
            message = None
        elif kind == "message_update" and message is not None:
            update = event.get("assistantMessageEvent")
            if isinstance(update, dict):
                _fold(blocks, streaming_arguments, update)
    if message is None:
        return None
    if tool_arguments:
        for index, text in streaming_arguments.items():
            if blocks.get(index, {}).get("type") == "toolCall":
                blocks[index]["arguments"] = partial_arguments(text)
    message["content"] = [blocks[i] for i in sorted(blocks)]
    try:
        return AssistantMessage.model_validate(message)
    except ValidationError:
        return None


def _fold(
    blocks: dict[int, dict[str, Any]], streaming_arguments: dict[int, str], update: dict[str, Any]
) -> None:
    kind, index = update.get("type", ""), update.get("contentIndex", 0)
    if not isinstance(index, int) or isinstance(index, bool) or not isinstance(update.get("delta", ""), str):
        return
    if kind == "text_start":
        blocks[index] = {"type": "text", "text": ""}
    elif kind == "thinking_start":
        blocks[index] = {"type": "thinking", "thinking": ""}
    elif kind == "toolcall_start":
        blocks[index] = {"type": "toolCall", "id": update.get("id", ""), "name": update.get("toolName", "")}
        streaming_arguments[index] = ""
    elif kind == "text_delta" and index in blocks:
        blocks[index]["text"] = blocks[index].get("text", "") + update.get("delta", "")
    elif kind == "thinking_delta" and index in blocks:
        blocks[index]["thinking"] = blocks[index].get("thinking", "") + update.get("delta", "")
    elif kind == "toolcall_delta" and index in streaming_arguments:
        streaming_arguments[index] += update.get("delta", "")
    elif kind == "toolcall_end" and isinstance(update.get("toolCall"), dict):
        blocks[index] = update["toolCall"]
        streaming_arguments.pop(index, None)


# How many prefixes of streaming arguments are tried, last first, before ``{}``.
_PARTIAL_TRIES = 16
# Longer streaming arguments read as ``{}`` until they end (a query's time).
_PARTIAL_MAX_CHARS = 1_000_000


def partial_arguments(text: str) -> dict[str, Any]:
    """A tool call's arguments as far as they have streamed (pi's
    ``parseStreamingJson``): the JSON so far with its open string, arrays
    and objects closed, and a key or value not finished yet left out;
    ``{}`` while nothing of it reads as an object (or past a million
    characters, or nested deeper than the workflow reads arguments)."""
    if not text.strip() or len(text) > _PARTIAL_MAX_CHARS:
        return {}
    with contextlib.suppress(ValueError, RecursionError):
        whole = json.loads(text)
        return whole if isinstance(whole, dict) and nesting_depth(whole) <= MAX_NESTING else {}
    closers = ""  # of the open arrays and objects, innermost first
    ends: deque[tuple[int, str]] = deque(maxlen=_PARTIAL_TRIES)  # where a prefix may end, its closers
    in_string = escaped = False
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                ends.append((i + 1, closers))
        elif char == '"':
            in_string = True
        elif char in "{[":
            closers = ("}" if char == "{" else "]") + closers
            if len(closers) > MAX_NESTING:
                return {}
            ends.append((i + 1, closers))
        elif char in "}]":
            closers = closers[1:]
            ends.append((i + 1, closers))
        elif char not in " \t\r\n,:":
            ends.append((i + 1, closers))  # a number or literal so far
    if in_string:  # a string value so far, closed (a key so far reads as nothing)
        ends.append((len(text) - escaped, '"' + closers))
    for end, closing in reversed(ends):
        try:
            value = json.loads(text[:end] + closing)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return {}
