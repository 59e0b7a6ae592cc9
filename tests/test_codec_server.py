"""The codec endpoint (codec_server.py): what the UI, the CLI and a client in
any language read payloads through.

The first tests run the server in this process on the worker's own
converter (small thresholds, a file store in a temporary directory); the
last ones use the codec server the dev server's UI is pointed at, with real
conversations on the shared worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.converter import DataConverter, PayloadCodec

import codec_server
import runtime.payloads
from codec_server import MAX_PAYLOADS, CodecSettings, build_app, settings_from
from runtime.payloads import StoreContextCachingConverter, data_converter
from runtime.settings import Settings
from testbed.local_stack import CodecServer, temporal_cli
from tests.support.s3 import use_fake_s3
from tests.support.serving import serving
from tests.support.stack import Stack

COMPRESS_BYTES = 64
STORE_BYTES = 1024
ZLIB = b"binary/zlib"
REFERENCE_TYPE = b"temporal.api.sdk.v1.ExternalStorageReference"


# --- the server in this process -------------------------------------------------------


@dataclass
class Endpoint:
    """A codec server's URL and a way to talk to it as the UI and the CLI do."""

    url: str

    async def call(self, action: str, body: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.url}/{action}", data=body, headers=headers or {}) as response,
        ):
            return response.status, await response.text()

    async def payloads(
        self, action: str, payloads: Sequence[Payload], headers: dict[str, str] | None = None
    ) -> list[Payload]:
        status, text = await self.call(action, as_json(payloads), headers)
        assert status == 200, text
        return list(json_format.Parse(text, Payloads()).payloads)


def as_json(payloads: Sequence[Payload]) -> str:
    return json_format.MessageToJson(Payloads(payloads=payloads))


def worker_converter(monkeypatch: pytest.MonkeyPatch, root: Path, storage: str = "file") -> DataConverter:
    """The converter ``codec_server`` builds from the worker's settings, with small thresholds."""
    monkeypatch.setenv("AGENT_STORAGE", storage)
    monkeypatch.setenv("AGENT_STORAGE_DIR", str(root))
    monkeypatch.setenv("AGENT_STORAGE_THRESHOLD_BYTES", str(STORE_BYTES))
    monkeypatch.setenv("AGENT_COMPRESS_THRESHOLD_BYTES", str(COMPRESS_BYTES))
    return data_converter(Settings.from_env())


@dataclass
class LocalCodec(Endpoint):
    converter: DataConverter
    root: Path


@pytest.fixture(scope="module")
async def codec(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCodec]:
    root = tmp_path_factory.mktemp("payloads")
    with pytest.MonkeyPatch.context() as monkeypatch:
        converter = worker_converter(monkeypatch, root)
    async with serving(build_app(converter, CodecSettings())) as url:
        yield LocalCodec(url, converter, root)


def payload(data: bytes, encoding: bytes = b"json/plain", **metadata: bytes) -> Payload:
    return Payload(metadata={"encoding": encoding, **metadata}, data=data)


def repetitive(size: int) -> bytes:
    return (b'{"text": "the same words again"} ' * size)[:size]


