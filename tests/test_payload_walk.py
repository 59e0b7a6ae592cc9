"""A workflow task's payloads walked once (runtime/payload_walk.py) give
what the SDK's six passes give: the same bytes, each payload under its own
command's serialization context, stored payloads retrieved concurrently."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import temporalio.bridge.worker as bridge_worker
from temporalio.api.common.v1 import Payload
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import Client
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    ExternalStorage,
    PayloadCodec,
    SerializationContext,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.worker._workflow import _CommandAwareDataConverter

from runtime import payload_walk
from runtime.payloads import data_converter
from runtime.settings import Settings
from worker import build_worker

pytestmark = pytest.mark.skipif(payload_walk._SDK is None, reason="another temporalio: the stock passes run")

STOCK_DECODE = payload_walk._STOCK["decode_activation"]
STOCK_ENCODE = payload_walk._STOCK["encode_completion"]


def plain(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=f'"{text}"'.encode())


SMALL = plain("small")
COMPRESSIBLE = plain("c" * 3000)  # past the codec's 2 KB: compressed
# 12 KB that compresses to more than the 4 KB store threshold: stored.
LARGE = plain(
    base64.b64encode(
        b"".join(hashlib.sha256(bytes([i, j])).digest() for i in range(4) for j in range(70))
    ).decode()
)


@pytest.fixture
def converter(tmp_path: Path) -> DataConverter:
    return data_converter(
        Settings.from_env({"AGENT_STORAGE_DIR": str(tmp_path), "AGENT_STORAGE_THRESHOLD_BYTES": "4096"})
    )


def completion() -> WorkflowActivationCompletion:
    """Commands with payloads of each size, headers, a failure's details, a
    query answer, an update's answer and search attributes (never walked)."""
    c = WorkflowActivationCompletion(run_id="run")
    commands = c.successful.commands
    for seq, payloads in enumerate([[SMALL], [COMPRESSIBLE, SMALL], [LARGE, COMPRESSIBLE, SMALL]], start=1):
        schedule = commands.add().schedule_activity
        schedule.seq = seq
        schedule.activity_id = f"act-{seq}"
        schedule.activity_type = "tool"
        schedule.arguments.extend(payloads)
        schedule.headers["trace"].CopyFrom(SMALL)
    commands.add().upsert_workflow_search_attributes.search_attributes.indexed_fields["AgentStatus"].CopyFrom(
        plain("running")
    )
    commands.add().respond_to_query.succeeded.response.CopyFrom(COMPRESSIBLE)
    update = commands.add().update_response
    update.protocol_instance_id = "upd"
    update.completed.CopyFrom(LARGE)
    failed = commands.add().fail_workflow_execution.failure
    failed.message = "no"
    failed.application_failure_info.details.payloads.extend([COMPRESSIBLE, SMALL])
    commands.add().complete_workflow_execution.result.CopyFrom(SMALL)
    return c


async def activation(converter: DataConverter) -> WorkflowActivation:
    """Jobs whose payloads are as a worker receives them: encoded (so
    compressed, or a reference to the payload store)."""
    a = WorkflowActivation(run_id="run")

    async def encoded(*payloads: Payload) -> list[Payload]:
        return await converter._external_store_payload_sequence(
            await converter._encode_payload_sequence(list(payloads))
        )

    for seq, payloads in enumerate([[SMALL], [COMPRESSIBLE], [LARGE]], start=1):
        a.jobs.add().resolve_activity.seq = seq
        a.jobs[-1].resolve_activity.result.completed.result.CopyFrom((await encoded(*payloads))[0])
    failed = a.jobs.add().resolve_activity
    failed.seq = 4
    failed.result.failed.failure.application_failure_info.details.payloads.extend(
        await encoded(LARGE, COMPRESSIBLE)
    )
    signal = a.jobs.add().signal_workflow
    signal.signal_name = "steer"
    signal.input.extend(await encoded(SMALL, COMPRESSIBLE, LARGE))
    signal.headers["trace"].CopyFrom((await encoded(COMPRESSIBLE))[0])
    update = a.jobs.add().do_update
    update.name = "prompt"
    update.input.extend(await encoded(LARGE))
    return a


async def both(
    run: Callable[..., Any], stock: Callable[..., Any], message: Any, converter: Any, limit: int = 4
) -> tuple[Any, Any]:
    walked, stocked = type(message)(), type(message)()
    walked.CopyFrom(message)
    stocked.CopyFrom(message)
    await run(walked, converter, True, limit)
    await stock(stocked, converter, True, limit)
    return walked, stocked


