"""How payloads are written: the pydantic JSON converter, compression,
encryption (``runtime/encryption.py``, with keys set), and external
storage (large payloads go to a file store or S3 and the workflow history
keeps a small reference, so a long conversation stays under Temporal's
2 MB payload and 50 MB history limits).

``data_converter(settings)`` is the one place this is put together: the
worker, every client and the codec server use it. Every client and worker of
one deployment must use the same settings: a worker that cannot read a
reference cannot replay the workflow that holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.aws.s3driver import S3StorageDriver, S3StorageDriverClient
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    ExternalStorage,
    FailureConverter,
    PayloadCodec,
    PayloadConverter,
    SerializationContext,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
)

from activities.blobs import BlobMissing, BlobStore, FileBlobStore, S3BlobStore, checked_digest, digest_of
from activities.redact import scrub
from runtime.converter import (
    DECODE_BUDGET,
    READING_CARRY,
    UNCOMPRESSED,
    UNCOMPRESSED_KEY,
    AgentPayloadConverter,
    refused_payload,
    refused_reason,
)
from runtime.encryption import CodecChain, EncryptionCodec, keyring
from runtime.payload_walk import SUPPORTED_SDK
from runtime.settings import DEFAULT_MAX_DECOMPRESSED_BYTES, Settings, SettingsError

DEFAULT_THRESHOLD_BYTES = 256 * 1024
DEFAULT_COMPRESS_BYTES = 2048


class FileSystemStorageDriver(StorageDriver):
    """Stores payloads as files under ``root``, once per content.

    A payload lives at ``root/<namespace>/<first 2 hex>/<sha256>`` (the blob
    store, ``activities/blobs.py``), the hash taken over its serialized
    bytes, so storing the same payload twice writes one file. Workers on
    several machines need ``root`` on a shared volume.
    """

    def __init__(self, root: Path, max_read_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> None:
        self.root = root
        self._max_read = max_read_bytes

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
        """Read each claimed file back, checking its hash. The claims of one
        payload sequence (one signal's arguments, one result) together read
        at most ``max_read_bytes`` (``AGENT_MAX_DECOMPRESSED_BYTES``, the
        bound the codec puts on what they decompress to), a repeated claim
        counted each time: a 7 KB signal of 30 references to one 20 MB
        payload took a worker to 2.9 GB (a security audit). A claim past
        the bound is refused (the signal dropped). The carried input of a
        run continued as new is read unbounded, as by the codec."""
        return await _read_within_bound(
            claims,
            None if READING_CARRY.get() else self._max_read,
            self._max_read,
            key_of=lambda claim: (
                str(claim.claim_data.get("namespace")),
                str(claim.claim_data.get("sha256")),
            ),
            read=lambda claim, limit: asyncio.to_thread(self._read, claim, limit),
        )

    def blobs(self, namespace: str) -> FileBlobStore:
        return FileBlobStore(self.root / _namespace_dir(namespace))

    def path_for(self, namespace: str, digest: str) -> Path:
        """Where the payload with this sha256 hex digest lives."""
        return self.blobs(namespace).path(digest)

    def _write(self, namespace: str, payload: Payload) -> StorageDriverClaim:
        data = payload.SerializeToString()
        digest = digest_of(data)
        self.blobs(namespace).write(digest, data)
        return StorageDriverClaim(claim_data={"namespace": namespace, "sha256": digest})

    def _read(self, claim: StorageDriverClaim, limit: int | None = None) -> Payload:
        """The stored payload; for a reference that names no readable one, a
        refused payload saying why (``refused_payload``), as the codecs do
        for what they will not decode: anyone who may signal could send such
        a reference (or a client with other storage settings), and raising
        here failed every workflow task of the conversation. So a signal
        carrying it is dropped, an update or a start input is refused with
        the sentence; a workflow's own activity result so referred to still
        stops its workflow task until the payload is restored."""
        digest = claim.claim_data.get("sha256", "")
        try:
            checked_digest(digest)
        except ValueError:
            return refused_payload(
                f"refers to a stored payload by no valid sha256 digest ({str(dict(claim.claim_data))[:120]})"
            )
        blobs = self.blobs(str(claim.claim_data.get("namespace", "default")))
        try:
            if limit is not None:
                with contextlib.suppress(FileNotFoundError):  # read says it is gone
                    if blobs.path(digest).stat().st_size > limit:
                        return refused_payload(_past_bound(self._max_read))  # not read at all
            data = blobs.read(digest)
        except BlobMissing as err:
            return refused_payload(f"refers to a stored payload that is gone: {_missing(err, self.root)}")
        except OSError as err:
            # A namespace no file name can hold (too long once quoted; a
            # client or a forged reference chose it): refused as the rest.
            # Other errors (permissions, the disk) raise: the task is
            # retried until the store can be read.
            if err.errno not in _UNNAMEABLE:
                raise
            return refused_payload(f"refers to a stored payload by a name no file can have ({err.strerror})")
        payload = Payload()
        try:
            payload.ParseFromString(data)
        except DecodeError:
            return refused_payload(f"refers to a stored payload that is not a payload ({digest})")
        return payload


def _missing(err: BlobMissing, root: Path) -> str:
    """Why, naming the file under ``AGENT_STORAGE_DIR``: the sentence goes to
    whoever sent the reference (a client, the UI through the codec server),
    who need not learn where the workers keep their files."""
    where = str(err).replace(str(root), "AGENT_STORAGE_DIR", 1)
    return (
        f"Stored payload {where}: restore it, or point AGENT_STORAGE_DIR "
        "at the payload store this workflow was written with"
    )


async def _read_within_bound(
    claims: Sequence[StorageDriverClaim],
    left: int | None,
    bound: int,
    key_of: Callable[[StorageDriverClaim], tuple[str, str]],
    read: Callable[[StorageDriverClaim, int | None], Awaitable[Payload]],
) -> list[Payload]:
    """The payloads of one message's ``claims``, read one after another
    within ``left`` bytes together (None: unbounded), a repeated claim read
    once and counted each time; once the bound is spent, none is read.
    ``read`` may refuse one past the ``int | None`` it is given unread."""
    fetched: dict[tuple[str, str], Payload] = {}
    payloads = []
    for claim in claims:
        key = key_of(claim)
        payload = fetched.get(key)
        if payload is None:
            spent = left is not None and left <= 0
            payload = fetched[key] = refused_payload(_past_bound(bound)) if spent else await read(claim, left)
        payload, left = _charged(payload, left, bound)
        payloads.append(payload)
    return payloads


def _charged(payload: Payload, left: int | None, bound: int) -> tuple[Payload, int | None]:
    """``payload`` and what is left of a message's read bound after it, or
    a refusal past the bound (nothing charged); ``left`` None: no bound."""
    if left is None or refused_reason(payload) is not None:
        return payload, left
    if payload.ByteSize() > left:
        return refused_payload(_past_bound(bound)), left
    return payload, left - payload.ByteSize()


def _past_bound(bound: int) -> str:
    return (
        f"refers, with the payloads read with it, to stored payloads of more than {bound:,} "
        "bytes (AGENT_MAX_DECOMPRESSED_BYTES), so it was refused"
    )


_UNNAMEABLE = frozenset({errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR, errno.EINVAL, errno.ELOOP})


def _namespace_dir(namespace: str) -> str:
    """The namespace as one safe path segment (no separators, no ``.``/``..``)."""
    segment = quote(namespace, safe="")
    return "%2E" + segment[1:] if segment.startswith(".") else segment


class RefusingS3StorageDriver(S3StorageDriver):
    """The SDK's S3 driver, refusing what the file store refuses: a
    reference to an object that is gone, to another bucket than this
    deployment's, or whose content does not match its hash comes back as a
    refused payload saying why (a signal carrying it is dropped, an update
    or a start input refused), where the SDK's driver raised and so failed
    every workflow task of the conversation. A reference to another bucket
    is not fetched at all: the workers' credentials read only their own.
    Other errors (S3 unreachable, access denied) still raise: the task is
    retried until S3 answers."""

    def __init__(
        self, client: S3StorageDriverClient, bucket: str, max_read_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    ) -> None:
        super().__init__(client=client, bucket=bucket)
        self._own_bucket = bucket
        self._max_read = max_read_bytes
        # The object's key as it is in the bucket (under our prefix), for the refusal.
        self._key_in_bucket = client.key_of if isinstance(client, _PrefixedS3Client) else str

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        """As the file store's: the objects one message refers to are read
        within ``max_read_bytes`` together, a repeated one fetched once and
        counted each time; one after the bound is spent is not fetched. S3
        says no size before the download, so a message's objects are
        fetched one after another (a message rarely refers to more than
        one). The carried input of a run continued as new: all at once,
        unbounded."""
        if READING_CARRY.get():
            return list(await asyncio.gather(*(self._retrieve_one(context, claim) for claim in claims)))
        return await _read_within_bound(
            claims,
            self._max_read,
            self._max_read,
            key_of=lambda claim: (str(claim.claim_data.get("bucket")), str(claim.claim_data.get("key"))),
            read=lambda claim, _limit: self._retrieve_one(context, claim),
        )

    async def _retrieve_one(
        self, context: StorageDriverRetrieveContext, claim: StorageDriverClaim
    ) -> Payload:
        bucket, key = claim.claim_data.get("bucket"), claim.claim_data.get("key")
        if bucket != self._own_bucket:
            return refused_payload(
                f"refers to a stored payload in bucket {str(bucket)[:80]!r}, not this deployment's "
                f"({self._own_bucket!r})"
            )
        if not key:
            return refused_payload("refers to a stored payload by no key")
        try:
            [payload] = await super().retrieve(context, [claim])
        except (ValueError, DecodeError) as err:  # no content hash, another hash, or no payload
            return refused_payload(f"refers to a stored payload that does not match its reference: {err}")
        except RuntimeError as err:
            if not _is_missing_s3_object(err):
                raise
            where = self._key_in_bucket(key)
            return refused_payload(
                f"refers to a stored payload that is gone: s3://{bucket}/{where[:300]} is missing: "
                "restore it, or point AGENT_STORAGE at the payload store this workflow was written with"
            )
        return payload


def _is_missing_s3_object(err: BaseException) -> bool:
    """The SDK's S3 driver wraps a missing object's 404 in a RuntimeError."""
    response = getattr(err.__cause__, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in ("NoSuchKey", "404")


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

    def key_of(self, key: str) -> str:
        """The object's key in the bucket for a reference's ``key`` (under the prefix)."""
        return self._key(key)

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        async with self._client() as client:
            await client.put_object(bucket=bucket, key=self._key(key), data=data)

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        async with self._client() as client:
            return await client.object_exists(bucket=bucket, key=self._key(key))

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        async with self._client() as client:
            return await client.get_object(bucket=bucket, key=self._key(key))


def s3_client(url: str, settings: Settings) -> tuple[S3StorageDriverClient, str]:
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
        lambda: session.client("s3", endpoint_url=settings.aws_endpoint_url, region_name=settings.aws_region),
        new_aioboto3_client,
        prefix.strip("/"),
    )
    return client, bucket


def external_storage(settings: Settings) -> ExternalStorage | None:
    """External storage as ``AGENT_STORAGE`` says (``file``, ``s3://bucket/prefix`` or ``off``)."""
    if settings.storage == "off":
        return None
    driver: StorageDriver
    if settings.storage.startswith("s3://"):
        client, bucket = s3_client(settings.storage, settings)
        driver = RefusingS3StorageDriver(
            client=client, bucket=bucket, max_read_bytes=settings.max_decompressed_bytes
        )
    else:
        driver = FileSystemStorageDriver(settings.storage_dir, settings.max_decompressed_bytes)
    return ExternalStorage(drivers=[driver], payload_size_threshold=settings.storage_threshold)


S3_PROBE = b"durable agent worker: S3 storage probe\n"
S3_PROBE_TIMEOUT_S = 30.0


async def probe_s3_storage(settings: Settings, timeout: float = S3_PROBE_TIMEOUT_S) -> None:
    """For the worker, before it takes work: with ``AGENT_STORAGE=s3://...``,
    write a small blob to the bucket and read it back (through the keys, when
    set), so wrong AWS settings are one line at start (``SettingsError``),
    not every model call failing later (each one writes its context there).
    The blob is content-addressed: every start writes the same object."""
    if not settings.storage.startswith("s3://"):
        return
    store = blob_store(settings)
    assert isinstance(store, S3BlobStore)
    digest = digest_of(S3_PROBE)
    where = store.url(digest)
    step = "written"

    async def round_trip() -> None:
        nonlocal step
        await store.put_many({digest: S3_PROBE})
        step = "read back"
        await store.get(digest)

    try:
        await asyncio.wait_for(round_trip(), timeout)
    except TimeoutError:
        problem = f"{where} was not {step} within {timeout:g} s"
    except BlobMissing as err:  # its text names the object
        problem = str(err)
    except Exception as err:  # botocore's, or the SDK adapter's wrapping of them
        cause = err.__cause__ or err
        problem = f"{where} could not be {step}: {type(cause).__name__}: {cause}"
    else:
        return
    # The object's name has a long hex run, which the scrub would take for a key.
    problem = scrub(problem.rstrip(".").replace(digest, "{probe}"), settings.known_secrets())
    raise SettingsError(
        f"AGENT_STORAGE={settings.storage} cannot be used: {problem.replace('{probe}', digest)}. "
        "Check the bucket, AWS_ENDPOINT_URL, AWS_REGION and the AWS credentials this worker runs with."
    )


def blob_store(settings: Settings) -> BlobStore | None:
    """The content-addressed store beside the external payloads (None when
    ``AGENT_STORAGE=off``), for the context store; its blobs are encrypted
    when ``settings`` hold encryption keys (they pass through no codec)."""
    if settings.storage == "off":
        return None
    if settings.storage.startswith("s3://"):
        client, bucket = s3_client(settings.storage, settings)
        return S3BlobStore(client, bucket, sealer=keyring(settings))
    # Not fsynced: the workflow holds every message, and resends the context
    # inline when a stored one is missing (lost or torn by a power failure);
    # the fsync cost ~0.1 ms of CPU per blob, two blobs a model call.
    return FileBlobStore(settings.storage_dir / "context", keyring(settings), durable=False)


class CompressionCodec(PayloadCodec):
    """zlib-compresses payloads of at least ``threshold`` bytes (None: none)
    but control payloads (marked by the converter: the ``state`` query, the
    settings in force, a prompt's receipt, which clients without this codec
    read), and decompresses any compressed payload up to ``max_decompressed`` bytes.

    The event stream's poll results and the final transcripts are large,
    repetitive JSON: compressed they take a fifth of the history. Smaller
    payloads (prompts, signals, tool calls, summaries) stay plain JSON so
    the Temporal UI and CLI show them as they are. Anyone who can send a
    signal can send a compressed payload, so reading one is bounded: 64 KiB
    of zlib can expand to 64 MiB, and a payload that would expand beyond
    ``max_decompressed`` is refused before it is held in memory.
    """

    def __init__(self, threshold: int | None, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> None:
        self._threshold = threshold
        self._max = max_decompressed

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._encode(p) for p in payloads]

    def _encode(self, payload: Payload) -> Payload:
        if payload.metadata.get(UNCOMPRESSED_KEY) == UNCOMPRESSED:
            # A control payload: plain, and without the marker, which the
            # Temporal CLI would show as a raw payload instead of its JSON.
            plain = Payload()
            plain.CopyFrom(payload)
            del plain.metadata[UNCOMPRESSED_KEY]
            return plain
        if self._threshold is not None and payload.ByteSize() >= self._threshold:
            return self._compress(payload)
        return payload

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Each payload decoded, the sequence's together within the bound:
        one signal of 20 payloads of 48 MiB each (under 1 MB sent) took a
        worker to 4 GB (a security audit). A sequence is one message's
        arguments or one result; the carried input is read unbounded."""
        left: int | None = None if READING_CARRY.get() else self._max
        decoded = []
        for payload in payloads:
            plain = await self._decode(payload, left)
            if left is not None and plain is not payload:
                left = max(0, left - plain.ByteSize())
            decoded.append(plain)
        return decoded

    async def _decode(self, payload: Payload, limit: int | None) -> Payload:
        if payload.metadata.get("encoding") != _ZLIB:
            return payload
        budget = DECODE_BUDGET.get()
        if budget is None or limit is None:
            return await self._inflate(payload, limit)
        async with budget.turn:
            plain = await self._inflate(payload, min(limit, budget.left))
            if refused_reason(plain) is None:
                budget.left = max(0, budget.left - plain.ByteSize())
            return plain

    async def _inflate(self, payload: Payload, limit: int | None) -> Payload:
        if len(payload.data) < _INFLATE_IN_THREAD_BYTES:
            return self.decompress(payload.data, limit)
        # zlib lets go of the GIL while it inflates: the event loop (and the
        # worker's heartbeats) keep running meanwhile.
        return await asyncio.to_thread(self.decompress, payload.data, limit)

    def decompress(self, data: bytes, limit: int | None = -1) -> Payload:
        """The payload ``data`` holds, or a refused payload saying why not
        (past ``limit`` bytes: by default the codec's bound; None: none)."""
        bound = self._max if limit == -1 else limit
        inflater = zlib.decompressobj()
        try:
            plain = inflater.decompress(data, bound + 1) if bound is not None else inflater.decompress(data)
        except zlib.error:
            return refused_payload(_NOT_ZLIB)
        if bound is not None and len(plain) > bound:
            together = "" if bound == self._max else ", with the other payloads read with it,"
            return refused_payload(
                f"decompresses{together} to more than {self._max:,} bytes (AGENT_MAX_DECOMPRESSED_BYTES), "
                "so it was refused as a decompression bomb"
            )
        if not inflater.eof:
            return refused_payload(_NOT_ZLIB)
        try:
            return Payload.FromString(plain)
        except DecodeError:
            return refused_payload(_NOT_A_PAYLOAD)

    def _compress(self, payload: Payload) -> Payload:
        data = zlib.compress(payload.SerializeToString(), 6)
        if len(data) >= payload.ByteSize():
            return payload
        return Payload(metadata={"encoding": _ZLIB}, data=data)


_ZLIB = b"binary/zlib"
_NOT_ZLIB = "is marked binary/zlib but its data does not decompress"
_NOT_A_PAYLOAD = "is marked binary/zlib and decompresses, but not to a payload (compressed by something else)"
# Smaller compressed data inflates on the event loop: even as a bomb it
# expands to at most about 4 MiB (zlib's ratio is at most ~1000:1), ~15 ms.
_INFLATE_IN_THREAD_BYTES = 4 * 1024


def data_converter(settings: Settings) -> DataConverter:
    """The data converter of the worker, its clients and the codec server:
    pydantic JSON, compression, encryption (with keys set) and external
    storage as ``settings`` say. Workers and clients must agree on all four.

    The codecs run compress-then-encrypt (and decrypt-then-decompress), and
    the SDK stores a payload externally after the codecs ran, so stored
    payloads are encrypted too. With keys set, failure messages and stack
    traces also go through the codecs (encoded attributes), so the history
    keeps no error text in the clear."""
    keys = keyring(settings)
    codecs = [
        CompressionCodec(settings.compress_threshold, settings.max_decompressed_bytes),
        EncryptionCodec(keys),
    ]
    converter_class = (
        StoreContextCachingConverter if _store_context_private_ok(settings) else AgentDataConverter
    )
    return converter_class(
        payload_converter_class=AgentPayloadConverter,
        payload_codec=CodecChain(codecs),
        failure_converter_class=(
            DefaultFailureConverterWithEncodedAttributes if keys is not None else DefaultFailureConverter
        ),
        external_storage=external_storage(settings),
    )


# The metadata key that marks a payload as a stored payload's reference (the
# SDK's ``_extstore._REFERENCE_MARKER_KEY``; anyone can set it on a signal).
_REFERENCE_MARKER_KEY = "__temporal_external_storage_reference"

_SHARED_CONVERTERS: dict[tuple[type, type], tuple[PayloadConverter, FailureConverter]] = {}
_STORE_CONTEXTS_KEPT = 256


@dataclasses.dataclass(frozen=True)
class AgentDataConverter(DataConverter):
    """The SDK's ``DataConverter``, cheaper to derive.

    The SDK derives a converter for each workflow activation and for each
    payload it stores externally (``with_context``, ``_with_store_context``),
    and every derived one built a fresh payload converter and failure
    converter, which were thrown away at once. Here the derived ones share
    them (they keep no state), and ``with_context`` returns this converter
    when none of its parts takes a context (as the SDK's would, after asking
    every part each time). Both are public API; the store contexts are
    cached by ``StoreContextCachingConverter``.
    """

    def __post_init__(self) -> None:
        key = (self.payload_converter_class, self.failure_converter_class)
        shared = _SHARED_CONVERTERS.get(key)
        if shared is None:
            super().__post_init__()
            shared = _SHARED_CONVERTERS.setdefault(key, (self.payload_converter, self.failure_converter))
        object.__setattr__(self, "payload_converter", shared[0])
        object.__setattr__(self, "failure_converter", shared[1])
        object.__setattr__(self, "_store_bound", {})
        # Whether any part makes use of a context; known at the first ask.
        object.__setattr__(self, "_takes_context", None)

    async def _decode_reference_payload_sequence(self, payloads: Sequence[Payload]) -> list[Payload]:
        # The SDK's private step (both the stock passes and runtime/payload_walk.py call it): it
        # raised on a payload marked as a stored payload's reference that decodes to none, failing
        # every workflow task of a conversation that anyone who may signal had sent one (TMPRL1106,
        # a security audit). Such a payload is refused instead: a signal carrying it is dropped.
        try:
            return await super()._decode_reference_payload_sequence(payloads)
        except RuntimeError as err:
            if "[TMPRL1106]" not in str(err):
                raise  # TMPRL1105, no storage here: held until the worker has the store's settings
        return [await self._one_reference(payload) for payload in payloads]

    async def _one_reference(self, payload: Payload) -> Payload:
        try:
            [decoded] = await super()._decode_reference_payload_sequence([payload])
            return decoded
        except RuntimeError as err:
            if "[TMPRL1106]" not in str(err):
                raise
        if self.payload_codec:  # why its codec did not make a reference of it (a key missing, ...)
            inner = Payload()
            inner.CopyFrom(payload)
            del inner.metadata[_REFERENCE_MARKER_KEY]
            del inner.external_payloads[:]
            [decoded] = await self.payload_codec.decode([inner])
            if refused_reason(decoded) is not None:
                return decoded
        return refused_payload("is marked as a reference to a stored payload, but is none")

    async def _external_retrieve_payload_sequence(self, payloads: Sequence[Payload]) -> list[Payload]:
        # The SDK's private step (both the stock passes and runtime/payload_walk.py call it).
        storage = self.external_storage
        if storage is not None:
            payloads = [_screened(storage, p) for p in payloads]
        return await super()._external_retrieve_payload_sequence(payloads)

    def with_context(self, context: SerializationContext) -> Self:
        # The SDK's parts (and ours) decide by how they are composed, not by
        # the context, so the first answer tells for all (the SDK's generic
        # answer walks every part each time).
        takes_context: bool | None = self._takes_context  # type: ignore[attr-defined]
        if takes_context is False:
            return self
        derived = super().with_context(context)
        if takes_context is None:
            object.__setattr__(self, "_takes_context", derived is not self)
        return derived


def _screened(storage: ExternalStorage, payload: Payload) -> Payload:
    """``payload``, or a refused payload when it is a reference to a stored
    payload that the SDK cannot even parse (not JSON, no claim, a driver no
    worker has): the SDK raised on it before any driver ran, failing every
    workflow task of a conversation that anyone who may signal had sent it
    (a security audit). So, as for a reference to a payload that is gone,
    a signal carrying it is dropped and an update or start refused. Uses the
    SDK's private parser; without it, the SDK's behaviour."""
    parse = getattr(storage, "_decode_reference", None)
    driver_named = getattr(storage, "_get_driver_by_name", None)
    if parse is None or driver_named is None:
        return payload
    try:
        reference = parse(payload)
        if reference is not None:
            dict(reference.claim_data)
    except Exception as err:
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        return refused_payload(f"is not a readable reference to a stored payload ({reason})")
    if reference is None:
        return payload
    try:
        driver_named(reference.driver_name)
    except ValueError:
        return refused_payload(
            f"refers to a stored payload of driver {str(reference.driver_name)[:80]!r}, which these "
            "storage settings do not have: use the AGENT_STORAGE settings it was written with"
        )
    return payload


@dataclasses.dataclass(frozen=True)
class StoreContextCachingConverter(AgentDataConverter):
    """``AgentDataConverter`` keeping the converters it binds to a store
    context: that context names the workflow run, which writes many
    payloads. It overrides a private SDK method (``_with_store_context``),
    so it is used only with the SDK version that was read
    (``_store_context_private_ok``)."""

    def _with_store_context(self, store_ctx: StorageDriverStoreContext) -> DataConverter:
        bound: dict[StorageDriverStoreContext, DataConverter] = self._store_bound  # type: ignore[attr-defined]
        found = bound.get(store_ctx)
        if found is None:
            found = super()._with_store_context(store_ctx)
            if len(bound) >= _STORE_CONTEXTS_KEPT:
                bound.clear()
            bound[store_ctx] = found
        return found


def _store_context_private_ok(settings: Settings) -> bool:
    """The SDK's private ``DataConverter._with_store_context`` may be used:
    the SDK is the version it was read against, and AGENT_SDK_FALLBACKS is
    off (the public path is then what CI runs, as a temporalio upgrade would)."""
    return (
        not settings.sdk_fallbacks
        and version("temporalio") == SUPPORTED_SDK
        and callable(getattr(DataConverter, "_with_store_context", None))
    )


def for_namespace(converter: DataConverter, namespace: str) -> DataConverter:
    """``converter`` storing large payloads under ``namespace``, as the
    worker does for that namespace's workflows (the codec server's
    ``/encode``). The SDK binds that context through its private
    ``_with_store_context``: only a ``StoreContextCachingConverter`` (the
    SDK read, fallbacks off) is bound; others store without a target (the
    file store's ``default`` namespace), which any reader still resolves:
    references carry their place."""
    if not isinstance(converter, StoreContextCachingConverter) or converter.external_storage is None:
        return converter
    context = StorageDriverStoreContext(target=StorageDriverWorkflowInfo(namespace=namespace))
    bound = converter._with_store_context(context)
    return bound if isinstance(bound, DataConverter) else converter


def data_converter_from_env() -> DataConverter:
    """``data_converter`` with the settings of the environment."""
    return data_converter(Settings.from_env())
