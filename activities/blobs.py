"""The one content-addressed blob store: bytes kept under the sha256 of
their content, on a filesystem or in S3.

Two things use it: external payload storage (payloads too large for the
history, ``runtime/payloads.py``) and the context store (the messages a
model call needs, ``activities/context_store.py``). A digest is always 64
lowercase hex characters (anything else is refused: a digest comes from a
history, which a client may have written); what is read is checked against
its digest, and a blob that fails the check is treated as missing (and
removed, so the next write puts it back whole). Files are written
atomically (a unique temporary file, fsync, rename) and readable by their
owner only. The context store's files skip the fsync (``durable=False``):
they are a cache of what the workflow holds, and one lost or torn by a
power failure reads as missing (its digest does not match), after which
the workflow resends the context inline.

With a ``sealer`` (the encryption keys, ``runtime/encryption.py``) blobs are
stored encrypted, under the digest of their plaintext, which is checked
after decrypting. A blob that cannot be decrypted here (no key, another
key) is reported missing but left alone: another process may hold its key.
So is a torn encrypted one (its authentication fails just as another key's
would); a write of the same content then skips it, and the context it held
is sent inline each time it is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Protocol

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# An encrypted blob starts with these bytes (a plaintext one is JSON).
SEALED_PREFIX = b"\x00DAE1"


class BlobMissing(LookupError):
    """A blob is not in the store, or what is there does not match its digest."""


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checked_digest(digest: Any) -> str:
    """``digest`` if it is a sha256 hex digest, else ``ValueError``."""
    if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
        shown = repr(digest)[:80]
        raise ValueError(f"{shown} is not a content digest (64 lowercase hex characters).")
    return digest


class BlobStore(Protocol):
    async def put_many(self, blobs: dict[str, bytes]) -> None: ...
    async def get(self, digest: str) -> bytes: ...
    async def get_many(self, digests: list[str]) -> dict[str, bytes]:
        """Each blob, by digest; ``BlobMissing`` if any is absent or corrupt."""
        ...


class BlobSealer(Protocol):
    """Encrypts blobs at rest, bound to their digest."""

    def seal_blob(self, data: bytes, digest: str) -> bytes: ...
    def open_blob(self, blob: bytes, digest: str) -> bytes | None: ...


def _sealed(sealer: BlobSealer | None, data: bytes, digest: str) -> bytes:
    return sealer.seal_blob(data, digest) if sealer is not None else data


def _opened(sealer: BlobSealer | None, where: str, blob: bytes, digest: str) -> bytes:
    """The plaintext of a stored blob (a plaintext blob, written before
    encryption was on, as it is); ``BlobMissing`` if it cannot be decrypted."""
    if not blob.startswith(SEALED_PREFIX):
        return blob
    if sealer is None:
        raise BlobMissing(
            f"{where} is encrypted and this process has no encryption key (AGENT_ENCRYPTION_KEYS)"
        )
    try:
        plain = sealer.open_blob(blob, digest)
    except Exception as err:
        raise BlobMissing(
            f"{where} cannot be decrypted: {err or type(err).__name__} (AGENT_ENCRYPTION_KEYS)"
        ) from None
    return blob if plain is None else plain


def private_dirs(path: Path) -> None:
    """Make ``path`` and each missing parent, every one 0700 (``mkdir
    (parents=True, mode=...)`` gives only the last one the mode and the
    parents the umask's 0755: a payload store's namespace directories were
    listable by every user of the machine). Existing ones are left as they are."""
    missing = []
    for directory in (path, *path.parents):
        if directory.is_dir():
            break
        missing.append(directory)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another writer made it meanwhile
            directory.mkdir(mode=0o700)


class FileBlobStore:
    """Blobs as files ``root/<first 2 hex>/<digest>``."""

    def __init__(self, root: Path, sealer: BlobSealer | None = None, *, durable: bool = True) -> None:
        self.root = root
        self._sealer = sealer
        self._durable = durable  # fsync each file before it is renamed into place

    def path(self, digest: str) -> Path:
        digest = checked_digest(digest)
        return self.root / digest[:2] / digest

    async def put_many(self, blobs: dict[str, bytes]) -> None:
        await asyncio.to_thread(self.write_all, blobs)

    async def get(self, digest: str) -> bytes:
        return await asyncio.to_thread(self.read, digest)

    async def get_many(self, digests: list[str]) -> dict[str, bytes]:
        # One thread hop for all: a context of 460 segments read cold took
        # ~90 ms one file per hop, ~10 ms in one (bench/README change 42).
        return await asyncio.to_thread(lambda: {digest: self.read(digest) for digest in digests})

    def write_all(self, blobs: dict[str, bytes]) -> None:
        for digest, data in blobs.items():
            self.write(digest, data)

    def write(self, digest: str, data: bytes) -> None:
        """Write ``data`` under ``digest`` unless it is there already."""
        path = self.path(digest)
        if path.exists():
            return
        private_dirs(path.parent)
        # A unique temporary name (mkstemp, mode 0600) per writer, so two
        # writers of the same blob never share one; the rename is atomic,
        # so a reader sees nothing or the whole blob.
        fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:8]}-")
        try:
            with os.fdopen(fd, "wb") as temp:
                temp.write(_sealed(self._sealer, data, digest))
                if self._durable:
                    temp.flush()
                    os.fsync(temp.fileno())
            os.replace(temp_name, path)
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise

    def read(self, digest: str) -> bytes:
        """The blob, checked against its digest; ``BlobMissing`` if absent or corrupt."""
        path = self.path(digest)
        try:
            data = _opened(self._sealer, str(path), path.read_bytes(), digest)
        except FileNotFoundError:
            raise BlobMissing(f"{path} is missing") from None
        if digest_of(data) != digest:
            with contextlib.suppress(OSError):
                path.unlink()  # the next write of this content puts it back whole
            raise BlobMissing(f"{path} was corrupt (its sha256 did not match its name) and was removed")
        return data


class S3BlobStore:
    """Blobs as objects ``<prefix><digest>`` in a bucket (the SDK's S3 client)."""

    def __init__(
        self, client: Any, bucket: str, prefix: str = "context/", sealer: BlobSealer | None = None
    ) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix
        self._sealer = sealer

    async def put_many(self, blobs: dict[str, bytes]) -> None:
        await asyncio.gather(
            *(
                self._client.put_object(
                    bucket=self._bucket,
                    key=self._prefix + checked_digest(d),
                    data=_sealed(self._sealer, data, d),
                )
                for d, data in blobs.items()
            )
        )

    async def get(self, digest: str) -> bytes:
        key = self._prefix + checked_digest(digest)
        where = self.url(digest)
        try:
            data: bytes = await self._client.get_object(bucket=self._bucket, key=key)
        except Exception as err:
            raise BlobMissing(f"{where} could not be read: {err}") from None
        data = _opened(self._sealer, where, data, digest)
        if digest_of(data) != digest:
            raise BlobMissing(f"{where} is corrupt (its sha256 does not match)")
        return data

    async def get_many(self, digests: list[str]) -> dict[str, bytes]:
        return dict(zip(digests, await asyncio.gather(*(self.get(d) for d in digests)), strict=True))

    def url(self, digest: str) -> str:
        """Where the blob is, as ``s3://bucket/key`` (the key under the
        client's own prefix, when it keeps one)."""
        key = self._prefix + checked_digest(digest)
        key_of = getattr(self._client, "key_of", None)
        return f"s3://{self._bucket}/{key_of(key) if key_of else key}"
