"""External payload storage: the filesystem driver, the AGENT_STORAGE settings
and a 3 MB activity result through a real Temporal dev server."""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import json
import os
import socket
import stat
import time
import uuid
import zlib
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from google.protobuf import json_format
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.sdk.v1 import ExternalStorageReference
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.contrib.aws.s3driver import S3StorageDriver
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    SerializationContext,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
    WorkflowSerializationContext,
)
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.blobs import BlobMissing, S3BlobStore, checked_digest, digest_of
from runtime.connect import connect
from runtime.converter import REFUSED, AgentPayloadConverter, refused_reason
from runtime.payloads import (
    DEFAULT_THRESHOLD_BYTES,
    CompressionCodec,
    FileSystemStorageDriver,
    blob_store,
    data_converter,
    data_converter_from_env,
    external_storage,
    probe_s3_storage,
)
from runtime.settings import Settings, SettingsError
from tests.support.s3 import denying_s3, use_fake_s3

if TYPE_CHECKING:  # local_stack resolves paths at import, which the workflow sandbox refuses
    from testbed.local_stack import DevServer

THRESHOLD = 1024
# Random hex: compression (on by default) must not make it small.
BIG = base64.b64encode(os.urandom(4 * THRESHOLD)).decode()
THREE_MB = 3 * 1024 * 1024
S3_EXTRA_MISSING = importlib.util.find_spec("aioboto3") is None or (
    importlib.util.find_spec("types_aiobotocore_s3") is None
)
needs_s3_extra = pytest.mark.skipif(
    S3_EXTRA_MISSING, reason="S3 extra missing: pip install 'temporalio[aioboto3]'"
)


def file_converter(root: Path) -> DataConverter:
    storage = ExternalStorage(drivers=[FileSystemStorageDriver(root)], payload_size_threshold=THRESHOLD)
    return dataclasses.replace(pydantic_data_converter, external_storage=storage)


def stored_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


async def test_large_payload_round_trips_as_a_small_reference(tmp_path: Path) -> None:
    converter = file_converter(tmp_path)

    [encoded] = await converter.encode([BIG])

    assert encoded.ByteSize() < 400
    assert len(stored_files(tmp_path)) == 1
    assert await converter.decode([encoded], [str]) == [BIG]


async def test_same_payload_stored_twice_makes_one_file(tmp_path: Path) -> None:
    converter = file_converter(tmp_path)

    first = await converter.encode([BIG])
    second = await converter.encode([BIG])

    assert first == second
    [path] = stored_files(tmp_path)
    assert path.relative_to(tmp_path).parts[:2] == ("default", path.name[:2])


async def test_payload_below_threshold_stays_inline(tmp_path: Path) -> None:
    converter = file_converter(tmp_path)

    [encoded] = await converter.encode(["small"])

    assert encoded.data == b'"small"'
    assert stored_files(tmp_path) == []


async def test_missing_stored_payload_names_the_file_under_the_store(tmp_path: Path) -> None:
    """Named from AGENT_STORAGE_DIR on: the sentence reaches whoever sent
    the reference, who need not learn the workers' absolute paths."""
    converter = dataclasses.replace(file_converter(tmp_path), payload_converter_class=AgentPayloadConverter)
    [encoded] = await converter.encode([BIG])
    [path] = stored_files(tmp_path)
    path.unlink()

    relative = f"AGENT_STORAGE_DIR/{path.relative_to(tmp_path)}"
    with pytest.raises(ApplicationError, match=f"gone: Stored payload {relative} is missing") as refused:
        await converter.decode([encoded], [str])
    assert refused.value.type == "PayloadRefused" and refused.value.non_retryable
    assert str(tmp_path) not in str(refused.value)


async def test_reference_with_bad_digest_is_refused(tmp_path: Path) -> None:
    driver = FileSystemStorageDriver(tmp_path)
    claim = StorageDriverClaim(claim_data={"namespace": "default", "sha256": "../../etc/passwd"})

    [refused] = await driver.retrieve(StorageDriverRetrieveContext(), [claim])
    assert refused.metadata["encoding"] == REFUSED and b"no valid sha256" in refused.data


def storage_from_env() -> object:
    return external_storage(Settings.from_env())


