"""External payload storage: the filesystem driver, the AGENT_STORAGE settings
and a 3 MB activity result through a real Temporal dev server."""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import json
import os
import socket
import time
import uuid
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

from runtime.connect import connect
from runtime.converter import REFUSED, AgentPayloadConverter
from runtime.payloads import (
    DEFAULT_THRESHOLD_BYTES,
    FileSystemStorageDriver,
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
        ("hang", "was not read back within 1 s", "within 1 s"),
    ):
        async with denying_s3(reads) as denied:
            use_fake_s3(monkeypatch, denied)
            settings = Settings.from_env({**os.environ, "AGENT_STORAGE": "s3://bucket/pre"})
            started = time.monotonic()
            with pytest.raises(SettingsError) as refused:
                await probe_s3_storage(settings, timeout=1)
            elapsed = time.monotonic() - started
        assert str(refused.value).startswith(
            f"AGENT_STORAGE=s3://bucket/pre cannot be used: {probe} {written}"
        )
        assert said in str(refused.value)
        assert elapsed < 3  # one timeout for the write and the read together

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
    converter = data_converter(Settings(storage=f"file://{tmp_path}", storage_threshold=THRESHOLD))

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
