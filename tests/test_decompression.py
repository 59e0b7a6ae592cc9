"""Compressed payloads are read with a bound (issue 12): anyone who may send
a signal may send 64 KiB of zlib that expands to 64 MiB and more. Such a
payload is refused with one sentence wherever it is read (the converter,
the codec server, a running conversation), and nothing wedges."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import tracemalloc
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.converter import DataConverter, StorageDriverClaim, StorageDriverRetrieveContext
from temporalio.exceptions import ApplicationError

import codec_server
from activities.blobs import digest_of
from codec_server import HEAVY_AT_ONCE, CodecSettings, build_app
from runtime.converter import READING_CARRY, refused_reason
from runtime.payloads import CompressionCodec, FileSystemStorageDriver, data_converter
from runtime.settings import DEFAULT_MAX_DECOMPRESSED_BYTES, Settings
from tests.support.stack import Stack
from tests.test_codec_server import Endpoint, as_json, assert_one_sentence, serving
from tests.test_robustness import still_answers

MiB = 1024 * 1024


def zlib_bomb(expands_to: int) -> Payload:
    """A payload marked as this project's compression whose JSON string
    inflates to ``expands_to`` bytes (built without holding them)."""
    body = b"a" * MiB
    inner_header = Payload(metadata={"encoding": b"json/plain"}, data=b"").SerializeToString()
    # A serialized Payload is its metadata, then field 2 (data) as a length-prefixed string.
    data_length = expands_to + 2
    prefix = inner_header + b"\x12" + _varint(data_length) + b'"'
    compressor = zlib.compressobj(9)
    chunks = [compressor.compress(prefix)]
    for _ in range(expands_to // MiB):
        chunks.append(compressor.compress(body))
    chunks.append(compressor.compress(b"a" * (expands_to % MiB) + b'"'))
    chunks.append(compressor.flush())
    return Payload(metadata={"encoding": b"binary/zlib"}, data=b"".join(chunks))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


BOMB = zlib_bomb(DEFAULT_MAX_DECOMPRESSED_BYTES + MiB)


def test_the_bomb_is_small_and_would_expand_beyond_the_bound() -> None:
    assert len(BOMB.data) <= 66 * 1024  # 64 KiB of zlib
    inner = Payload.FromString(zlib.decompress(BOMB.data))  # what an unbounded reader would hold
    assert inner.metadata["encoding"] == b"json/plain"
    assert len(inner.data) > DEFAULT_MAX_DECOMPRESSED_BYTES


async def test_a_bomb_is_refused_with_a_sentence_by_the_converter() -> None:
    converter = data_converter(Settings(storage="off"))

    with pytest.raises(ApplicationError) as refused:
        await converter.decode([BOMB], [str])

    assert refused.value.type == "PayloadRefused" and refused.value.non_retryable
    assert "more than 67,108,864 bytes" in refused.value.message
    assert "AGENT_MAX_DECOMPRESSED_BYTES" in refused.value.message


async def test_a_bomb_is_refused_before_it_is_held_in_memory() -> None:
    converter = data_converter(Settings(storage="off", max_decompressed_bytes=2 * MiB))
    bomb = zlib_bomb(64 * MiB)

    tracemalloc.start()
    try:
        with pytest.raises(ApplicationError, match="decompression bomb"):
            await converter.decode([bomb], [str])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 8 * MiB


async def test_a_large_payload_under_the_bound_still_reads() -> None:
    converter = data_converter(Settings(storage="off"))
    text = "the same words again " * 200_000  # 4 MiB, compressed to a few KiB

    [encoded] = await converter.encode([text])

    assert encoded.metadata["encoding"] == b"binary/zlib"
    assert await converter.decode([encoded], [str]) == [text]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"not zlib at all", "its data does not decompress"),
        (zlib.compress(b"\x0a\x04json" * 50)[:-6], "its data does not decompress"),
        (zlib.compress(b"\xff\xff\xff"), "decompresses, but not to a payload"),
    ],
    ids=["garbage", "truncated", "not-a-payload"],
)
async def test_corrupt_compressed_data_is_refused_with_a_sentence(data: bytes, says: str) -> None:
    """Each refusal says what is wrong: data that decompresses fine into
    something else was said not to decompress (an audit)."""
    converter = data_converter(Settings(storage="off"))

    with pytest.raises(ApplicationError, match=f"marked binary/zlib (but|and) {says}"):
        await converter.decode([Payload(metadata={"encoding": b"binary/zlib"}, data=data)], [str])


async def test_the_codec_server_answers_a_bomb_with_a_4xx_sentence() -> None:
    converter = data_converter(Settings(storage="off"))
    async with serving(build_app(converter, CodecSettings())) as url:
        status, text = await Endpoint(url).call(
            "decode", as_json([Payload(metadata={"encoding": b"json/plain"}, data=b'"ok"'), BOMB])
        )

    assert_one_sentence(status, text, 422, "Payload 1", "decompression bomb", "AGENT_MAX_DECOMPRESSED_BYTES")


async def test_the_payloads_of_one_message_are_bounded_together() -> None:
    """One signal of 20 payloads, each just under the bound (1 MB sent),
    took a worker to 4 GB (a security audit): a message's payloads decode
    within the bound together."""
    from runtime.converter import refused_reason

    converter = data_converter(Settings(storage="off", max_decompressed_bytes=2 * MiB))
    codec = converter.payload_codec
    assert codec is not None
    under = zlib_bomb(MiB + MiB // 2)  # each alone is read
    decoded = await codec.decode([under, under, under])
    assert refused_reason(decoded[0]) is None
    reason = refused_reason(decoded[1])
    assert reason is not None and "with the other payloads read with it" in reason
    assert refused_reason(decoded[2]) is not None
    assert [refused_reason(p) for p in await codec.decode([under])] == [None]


async def test_the_codec_server_bounds_what_one_request_decodes_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 payloads of 48 MiB (0.5 MB sent) took the codec server to 2 GB; a
    check after each part still let 8 be decompressed first (696 MiB held,
    a review): a payload is decompressed only within what is left."""
    from runtime.converter import refused_reason
    from runtime.payloads import CompressionCodec

    held: list[int] = []
    real = CompressionCodec.decompress

    def counted(self: CompressionCodec, data: bytes, limit: int | None = -1) -> Payload:
        payload = real(self, data, limit)
        if refused_reason(payload) is None:
            held.append(payload.ByteSize())
        return payload

    monkeypatch.setattr(CompressionCodec, "decompress", counted)
    converter = data_converter(Settings(storage="off", max_decompressed_bytes=2 * MiB))
    under = zlib_bomb(MiB + 9 * MiB // 10)
    async with serving(build_app(converter, CodecSettings(max_decompressed_bytes=2 * MiB))) as url:
        status, text = await Endpoint(url).call("decode", as_json([under]))
        assert status == 200
        held.clear()
        status, text = await Endpoint(url).call("decode", as_json([under] * 9))
    assert status in (413, 422) and "AGENT_MAX_DECOMPRESSED_BYTES" in text, text
    assert len(held) == 1  # the one that fits; the chunked check held 8


async def test_the_codec_server_decodes_for_two_requests_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 requests of 80 KB, each a zlib payload of 60 MiB, took the codec
    server to 3.1 GB (an audit): requests with compressed or stored payloads
    take turns, two at a time, and a turn ends when its answer is written
    (not after the minute a client that never reads is given)."""
    active = most = 0
    real = codec_server._decode_all

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal active, most
        active += 1
        most = max(most, active)
        try:
            await asyncio.sleep(0.05)
            return await real(*args, **kwargs)
        finally:
            active -= 1

    monkeypatch.setattr(codec_server, "_decode_all", counted)
    converter = data_converter(Settings(storage="off", max_decompressed_bytes=2 * MiB))
    under = zlib_bomb(MiB)
    async with serving(build_app(converter, CodecSettings(max_decompressed_bytes=2 * MiB))) as url:
        endpoint = Endpoint(url)
        answers = await asyncio.wait_for(
            asyncio.gather(*(endpoint.call("decode", as_json([under])) for _ in range(8))), 30
        )
    assert [status for status, _ in answers] == [200] * 8
    assert most == HEAVY_AT_ONCE


async def test_plain_payloads_do_not_wait_for_the_heavy_requests_turns() -> None:
    """Payloads that are plain JSON decode to what was sent: they are read at
    once while compressed ones wait for a turn."""
    converter = data_converter(Settings(storage="off"))
    app = build_app(converter, CodecSettings())
    gate = app[codec_server._HEAVY]
    for _ in range(HEAVY_AT_ONCE):
        await gate.acquire()
    compressed = Payload(metadata={"encoding": b"binary/zlib"}, data=zlib.compress(_plain(b'"big"')))
    async with serving(app) as url:
        endpoint = Endpoint(url)
        heavy = asyncio.create_task(endpoint.call("decode", as_json([compressed])))
        status, _ = await endpoint.call(
            "decode", as_json([Payload(metadata={"encoding": b"json/plain"}, data=b'"ok"')])
        )
        assert status == 200
        await asyncio.sleep(0.3)
        assert not heavy.done()
        for _ in range(HEAVY_AT_ONCE):
            gate.release()
        status, text = await asyncio.wait_for(heavy, 10)
    assert status == 200 and json.loads(text)["payloads"][0]["data"] == base64.b64encode(b'"big"').decode()


async def test_a_turn_that_runs_out_closes_its_connection_and_lets_the_next_in() -> None:
    """A client that never read its answer kept the decoded payloads in
    memory while the turn's deadline let the next request decode more (a
    review): at the deadline the connection is closed, then the turn ends."""
    from types import SimpleNamespace

    closed: list[bool] = []
    gate = asyncio.Semaphore(1)
    request = SimpleNamespace(
        method="POST", raw_path="/decode", transport=SimpleNamespace(close=lambda: closed.append(True))
    )
    turn = await codec_server._Turn.take(gate, request)  # type: ignore[arg-type]
    assert gate.locked()
    turn._expire()
    assert closed == [True] and not gate.locked()
    turn.end()  # the answer's own end afterwards releases nothing twice
    assert not gate.locked() and gate._value == 1


def _plain(data: bytes) -> bytes:
    return Payload(metadata={"encoding": b"json/plain"}, data=data).SerializeToString()


# --- a running conversation ------------------------------------------------------------


async def plain_client(stack: Stack) -> Client:
    """A client that sends payloads as given: no codec of this project."""
    return await Client.connect(stack.dev_server.address)


async def test_a_bomb_signal_is_dropped_and_a_bomb_update_refused(stack: Stack) -> None:
    handle = await stack.start()
    raw = (await plain_client(stack)).get_workflow_handle(handle.id)

    await raw.signal("steer", RawValue(BOMB))
    await raw.signal("follow_up", RawValue(BOMB))
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await raw.execute_update("prompt", RawValue(BOMB))

    assert "decompression bomb" in str(refused.value.cause)
    current = await stack.state(handle)
    assert (current.steering_queue, current.follow_up_queue, current.status) == (0, 0, "idle")
    await still_answers(stack, handle)
    await handle.signal("close")


async def test_a_bomb_start_input_fails_the_conversation_with_a_sentence(stack: Stack) -> None:
    client = await plain_client(stack)
    handle = await client.start_workflow(
        "AgentWorkflow", RawValue(BOMB), id=f"bomb-{uuid.uuid4().hex[:8]}", task_queue=stack.task_queue
    )

    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 30)

    assert "decompression bomb" in str(failed.value.cause)


async def test_a_control_payload_leaves_the_codec_plain_and_unmarked() -> None:
    """The state query and the control updates' results stay plain JSON at
    any size, and carry only their encoding: the Temporal CLI prints a
    payload with other metadata as raw bytes instead of its JSON."""
    from runtime.converter import AgentPayloadConverter
    from workflows.contract import SettingsInForce

    settings = SettingsInForce(system_prompt="Be brief. " * 500)
    payload = AgentPayloadConverter().to_payloads([settings])[0]
    for threshold in (2048, None):
        (encoded,) = await CompressionCodec(threshold).encode([payload])
        assert dict(encoded.metadata) == {"encoding": b"json/plain"}
        assert encoded.data == payload.data
    (other,) = await CompressionCodec(2048).encode(
        AgentPayloadConverter().to_payloads([settings.model_dump()])
    )
    assert dict(other.metadata) == {"encoding": b"binary/zlib"}  # the same JSON as a plain dict is compressed


async def _stored_600_kb(tmp_path: Path) -> tuple[DataConverter, Payload]:
    """A converter storing payloads of 4 KB or more in ``tmp_path`` (1 MiB
    decode budget), and its reference to a stored 600 KB payload."""
    settings = Settings(
        storage="file",
        storage_dir=tmp_path,
        storage_threshold=4096,
        max_decompressed_bytes=MiB,
        compress_threshold=None,
    )
    converter = data_converter(settings)
    [reference] = await converter.encode([os.urandom(300_000).hex()])  # 600 KB
    return converter, reference


async def test_the_codec_server_counts_stored_payloads_against_the_request_budget(tmp_path: Path) -> None:
    """A reference is a few hundred bytes and its stored payload any size,
    compressed or not (a control payload never is): 50 references to a
    1 MB payload (16 KB sent) came back as 66 MB, past a 1 MiB budget (a
    UI audit). They count, as compressed payloads do."""
    converter, reference = await _stored_600_kb(tmp_path)
    assert reference.metadata["encoding"] == b"json/protobuf" and reference.ByteSize() < 1000
    async with serving(build_app(converter, CodecSettings(max_decompressed_bytes=MiB))) as url:
        status, text = await Endpoint(url).call("decode", as_json([reference]))
        assert status == 200
        status, text = await Endpoint(url).call("decode", as_json([reference] * 50))
    assert status == 413 and "AGENT_MAX_DECOMPRESSED_BYTES" in text, (status, text[:200])


async def test_two_stored_payloads_just_past_the_request_budget_are_refused(tmp_path: Path) -> None:
    """The request's payloads decode within AGENT_MAX_DECOMPRESSED_BYTES
    together: two of 600 KB each under a 1 MiB budget pass it (by 0.15 MB)."""
    converter, reference = await _stored_600_kb(tmp_path)
    async with serving(build_app(converter, CodecSettings(max_decompressed_bytes=MiB))) as url:
        status, _ = await Endpoint(url).call("decode", as_json([reference]))
        assert status == 200
        status, text = await Endpoint(url).call("decode", as_json([reference] * 2))

    assert status == 413 and "AGENT_MAX_DECOMPRESSED_BYTES" in text, (status, text[:200])


async def test_a_bomb_memo_does_not_stop_the_conversation_when_it_replays(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """A start memo the worker refuses is never read by the workflow: the
    first run goes on, and so must a replay on a worker that has not got
    the conversation in its cache (it failed every workflow task before)."""
    from runtime.settings import Settings
    from worker import build_worker

    queue = f"memo-{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env(worker_env, task_queue=queue)
    client = await plain_client(stack)
    async with build_worker(stack.client, settings):
        raw = await client.start_workflow(
            "AgentWorkflow",
            {"model": stack.model},
            id=f"memo-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            memo={"note": RawValue(BOMB)},
        )
        handle = stack.client.get_workflow_handle(raw.id)
        await still_answers(stack, handle, "first")
    async with build_worker(stack.client, settings):  # a new worker: the conversation replays
        await asyncio.wait_for(still_answers(stack, handle, "after the replay"), 30)
        await handle.signal("close")


# --- references to stored payloads ------------------------------------------------------


_REFERENCE_METADATA = {
    "encoding": b"json/protobuf",
    "messageType": b"temporal.api.sdk.v1.ExternalStorageReference",
}


def _reference(claim: dict[str, str], driver: str = "fs") -> Payload:
    """A reference as the SDK writes one, to whatever ``claim`` says."""
    data = json.dumps({"claimData": claim, "driverName": driver}).encode()
    return Payload(metadata=_REFERENCE_METADATA, data=data)


_DIGEST = "2a" * 32
MALFORMED_REFERENCES = {
    "a driver no worker has": _reference({"namespace": "default", "sha256": _DIGEST}, driver="s3"),
    "no JSON": Payload(metadata=_REFERENCE_METADATA, data=b"not json"),
    "the legacy encoding, empty": Payload(
        metadata={"encoding": b"json/external-storage-reference"}, data=b"{}"
    ),
    "a namespace too long for a file name": _reference({"namespace": "é" * 50, "sha256": _DIGEST}),
}


@pytest.mark.parametrize("name", list(MALFORMED_REFERENCES))
async def test_a_reference_the_sdk_cannot_follow_is_refused_with_a_sentence(
    name: str, tmp_path: Path
) -> None:
    """Anyone who may signal can send a reference: one naming a driver no
    worker has, or not JSON, or a namespace no file name can hold, made the
    SDK (or the file system) raise, failing every workflow task of the
    conversation (a security audit). It is refused as one to a payload that
    is gone is."""
    converter = data_converter(Settings(storage="file", storage_dir=tmp_path))

    [read] = await converter.decode([MALFORMED_REFERENCES[name]], [RawValue])

    assert refused_reason(read.payload) is not None, name
    assert str(tmp_path) not in refused_reason(read.payload)


async def test_a_signal_with_a_reference_the_sdk_cannot_follow_is_dropped(stack: Stack) -> None:
    handle = await stack.start()
    raw = (await plain_client(stack)).get_workflow_handle(handle.id)

    for reference in MALFORMED_REFERENCES.values():
        await raw.signal("steer", RawValue(reference))
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await raw.execute_update("prompt", RawValue(MALFORMED_REFERENCES["a driver no worker has"]))

    assert "driver 's3', which these storage settings do not have" in str(refused.value.cause)
    assert (await stack.state(handle)).steering_queue == 0
    await still_answers(stack, handle)  # the suite also fails a test whose conversation fails a task
    await handle.signal("close")


async def test_the_references_of_one_message_read_at_most_the_bound_together(tmp_path: Path) -> None:
    """A 7 KB signal of 30 references to one stored 20 MB payload took a
    worker to 2.9 GB (a security audit): the stored payloads one message
    refers to are read within AGENT_MAX_DECOMPRESSED_BYTES together, a
    repeated one counted each time, one past what is left refused unread;
    the carried input of a run continued as new is read whole, as by the
    codec."""
    driver = FileSystemStorageDriver(tmp_path, max_read_bytes=MiB)
    small = Payload(metadata={"encoding": b"json/plain"}, data=b'"' + b"a" * 300_000 + b'"')
    large = Payload(metadata={"encoding": b"json/plain"}, data=b'"' + b"b" * (MiB + 10) + b'"')
    claims = [
        StorageDriverClaim(claim_data={"namespace": "default", "sha256": digest_of(p.SerializeToString())})
        for p in (small, large)
    ]
    for payload in (small, large):
        driver._write("default", payload)
    context = StorageDriverRetrieveContext()

    read = await driver.retrieve(context, [claims[0]] * 5)
    assert [refused_reason(p) is None for p in read] == [True, True, True, False, False]
    assert read[0] == small and "AGENT_MAX_DECOMPRESSED_BYTES" in (refused_reason(read[3]) or "")
    [alone] = await driver.retrieve(context, [claims[1]])
    assert "AGENT_MAX_DECOMPRESSED_BYTES" in (refused_reason(alone) or "")

    carry = READING_CARRY.set(True)
    try:
        read = await driver.retrieve(context, [claims[0]] * 5 + [claims[1]])
    finally:
        READING_CARRY.reset(carry)
    assert read == [small] * 5 + [large]