async def test_a_completion_encodes_to_the_stock_passes_bytes(converter: DataConverter) -> None:
    original = completion()
    walked, stocked = await both(payload_walk.encode_completion, STOCK_ENCODE, original, converter)
    assert walked == stocked
    commands = walked.successful.commands
    assert commands[0].schedule_activity.arguments[0] == SMALL  # small payloads stay as they are
    compressed = commands[1].schedule_activity.arguments[0]
    assert compressed != COMPRESSIBLE and compressed.ByteSize() < 1000
    stored = commands[2].schedule_activity.arguments[0]
    assert stored.metadata["encoding"] == b"json/protobuf" and len(stored.external_payloads) == 1
    # Search attributes are the server's to read: never encoded.
    attributes = commands[3].upsert_workflow_search_attributes.search_attributes.indexed_fields
    assert attributes["AgentStatus"] == plain("running")
    assert walked != original


async def test_an_activation_decodes_to_the_stock_passes_bytes(converter: DataConverter) -> None:
    original = await activation(converter)
    walked, stocked = await both(payload_walk.decode_activation, STOCK_DECODE, original, converter)
    assert walked == stocked
    jobs = walked.jobs
    assert [jobs[i].resolve_activity.result.completed.result for i in range(3)] == [
        SMALL,
        COMPRESSIBLE,
        LARGE,
    ]
    assert list(jobs[3].resolve_activity.result.failed.failure.application_failure_info.details.payloads) == [
        LARGE,
        COMPRESSIBLE,
    ]
    assert list(jobs[4].signal_workflow.input) == [SMALL, COMPRESSIBLE, LARGE]
    assert jobs[4].signal_workflow.headers["trace"] == COMPRESSIBLE
    assert list(jobs[5].do_update.input) == [LARGE]


async def test_headers_are_left_alone_when_the_worker_does_not_encode_them(converter: DataConverter) -> None:
    original = completion()
    walked, stocked = type(original)(), type(original)()
    walked.CopyFrom(original)
    stocked.CopyFrom(original)
    await payload_walk.encode_completion(walked, converter, False, 4)
    await STOCK_ENCODE(stocked, converter, False, 4)
    assert walked == stocked
    assert walked.successful.commands[0].schedule_activity.headers["trace"] == SMALL


class StampingCodec(PayloadCodec, WithSerializationContext):
    """Writes the serialization context it encoded or decoded under into
    the payload: which command's context each payload got."""

    def __init__(self, context: SerializationContext | None = None) -> None:
        self.context = context

    def with_context(self, context: SerializationContext) -> StampingCodec:
        return StampingCodec(context)

    def _stamp(self, payloads: Sequence[Payload], key: str) -> list[Payload]:
        out = []
        for payload in payloads:
            stamped = Payload()
            stamped.CopyFrom(payload)
            context = self.context
            name = getattr(context, "activity_id", None) or getattr(context, "workflow_id", None) or "none"
            stamped.metadata[key] = str(name).encode()
            out.append(stamped)
        return out

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self._stamp(payloads, "encoded-for")

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return self._stamp(payloads, "decoded-for")


class Instance:
    """What the SDK's command-aware converter asks a workflow instance:
    each activity command's context is its own."""

    def get_serialization_context(self, command_info: Any) -> SerializationContext | None:
        if command_info is None:
            return None
        return ActivitySerializationContext(
            namespace="default",
            workflow_id="wf",
            workflow_type="Agent",
            activity_id=f"act-{command_info.command_seq}",
            activity_type="tool",
            activity_task_queue="q",
            is_local=False,
        )

    def get_external_store_context(self, command_info: Any) -> StorageDriverStoreContext:
        return StorageDriverStoreContext()


def command_aware() -> DataConverter:
    base = DataConverter(payload_codec=StampingCodec())
    workflow_context = WorkflowSerializationContext(namespace="default", workflow_id="wf")
    return _CommandAwareDataConverter.create(
        instance=Instance(),  # type: ignore[arg-type]
        context_free_dc=base,
        workflow_context_dc=base.with_context(workflow_context),
        workflow_context=workflow_context,
    )


