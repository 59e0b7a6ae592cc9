"""External payload storage: large payloads go to a file store or S3 and the
workflow history keeps a small reference, so a long conversation stays under
Temporal's 2 MB payload and 50 MB history limits.

Every client and worker of one deployment must use the same store: a worker
that cannot read a reference cannot replay the workflow that holds it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import re
import tempfile
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from temporalio.api.common.v1 import Payload
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    PayloadCodec,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from runtime.converter import AgentPayloadConverter

DEFAULT_STORAGE_DIR = Path(".agent-data/payloads")
DEFAULT_THRESHOLD_BYTES = 256 * 1024
DEFAULT_COMPRESS_BYTES = 2048

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class StoredPayloadMissing(FileNotFoundError):
    """A reference in the history points at a stored payload that is gone."""


class FileSystemStorageDriver(StorageDriver):
    """Stores payloads as files under ``root``, once per content.

    A payload lives at ``root/<namespace>/<first 2 hex>/<sha256>``, the hash
    taken over its serialized bytes, so storing the same payload twice writes
    one file. Workers on several machines need ``root`` on a shared volume.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def name(self) -> str:
        """``fs``: written into every reference in the history, so renaming it orphans them."""
        return "fs"

    def type(self) -> str:
        """``fs``, the same in every language (the SDK default would be the class name)."""
        return "fs"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        """Write each payload's file (unless it exists) and claim it by namespace and hash."""
        namespace = context.target.namespace if context.target and context.target.namespace else "default"
        return await asyncio.gather(*(asyncio.to_thread(self._write, namespace, p) for p in payloads))

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        """Read each claimed file back, checking its hash."""
        return await asyncio.gather(*(asyncio.to_thread(self._read, claim) for claim in claims))

    def path_for(self, namespace: str, digest: str) -> Path:
        """Where the payload with this sha256 hex digest lives."""
        return self.root / _namespace_dir(namespace) / digest[:2] / digest

    def _write(self, namespace: str, payload: Payload) -> StorageDriverClaim:
        data = payload.SerializeToString()
        digest = hashlib.sha256(data).hexdigest()
        path = self.path_for(namespace, digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # Rename is atomic, so a reader never sees a half-written file and
            # two writers of the same content both leave a whole one.
            fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:8]}-")
            try:
                with os.fdopen(fd, "wb") as temp:
                    temp.write(data)
                    temp.flush()
                    os.fsync(temp.fileno())
                os.replace(temp_name, path)
            except BaseException:
                Path(temp_name).unlink(missing_ok=True)
                raise
        return StorageDriverClaim(claim_data={"namespace": namespace, "sha256": digest})

    def _read(self, claim: StorageDriverClaim) -> Payload:
        digest = claim.claim_data.get("sha256", "")
        if not _SHA256_HEX.fullmatch(digest):
            raise ValueError(f"Payload reference {dict(claim.claim_data)} has no valid sha256 digest.")
        path = self.path_for(claim.claim_data.get("namespace", "default"), digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise StoredPayloadMissing(
                f"Stored payload {path} is missing: restore it, or point AGENT_STORAGE_DIR "
                "at the payload store this workflow was written with."
            ) from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"Stored payload {path} is corrupt (its sha256 does not match its name).")
        payload = Payload()
        payload.ParseFromString(data)
        return payload


def _namespace_dir(namespace: str) -> str:
    """The namespace as one safe path segment (no separators, no ``.``/``..``)."""
    segment = quote(namespace, safe="")
    return "%2E" + segment[1:] if segment.startswith(".") else segment


class _PrefixedS3Client(S3StorageDriverClient):
    """The SDK's aioboto3 adapter on a fresh aioboto3 client per call, with keys under ``prefix``.

    An aioboto3 client is an async context manager tied to one event loop,
    while the data converter is built before any loop runs and may outlive
    one; a client per call (about 4 ms once the first has loaded the S3
    model) needs no lifecycle. References in the history hold keys without
    the prefix: keep it fixed for a deployment.
    """

    def __init__(
        self,
        open_client: Callable[[], AbstractAsyncContextManager[Any]],
        adapt: Callable[[Any], S3StorageDriverClient],
        prefix: str,
    ) -> None:
        self._prefix = prefix
        self._open_client = open_client
        self._adapt = adapt

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[S3StorageDriverClient]:
        async with self._open_client() as client:
            yield self._adapt(client)

    def _key(self, key: str) -> str:
        return f"{self._prefix}/{key}" if self._prefix else key

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        async with self._client() as client:
            await client.put_object(bucket=bucket, key=self._key(key), data=data)

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        async with self._client() as client:
            return await client.object_exists(bucket=bucket, key=self._key(key))

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        async with self._client() as client:
            return await client.get_object(bucket=bucket, key=self._key(key))


