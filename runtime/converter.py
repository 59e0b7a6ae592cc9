"""The payload converter: pydantic's JSON converter, with JSON that cannot
be decoded (nested deeper than the parser allows, not JSON at all) turned
into an ``ApplicationError`` instead of an arbitrary exception. JSON that
pydantic's strict parser refuses but the standard library reads (a lone
surrogate escape such as ``"\\ud800"``, which other languages' encoders
write) is read by the standard library; the workflow cleans such text.

Why: the SDK fails the workflow task (and retries it forever) when it
cannot decode a workflow's start input, but it lets an ``ApplicationError``
from the converter through as is, which fails the workflow with that
sentence: a defined end instead of a wedged conversation. A signal it
cannot decode is dropped with a log line, an update is refused.

The same holds for a payload the codec refused (a decompression bomb, a
payload that does not decrypt): the codec hands on a ``binary/refused``
payload carrying the reason, and this converter refuses it with that
sentence.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
    JSONPlainPayloadConverter,
)
from temporalio.exceptions import ApplicationError

READING_CARRY: contextvars.ContextVar[bool] = contextvars.ContextVar("agent_reading_carry", default=False)
"""Set while a worker decodes the arguments of a run its conversation's
own continue-as-new started (``runtime/payload_walk.py``; not a retry's or
a cron schedule's, which start from the client's input): the workflow's
state, written by a worker that held it in memory, read without the
decompression bound. A transcript or queues past the bound failed the
next run for good."""


class DecodeBudget:
    """What the payloads read together (one codec server request) may still
    decompress to; their decompression takes turns, so the bound holds
    whatever is fetched at once."""

    def __init__(self, left: int) -> None:
        self.left = left
        self.turn = asyncio.Lock()


DECODE_BUDGET: contextvars.ContextVar[DecodeBudget | None] = contextvars.ContextVar(
    "agent_decode_budget", default=None
)


UNCOMPRESSED_KEY = "compression"
UNCOMPRESSED = b"none"
"""Metadata of a control payload (a model class with ``uncompressed``: the
``state`` query, the settings in force, a prompt's receipt) that the codec
never compresses (``CompressionCodec``); one past the storage threshold
still moves to the payload store, as any payload."""


class _DecodeSafeJSONConverter(PydanticJSONPlainPayloadConverter):
    def to_payload(self, value: Any) -> Payload | None:
        payload = super().to_payload(value)
        if payload is not None and getattr(type(value), "uncompressed", False) is True:
            payload.metadata[UNCOMPRESSED_KEY] = UNCOMPRESSED
        return payload

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        try:
            return super().from_payload(payload, type_hint)
        except ValidationError as err:
            problem = next((e for e in err.errors() if e.get("type") == "json_invalid"), None)
            if problem is None:
                raise  # a value of the wrong type: the caller's to report
        try:
            value = json.loads(payload.data)
        except (ValueError, RecursionError):
            raise ApplicationError(
                f"A payload is not JSON this agent can read: {problem.get('msg')}. "
                "Send plain JSON nested at most 64 levels deep.",
                type="PayloadDecodeError",
                non_retryable=True,
            ) from None
        return value if type_hint in (None, Any) else TypeAdapter(type_hint).validate_python(value)


REFUSED = b"binary/refused"
_REASON_CHARS = 500


class PayloadUnreadable(Exception):
    """A payload the conversation's history holds and this worker cannot
    read now (a key removed too early, a stored payload gone, a lower
    decompression limit), raised while decoding a workflow task that
    replays history (``runtime/payload_walk.py``): the SDK fails the task
    (retried) with this sentence, and the conversation goes on once the
    worker can read it. Refused as a value, it failed the replayed workflow
    (or an accepted update) where the history went on, and the task failed
    with a nondeterminism error that hid the reason (found by a storage
    audit)."""


def refused_reason(payload: Payload) -> str | None:
    """The reason of a payload a codec refused (``refused_payload``), else None."""
    if payload.metadata.get("encoding") != REFUSED:
        return None
    return payload.data.decode(errors="replace")[:_REASON_CHARS].rstrip(".")


def refused_payload(reason: str) -> Payload:
    """What a codec hands on instead of a payload it will not decode.

    ``reason`` completes the sentence "A payload ..." ("decompresses to more
    than ..."). Raising in a codec would fail the workflow task, and the
    task would fail again on every retry (a wedged conversation); this
    marker goes on to the payload converter instead, which refuses it with
    the reason (``_RefusedPayloadConverter``): a signal carrying it is dropped,
    an update refused, a start input fails the workflow with that sentence,
    and the codec server answers 422 with it.
    """
    return Payload(metadata={"encoding": REFUSED}, data=reason.encode())


class _RefusedPayloadConverter(EncodingPayloadConverter):
    """Reads a payload the codec refused: it raises the codec's reason."""

    @property
    def encoding(self) -> str:
        return REFUSED.decode()

    def to_payload(self, value: Any) -> Payload | None:
        return None  # never chosen to write a value

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        raise ApplicationError(
            f"A payload {refused_reason(payload)}.", type="PayloadRefused", non_retryable=True
        )


# One instance for every AgentPayloadConverter: the SDK makes a payload
# converter per serialization context (several per workflow task), and each
# JSON converter keeps its own cache of pydantic TypeAdapters (building one
# takes about a millisecond); shared, the cache is warm. Its methods keep no
# other state.
_JSON = None


def _json_converter() -> Any:
    global _JSON
    if _JSON is None:
        _JSON = _DecodeSafeJSONConverter()
    return _JSON


class AgentPayloadConverter(CompositePayloadConverter):
    """``PydanticPayloadConverter`` with decode failures made explicit."""

    def __init__(self) -> None:
        # The SDK constructs one for each converter it derives (twice per
        # workflow activation at least); the table of converters is built once
        # and shared (the SDK replaces it, never changes it in place).
        self.converters = _converters()

    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[type] | None = None) -> list[Any]:
        """As the SDK's, but a payload in an encoding nobody here reads (none,
        an unknown one, protobuf without its type, ``binary/null`` with data)
        is refused with an ``ApplicationError``, as a JSON decode failure is:
        a start input so encoded fails the conversation with a sentence
        instead of failing its workflow task forever."""
        try:
            return super().from_payloads(payloads, type_hints)
        except (ApplicationError, ValidationError):
            raise  # already a sentence, or a value of the wrong type: the caller's to report
        except Exception as err:
            encodings = sorted({_encoding(p) for p in payloads})
            raise ApplicationError(
                f"A payload could not be read (encoding {', '.join(e or 'none' for e in encodings)}: "
                f"{str(err.__cause__ or err)[:200]}). Send plain JSON (json/plain).",
                type="PayloadDecodeError",
                non_retryable=True,
            ) from None


def _encoding(payload: Payload) -> str:
    return payload.metadata.get("encoding", b"").decode(errors="replace")[:40]


_CONVERTERS: Any = None


def _converters() -> Any:
    global _CONVERTERS
    if _CONVERTERS is None:
        json_converter = _json_converter()
        _CONVERTERS = CompositePayloadConverter(
            *(
                json_converter if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            ),
            _RefusedPayloadConverter(),
        ).converters
    return _CONVERTERS