async def test_each_payload_is_encoded_under_its_own_commands_context() -> None:
    walked, stocked = await both(payload_walk.encode_completion, STOCK_ENCODE, completion(), command_aware())
    assert walked == stocked
    commands = walked.successful.commands
    for seq in (1, 2, 3):
        arguments = commands[seq - 1].schedule_activity.arguments
        assert {p.metadata["encoded-for"] for p in arguments} == {f"act-{seq}".encode()}
    assert commands[4].respond_to_query.succeeded.response.metadata["encoded-for"] == b"none"


async def test_each_payload_is_decoded_under_its_own_jobs_context() -> None:
    a = WorkflowActivation(run_id="run")
    for seq in (7, 8):
        a.jobs.add().resolve_activity.seq = seq
        a.jobs[-1].resolve_activity.result.completed.result.CopyFrom(SMALL)
    walked, stocked = await both(payload_walk.decode_activation, STOCK_DECODE, a, command_aware())
    assert walked == stocked
    assert [j.resolve_activity.result.completed.result.metadata["decoded-for"] for j in walked.jobs] == [
        b"act-7",
        b"act-8",
    ]


@dataclasses.dataclass
class SlowDriver(StorageDriver):
    """A store whose reads take a while, counting how many run at once."""

    blobs: dict[str, Payload] = dataclasses.field(default_factory=dict)
    running: int = 0
    most: int = 0

    def name(self) -> str:
        return "slow"

    def type(self) -> str:
        return "slow"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        claims = []
        for payload in payloads:
            key = str(len(self.blobs))
            self.blobs[key] = payload
            claims.append(StorageDriverClaim(claim_data={"key": key}))
        return claims

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.05)
        self.running -= 1
        return [self.blobs[claim.claim_data["key"]] for claim in claims]


async def test_stored_payloads_are_fetched_at_most_limit_at_once() -> None:
    driver = SlowDriver()
    converter = DataConverter(external_storage=ExternalStorage(drivers=[driver], payload_size_threshold=10))
    values = [plain(f"result number {n}") for n in range(6)]
    a = WorkflowActivation(run_id="run")
    for seq, value in enumerate(values):
        a.jobs.add().resolve_activity.seq = seq
        a.jobs[-1].resolve_activity.result.completed.result.CopyFrom(
            (await converter._external_store_payload_sequence([value]))[0]
        )
    a.jobs.add().signal_workflow.input.append(SMALL)  # nothing to fetch
    walked = WorkflowActivation()
    walked.CopyFrom(a)
    await payload_walk.decode_activation(walked, converter, True, 3)
    assert [j.resolve_activity.result.completed.result for j in walked.jobs[:6]] == values
    assert driver.most == 3
    assert walked == (await both(payload_walk.decode_activation, STOCK_DECODE, a, converter, limit=3))[1]


