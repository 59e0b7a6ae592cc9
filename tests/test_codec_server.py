"""The codec endpoint (codec_server.py): what the UI, the CLI and a client in
any language read payloads through.

The first tests run the server in this process on the worker's own
converter (small thresholds, a file store in a temporary directory); the
last ones use the codec server the dev server's UI is pointed at, with real
conversations on the shared worker.
"""

from __future__ import annotations

import asyncio
import base64
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
from tests.support.s3 import denying_s3, use_fake_s3
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
        "http://127.0.0.1:8080",  # compose's UI, as its browser may name it
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


async def test_a_payload_marked_as_a_reference_that_is_none_gets_a_422(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plain payload marked as a stored payload's reference (anyone may
    mark a signal so): the store was blamed with a 502 (a security audit)."""
    converter = worker_converter(monkeypatch, tmp_path)
    marked = payload(b'"hello"')
    marked.metadata["__temporal_external_storage_reference"] = b"true"

    async with serving(build_app(converter, CodecSettings())) as url:
        status, text = await Endpoint(url).call("decode", as_json([marked]))

    assert_one_sentence(status, text, 422, "is marked as a reference to a stored payload, but is none")


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


PLAIN = base64.b64encode(b"json/plain").decode()


# --- the protocol ---------------------------------------------------------------------------


async def test_an_unknown_endpoint_is_a_404_naming_the_right_ones(codec: LocalCodec) -> None:
    """A misconfigured --codec-endpoint path is told where to POST."""
    status, text = await codec.call("decoder", as_json([payload(b'"hi"')]))

    assert_one_sentence(status, text, 404, "/encode", "/decode")


async def test_a_path_cannot_write_lines_of_its_own_into_the_log(
    codec: LocalCodec, caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal is logged with the path as sent: decoded, `%0A` in it
    wrote a forged line into the codec server's log (a security audit)."""
    forged = "/x%0A2026-01-01 CRITICAL forged/decode2"
    with caplog.at_level("WARNING", logger="codec_server"):
        status, text = await codec.call(forged.lstrip("/"), as_json([payload(b'"hi"')]))

    assert status == 404 and "\n" not in text.rstrip("\n")
    [record] = [r for r in caplog.records if r.name == "codec_server"]
    assert "\n" not in record.getMessage() and "%0A" in record.getMessage()


async def test_a_get_is_told_to_post(codec: LocalCodec) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{codec.url}/decode") as response:
        status, text = response.status, await response.text()

    assert_one_sentence(status, text, 405, "Use POST")


async def test_an_empty_request_gets_an_empty_payload_list(codec: LocalCodec) -> None:
    """proto3 JSON drops an empty list; the UI reads `payloads` from the answer."""
    status, text = await codec.call("decode", '{"payloads": []}')

    assert status == 200 and json.loads(text) == {"payloads": []}


async def test_download_gives_back_the_stored_payload_a_reference_names(codec: LocalCodec) -> None:
    """The UI asks /download for a stored payload: it gets the payload, not the reference re-encoded."""
    big = payload(hex_text(6000))
    [reference] = await codec.converter.encode([RawValue(big)])
    assert reference.metadata["encoding"] == b"json/protobuf"

    assert await codec.payloads("download", [reference]) == [big]


async def test_encode_without_a_namespace_header_stores_under_default(codec: LocalCodec) -> None:
    [reference] = await codec.payloads("encode", [payload(hex_text(6000))])

    assert json.loads(reference.data)["claimData"]["namespace"] == "default"


async def test_url_safe_base64_data_is_read(codec: LocalCodec) -> None:
    """Protobuf JSON parsers accept URL-safe base64 (another language's client may write it)."""
    data = b'"??>>"'  # standard base64 "Ij8/Pj4i" has '/': URL-safe writes '_'
    urlsafe = base64.urlsafe_b64encode(data).decode()
    assert "_" in urlsafe
    body = json.dumps({"payloads": [{"metadata": {"encoding": PLAIN}, "data": urlsafe}]})

    status, text = await codec.call("decode", body)

    assert status == 200, text
    assert base64.b64decode(json.loads(text)["payloads"][0]["data"]) == data


