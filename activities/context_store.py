"""Content-addressed storage of conversation context for the LLM activity.

The model needs the whole transcript every turn, but the workflow history
must not carry it every turn (that makes history grow with the square of the
turns). So the messages each model call adds are stored once, as one
*segment* (a JSON list of messages) under the sha256 of its content, in the
blob store beside the external payloads (``AGENT_STORAGE``); a *manifest*
names a whole context (its segments, in order). The workflow passes the
last manifest's digest plus the messages added since; the activity rebuilds
the context, stores the new messages and its answer as one segment, and
returns the new manifest's digest. History per turn stays constant, and a
turn writes two blobs whatever its number of messages (a third when
segments merge, below). The store is a cache
of what the workflow holds: a blob that is gone (or torn, failing its
digest) makes ``load`` raise ``ContextMissing`` and the workflow resend the
context inline, so its files are not fsynced (``runtime/payloads.py``).

A manifest lists one segment per model call at first. Listing them all
made each call write a manifest that grew with the conversation, and the
store's bytes grow with the square of its calls (by call 2,000 a manifest
of ~134 KB, ~134 MB of manifests in all), and a cold read one request per
call. So segments merge as a counter's digits carry: whenever the last
``MERGE_FANOUT`` segments span the same number of calls, they are written
again as one segment spanning all of them (the manifest's ``spans``). A
manifest then lists at most ``MERGE_FANOUT - 1`` segments per power of
``MERGE_FANOUT`` calls (45 at 2,000 calls), and each message is written
once per level (three times at 2,000 calls). Segments merge only when
this worker holds all of them (it has just read the context); a segment
too large for the cache stays as it is. ``spans`` is advisory: a reader
that ignores it (an earlier version) reads the same context.

Manifests written before segments (a JSON list of per-message digests)
are still read; the next save keeps those messages where they are.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from activities.blobs import BlobMissing, BlobStore, checked_digest, digest_of
from workflows.models import AgentMessage, MessageAdapter

_MESSAGES = TypeAdapter(list[Any])
MERGE_FANOUT = 16  # segments that merge into one (see the module)
# What the cache keeps parsed, counted as stored (JSON). Parsed messages take
# 1.5-2.5x that in memory (measured: long texts nearer 1.5x), and once sent
# to the model ~1x more (their JSON as sent, activities/model_http.py). When only
# entries were counted, 20,000 segments holding a 20 KB tool output each
# kept ~330 MB of a worker's memory for good. AGENT_CONTEXT_CACHE_MB sets
# it for the worker.
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
logger = logging.getLogger(__name__)


class ContextMissing(LookupError):
    """A stored segment or manifest is gone or unreadable (the workflow resends inline)."""


@dataclass(frozen=True)
class Manifest:
    """What a stored context is made of: per-message blobs (manifests of an
    earlier version only), then segments."""

    messages: tuple[str, ...] = ()
    segments: tuple[str, ...] = field(default_factory=tuple)
    spans: tuple[int, ...] = ()  # model calls per segment; () or a wrong length: one each

    def segment_spans(self) -> tuple[int, ...]:
        if len(self.spans) == len(self.segments):
            return self.spans
        return (1,) * len(self.segments)

    def to_json(self) -> bytes:
        value: dict[str, Any] = {"messages": list(self.messages), "segments": list(self.segments)}
        if any(span != 1 for span in self.segment_spans()):
            value["spans"] = list(self.segment_spans())
        return json.dumps(value).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        value = json.loads(data)
        if isinstance(value, list):  # before segments: one digest per message
            return cls(messages=tuple(checked_digest(d) for d in value))
        if not isinstance(value, dict):
            raise ValueError("a manifest is a JSON object")
        spans = value.get("spans")
        if not isinstance(spans, list) or not all(type(n) is int and n > 0 for n in spans):
            spans = []  # advisory only (merging): anything else reads as one call each
        return cls(
            messages=tuple(checked_digest(d) for d in value.get("messages", [])),
            segments=tuple(checked_digest(d) for d in value.get("segments", [])),
            spans=tuple(spans),
        )


class ContextStore:
    """Stores segments and manifests; caches what it read or wrote (content never changes)."""

    def __init__(
        self, blobs: BlobStore, cache_size: int = 20_000, cache_bytes: int = DEFAULT_CACHE_BYTES
    ) -> None:
        """``cache_size`` entries at most, and at most ``cache_bytes`` of
        them as stored (JSON): the least recently used go first."""
        self._blobs = blobs
        self._writing: set[asyncio.Task[None]] = set()
        # digest -> the background write that puts it in the store
        self._pending: dict[str, asyncio.Task[None]] = {}
        # digest -> (message | list[message] | Manifest, its stored size in bytes)
        self._cache: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._cached_bytes = 0

    async def load(self, manifest_digest: str) -> tuple[Manifest, list[AgentMessage]]:
        """The manifest and the messages it names; ``ContextMissing`` if any
        part is gone or unreadable (a digest that is not one included)."""
        try:
            manifest = await self._manifest(checked_digest(manifest_digest))
            cached = [self._cached(d) for d in manifest.segments] if not manifest.messages else []
            if cached and all(isinstance(c, list) for c in cached):
                # This worker wrote or read them all (a conversation staying on
                # one worker): no task per segment.
                return manifest, [m for segment in cached for m in segment]
            # Read cold (a new worker, or one whose cache let them go): the
            # parts not cached here, in one request to the store. What is
            # cached is taken first: the read lets other calls run, which may
            # push it out of the cache meanwhile.
            singles = {d: self._cached(d) for d in manifest.messages}
            segments = {d: self._cached(d) for d in manifest.segments}
            need_singles = [d for d, m in singles.items() if not _is_message(m)]
            need_segments = [d for d, segment in segments.items() if not isinstance(segment, list)]
            read = await self._read_many(list(dict.fromkeys(need_singles + need_segments)))
            singles.update((d, self._parsed_message(d, read[d])) for d in need_singles)
            segments.update((d, self._parsed_segment(d, read[d])) for d in need_segments)
        except (BlobMissing, ValidationError, ValueError) as err:
            raise ContextMissing(
                f"stored context {str(manifest_digest)[:80]} cannot be read: {err}"
            ) from None
        return manifest, [
            *(singles[d] for d in manifest.messages),
            *(m for d in manifest.segments for m in segments[d]),
        ]

    async def save(self, manifest: Manifest, messages: list[AgentMessage]) -> str:
        """Store ``messages`` as one segment after ``manifest``; the new manifest's digest."""
        digest, blobs = self._encode(manifest, messages)
        await self._blobs.put_many(blobs)
        return digest

    def save_soon(self, manifest: Manifest, messages: list[AgentMessage]) -> str:
        """``save``, with the writes left to a background task: the digest
        comes back at once. This worker reads the new context from its cache;
        another worker that finds it not yet written (or never, if the write
        failed) gets ``ContextMissing`` and the workflow sends the context
        inline, as for any lost context. Saves ~2 ms a model call."""
        digest, blobs = self._encode(manifest, messages)
        task = asyncio.get_running_loop().create_task(self._write(blobs))
        self._writing.add(task)
        self._pending.update(dict.fromkeys(blobs, task))
        task.add_done_callback(functools.partial(self._written, list(blobs)))
        return digest

    def _written(self, digests: list[str], task: asyncio.Task[None]) -> None:
        self._writing.discard(task)
        for digest in digests:
            if self._pending.get(digest) is task:
                del self._pending[digest]

    async def _read(self, digest: str) -> bytes:
        return (await self._read_many([digest]))[digest]

    async def _read_many(self, digests: list[str]) -> dict[str, bytes]:
        """Blobs from the store, once this worker's own writes of them (if
        any is under way) have ended: a segment too large for the cache is
        read back by the next model call, which may come first."""
        if not digests:
            return {}
        writing = {self._pending[d] for d in digests if d in self._pending}
        for task in writing:
            await asyncio.shield(task)  # never raises: ``_write`` logs a failure
        return await self._blobs.get_many(digests)

    async def _write(self, blobs: dict[str, bytes]) -> None:
        try:
            await self._blobs.put_many(blobs)
        except Exception as err:  # the context is cached here; elsewhere it is resent inline
            logger.warning("Storing context failed: %s", err)

    async def flush(self) -> None:
        """Wait for the background writes (tests, shutdown)."""
        while self._writing:
            await asyncio.gather(*list(self._writing), return_exceptions=True)

    def _encode(self, manifest: Manifest, messages: list[AgentMessage]) -> tuple[str, dict[str, bytes]]:
        blobs: dict[str, bytes] = {}
        segments, spans = list(manifest.segments), list(manifest.segment_spans())
        if messages:
            segments.append(self._segment_blob(list(messages), blobs))
            spans.append(1)
            self._merge_tail(segments, spans, blobs)
        new = Manifest(manifest.messages, tuple(segments), tuple(spans))
        data = new.to_json()
        digest = digest_of(data)
        blobs[digest] = data
        self._remember(digest, new, len(data))
        return digest, blobs

    def _segment_blob(self, messages: list[AgentMessage], blobs: dict[str, bytes]) -> str:
        """The digest of a segment of ``messages``, added to ``blobs`` unless held here already."""
        data = _MESSAGES.dump_json([MessageAdapter.dump_python(m, mode="json") for m in messages])
        segment = digest_of(data)
        if segment not in self._cache:
            blobs[segment] = data
            self._remember(segment, messages, len(data))
        return segment

    def _merge_tail(self, segments: list[str], spans: list[int], blobs: dict[str, bytes]) -> None:
        """Merge the last ``MERGE_FANOUT`` segments while they span alike (see the module)."""
        while len(spans) >= MERGE_FANOUT and len(set(spans[-MERGE_FANOUT:])) == 1:
            parts = [self._cached(d) for d in segments[-MERGE_FANOUT:]]
            if not all(isinstance(part, list) for part in parts):
                return  # one is not held here (too large to cache): they stay as they are
            merged = self._segment_blob([m for part in parts for m in part], blobs)
            span = spans[-1] * MERGE_FANOUT
            del segments[-MERGE_FANOUT:], spans[-MERGE_FANOUT:]
            segments.append(merged)
            spans.append(span)

    async def _manifest(self, digest: str) -> Manifest:
        cached = self._cached(digest)
        if isinstance(cached, Manifest):
            return cached
        data = await self._read(digest)
        manifest = Manifest.from_json(data)
        self._remember(digest, manifest, len(data))
        return manifest

    def _parsed_segment(self, digest: str, data: bytes) -> list[AgentMessage]:
        segment = [MessageAdapter.validate_python(m) for m in _MESSAGES.validate_json(data)]
        self._remember(digest, segment, len(data))
        return segment

    def _parsed_message(self, digest: str, data: bytes) -> AgentMessage:
        message: AgentMessage = MessageAdapter.validate_json(data)
        self._remember(digest, message, len(data))
        return message

    def _cached(self, digest: str) -> Any:
        cached = self._cache.get(digest)
        if cached is None:
            return None
        self._cache.move_to_end(digest)
        return cached[0]

    def _remember(self, digest: str, value: Any, size: int) -> None:
        """Keep ``value`` (``size`` bytes as stored), the least recently
        used going first past either bound. One larger than the whole byte
        bound is not kept: it is read from the blob store when needed."""
        if size > self._cache_bytes:
            return
        previous = self._cache.pop(digest, None)
        if previous is not None:
            self._cached_bytes -= previous[1]
        self._cache[digest] = (value, size)
        self._cached_bytes += size
        while len(self._cache) > self._cache_size or self._cached_bytes > self._cache_bytes:
            _, (_, dropped) = self._cache.popitem(last=False)
            self._cached_bytes -= dropped


def _is_message(cached: Any) -> bool:
    """Whether a cache entry is a single message (not a segment, a manifest or nothing)."""
    return cached is not None and not isinstance(cached, list | Manifest)