async def test_a_failing_store_fails_the_task_as_the_stock_passes_do() -> None:
    class Broken(SlowDriver):
        async def store(self, context: Any, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
            raise OSError("disk full")

    converter = DataConverter(external_storage=ExternalStorage(drivers=[Broken()], payload_size_threshold=10))
    for run in (payload_walk.encode_completion, STOCK_ENCODE):
        with pytest.raises(OSError, match="disk full"):
            await run(completion(), converter, True, 4)


def test_install_swaps_the_sdks_functions_and_back() -> None:
    try:
        assert payload_walk.install(False) is False
        # The SDK's own passes, then the check of a replay's unreadable payloads.
        assert bridge_worker.decode_activation is payload_walk._checked_stock_decode
        assert bridge_worker.encode_completion is STOCK_ENCODE
        assert payload_walk.install(True) is True
        assert bridge_worker.decode_activation is payload_walk.decode_activation
        assert bridge_worker.encode_completion is payload_walk.encode_completion
    finally:
        payload_walk.install(True)


async def test_the_worker_walks_once_unless_told_not_to(client: Client, worker_env: dict[str, str]) -> None:
    try:
        for n, (env, walked) in enumerate(
            [({}, True), ({"AGENT_PAYLOAD_WALK": "off"}, False), ({"AGENT_SDK_FALLBACKS": "on"}, False)]
        ):
            build_worker(client, Settings.from_env({**worker_env, **env}, task_queue=f"walk-setting-{n}"))
            assert (bridge_worker.decode_activation is payload_walk.decode_activation) is walked, env
            assert (bridge_worker.encode_completion is payload_walk.encode_completion) is walked, env
    finally:
        payload_walk.install(True)


async def test_a_stored_payload_on_a_worker_without_storage_fails_the_task_as_the_stock_passes_do(
    converter: DataConverter,
) -> None:
    """A worker with AGENT_STORAGE=off given a reference: the task fails
    (and is retried until the setting is fixed) instead of the workflow
    reading the reference itself as the value."""
    a = WorkflowActivation(run_id="run")
    signal = a.jobs.add().signal_workflow
    signal.signal_name = "steer"
    signal.input.extend(await converter._external_store_payload_sequence([LARGE]))
    assert signal.input[0].metadata["encoding"] == b"json/protobuf"
    without = data_converter(Settings.from_env({"AGENT_STORAGE": "off"}))
    for run in (payload_walk.decode_activation, STOCK_DECODE):
        copy = WorkflowActivation()
        copy.CopyFrom(a)
        with pytest.raises(RuntimeError, match="TMPRL1105"):
            await run(copy, without, True, 4)


def test_a_replay_fails_on_a_payload_it_read_before_but_drops_a_signal_as_it_did() -> None:
    """A replaying workflow task that cannot read a payload the history
    holds fails with the reason (a review: an update's payload was refused
    as a value, and a nondeterminism error hid why). A signal refused on
    its first read was dropped then and is dropped again: no failure."""
    from temporalio.bridge.proto.workflow_activation import (
        DoUpdate,
        SignalWorkflow,
        WorkflowActivation,
        WorkflowActivationJob,
    )

    from runtime.converter import PayloadUnreadable, refused_payload

    gone = refused_payload("refers to a stored payload that is gone: ab12")
    signal = WorkflowActivationJob(signal_workflow=SignalWorkflow(signal_name="steer", input=[gone]))
    update = WorkflowActivationJob(do_update=DoUpdate(name="prompt", input=[gone]))
    payload_walk.refuse_unreadable_history(WorkflowActivation(is_replaying=True, jobs=[signal]))
    with pytest.raises(PayloadUnreadable) as raised:
        payload_walk.refuse_unreadable_history(WorkflowActivation(is_replaying=True, jobs=[signal, update]))
    assert str(raised.value).startswith(
        "A payload this conversation's history holds refers to a stored payload that is gone: "
        "ab12 on this worker"
    )


async def test_a_continued_runs_input_is_read_past_the_decompression_bound(tmp_path: Path) -> None:
    """The input of a run continued as new is the conversation's own state
    (written by its own continue-as-new): read whatever its size, where a start input
    or a signal in the same activation is still bounded (a limits audit: a
    carry past AGENT_MAX_DECOMPRESSED_BYTES failed the next run for good)."""
    from temporalio.api.enums.v1 import ContinueAsNewInitiator

    from runtime.converter import refused_reason

    bounded = data_converter(
        Settings.from_env({"AGENT_STORAGE": "off", "AGENT_MAX_DECOMPRESSED_BYTES": str(1024 * 1024)})
    )
    big = plain("x" * (2 * 1024 * 1024))
    [encoded] = await bounded._encode_payload_sequence([big])

    def jobs(initiator: int) -> WorkflowActivation:
        a = WorkflowActivation(run_id="run")
        start = a.jobs.add().initialize_workflow
        start.workflow_type = "AgentWorkflow"
        if initiator:
            start.continued_from_execution_run_id = "the-run-before"
            start.continued_initiator = initiator  # type: ignore[assignment]
        start.arguments.append(encoded)
        start.memo.fields["note"].CopyFrom(encoded)  # the client's, carried as it was
        signal = a.jobs.add().signal_workflow
        signal.signal_name = "steer"
        signal.input.append(encoded)
        return a

    carried = jobs(ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_WORKFLOW)
    await payload_walk.decode_activation(carried, bounded, False, 4)
    assert carried.jobs[0].initialize_workflow.arguments[0] == big
    assert refused_reason(carried.jobs[0].initialize_workflow.memo.fields["note"]) is not None
    assert refused_reason(carried.jobs[1].signal_workflow.input[0]) is not None  # a signal: bounded

    # A run started anew, or continued by a retry or a cron schedule (from the
    # client's own input: a review found these read unbounded).
    for initiator in (
        0,
        ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_RETRY,
        ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_CRON_SCHEDULE,
    ):
        started = jobs(initiator)
        await payload_walk.decode_activation(started, bounded, False, 4)
        assert refused_reason(started.jobs[0].initialize_workflow.arguments[0]) is not None, initiator
