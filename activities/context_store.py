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
import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

from pydantic import TypeAdapter

from workflows.models import AgentMessage, MessageAdapter

_DIGESTS = TypeAdapter(list[str])


class ContextMissing(LookupError):
    """A stored message or manifest is gone (the workflow resends inline)."""


class BlobStore(Protocol):
    async def put_many(self, blobs: dict[str, bytes]) -> None: ...
    async def get(self, digest: str) -> bytes: ...


class FileBlobStore:
    """Blobs as files ``root/<2 hex>/<digest>``, written atomically."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, digest: str) -> Path:
        return self._root / digest[:2] / digest

    async def put_many(self, blobs: dict[str, bytes]) -> None:
        await asyncio.to_thread(self._write_all, blobs)

    def _write_all(self, blobs: dict[str, bytes]) -> None:
        for digest, data in blobs.items():
            path = self._path(digest)
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_suffix(f".{os.getpid()}.tmp")
            temp.write_bytes(data)
            temp.replace(path)

    async def get(self, digest: str) -> bytes:
        try:
            return await asyncio.to_thread(self._path(digest).read_bytes)
        except FileNotFoundError:
            raise ContextMissing(f"stored context {digest} is missing from {self._root}") from None


class S3BlobStore:
    """Blobs as objects ``context/<digest>`` in the payload bucket."""

    def __init__(self, client: object, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    async def put_many(self, blobs: dict[str, bytes]) -> None:
        await asyncio.gather(
            *(
                self._client.put_object(bucket=self._bucket, key=f"context/{digest}", data=data)  # type: ignore[attr-defined]
                for digest, data in blobs.items()
            )
        )

    async def get(self, digest: str) -> bytes:
        try:
            return await self._client.get_object(bucket=self._bucket, key=f"context/{digest}")  # type: ignore[attr-defined,no-any-return]
        except Exception as err:
            raise ContextMissing(f"stored context {digest} is missing: {err}") from None


def blob_store_from_env() -> BlobStore | None:
    """The store next to the external payloads (None when AGENT_STORAGE=off)."""
    setting = os.environ.get("AGENT_STORAGE", "").strip() or "file"
    if setting == "off":
        return None
    if setting.startswith("s3://"):
        from storage import s3_client

        return S3BlobStore(*s3_client(setting))
    root = Path(os.environ.get("AGENT_STORAGE_DIR", "").strip() or ".agent-data/payloads").resolve()
    return FileBlobStore(root / "context")


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ContextStore:
    """Stores messages and manifests; caches what it read (content never changes)."""

    def __init__(self, blobs: BlobStore, cache_size: int = 20_000) -> None:
        self._blobs = blobs
        self._cache: OrderedDict[str, AgentMessage] = OrderedDict()
        self._cache_size = cache_size

    async def load(self, manifest: str) -> tuple[list[str], list[AgentMessage]]:
        """The digests and messages a manifest names."""
        digests = _DIGESTS.validate_json(await self._blobs.get(manifest))
        messages = await asyncio.gather(*(self._message(d) for d in digests))
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
