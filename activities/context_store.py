"""Content-addressed storage of conversation context for the LLM activity.

The model needs the whole transcript every turn, but the workflow history
must not carry it every turn (that makes history grow with the square of the
turns). So each message is stored once, under the sha256 of its JSON, in the
same place as external payloads (``AGENT_STORAGE``); a *manifest* (the list
of message digests) names a whole context. The workflow passes the last
manifest's digest plus the messages added since; the activity rebuilds the
context, stores the new messages and its answer, and returns the new
manifest's digest. History per turn stays constant.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict

from pydantic import TypeAdapter, ValidationError

from activities.blobs import BlobMissing, BlobStore, checked_digest, digest_of
from workflows.models import AgentMessage, MessageAdapter

_DIGESTS = TypeAdapter(list[str])


class ContextMissing(LookupError):
    """A stored message or manifest is gone or unreadable (the workflow resends inline)."""


class ContextStore:
    """Stores messages and manifests; caches what it read (content never changes)."""

    def __init__(self, blobs: BlobStore, cache_size: int = 20_000) -> None:
        self._blobs = blobs
        self._cache: OrderedDict[str, AgentMessage] = OrderedDict()
        self._cache_size = cache_size

    async def load(self, manifest: str) -> tuple[list[str], list[AgentMessage]]:
        """The digests and messages a manifest names; ``ContextMissing`` if
        any is gone or unreadable (a digest that is not one included)."""
        try:
            digests = [checked_digest(d) for d in _DIGESTS.validate_json(await self._blobs.get(manifest))]
            messages = await asyncio.gather(*(self._message(d) for d in digests))
        except (BlobMissing, ValidationError, ValueError) as err:
            raise ContextMissing(f"stored context {str(manifest)[:80]} cannot be read: {err}") from None
        return digests, list(messages)

    async def _message(self, digest: str) -> AgentMessage:
        cached = self._cache.get(digest)
        if cached is not None:
            self._cache.move_to_end(digest)
            return cached
        message = MessageAdapter.validate_json(await self._blobs.get(digest))
        self._remember(digest, message)
        return message  # type: ignore[no-any-return]

    def _remember(self, digest: str, message: AgentMessage) -> None:
        self._cache[digest] = message
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def save(self, digests: list[str], messages: list[AgentMessage]) -> str:
        """Store ``messages`` after the context ``digests``; the new manifest's digest."""
        added = []
        blobs: dict[str, bytes] = {}
        for message in messages:
            data = MessageAdapter.dump_json(message)
            digest = digest_of(data)
            if digest not in self._cache:
                blobs[digest] = data
                self._remember(digest, message)
            added.append(digest)
        manifest = json.dumps(digests + added).encode()
        manifest_digest = digest_of(manifest)
        blobs[manifest_digest] = manifest
        await self._blobs.put_many(blobs)
        return manifest_digest
