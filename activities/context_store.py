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
turn writes two blobs whatever its number of messages. The store is a cache
of what the workflow holds: a blob that is gone (or torn, failing its
digest) makes ``load`` raise ``ContextMissing`` and the workflow resend the
context inline, so its files are not fsynced (``runtime/payloads.py``).

Manifests written before segments (a JSON list of per-message digests)
are still read; the next save keeps those messages where they are.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from activities.blobs import BlobMissing, BlobStore, checked_digest, digest_of
from workflows.models import AgentMessage, MessageAdapter

_MESSAGES = TypeAdapter(list[Any])
logger = logging.getLogger(__name__)


class ContextMissing(LookupError):
    """A stored segment or manifest is gone or unreadable (the workflow resends inline)."""


@dataclass(frozen=True)
class Manifest:
    """What a stored context is made of: per-message blobs (manifests of an
    earlier version only), then segments."""

    messages: tuple[str, ...] = ()
    segments: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> bytes:
        return json.dumps({"messages": list(self.messages), "segments": list(self.segments)}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        value = json.loads(data)
        if isinstance(value, list):  # before segments: one digest per message
            return cls(messages=tuple(checked_digest(d) for d in value))
        if not isinstance(value, dict):
            raise ValueError("a manifest is a JSON object")
        return cls(
            messages=tuple(checked_digest(d) for d in value.get("messages", [])),
            segments=tuple(checked_digest(d) for d in value.get("segments", [])),
        )


class ContextStore:
    """Stores segments and manifests; caches what it read or wrote (content never changes)."""

    def __init__(self, blobs: BlobStore, cache_size: int = 20_000) -> None:
        self._blobs = blobs
        self._writing: set[asyncio.Task[None]] = set()
        self._cache: OrderedDict[str, Any] = OrderedDict()  # digest -> message | list[message] | Manifest
        self._cache_size = cache_size

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
            singles, segments = await asyncio.gather(
                asyncio.gather(*(self._message(d) for d in manifest.messages)),
                asyncio.gather(*(self._segment(d) for d in manifest.segments)),
            )
        except (BlobMissing, ValidationError, ValueError) as err:
            raise ContextMissing(
                f"stored context {str(manifest_digest)[:80]} cannot be read: {err}"
            ) from None
        return manifest, [*singles, *(m for segment in segments for m in segment)]

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
        task.add_done_callback(self._writing.discard)
        return digest

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
        segments = manifest.segments
        if messages:
            data = _MESSAGES.dump_json([MessageAdapter.dump_python(m, mode="json") for m in messages])
            segment = digest_of(data)
            if segment not in self._cache:
                blobs[segment] = data
                self._remember(segment, list(messages))
            segments = (*segments, segment)
        new = Manifest(manifest.messages, segments)
        data = new.to_json()
        digest = digest_of(data)
        blobs[digest] = data
        self._remember(digest, new)
        return digest, blobs

    async def _manifest(self, digest: str) -> Manifest:
        cached = self._cached(digest)
        if isinstance(cached, Manifest):
            return cached
        manifest = Manifest.from_json(await self._blobs.get(digest))
        self._remember(digest, manifest)
        return manifest

    async def _segment(self, digest: str) -> list[AgentMessage]:
        cached = self._cached(digest)
        if isinstance(cached, list):
            return cached
        segment = [
            MessageAdapter.validate_python(m) for m in _MESSAGES.validate_json(await self._blobs.get(digest))
        ]
        self._remember(digest, segment)
        return segment

    async def _message(self, digest: str) -> AgentMessage:
        cached = self._cached(digest)
        if cached is not None and not isinstance(cached, list | Manifest):
            return cached  # type: ignore[no-any-return]
        message = MessageAdapter.validate_json(await self._blobs.get(digest))
        self._remember(digest, message)
        return message  # type: ignore[no-any-return]

    def _cached(self, digest: str) -> Any:
        cached = self._cache.get(digest)
        if cached is not None:
            self._cache.move_to_end(digest)
        return cached

    def _remember(self, digest: str, value: Any) -> None:
        self._cache[digest] = value
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