async def test_unpadded_base64_data_is_read(codec: LocalCodec) -> None:
    data = b'"hi"'  # base64 "ImhpIg==": unpadded "ImhpIg"
    body = json.dumps({"payloads": [{"metadata": {"encoding": PLAIN}, "data": "ImhpIg"}]})

    status, text = await codec.call("decode", body)

    assert status == 200, text
    assert base64.b64decode(json.loads(text)["payloads"][0]["data"]) == data


async def test_metadata_that_is_not_base64_is_refused_as_such(codec: LocalCodec) -> None:
    body = json.dumps({"payloads": [{"metadata": {"encoding": "!!!"}, "data": "ImhpIg=="}]})

    assert_one_sentence(*await codec.call("decode", body), 400, "Payload 0", "base64")


async def test_data_with_a_non_ascii_character_is_refused_as_not_base64(codec: LocalCodec) -> None:
    """Not a 500: one sentence saying what is wrong with the payload."""
    body = json.dumps({"payloads": [{"metadata": {"encoding": PLAIN}, "data": "ImhpIg==\u00e9"}]})

    assert_one_sentence(*await codec.call("decode", body), 400, "Payload 0", "base64")


async def test_a_payload_in_an_encoding_of_another_codec_goes_back_as_it_came(codec: LocalCodec) -> None:
    """README: as Temporal's remote codecs do. Refused (422), one such payload
    (a signal sent with `--input-meta encoding=binary/custom-codec`) blanked
    the page it came in: `temporal workflow show --codec-endpoint` printed
    no event at all (a contract audit). The payloads beside it are decoded."""
    text_payload = payload(hex_text(6000))
    [compressed] = await codec.converter.encode([RawValue(text_payload)])
    foreign = payload(b"\x00\x01 not ours", b"binary/custom-codec", other=b"kept")

    status, text = await codec.call("decode", as_json([foreign, compressed]))

    assert status == 200, text
    back = json_format.Parse(text, Payloads()).payloads
    assert back[0] == foreign
    assert back[1] == text_payload


async def test_a_reference_for_another_storage_driver_gets_a_422_naming_the_settings(
    codec: LocalCodec,
) -> None:
    """README: storage settings that do not match get a 4xx (not a 502 'store did not answer')."""
    [reference] = await codec.converter.encode([RawValue(payload(hex_text(6000)))])
    s3_reference = payload(
        json.dumps({**json.loads(reference.data), "driverName": "aws.s3driver"}).encode(),
        b"json/protobuf",
        messageType=reference.metadata["messageType"],
    )

    status, text = await codec.call("decode", as_json([s3_reference]))

    assert_one_sentence(status, text, 422, "Payload 0", "storage settings", "AGENT_STORAGE")


