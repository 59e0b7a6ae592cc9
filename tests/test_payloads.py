"""Payload storage, compression, the data converters and the one-walk
payload passes (runtime/payloads.py, runtime/payload_walk.py): behaviours
a mutation audit found no other test pinning, each beside the stock SDK's."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest
import temporalio.converter._extstore as extstore
from aiohttp import web
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload
from temporalio.api.sdk.v1 import ExternalStorageReference
from temporalio.bridge.proto.workflow_activation import DoUpdate, WorkflowActivation, WorkflowActivationJob
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    WorkflowSerializationContext,
)
from temporalio.exceptions import ApplicationError

from runtime import payload_walk
from runtime.converter import DECODE_BUDGET, DecodeBudget, PayloadUnreadable, refused_payload, refused_reason
from runtime.payloads import (
    _STORE_CONTEXTS_KEPT,
    CompressionCodec,
    FileSystemStorageDriver,
    StoreContextCachingConverter,
    blob_store,
    data_converter,
    data_converter_from_env,
)
from runtime.settings import Settings
from tests.support.s3 import use_fake_s3
from tests.support.serving import serving
from tests.test_encryption import KEY_A
from tests.test_payload_walk import (
    COMPRESSIBLE,
    LARGE,
    SMALL,
    STOCK_DECODE,
    STOCK_ENCODE,
    SlowDriver,
    both,
    completion,
    converter,  # noqa: F401  (the fixture)
    plain,
)
from tests.test_storage import BIG, THRESHOLD, _ContextRecorder, _run_context, needs_s3_extra

walk_only = pytest.mark.skipif(payload_walk._SDK is None, reason="another temporalio: the stock passes run")


async def encoded(converter: DataConverter, *payloads: object) -> list:  # noqa: F811
    return await converter._external_store_payload_sequence(
        await converter._encode_payload_sequence(list(payloads))
    )


@walk_only
@pytest.mark.parametrize("headers", [True, False])
async def test_a_start_jobs_every_payload_decodes_as_the_stock_passes_do(
    converter: DataConverter,  # noqa: F811
    headers: bool,
) -> None:
    """A run's start carries headers, a continued failure, the last completion and a memo: each decoded as
    the SDK would."""
    a = WorkflowActivation(run_id="run")
    start = a.jobs.add().initialize_workflow
    start.workflow_type = "AgentWorkflow"
    start.arguments.extend(await encoded(converter, SMALL, COMPRESSIBLE))
    start.headers["trace"].CopyFrom((await encoded(converter, COMPRESSIBLE))[0])
    details = start.continued_failure.application_failure_info.details.payloads
    details.extend(await encoded(converter, COMPRESSIBLE))
    start.last_completion_result.payloads.extend(await encoded(converter, LARGE))
    start.memo.fields["note"].CopyFrom((await encoded(converter, COMPRESSIBLE))[0])
    walked, stocked = a.__class__(), a.__class__()
    walked.CopyFrom(a)
    stocked.CopyFrom(a)
    await payload_walk.decode_activation(walked, converter, headers, 4)
    await STOCK_DECODE(stocked, converter, headers, 4)
    assert walked == stocked
    got = walked.jobs[0].initialize_workflow
    assert list(got.arguments) == [SMALL, COMPRESSIBLE]
    assert list(got.continued_failure.application_failure_info.details.payloads) == [COMPRESSIBLE]
    assert list(got.last_completion_result.payloads) == [LARGE]
    assert got.memo.fields["note"] == COMPRESSIBLE
    assert (got.headers["trace"] == COMPRESSIBLE) is headers


@walk_only
async def test_a_payload_exactly_at_the_storage_threshold_is_stored_as_the_stock_passes_do() -> None:
    """The threshold is inclusive (the SDK stores a payload of at least that size): the walk must store the
    same ones."""

    at = SMALL.ByteSize()
    outcomes = []
    for run in (payload_walk.encode_completion, STOCK_ENCODE):  # each its own store: the keys count from 0
        storing = DataConverter(
            external_storage=ExternalStorage(drivers=[SlowDriver()], payload_size_threshold=at)
        )
        c = WorkflowActivationCompletion(run_id="run")
        c.successful.commands.add().complete_workflow_execution.result.CopyFrom(SMALL)
        await run(c, storing, True, 4)
        outcomes.append(c)
    walked, stocked = outcomes
    assert walked == stocked
    result = walked.successful.commands[0].complete_workflow_execution.result
    assert result != SMALL and len(result.external_payloads) == 1


@walk_only
async def test_a_failing_store_stops_the_other_stores_of_the_task() -> None:
    """One store failing fails the task at once: the task's other payloads are not left being written, as in
    the SDK's passes."""

    class HalfBroken(SlowDriver):
        async def store(
            self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
        ) -> list[StorageDriverClaim]:
            if payloads[0] == SMALL:
                raise OSError("disk full")
            await asyncio.sleep(0.3)
            return await super().store(context, payloads)

    driver = HalfBroken()
    storing = DataConverter(external_storage=ExternalStorage(drivers=[driver], payload_size_threshold=1))
    c = WorkflowActivationCompletion(run_id="run")
    for n in range(3):
        schedule = c.successful.commands.add().schedule_activity
        schedule.seq = n + 1
        schedule.arguments.append(plain(f"slow {n}"))
    c.successful.commands.add().complete_workflow_execution.result.CopyFrom(SMALL)
    with pytest.raises(OSError, match="disk full"):
        await payload_walk.encode_completion(c, storing, True, 8)
    await asyncio.sleep(0.5)
    assert driver.blobs == {}