def _s3_driver(url: str) -> S3StorageDriver:
    """The SDK's S3 driver for ``s3://bucket/prefix`` (endpoint and region from AWS_* variables)."""
    client, bucket = s3_client(url)
    return S3StorageDriver(client=client, bucket=bucket)


def s3_client(url: str) -> tuple[S3StorageDriverClient, str]:
    """An S3 client keeping keys under the prefix of ``s3://bucket/prefix``, and the bucket."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"AGENT_STORAGE={url!r} names no bucket; use s3://bucket or s3://bucket/prefix.")
    try:
        import aioboto3
        from temporalio.contrib.aws.s3driver.aioboto3 import new_aioboto3_client
    except ImportError as err:
        raise ImportError(
            f"AGENT_STORAGE={url} needs the S3 extra ({err.name} is not installed): "
            "pip install 'temporalio[aioboto3]'."
        ) from None
    session = aioboto3.Session()
    client = _PrefixedS3Client(
        lambda: session.client(
            "s3",
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
            region_name=os.environ.get("AWS_REGION") or None,
        ),
        new_aioboto3_client,
        prefix.strip("/"),
    )
    return client, bucket


def _threshold_from_env() -> int:
    raw = os.environ.get("AGENT_STORAGE_THRESHOLD_BYTES", "").strip()
    if not raw:
        return DEFAULT_THRESHOLD_BYTES
    if not raw.isdigit():
        raise ValueError(
            f"AGENT_STORAGE_THRESHOLD_BYTES must be a whole number of bytes (0 or more), got {raw!r}."
        )
    return int(raw)


def storage_from_env() -> ExternalStorage | None:
    """External storage as configured by AGENT_STORAGE (``file``, ``s3://bucket/prefix`` or ``off``)."""
    setting = os.environ.get("AGENT_STORAGE", "").strip() or "file"
    if setting == "off":
        return None
    threshold = _threshold_from_env()
    driver: StorageDriver
    if setting == "file":
        root = Path(os.environ.get("AGENT_STORAGE_DIR", "").strip() or DEFAULT_STORAGE_DIR)
        driver = FileSystemStorageDriver(root.resolve())
    elif setting.startswith("s3://"):
        driver = _s3_driver(setting)
    else:
        raise ValueError(f"AGENT_STORAGE must be 'file', 'off' or 's3://bucket/prefix', got {setting!r}.")
    return ExternalStorage(drivers=[driver], payload_size_threshold=threshold)


class CompressionCodec(PayloadCodec):
    """zlib-compresses payloads of at least ``threshold`` bytes.

    The event stream's poll results and the final transcripts are large,
    repetitive JSON: compressed they take a fifth of the history. Smaller
    payloads (prompts, signals, tool calls, summaries) stay plain JSON so
    the Temporal UI and CLI show them as they are.
    """

    def __init__(self, threshold: int) -> None:
        self._threshold = threshold

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._compress(p) if p.ByteSize() >= self._threshold else p for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload.FromString(zlib.decompress(p.data)) if p.metadata.get("encoding") == _ZLIB else p
            for p in payloads
        ]

    def _compress(self, payload: Payload) -> Payload:
        data = zlib.compress(payload.SerializeToString(), 6)
        if len(data) >= payload.ByteSize():
            return payload
        return Payload(metadata={"encoding": _ZLIB}, data=data)


_ZLIB = b"binary/zlib"


def _compression_from_env() -> CompressionCodec | None:
    raw = os.environ.get("AGENT_COMPRESS_THRESHOLD_BYTES", "").strip() or str(DEFAULT_COMPRESS_BYTES)
    if raw == "off":
        return None
    if not raw.isdigit():
        raise ValueError(f"AGENT_COMPRESS_THRESHOLD_BYTES must be a number of bytes or 'off', got {raw!r}.")
    return CompressionCodec(int(raw))


def data_converter_from_env() -> DataConverter:
    """The pydantic data converter with the compression and external storage
    the environment asks for. Workers and clients must agree on both."""
    return dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=AgentPayloadConverter,
        payload_codec=_compression_from_env(),
        external_storage=storage_from_env(),
    )