def test_storage_defaults_to_files_in_the_users_data_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for name in ("AGENT_STORAGE", "AGENT_STORAGE_DIR", "AGENT_STORAGE_THRESHOLD_BYTES", "AGENT_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)

    storage = external_storage(Settings.from_env())

    assert storage is not None
    [driver] = storage.drivers
    assert isinstance(driver, FileSystemStorageDriver)
    assert driver.root == (tmp_path / "data").resolve() / "durable-agent" / "payloads"
    assert driver.root.is_absolute()
    assert storage.payload_size_threshold == DEFAULT_THRESHOLD_BYTES


def test_file_storage_reads_dir_and_threshold(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_STORAGE", "file")
    monkeypatch.setenv("AGENT_STORAGE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("AGENT_STORAGE_THRESHOLD_BYTES", "4096")

    storage = storage_from_env()

    assert storage is not None
    [driver] = storage.drivers
    assert isinstance(driver, FileSystemStorageDriver)
    assert driver.root == tmp_path / "store"
    assert storage.payload_size_threshold == 4096


def test_off_disables_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_STORAGE", "off")

    assert storage_from_env() is None
    assert data_converter_from_env().external_storage is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("AGENT_STORAGE", "ftp://somewhere", "AGENT_STORAGE must be 'file', 'off' or 's3://bucket/prefix'"),
        ("AGENT_STORAGE", "s3://", "names no bucket"),
        ("AGENT_STORAGE_THRESHOLD_BYTES", "256KiB", "must be a whole number"),
        ("AGENT_STORAGE_THRESHOLD_BYTES", "-1", "must not be negative"),
    ],
)
def test_bad_setting_is_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    monkeypatch.delenv("AGENT_STORAGE", raising=False)
    monkeypatch.setenv(name, value)

    with pytest.raises(ValueError, match=message):
        storage_from_env()


@needs_s3_extra
def test_s3_url_builds_the_sdk_s3_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_STORAGE", "s3://bucket/prefix")
    monkeypatch.setenv("AGENT_STORAGE_THRESHOLD_BYTES", "1000")

    storage = storage_from_env()

    assert storage is not None
    [driver] = storage.drivers
    assert isinstance(driver, S3StorageDriver)
    assert driver.name() == "aws.s3driver"
    assert storage.payload_size_threshold == 1000


@needs_s3_extra
async def test_s3_storage_keeps_payloads_under_the_prefix(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    url, objects = fake_s3
    monkeypatch.setenv("AGENT_STORAGE", "s3://bucket/some/prefix")
    monkeypatch.setenv("AGENT_STORAGE_THRESHOLD_BYTES", str(THRESHOLD))
    use_fake_s3(monkeypatch, url)
    converter = data_converter_from_env()

    [encoded] = await converter.encode([BIG])

    [key] = objects
    assert key.startswith("/bucket/some/prefix/v0/d/sha256/")
    assert encoded.ByteSize() < 400
    assert await converter.decode([encoded], [str]) == [BIG]


@needs_s3_extra
async def test_the_worker_probes_s3_storage_before_it_takes_work(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """Every model call writes its context to the store: wrong AWS settings
    used to show only then, as failing model calls. A working bucket gets
    one small object, the same at every start."""
    url, objects = fake_s3
    use_fake_s3(monkeypatch, url)
    settings = Settings.from_env({**os.environ, "AGENT_STORAGE": "s3://bucket/pre"})
    await probe_s3_storage(settings)
    await probe_s3_storage(settings)
    [key] = objects
    assert key.startswith("/bucket/pre/context/")

    probe = f"s3://bucket/pre{key.removeprefix('/bucket/pre')}"
    for reads, written, said in (
        ("denied", "could not be written: ClientError: An error occurred (AccessDenied)", "PutObject"),
        ("only", "could not be read: ", "AccessDenied"),
        ("hang", "was not read back within 2 s", "within 2 s"),
    ):
        async with denying_s3(reads) as denied:
            use_fake_s3(monkeypatch, denied)
            settings = Settings.from_env({**os.environ, "AGENT_STORAGE": "s3://bucket/pre"})
            started = time.monotonic()
            with pytest.raises(SettingsError) as refused:
                await probe_s3_storage(settings, timeout=2)  # 1 s was too short for a write on a busy machine
            elapsed = time.monotonic() - started
        assert str(refused.value).startswith(
            f"AGENT_STORAGE=s3://bucket/pre cannot be used: {probe} {written}"
        )
        assert said in str(refused.value)
        assert elapsed < 5  # one timeout for the write and the read together

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    use_fake_s3(monkeypatch, f"http://127.0.0.1:{port}")
    with pytest.raises(SettingsError, match="AGENT_STORAGE=s3://bucket cannot be used: "):
        await probe_s3_storage(Settings.from_env({**os.environ, "AGENT_STORAGE": "s3://bucket"}), timeout=20)


@needs_s3_extra
async def test_s3_references_the_store_cannot_honour_are_refused_not_raised(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """As the file store's: a raise here failed every workflow task of the
    conversation whose signal, update or start input carried the reference.
    A reference to another bucket is not even fetched."""
    url, objects = fake_s3
    use_fake_s3(monkeypatch, url)
    monkeypatch.setenv("AGENT_STORAGE", "s3://bucket/prefix")
    monkeypatch.setenv("AGENT_STORAGE_THRESHOLD_BYTES", str(THRESHOLD))
    converter = data_converter_from_env()
    [encoded] = await converter.encode([BIG])
    [key] = objects
    stored = objects[key]

    async def refusal(reference: Payload) -> str:
        with pytest.raises(ApplicationError) as refused:
            await converter.decode([reference], [str])
        assert refused.value.type == "PayloadRefused" and refused.value.non_retryable
        return str(refused.value)

    def with_claim(**changes: str) -> Payload:
        assert encoded.metadata["encoding"] == b"json/protobuf"
        reference = json_format.Parse(encoded.data, ExternalStorageReference())
        for field, value in changes.items():
            reference.claim_data[field] = value
        return Payload(metadata=dict(encoded.metadata), data=json_format.MessageToJson(reference).encode())

    objects["/elsewhere" + key.removeprefix("/bucket")] = stored
    assert "in bucket 'elsewhere', not this deployment's ('bucket')" in await refusal(
        with_claim(bucket="elsewhere")
    )
    assert "refers to a stored payload by no key" in await refusal(with_claim(key=""))
    assert "does not match its reference" in await refusal(with_claim(hash_value="0" * 64))
    objects.clear()
    assert (
        f"refers to a stored payload that is gone: s3://bucket{key.removeprefix('/bucket')} is missing"
        in (await refusal(encoded))
    )  # the key under the prefix, as the object is named in the bucket
    objects[key] = stored
    assert await converter.decode([encoded], [str]) == [BIG]


@needs_s3_extra
async def test_the_s3_objects_of_one_message_are_read_within_the_bound_together(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """As the file store's (a security audit: 30 references to one stored
    20 MB payload in a 7 KB signal took a worker to 2.9 GB): the objects a
    message refers to are read within AGENT_MAX_DECOMPRESSED_BYTES together,
    a repeated one counted each time."""
    url, objects = fake_s3
    use_fake_s3(monkeypatch, url)
    monkeypatch.setenv("AGENT_STORAGE", "s3://bucket/prefix")
    monkeypatch.setenv("AGENT_STORAGE_THRESHOLD_BYTES", str(THRESHOLD))
    monkeypatch.setenv("AGENT_MAX_DECOMPRESSED_BYTES", str(1024 * 1024))
    monkeypatch.setenv("AGENT_COMPRESS_THRESHOLD_BYTES", "off")  # stored as it is (the codec would bound it)
    converter = data_converter_from_env()
    text = base64.b64encode(os.urandom(225_000)).decode()  # 300 KB
    [encoded] = await converter.encode([text])
    assert len(objects) == 1

    assert await converter.decode([encoded] * 3, [str] * 3) == [text] * 3
    with pytest.raises(ApplicationError, match="AGENT_MAX_DECOMPRESSED_BYTES") as refused:
        await converter.decode([encoded] * 4, [str] * 4)
    assert refused.value.type == "PayloadRefused"


@activity.defn(name="make_big_string")
async def make_big_string(size: int) -> str:
    return base64.b64encode(os.urandom(size * 3 // 4)).decode()


@workflow.defn(name="BigResultWorkflow")
class BigResultWorkflow:
    """Returns the length of a string an activity made, to move it through history."""

    @workflow.run
    async def run(self, size: int) -> int:
        text = await workflow.execute_activity(
            make_big_string,
            size,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
        return len(text)


async def run_big_result_workflow(dev_server: DevServer) -> WorkflowHandle[BigResultWorkflow, int]:
    """Run ``BigResultWorkflow`` to completion on its own task queue, with the
    converter the environment asks for; raises its failure."""
    client = await connect(Settings.from_env(address=dev_server.address))
    task_queue = f"storage-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=task_queue, workflows=[BigResultWorkflow], activities=[make_big_string]
    ):
        handle = await client.start_workflow(
            BigResultWorkflow.run,
            THREE_MB,
            id=f"big-result-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            execution_timeout=timedelta(seconds=20),
        )
        await handle.result()
    return handle


async def test_three_megabyte_activity_result_passes_with_storage(
    dev_server: DevServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENT_STORAGE", "file")
    monkeypatch.setenv("AGENT_STORAGE_DIR", str(tmp_path))

    handle = await run_big_result_workflow(dev_server)

    assert await handle.result() == THREE_MB
    assert len(stored_files(tmp_path)) == 1
    history = await handle.fetch_history()
    [completed] = [e for e in history.events if e.HasField("activity_task_completed_event_attributes")]
    assert completed.activity_task_completed_event_attributes.result.ByteSize() < 400


async def test_three_megabyte_activity_result_fails_without_storage(
    dev_server: DevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_STORAGE", "off")

    with pytest.raises(WorkflowFailureError) as failure:
        await run_big_result_workflow(dev_server)

    assert "PayloadsTooLarge" in str(failure.value.cause.__cause__)


async def test_large_payloads_are_compressed_and_small_ones_stay_readable() -> None:
    from runtime.payloads import CompressionCodec

    converter = dataclasses.replace(pydantic_data_converter, payload_codec=CompressionCodec(2048))
    big = {"messages": ["the same words again " * 20] * 50}
    small = {"prompt": "hello"}
    encoded = await converter.encode([big, small])
    assert encoded[0].metadata["encoding"] == b"binary/zlib"
    assert encoded[0].ByteSize() < len(str(big)) / 5
    assert encoded[1].metadata["encoding"] == b"json/plain"
    assert await converter.decode(encoded, [dict, dict]) == [big, small]


# --- the derived converters the SDK asks for ------------------------------------------------------


def _run_context(namespace: str, run_id: str) -> StorageDriverStoreContext:
    return StorageDriverStoreContext(
        target=StorageDriverWorkflowInfo(id="wf", run_id=run_id, type="AgentWorkflow", namespace=namespace)
    )


async def test_a_payload_stored_for_a_run_lands_in_its_namespace_each_time(tmp_path: Path) -> None:
    converter = data_converter(Settings(storage="file", storage_dir=tmp_path, storage_threshold=THRESHOLD))

    for namespace in ("team-a", "team-b", "team-a"):
        bound = converter._with_store_context(_run_context(namespace, "run-1"))
        [reference] = await bound.encode([BIG + namespace])
        assert json.loads(reference.data)["claimData"]["namespace"] == namespace
        assert await converter.decode([reference], [str]) == [BIG + namespace]


class _ContextRecorder(PydanticPayloadConverter):
    """A payload converter that wants the serialization context (as a user's might)."""

    def __init__(self, context: SerializationContext | None = None) -> None:
        super().__init__()
        self.context = context

    def with_context(self, context: SerializationContext) -> _ContextRecorder:
        return _ContextRecorder(context)


def test_a_part_that_wants_the_context_still_gets_it() -> None:
    plain = data_converter(Settings(storage="off"))
    context = WorkflowSerializationContext(namespace="default", workflow_id="wf")
    assert plain.with_context(context) is plain  # nothing in it takes a context

    wanting = dataclasses.replace(plain, payload_converter_class=_ContextRecorder)
    derived = wanting.with_context(context)

    assert derived is not wanting
    assert derived.payload_converter._inner_payload_converter.context == context  # type: ignore[attr-defined]


def test_the_default_data_directory_is_read_from_the_environment_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`Settings.from_env(env)` took XDG_DATA_HOME from the process, not
    from `env` (a design audit): an embedding program's env was half read."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "process"))
    given = Settings.from_env({"XDG_DATA_HOME": str(tmp_path / "given")})
    assert given.storage_dir == (tmp_path / "given").resolve() / "durable-agent" / "payloads"
    home = Settings.from_env({"HOME": str(tmp_path / "home")})
    assert home.tool_output_dir == (tmp_path / "home").resolve() / ".local/share/durable-agent/tool-output"


MiB = 1024 * 1024


def json_payload(size: int) -> Payload:
    """A json/plain payload whose serialized form is exactly ``size`` bytes."""
    payload = Payload(metadata={"encoding": b"json/plain"}, data=b"")
    payload.data = b"a" * (size - payload.ByteSize() - 4)
    while payload.ByteSize() < size:
        payload.data += b"a"
    assert payload.ByteSize() == size
    return payload


async def test_a_payload_that_expands_to_exactly_the_bound_is_read() -> None:
    """AGENT_MAX_DECOMPRESSED_BYTES: a payload that would expand *beyond* it is refused."""
    codec = CompressionCodec(threshold=64, max_decompressed=MiB)
    at_bound = json_payload(MiB)
    [compressed] = await codec.encode([at_bound])
    assert compressed.metadata["encoding"] == b"binary/zlib"

    [decoded] = await codec.decode([compressed])
    assert refused_reason(decoded) is None and decoded == at_bound

    [past] = await codec.decode(
        [
            Payload(
                metadata={"encoding": b"binary/zlib"},
                data=zlib.compress(json_payload(MiB + 1).SerializeToString()),
            )
        ]
    )
    assert "decompression bomb" in (refused_reason(past) or "")


async def test_payloads_at_the_compress_threshold_are_compressed() -> None:
    """AGENT_COMPRESS_THRESHOLD_BYTES: payloads at or above this size are compressed."""
    codec = CompressionCodec(threshold=4096)
    at, under = json_payload(4096), json_payload(4095)

    encoded_at, encoded_under = await codec.encode([at, under])

    assert encoded_at.metadata["encoding"] == b"binary/zlib"
    assert encoded_under == under


async def test_compressed_data_cut_before_its_checksum_is_refused() -> None:
    """zlib's adler32 at the end of the stream is what tells a payload
    altered or cut short; a stream without it is not read."""
    codec = CompressionCodec(threshold=64)
    payload = Payload(metadata={"encoding": b"json/plain"}, data=b'"pay 10 EUR to alice"' * 20)
    whole = zlib.compress(payload.SerializeToString())
    assert (
        Payload.FromString(zlib.decompressobj().decompress(whole[:-4])) == payload
    )  # all there but the checksum

    [decoded] = await codec.decode([Payload(metadata={"encoding": b"binary/zlib"}, data=whole[:-4])])

    assert "does not decompress" in (refused_reason(decoded) or "")


async def test_a_reference_naming_a_namespace_outside_the_store_is_refused(tmp_path: Path) -> None:
    """A claim comes from the history (a client may have written it): its
    namespace is one path segment under AGENT_STORAGE_DIR, never a way out."""
    root = tmp_path / "store"
    root.mkdir()
    planted = Payload(metadata={"encoding": b"json/plain"}, data=b'"planted outside the store"')
    data = planted.SerializeToString()
    digest = digest_of(data)
    (tmp_path / digest[:2]).mkdir()
    (tmp_path / digest[:2] / digest).write_bytes(data)  # what root/../<2 hex>/<digest> names
    (tmp_path / "x").mkdir()
    driver = FileSystemStorageDriver(root)

    for namespace in ("..", "x/..", "x/../..", "../x/.."):
        claim = StorageDriverClaim(claim_data={"namespace": namespace, "sha256": digest})
        [read] = await driver.retrieve(StorageDriverRetrieveContext(), [claim])
        assert read.metadata["encoding"] == REFUSED, namespace
        assert driver.path_for(namespace, digest).resolve().is_relative_to(root.resolve()), namespace


async def test_a_stored_file_that_is_no_payload_is_refused_not_raised(tmp_path: Path) -> None:
    """As a missing one: a reference anyone may send (a signal) must not
    fail the workflow task on every retry; here its bytes match its digest
    but are no serialized Payload (a context blob's JSON, say)."""
    not_a_payload = b"\xff\xff\xff not a protobuf"
    digest = digest_of(not_a_payload)
    driver = FileSystemStorageDriver(tmp_path)
    driver.blobs("default").write(digest, not_a_payload)

    claim = StorageDriverClaim(claim_data={"namespace": "default", "sha256": digest})
    [read] = await driver.retrieve(StorageDriverRetrieveContext(), [claim])

    assert read.metadata["encoding"] == REFUSED and b"not a payload" in read.data


async def test_a_digest_with_a_path_after_its_hex_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    """A digest is exactly 64 lowercase hex characters: one that starts so
    and goes on as a path must not name (nor, as a corrupt blob, remove) a
    file outside the store."""

    root = tmp_path / "store"
    victim = tmp_path / "victim"
    victim.write_bytes(b"not the store's")
    hostile = "a" * 64 + "/../../../../victim"

    with pytest.raises(ValueError):
        checked_digest(hostile)
    with pytest.raises(ValueError):
        checked_digest("a" * 64 + "\n")
    claim = StorageDriverClaim(claim_data={"namespace": "default", "sha256": hostile})
    [read] = await FileSystemStorageDriver(root).retrieve(StorageDriverRetrieveContext(), [claim])

    assert read.metadata["encoding"] == REFUSED and b"no valid sha256" in read.data
    assert victim.read_bytes() == b"not the store's"


@pytest.mark.parametrize("digest", ["A" * 64, "aB" * 32, "a" * 63, "a" * 65, " " + "a" * 64])
def test_a_digest_that_is_not_64_lowercase_hex_is_refused(digest: str) -> None:
    """What the blob store's docstring promises (a digest comes from a
    history, which a client may have written). Upper case would name the
    same file on a case-insensitive volume, whose content then fails the
    (lowercase) check and is removed as corrupt."""

    with pytest.raises(ValueError):
        checked_digest(digest)


async def test_stored_payloads_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    """The blob store's files (conversation contents, in the clear without
    AGENT_ENCRYPTION_KEYS) and their directories are the owner's alone,
    whatever the umask."""

    root = tmp_path / "store"
    driver = FileSystemStorageDriver(root)
    big = Payload(metadata={"encoding": b"json/plain"}, data=b'"a conversation"')
    old = os.umask(0o022)
    try:
        driver._write("default", big)
    finally:
        os.umask(old)

    [path] = [p for p in root.rglob("*") if p.is_file()]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Every directory made for it: the store, the namespace's, the <first 2 hex> one.
    made = [path.parent, path.parent.parent, root]
    assert [d.relative_to(tmp_path).as_posix() for d in made] == [
        f"store/default/{path.name[:2]}",
        "store/default",
        "store",
    ]
    assert [oct(stat.S_IMODE(d.stat().st_mode)) for d in made] == [oct(0o700)] * 3


async def test_a_stored_payload_altered_on_disk_is_refused_and_removed(tmp_path: Path) -> None:
    """What is read is checked against its digest: a stored payload replaced
    by another (valid) payload is not read as the one the history refers
    to, and is removed, so the next write of that content puts it back."""

    converter = data_converter(
        Settings(storage="file", storage_dir=tmp_path, storage_threshold=1024, compress_threshold=None)
    )
    original = "the real answer " + "x" * 4096
    [reference] = await converter.encode([original])
    [path] = [p for p in tmp_path.rglob("*") if p.is_file()]
    forged = Payload(metadata={"encoding": b"json/plain"}, data=b'"a forged answer"')
    path.write_bytes(forged.SerializeToString())

    with pytest.raises(ApplicationError) as refused:
        await converter.decode([reference], [str])

    assert refused.value.type == "PayloadRefused" and "corrupt" in refused.value.message
    assert not path.exists()
    await converter.encode([original])
    assert await converter.decode([reference], [str]) == [original]


async def test_an_s3_context_blob_altered_in_the_bucket_reads_as_missing(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """As the file store's: an object whose content does not match its
    digest is not handed to the model call as the context it names."""

    url, objects = fake_s3
    use_fake_s3(monkeypatch, url)
    store = blob_store(Settings.from_env({**os.environ, "AGENT_STORAGE": "s3://bucket"}))
    assert isinstance(store, S3BlobStore)
    data = b'[{"role": "user", "content": "the real question"}]'
    await store.put_many({digest_of(data): data})
    [key] = objects
    objects[key] = b'[{"role": "user", "content": "a forged question"}]'

    with pytest.raises(BlobMissing, match="corrupt"):
        await store.get(digest_of(data))


async def test_s3_context_blobs_are_read_together_and_checked_each(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """A cold read of a context asks for all its segments at once; any one
    missing or altered fails the read as a single one does."""
    url, objects = fake_s3
    use_fake_s3(monkeypatch, url)
    store = blob_store(Settings.from_env({**os.environ, "AGENT_STORAGE": "s3://bucket"}))
    assert isinstance(store, S3BlobStore)
    blobs = {digest_of(d): d for d in (b'["one"]', b'["two"]', b'["three"]')}
    await store.put_many(blobs)
    assert await store.get_many(list(blobs)) == blobs
    absent = digest_of(b'["never written"]')
    with pytest.raises(BlobMissing, match="could not be read"):
        await store.get_many([*blobs, absent])
    objects[next(k for k in objects if k.endswith(list(blobs)[1]))] = b'["altered"]'
    with pytest.raises(BlobMissing, match="corrupt"):
        await store.get_many(list(blobs))