@walk_only
async def test_a_start_memo_the_worker_cannot_read_does_not_wedge_a_replay(
    converter: DataConverter,  # noqa: F811
) -> None:
    """The workflow never reads its memo: a memo the first run refused (and went on) must not fail every
    replay."""

    def start(replaying: bool) -> WorkflowActivation:
        a = WorkflowActivation(run_id="run", is_replaying=replaying)
        job = a.jobs.add().initialize_workflow
        job.workflow_type = "AgentWorkflow"
        job.arguments.append(SMALL)
        job.memo.fields["note"].CopyFrom(Payload(metadata={"encoding": b"binary/zlib"}, data=b"not zlib"))
        return a

    await payload_walk.decode_activation(start(False), converter, False, 4)  # the first run goes on
    await payload_walk.decode_activation(start(True), converter, False, 4)  # so must its replay


def test_a_start_input_the_worker_cannot_read_still_stops_a_replay() -> None:
    """Unlike its memo, a start's input is what the first run read: a replay
    that cannot read it fails its task with the reason, and goes on once it can."""
    activation = WorkflowActivation(run_id="run", is_replaying=True)
    job = activation.jobs.add().initialize_workflow
    job.arguments.append(refused_payload("refers to a stored payload that is gone: ef56"))
    with pytest.raises(PayloadUnreadable, match="gone: ef56 on this worker"):
        payload_walk.refuse_unreadable_history(activation)


@walk_only
async def test_the_stock_passes_also_fail_a_replay_on_a_payload_read_before(
    converter: DataConverter,  # noqa: F811
) -> None:
    """With AGENT_PAYLOAD_WALK=off a replay still fails, with the reason, on an update it cannot read."""

    gone = refused_payload("refers to a stored payload that is gone: ab12")
    update = WorkflowActivationJob(do_update=DoUpdate(name="prompt", input=[gone]))
    await payload_walk._checked_stock_decode(
        WorkflowActivation(is_replaying=False, jobs=[update]), converter, True, 4
    )
    with pytest.raises(PayloadUnreadable, match="gone: ab12 on this worker"):
        await payload_walk._checked_stock_decode(
            WorkflowActivation(is_replaying=True, jobs=[update]), converter, True, 4
        )