async def test_encode_to_a_store_that_cannot_write_gets_a_502(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README: a 502 with one sentence when the payload store does not answer."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    converter = worker_converter(monkeypatch, not_a_dir)

    async with serving(build_app(converter, CodecSettings())) as url:
        status, text = await Endpoint(url).call("encode", as_json([payload(hex_text(6000))]))

    assert_one_sentence(status, text, 502, "payload store")


@pytest.mark.skipif(S3_EXTRA_MISSING, reason="S3 extra missing: pip install 'temporalio[aioboto3]'")
async def test_a_store_that_refuses_reads_gets_a_502(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """README: a 502 with one sentence when the payload store does not answer
    (here S3 denies the read): not a 4xx blaming the request."""
    use_fake_s3(monkeypatch, fake_s3[0])
    writer = worker_converter(monkeypatch, Path("unused"), storage="s3://bucket/prefix")
    [reference] = await writer.encode([RawValue(payload(hex_text(6000)))])
    async with denying_s3() as url:
        use_fake_s3(monkeypatch, url)
        converter = worker_converter(monkeypatch, Path("unused"), storage="s3://bucket/prefix")
        async with serving(build_app(converter, CodecSettings())) as codec_url:
            status, text = await Endpoint(codec_url).call("decode", as_json([reference]))

    assert_one_sentence(status, text, 502, "Payload 0", "payload store")


async def test_a_body_past_64_mib_gets_a_413_sentence(codec: LocalCodec) -> None:
    status, text = await codec.call("decode", " " * (codec_server.MAX_BODY_BYTES + 1))

    assert_one_sentence(status, text, 413, "body size")


# --- the browser's view (CORS) ---------------------------------------------------------------


async def test_the_ui_may_send_credentials(guarded: Endpoint) -> None:
    """The UI's "include credentials" setting fetches with credentials: the
    browser then reads an answer only with Access-Control-Allow-Credentials."""
    preflight = {"Origin": UI, "Access-Control-Request-Method": "POST"}
    headers = {"Origin": UI, "Authorization": "Bearer s3cret"}
    async with aiohttp.ClientSession() as session:
        async with session.options(f"{guarded.url}/decode", headers=preflight) as response:
            assert response.headers.get("Access-Control-Allow-Credentials") == "true"
        async with session.post(
            f"{guarded.url}/decode", data=as_json([payload(b'"hi"')]), headers=headers
        ) as response:
            assert response.status == 200
            assert response.headers.get("Access-Control-Allow-Credentials") == "true"


async def test_a_private_network_preflight_is_allowed(guarded: Endpoint) -> None:
    """Chrome's Private Network Access: a UI served from a public address asks
    before calling a loopback codec server."""
    preflight = {
        "Origin": UI,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Private-Network": "true",
    }
    async with (
        aiohttp.ClientSession() as session,
        session.options(f"{guarded.url}/decode", headers=preflight) as response,
    ):
        assert response.status == 204
        assert response.headers.get("Access-Control-Allow-Private-Network") == "true"


async def test_an_answer_to_a_browser_varies_by_origin(guarded: Endpoint) -> None:
    """A cache between the UI and the server must not hand one origin's answer to another."""
    headers = {"Origin": UI, "Authorization": "Bearer s3cret"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{guarded.url}/decode", data=as_json([payload(b'"hi"')]), headers=headers) as response,
    ):
        assert "Origin" in response.headers.get("Vary", "")


async def test_the_ui_can_read_a_refusal(guarded: Endpoint) -> None:
    """A refusal to the UI's origin carries the CORS headers: the browser
    hands the page the status and sentence instead of a network error."""
    headers = {"Origin": UI, "Authorization": "Bearer s3cret"}
    broken = payload(b"not zlib", b"binary/zlib")  # marked compressed, data that does not decompress
    status, text = await guarded.call("decode", as_json([broken]), headers)
    assert status == 422, text
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{guarded.url}/decode", data=as_json([broken]), headers=headers) as response,
    ):
        assert response.status == 422
        assert response.headers.get("Access-Control-Allow-Origin") == UI


async def test_the_token_without_the_bearer_scheme_is_refused(guarded: Endpoint) -> None:
    """The header is compared whole: `Authorization: Bearer <token>`, nothing else."""
    for header in ("s3cret", "Basic s3cret"):
        status, text = await guarded.call("decode", as_json([payload(b'"hi"')]), {"Authorization": header})
        assert_one_sentence(status, text, 401, "Bearer")


# --- the process ---------------------------------------------------------------------------------


def test_the_decode_bound_comes_from_agent_max_decompressed_bytes() -> None:
    """README: what one request decodes to is bounded by AGENT_MAX_DECOMPRESSED_BYTES (413)."""
    settings = Settings(storage="off", max_decompressed_bytes=3 * 1024 * 1024)

    assert settings_from([], settings).max_decompressed_bytes == 3 * 1024 * 1024


def test_a_cors_origin_given_with_a_trailing_slash_matches_the_browsers_origin() -> None:
    """Browsers send `Origin: http://host:port` without a slash; a user may type one."""
    assert settings_from(["--cors-origin", "http://localhost:9000/"]).cors_origins == (
        "http://localhost:9000",
    )


def codec_server_process(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``python codec_server.py args`` with its payload store under ``tmp_path``."""
    return subprocess.Popen(
        [sys.executable, str(Path(codec_server.__file__)), *args],
        env={**os.environ, "AGENT_STORAGE_DIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_by_default_it_listens_on_loopback_only(tmp_path: Path) -> None:
    """README: it listens on 127.0.0.1 unless --host says otherwise."""
    process = codec_server_process(tmp_path, "--port", "0")
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
    finally:
        process.terminate()
        process.wait(timeout=30)

    assert line.startswith("codec server listening on http://127.0.0.1:"), line


def test_an_ipv6_host_is_printed_as_a_url_that_answers(tmp_path: Path) -> None:
    """`--host ::1` says `listening on http://[::1]:PORT`, a URL the CLI and the UI can use."""
    import socket
    import urllib.request

    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    process = codec_server_process(tmp_path, "--host", "::1", "--port", "0")
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            pytest.skip(f"cannot listen on ::1 here: {process.stderr.read() if process.stderr else ''}")
        url = line.strip().removeprefix("codec server listening on ")
        request = urllib.request.Request(f"{url}/decode", data=b'{"payloads": []}', method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
    finally:
        process.terminate()
        process.wait(timeout=30)

    assert url.startswith("http://[::1]:")
    assert answer == {"payloads": []}


def test_a_port_in_use_stops_the_server_with_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(Path(codec_server.__file__)), "--port", str(port)],
            env={**os.environ, "AGENT_STORAGE_DIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=30,
        )

    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}")
    assert "Traceback" not in result.stderr


def test_it_warns_of_a_key_file_others_can_read(tmp_path: Path) -> None:
    """It holds the keys as the worker does, and says so as the worker does."""
    import socket

    key_file = tmp_path / "keys"
    key_file.write_text("k1:" + base64.b64encode(bytes(range(32))).decode() + "\n")
    key_file.chmod(0o604)
    with socket.socket() as taken:  # then it stops at once, its warning said
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(Path(codec_server.__file__)), "--port", str(port)],
            env={
                **os.environ,
                "AGENT_STORAGE_DIR": str(tmp_path),
                "AGENT_ENCRYPTION_KEY_FILE": str(key_file),
            },
            capture_output=True,
            text=True,
            timeout=30,
        )

    assert f"AGENT_ENCRYPTION_KEY_FILE={key_file} can be read by other users (mode 0o604)" in result.stderr


async def raw_post(url: str, path: str, headers: bytes, body: bytes = b'{"payloads": []}') -> tuple[int, str]:
    """A POST with header bytes no HTTP client library sends (not UTF-8)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n".encode()
        + headers
        + b"\r\n"
        + body
    )
    answer = await reader.read()
    writer.close()
    head, _, text = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), text.decode()


async def test_a_token_that_is_not_utf8_is_refused_as_a_wrong_token(guarded: Endpoint) -> None:
    status, text = await raw_post(guarded.url, "/decode", b"Authorization: Bearer \xff\xfe\r\n")

    assert_one_sentence(status, text, 401, "Bearer")


async def test_an_origin_that_is_not_utf8_is_refused_with_a_sentence(guarded: Endpoint) -> None:
    status, text = await raw_post(
        guarded.url, "/decode", b"Authorization: Bearer s3cret\r\nOrigin: http://\xff.example\r\n"
    )

    assert_one_sentence(status, text, 403, "may not read payloads here")


async def test_a_namespace_that_is_not_utf8_is_the_requests_fault_not_the_stores(codec: LocalCodec) -> None:
    body = as_json([payload(b'"' + os.urandom(200_000).hex().encode() + b'"')])  # past the storage threshold

    status, text = await raw_post(codec.url, "/encode", b"X-Namespace: t\xff\r\n", body.encode())

    assert_one_sentence(status, text, 400, "X-Namespace")