def hex_text(size: int) -> bytes:
    """Halves under zlib: large enough, it is compressed AND stored."""
    return os.urandom(size // 2).hex().encode()


payload_strategy = st.builds(
    payload,
    data=st.one_of(
        st.binary(max_size=3 * STORE_BYTES),  # random: not worth compressing; stored when large
        st.integers(0, 8 * STORE_BYTES).map(hex_text),  # compressed, and stored when large
        st.integers(0, 8 * STORE_BYTES).map(repetitive),  # compressed to almost nothing
    ),
    encoding=st.sampled_from([b"json/plain", b"binary/plain"]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(payload_strategy, max_size=4))
@example(payloads=[payload(repetitive(3000)), payload(hex_text(6000)), payload(b'"small"')])
async def test_encode_then_decode_gives_back_every_payload(
    codec: LocalCodec, payloads: list[Payload]
) -> None:
    encoded = await codec.payloads("encode", payloads)
    assert await codec.payloads("decode", encoded) == payloads

    # The server and the worker write and read the same format.
    assert [
        raw.payload for raw in await codec.converter.decode(encoded, [RawValue] * len(encoded))
    ] == payloads
    by_worker = await codec.converter.encode([RawValue(p) for p in payloads])
    assert await codec.payloads("decode", by_worker) == payloads


async def test_encode_compresses_large_payloads_and_stores_the_largest(codec: LocalCodec) -> None:
    small, compressible, large = payload(b'"hi"'), payload(repetitive(3000)), payload(hex_text(6000))

    encoded = await codec.payloads("encode", [small, compressible, large])

    assert encoded[0] == small
    assert encoded[1].metadata["encoding"] == ZLIB
    assert encoded[2].metadata["messageType"] == REFERENCE_TYPE
    assert len(json.loads(encoded[2].data)["claimData"]["sha256"]) == 64
    # Stored as the worker stores it: compressed first, then moved out of the history.
    [stored] = [p for p in codec.root.rglob(json.loads(encoded[2].data)["claimData"]["sha256"])]
    assert Payload.FromString(stored.read_bytes()).metadata["encoding"] == ZLIB


async def test_a_none_decodes_to_json_null(codec: LocalCodec) -> None:
    """A handler that returns None (an update's outcome) is written as
    `binary/null`, which the UI showed as its metadata in base64."""
    [none] = await codec.converter.encode([None])
    assert none.metadata["encoding"] == b"binary/null"

    [decoded] = await codec.payloads("decode", [none])

    assert decoded == payload(b"null")
    assert await codec.converter.decode([decoded]) == [None]


async def test_encode_stores_under_the_request_namespace(codec: LocalCodec) -> None:
    [reference] = await codec.payloads("encode", [payload(hex_text(6000))], {"X-Namespace": "team-a"})

    claim = json.loads(reference.data)["claimData"]
    assert claim["namespace"] == "team-a"
    assert (codec.root / "team-a" / claim["sha256"][:2] / claim["sha256"]).is_file()


@pytest.mark.parametrize("public_path", ["fallbacks", "another SDK"])
async def test_encode_on_the_sdks_public_path_stores_under_default(
    public_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Binding the namespace takes a private SDK method: with
    AGENT_SDK_FALLBACKS on, or on an SDK version other than the one read,
    a payload is stored without it (under `default`) and read back all
    the same."""
    if public_path == "fallbacks":
        monkeypatch.setenv("AGENT_SDK_FALLBACKS", "on")
    else:
        monkeypatch.setattr(runtime.payloads, "SUPPORTED_SDK", "0.0.1")
    converter = worker_converter(monkeypatch, tmp_path)
    assert not isinstance(converter, StoreContextCachingConverter)
    big = payload(hex_text(6000))
    async with serving(build_app(converter, CodecSettings())) as url:
        codec = LocalCodec(url, converter, tmp_path)
        [reference] = await codec.payloads("encode", [big], {"X-Namespace": "team-b"})
        assert json.loads(reference.data)["claimData"]["namespace"] == "default"
        assert await codec.payloads("decode", [reference]) == [big]


def assert_one_sentence(status: int, text: str, expected_status: int, *words: str) -> None:
    assert status == expected_status, text
    sentence = text.strip()
    assert "\n" not in sentence and "Traceback" not in sentence
    assert sentence.endswith("."), sentence
    for word in words:
        assert word in sentence


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ("nope", 400, ["not JSON"]),
        ("null", 400, ["not an object"]),
        ("[]", 400, ["not an object"]),
        ('{"payload": []}', 400, ["not a Payloads object"]),
        ('{"a":' * 200_000 + "1" + "}" * 200_000, 400, ["nested too deep"]),
        ("[" * 100_000 + "]" * 100_000, 400, ["nested too deep"]),
        (
            '{"payloads": [{"metadata": {"encoding": "anNvbi9wbGFpbg=="}, "data": "!!!"}]}',
            400,
            ["Payload 0", "base64"],
        ),
        (
            as_json([payload(b"x", b"binary/encrypted")]),
            422,
            ["Payload 0", "binary/encrypted", "no encryption key", "AGENT_ENCRYPTION_KEYS"],
        ),
        (as_json([payload(b'"ok"'), payload(b"not zlib", ZLIB)]), 422, ["Payload 1", "does not decompress"]),
    ],
)
async def test_bad_request_gets_a_4xx_with_one_sentence(
    codec: LocalCodec, body: str, status: int, words: list[str]
) -> None:
    assert_one_sentence(*await codec.call("decode", body), status, *words)


async def test_reference_to_a_deleted_file_gets_a_4xx_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    converter = worker_converter(monkeypatch, tmp_path)
    [reference] = await converter.encode([RawValue(payload(hex_text(6000)))])
    [stored] = [p for p in tmp_path.rglob("*") if p.is_file()]
    stored.unlink()

    async with serving(build_app(converter, CodecSettings())) as url:
        status, text = await Endpoint(url).call("decode", as_json([reference]))

    assert_one_sentence(
        status, text, 422, "Payload 0", "gone", f"AGENT_STORAGE_DIR/{stored.relative_to(tmp_path)}"
    )
    assert str(tmp_path) not in text


async def test_reference_without_storage_settings_gets_a_4xx(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    [reference] = await worker_converter(monkeypatch, tmp_path).encode([RawValue(payload(hex_text(6000)))])
    without_storage = worker_converter(monkeypatch, tmp_path, storage="off")

    async with serving(build_app(without_storage, CodecSettings())) as url:
        status, text = await Endpoint(url).call("decode", as_json([reference]))

    assert_one_sentence(status, text, 422, "stored outside the history", "AGENT_STORAGE")


S3_EXTRA_MISSING = any(
    __import__("importlib.util").util.find_spec(name) is None for name in ("aioboto3", "types_aiobotocore_s3")
)


@pytest.mark.skipif(S3_EXTRA_MISSING, reason="S3 extra missing: pip install 'temporalio[aioboto3]'")
async def test_s3_references_resolve_and_a_missing_object_gets_a_4xx(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    url, objects = fake_s3
    use_fake_s3(monkeypatch, url)
    converter = worker_converter(monkeypatch, Path("unused"), storage="s3://bucket/prefix")
    big = payload(hex_text(6000))
    [reference] = await converter.encode([RawValue(big)])

    async with serving(build_app(converter, CodecSettings())) as codec_url:
        endpoint = Endpoint(codec_url)
        assert await endpoint.payloads("decode", [reference]) == [big]
        objects.clear()
        status, text = await endpoint.call("decode", as_json([reference]))

    assert_one_sentence(status, text, 422, "Payload 0", "gone")


# --- who may call -----------------------------------------------------------------------

UI = "http://127.0.0.1:8233"


@pytest.fixture
async def guarded(codec: LocalCodec) -> AsyncIterator[Endpoint]:
    settings = CodecSettings(cors_origins=(UI,), token="s3cret")
    async with serving(build_app(codec.converter, settings)) as url:
        yield Endpoint(url)


async def test_token_is_required_when_set(guarded: Endpoint) -> None:
    body = as_json([payload(b'"hi"')])

    assert_one_sentence(*await guarded.call("decode", body), 401, "Bearer")
    assert_one_sentence(*await guarded.call("decode", body, {"Authorization": "Bearer wrong"}), 401)
    status, _ = await guarded.call("decode", body, {"Authorization": "Bearer s3cret"})
    assert status == 200


async def test_the_ui_origin_passes_the_preflight_and_reads_the_answer(guarded: Endpoint) -> None:
    preflight = {
        "Origin": UI,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-namespace,authorization",
    }
    async with aiohttp.ClientSession() as session:
        async with session.options(f"{guarded.url}/decode", headers=preflight) as response:
            assert response.status == 204  # no token needed: browsers send none on a preflight
            assert response.headers["Access-Control-Allow-Origin"] == UI
            allowed = response.headers["Access-Control-Allow-Headers"].lower()
            assert {"content-type", "x-namespace", "authorization"} <= {h.strip() for h in allowed.split(",")}
        headers = {"Origin": UI, "Authorization": "Bearer s3cret", "X-Namespace": "default"}
        async with session.post(
            f"{guarded.url}/decode", data=as_json([payload(b'"hi"')]), headers=headers
        ) as response:
            assert response.status == 200
            assert response.headers["Access-Control-Allow-Origin"] == UI


async def test_another_origin_is_refused(guarded: Endpoint) -> None:
    status, text = await guarded.call(
        "decode", as_json([]), {"Origin": "http://evil.example", "Authorization": "Bearer s3cret"}
    )

    assert_one_sentence(status, text, 403, "http://evil.example", "--cors-origin")


def test_settings_come_from_the_command_line_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_CODEC_CORS_ORIGINS", raising=False)
    monkeypatch.delenv("AGENT_CODEC_TOKEN", raising=False)
    defaults = settings_from([])
    assert (defaults.host, defaults.port, defaults.token) == ("127.0.0.1", 8081, None)
    assert set(defaults.cors_origins) == {
        "http://localhost:8233",
        "http://127.0.0.1:8233",
        "http://localhost:8080",
    }

    monkeypatch.setenv("AGENT_CODEC_CORS_ORIGINS", "https://ui.example, http://localhost:9000/")
    monkeypatch.setenv("AGENT_CODEC_TOKEN", "t")
    from_env = settings_from([])
    assert from_env.cors_origins == ("https://ui.example", "http://localhost:9000")
    assert from_env.token == "t"

    assert settings_from(["--cors-origin", "http://a", "--cors-origin", "http://b"]).cors_origins == (
        "http://a",
        "http://b",
    )


def test_bad_storage_setting_stops_the_server_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(Path(codec_server.__file__)), "--port", "0"],
        env={**os.environ, "AGENT_STORAGE": "ftp://nowhere"},
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 2
    assert result.stderr.startswith("error: AGENT_STORAGE must be")
    assert "Traceback" not in result.stderr


def test_a_port_out_of_range_is_refused_with_one_line() -> None:
    result = subprocess.run(
        [sys.executable, str(Path(codec_server.__file__)), "--port", "99999"],
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 2
    assert "--port must be a port number (0-65535), not 99999" in result.stderr
    assert "Traceback" not in result.stderr


def test_server_process_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    server = CodecServer(env={"AGENT_STORAGE_DIR": str(tmp_path)}).start()
    server.stop()

    assert server.process is not None and server.process.returncode == 0


# --- real conversations, the shared worker, the stack's codec server ---------------------


def codec_url(stack: Stack) -> str:
    assert stack.dev_server.codec is not None
    return stack.dev_server.codec.url


def temporal(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [temporal_cli(), *args, "--address", stack.dev_server.address],
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_cli_query_with_the_codec_endpoint_prints_the_tool_output(stack: Stack) -> None:
    handle, [marker] = await stack.run_bulky_tools(3)
    workflow_id = handle.id

    plain = temporal(stack, "workflow", "query", "--workflow-id", workflow_id, "--type", "messages")
    decoded = temporal(
        stack,
        "workflow",
        "query",
        "--workflow-id",
        workflow_id,
        "--type",
        "messages",
        "--codec-endpoint",
        codec_url(stack),
    )

    assert marker not in plain.stdout and "YmluYXJ5L3psaWI=" in plain.stdout  # base64 of binary/zlib
    assert decoded.returncode == 0, decoded.stderr
    assert marker in decoded.stdout


class HttpDecodeCodec(PayloadCodec):
    """What a client in any language does: no code of this project, just
    an HTTP call to the codec server's /decode (and plain JSON out)."""

    def __init__(self, url: str) -> None:
        self._url = url

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        request = urllib.request.Request(
            f"{self._url}/decode",
            data=json_format.MessageToJson(Payloads(payloads=payloads)).encode(),
            headers={"Content-Type": "application/json", "X-Namespace": "default"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return list(json_format.Parse(response.read(), Payloads()).payloads)


async def test_plain_sdk_client_reads_events_messages_and_result_through_decode(stack: Stack) -> None:
    handle, [marker] = await stack.run_bulky_tools(3)
    workflow_id = handle.id
    codec_less = await Client.connect(stack.dev_server.address)
    with pytest.raises(Exception, match="Unknown payload encoding binary/zlib"):
        await codec_less.get_workflow_handle(workflow_id).query("messages")

    client = await Client.connect(
        stack.dev_server.address,
        data_converter=dataclasses.replace(
            DataConverter.default, payload_codec=HttpDecodeCodec(codec_url(stack))
        ),
    )
    handle = client.get_workflow_handle(workflow_id)

    events = [
        item.data async for item in WorkflowStreamClient.create(client, workflow_id).subscribe(["events"])
    ]
    [tool_end] = [e for e in events if e["type"] == "tool_execution_end"]
    assert tool_end["result"]["content"][0]["text"] == marker
    messages = await handle.query("messages")
    assert messages[2]["content"][0]["text"] == marker
    result = await handle.result()
    assert result["messages"] == messages


def raw_payloads(message: Message) -> Iterator[Payload]:
    """Every Payload inside a history proto (inputs, results, headers, memos, summaries...)."""
    if isinstance(message, Payload):
        yield message
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            for item in value.values():
                if isinstance(item, Message):
                    yield from raw_payloads(item)
        elif field.is_repeated:
            for item in value:
                yield from raw_payloads(item)
        else:
            yield from raw_payloads(value)


async def test_every_raw_payload_of_a_stored_history_decodes_to_json(stack: Stack) -> None:
    handle, markers = await stack.run_bulky_tools(3, 400)
    history = await handle.fetch_history()
    payloads = [p for event in history.events for p in raw_payloads(event)]
    assert sum(p.metadata.get("messageType") == REFERENCE_TYPE for p in payloads) >= 2  # tool output, result
    assert sum(p.metadata.get("encoding") == ZLIB for p in payloads) >= 1

    decoded = await Endpoint(codec_url(stack)).payloads("decode", payloads, {"X-Namespace": "default"})

    assert len(decoded) == len(payloads)
    texts = []
    for item in decoded:
        assert item.metadata["encoding"] == b"json/plain", item.metadata
        texts.append(json.dumps(json.loads(item.data)))
    for marker in markers:
        assert any(marker in text for text in texts)
    assert not any("claimData" in text for text in texts)


async def test_a_codec_less_client_starts_prompts_signals_and_reads_state(stack: Stack) -> None:
    """The README's promise: small control payloads stay plain JSON."""
    stack.script({"text": "First answer."}, {"text": "Second answer."})
    client = await Client.connect(stack.dev_server.address)  # the SDK's default converter, no codec
    handle = await client.start_workflow(
        "AgentWorkflow",
        {"model": stack.model, "thinkingLevel": "low"},
        id=f"plain-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
    )

    started = await handle.execute_update("prompt", "hello")
    await handle.signal("follow_up", "and then?")
    for _ in range(200):
        state = await handle.query("state")
        if state["messageCount"] == 4 and state["status"] == "idle":
            break
        await asyncio.sleep(0.05)
    await handle.signal("close")

    assert started["run"] == 1
    assert state["model"] == stack.model
    assert (state["status"], state["messageCount"]) == ("idle", 4)  # prompt, answer, follow-up, answer


async def test_a_malformed_reference_gets_a_4xx_not_a_store_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A reference cut short is the request's fault: the store was never asked."""
    converter = worker_converter(monkeypatch, tmp_path)
    [reference] = await converter.encode([RawValue(payload(hex_text(6000)))])
    broken = Payload()
    broken.CopyFrom(reference)
    broken.data = reference.data[: len(reference.data) // 2]

    async with serving(build_app(converter, CodecSettings())) as url:
        status, text = await Endpoint(url).call("decode", as_json([broken]))

    assert_one_sentence(status, text, 422, "Payload 0")


async def test_a_request_of_too_many_payloads_is_refused_at_once(codec: LocalCodec) -> None:
    """One /decode of 600,000 tiny payloads (36 MiB, under the body limit)
    took 25 s of the server's one thread, and held every other request (the
    UI's next page) up meanwhile."""
    started = time.monotonic()
    status, text = await codec.call("decode", as_json([payload(b'"x"')] * (MAX_PAYLOADS + 1)))
    assert status == 413 and text.startswith(f"At most {MAX_PAYLOADS:,} payloads in one request")
    assert time.monotonic() - started < 5
    assert len(await codec.payloads("decode", [payload(b'"x"')] * MAX_PAYLOADS)) == MAX_PAYLOADS


@pytest.mark.parametrize(
    "origin",
    [f"{UI}.evil.example", f"{UI}0", f"{UI}@evil.example", "http://127.0.0.1", UI.replace("http", "https")],
)
async def test_an_origin_that_only_resembles_the_ui_is_refused(guarded: Endpoint, origin: str) -> None:
    """Origins are compared whole: a page on 127.0.0.1:8233.evil.example
    must not read conversation contents with the UI's permission."""
    status, text = await guarded.call(
        "decode", as_json([payload(b'"hi"')]), {"Origin": origin, "Authorization": "Bearer s3cret"}
    )

    assert_one_sentence(status, text, 403, origin)


@pytest.mark.parametrize("action", ["encode", "decode", "download", "prefix/decode"])
async def test_every_endpoint_wants_the_token(guarded: Endpoint, action: str) -> None:
    """With AGENT_CODEC_TOKEN set, every request needs the token: /encode
    writes to the payload store, /download reads as /decode does."""
    body = as_json([payload(b'"hi"')])

    assert_one_sentence(*await guarded.call(action, body), 401, "Bearer")
    status, text = await guarded.call(action, body, {"Authorization": "Bearer s3cret"})
    assert status == 200, text


async def test_a_request_without_the_token_is_told_the_scheme_in_the_header(guarded: Endpoint) -> None:
    """A 401 names its scheme (RFC 9110: WWW-Authenticate), which HTTP
    clients read to retry with the token."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{guarded.url}/decode", data=as_json([payload(b'"hi"')])) as response,
    ):
        assert response.status == 401
        assert response.headers.get("WWW-Authenticate") == "Bearer"


async def test_encode_refuses_a_payload_no_plain_client_writes(codec: LocalCodec) -> None:
    """/encode takes what a plain client writes: one already compressed,
    encrypted or refused is a 422 with a sentence, not stored as if plain."""
    for encoding in (b"binary/zlib", b"binary/encrypted", b"binary/refused"):
        status, text = await codec.call("encode", as_json([payload(b"x" * 10, encoding)]))
        assert_one_sentence(status, text, 422, "Payload 0", encoding.decode(), "cannot encode")