@walk_only
async def test_marked_references_encode_and_decode_as_the_stock_passes_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the SDK marking references (its _ENCODE_STORAGE_REFERENCES), the walk still writes and reads the
    stock bytes."""

    monkeypatch.setattr(extstore, "_ENCODE_STORAGE_REFERENCES", True)
    storing = data_converter(  # encrypted: the codecs change even a small reference
        Settings.from_env(
            {
                "AGENT_STORAGE_DIR": str(tmp_path),
                "AGENT_STORAGE_THRESHOLD_BYTES": "4096",
                "AGENT_ENCRYPTION_KEYS": f"a:{KEY_A}",
            }
        )
    )
    walked, stocked = await both(payload_walk.encode_completion, STOCK_ENCODE, completion(), storing)
    # Encryption is randomized: each side's reference is compared by what it decodes to.
    for side in (walked, stocked):
        stored = side.successful.commands[2].schedule_activity.arguments[0]
        assert stored.metadata["encoding"] != b"json/protobuf"  # the reference went through the codecs
        a = WorkflowActivation(run_id="run")
        a.jobs.add().resolve_activity.result.completed.result.CopyFrom(stored)
        walked_a, stocked_a = await both(payload_walk.decode_activation, STOCK_DECODE, a, storing)
        assert walked_a == stocked_a
        assert walked_a.jobs[0].resolve_activity.result.completed.result == LARGE


def test_a_replay_names_the_unreadable_activity_result_among_other_fields() -> None:
    """An activity result the worker cannot read on replay fails with its reason, whatever scalar fields sit
    beside it."""

    job = WorkflowActivationJob()
    job.resolve_activity.seq = 3
    job.resolve_activity.is_local = True
    job.resolve_activity.result.completed.result.CopyFrom(
        refused_payload("refers to a stored payload that is gone: cd34")
    )
    with pytest.raises(PayloadUnreadable, match="gone: cd34 on this worker"):
        payload_walk.refuse_unreadable_history(WorkflowActivation(is_replaying=True, jobs=[job]))


@needs_s3_extra
async def test_an_s3_object_gone_as_real_s3_says_it_is_refused_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real S3 answers a missing object's GET with a NoSuchKey error body: the reference is refused, naming
    the object."""

    objects: dict[str, bytes] = {}

    async def handle(request: web.Request) -> web.Response:
        if request.method == "PUT":
            objects[request.path] = await request.read()
            return web.Response()
        if request.path in objects:
            return web.Response(body=b"" if request.method == "HEAD" else objects[request.path])
        if request.method == "HEAD":
            return web.Response(status=404)
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code>'
            "<Message>The specified key does not exist.</Message></Error>"
        )
        return web.Response(status=404, body=body.encode(), content_type="application/xml")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with serving(app) as url:
        use_fake_s3(monkeypatch, url)
        monkeypatch.setenv("AGENT_STORAGE", "s3://bucket/prefix")
        monkeypatch.setenv("AGENT_STORAGE_THRESHOLD_BYTES", str(THRESHOLD))
        storing = data_converter_from_env()
        [encoded] = await storing.encode([BIG])
        [key] = objects
        objects.clear()
        with pytest.raises(ApplicationError) as refused:
            await storing.decode([encoded], [str])
    assert refused.value.type == "PayloadRefused"
    assert f"gone: s3://bucket{key.removeprefix('/bucket')} is missing" in str(refused.value)


async def test_a_file_reference_naming_no_namespace_reads_the_default_one(tmp_path: Path) -> None:
    """A reference written without a target (a client's, the codec server's) is read from the ``default``
    namespace."""

    driver = FileSystemStorageDriver(tmp_path)
    [claim] = await driver.store(StorageDriverStoreContext(), [SMALL])
    assert claim.claim_data["namespace"] == "default"
    bare = StorageDriverClaim(claim_data={"sha256": claim.claim_data["sha256"]})
    assert await driver.retrieve(StorageDriverRetrieveContext(), [bare]) == [SMALL]


async def test_plain_payloads_do_not_use_up_the_decompression_bound() -> None:
    """The bound is on what decompression makes: a large uncompressed argument beside a compressed one leaves
    that one readable."""

    codec = CompressionCodec(threshold=None, max_decompressed=10_000)
    big_plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"' + b"p" * 8000 + b'"')
    inner = Payload(metadata={"encoding": b"json/plain"}, data=b'"' + b"z" * 5000 + b'"')
    compressed = Payload(metadata={"encoding": b"binary/zlib"}, data=zlib.compress(inner.SerializeToString()))
    decoded = await codec.decode([big_plain, compressed])
    assert refused_reason(decoded[1]) is None
    assert decoded == [big_plain, inner]


async def test_a_payload_compression_would_not_shrink_stays_plain() -> None:
    """Incompressible data past the threshold is left as it is (readable in the UI), not stored larger as
    zlib."""

    noise = Payload(metadata={"encoding": b"binary/plain"}, data=os.urandom(4096))
    assert await CompressionCodec(threshold=1024).encode([noise]) == [noise]


def s3_converter(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]], storage: str
) -> DataConverter:
    """The worker's converter storing payloads of ``THRESHOLD`` bytes and up at ``storage`` (a fake S3)."""
    use_fake_s3(monkeypatch, fake_s3[0])
    monkeypatch.setenv("AGENT_STORAGE", storage)
    monkeypatch.setenv("AGENT_STORAGE_THRESHOLD_BYTES", str(THRESHOLD))
    return data_converter_from_env()


@needs_s3_extra
async def test_an_s3_object_that_matches_its_hash_but_is_no_payload_is_refused_not_raised(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """Content that is no payload (its hash in the reference matching) is refused with a sentence, not raised
    into the task."""

    objects = fake_s3[1]
    storing = s3_converter(monkeypatch, fake_s3, "s3://bucket/prefix")
    [encoded] = await storing.encode([BIG])
    [key] = objects
    junk = b"\xff\xff\xff not a payload"
    objects[key] = junk
    reference = json_format.Parse(encoded.data, ExternalStorageReference())
    reference.claim_data["hash_value"] = hashlib.sha256(junk).hexdigest()
    forged = Payload(metadata=dict(encoded.metadata), data=json_format.MessageToJson(reference).encode())
    with pytest.raises(ApplicationError) as refused:
        await storing.decode([forged], [str])
    assert refused.value.type == "PayloadRefused"
    assert "does not match its reference" in str(refused.value)


@needs_s3_extra
async def test_an_s3_prefix_written_with_slashes_keeps_the_same_keys(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """``s3://bucket/prefix/`` and ``s3://bucket/prefix`` name the same objects: a trailing slash makes no
    empty key segment."""

    objects = fake_s3[1]
    keys = []
    for storage in ("s3://bucket/some/prefix", "s3://bucket/some/prefix/"):
        objects.clear()
        storing = s3_converter(monkeypatch, fake_s3, storage)
        [encoded] = await storing.encode([BIG])
        keys.append(list(objects))
        assert await storing.decode([encoded], [str]) == [BIG]
    assert keys[0] == keys[1] and keys[0][0].startswith("/bucket/some/prefix/v0/")


async def test_a_refused_payload_uses_none_of_a_requests_decode_budget() -> None:
    """The codec server's per-request budget counts what was read: a payload refused beside it leaves the
    rest of the budget."""

    inner = Payload(metadata={"encoding": b"json/plain"}, data=b'"' + b"z" * 5000 + b'"')
    compressed = Payload(metadata={"encoding": b"binary/zlib"}, data=zlib.compress(inner.SerializeToString()))
    garbage = Payload(metadata={"encoding": b"binary/zlib"}, data=b"not zlib at all")
    token = DECODE_BUDGET.set(DecodeBudget(inner.ByteSize()))
    try:
        refused, read = await CompressionCodec(threshold=None).decode([garbage, compressed])
    finally:
        DECODE_BUDGET.reset(token)
    assert refused_reason(refused) is not None
    assert read == inner


def test_a_part_that_wants_the_context_gets_it_every_time() -> None:
    """A user's payload converter that takes a context gets each workflow's own, not only on the first ask."""

    wanting = dataclasses.replace(
        data_converter(Settings(storage="off")), payload_converter_class=_ContextRecorder
    )
    for workflow_id in ("wf-1", "wf-2"):
        context = WorkflowSerializationContext(namespace="default", workflow_id=workflow_id)
        derived = wanting.with_context(context)
        assert derived is not wanting
        assert derived.payload_converter._inner_payload_converter.context == context  # type: ignore[attr-defined]


def _bindable(tmp_path: Path) -> DataConverter:

    storing = data_converter(Settings(storage="file", storage_dir=tmp_path))
    if not isinstance(storing, StoreContextCachingConverter):
        pytest.skip("another temporalio: the store contexts are not cached")
    return storing


def test_a_runs_store_context_is_bound_once(tmp_path: Path) -> None:
    """A run writing many payloads reuses one bound storing instead of deriving one per payload."""

    storing = _bindable(tmp_path)
    first = storing._with_store_context(_run_context("default", "run-1"))
    assert storing._with_store_context(_run_context("default", "run-1")) is first
    assert storing._with_store_context(_run_context("default", "run-2")) is not first


def test_the_bound_store_contexts_kept_are_bounded(tmp_path: Path) -> None:
    """A long-lived worker sees endless runs: the converters kept per run stay bounded
    (_STORE_CONTEXTS_KEPT)."""

    storing = _bindable(tmp_path)
    for n in range(_STORE_CONTEXTS_KEPT * 2 + 1):
        storing._with_store_context(_run_context("default", f"run-{n}"))
    assert len(storing._store_bound) <= _STORE_CONTEXTS_KEPT  # type: ignore[attr-defined]


def test_with_storage_off_there_is_no_context_store(tmp_path: Path) -> None:
    """AGENT_STORAGE=off writes nothing to disk: no blob store for the context either (it is sent inline)."""

    assert blob_store(Settings.from_env({"AGENT_STORAGE": "off", "AGENT_STORAGE_DIR": str(tmp_path)})) is None
