"""Encryption at rest (issue 12): with AGENT_ENCRYPTION_KEYS set, the
Temporal server's history, the payload store and the context store hold
only ciphertext; the worker, its clients and the codec server (behind its
token) read everything; and keys rotate (the first encrypts, all decrypt)."""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from activities.blobs import SEALED_PREFIX, BlobMissing, FileBlobStore, S3BlobStore, checked_digest, digest_of
from activities.context_store import ContextStore, Manifest
from client import Conversation, ConversationNotFound, Refused
from runtime.connect import connect
from runtime.converter import REFUSED, AgentPayloadConverter, refused_payload
from runtime.encryption import ENCRYPTED, KEY_ID, Keyring, Undecryptable, UnknownKey, _payload_context
from runtime.payloads import blob_store, data_converter, probe_s3_storage
from runtime.settings import Settings, SettingsError, key_id_of
from testbed.local_stack import CodecServer, DevServer, start_worker, stop_process
from testbed.scripted_model import ScriptedModelServer
from tests.support.s3 import use_fake_s3
from tests.support.serving import serving
from tests.support.stack import Stack
from tests.test_codec_server import Endpoint, raw_payloads
from workflows.models import UserMessage

KEY_A = base64.b64encode(os.urandom(32)).decode()
KEY_B = base64.b64encode(os.urandom(32)).decode()
REFERENCE_TYPE = b"temporal.api.sdk.v1.ExternalStorageReference"
SDK_RECORDS = {"EVENT_TYPE_MARKER_RECORDED", "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"}


def settings_with(keys: str, **overrides: Any) -> Settings:
    return Settings.from_env({"AGENT_ENCRYPTION_KEYS": keys, "AGENT_STORAGE": "off"}, **overrides)


# --- the settings -----------------------------------------------------------------------------


def test_keys_come_first_one_first_from_the_list_or_a_file(tmp_path: Path) -> None:
    listed = Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"2025-02:{KEY_B}, 2025-01:{KEY_A}"})
    key_file = tmp_path / "keys"
    key_file.write_text(f"# newest first\n2025-02:{KEY_B}\n\n2025-01:{KEY_A}  # retire in March\n")
    from_file = Settings.from_env({"AGENT_ENCRYPTION_KEY_FILE": str(key_file)})
    single = Settings.from_env({"AGENT_ENCRYPTION_KEY": KEY_A})

    expected = (("2025-02", base64.b64decode(KEY_B)), ("2025-01", base64.b64decode(KEY_A)))
    assert listed.encryption_keys == from_file.encryption_keys == expected
    [(key_id, key)] = single.encryption_keys
    assert key == base64.b64decode(KEY_A) and KEY_A not in key_id
    assert KEY_A not in repr(listed)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"AGENT_ENCRYPTION_KEY": "c2hvcnQ="}, "must be 32 random bytes in base64"),
        ({"AGENT_ENCRYPTION_KEYS": f"a:{KEY_A[:-4]}"}, "must be 32 random bytes in base64"),
        ({"AGENT_ENCRYPTION_KEYS": KEY_A}, "entry 1 is not ID:BASE64"),
        ({"AGENT_ENCRYPTION_KEYS": f"a:{KEY_A},a:{KEY_B}"}, "key id 'a' is given twice"),
        ({"AGENT_ENCRYPTION_KEYS": f"a:{KEY_A}", "AGENT_ENCRYPTION_KEY": KEY_B}, "Set one of"),
        ({"AGENT_ENCRYPTION_KEY_FILE": "/nonexistent/keys"}, "cannot be read"),
    ],
)
def test_a_bad_key_setting_is_refused_with_a_sentence_that_shows_no_key(
    env: dict[str, str], says: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env(env)

    assert says in str(refused.value)
    assert KEY_A[:8] not in str(refused.value) and KEY_B[:8] not in str(refused.value)


# --- the codec ----------------------------------------------------------------------------------


async def test_payloads_are_compressed_then_encrypted_and_read_back() -> None:
    converter = data_converter(settings_with(f"a:{KEY_A}"))
    long_text = "marker-compressible " * 2000

    small, large = await converter.encode(["marker-small", long_text])

    for payload in (small, large):
        assert payload.metadata["encoding"] == ENCRYPTED and payload.metadata[KEY_ID] == b"a"
        assert b"marker" not in payload.data
    assert len(large.data) < len(long_text) / 10  # compressed before encrypting: ciphertext does not compress
    assert await converter.decode([small, large], [str, str]) == ["marker-small", long_text]


async def test_data_written_under_key_a_reads_after_rotating_to_b_then_a() -> None:
    before = data_converter(settings_with(f"a:{KEY_A}"))
    after = data_converter(settings_with(f"b:{KEY_B},a:{KEY_A}"))
    [old] = await before.encode(["written under a"])

    [new] = await after.encode(["written under b"])

    assert await after.decode([old, new], [str, str]) == ["written under a", "written under b"]
    assert new.metadata[KEY_ID] == b"b"


@pytest.mark.parametrize(
    ("reader", "says"),
    [
        ("b:" + KEY_B, "encrypted with key 'a', which is not among this process's keys (b)"),
        ("a:" + KEY_B, "does not decrypt with key 'a': it was altered"),
        (None, "no encryption key is set here"),
    ],
)
async def test_a_payload_that_does_not_decrypt_is_refused_with_a_sentence(
    reader: str | None, says: str
) -> None:
    [encrypted] = await data_converter(settings_with(f"a:{KEY_A}")).encode(["secret"])
    settings = settings_with(reader) if reader else Settings(storage="off")

    with pytest.raises(ApplicationError) as refused:
        await data_converter(settings).decode([encrypted], [str])

    assert says in refused.value.message and refused.value.type == "PayloadRefused"


async def test_an_altered_payload_is_refused() -> None:
    converter = data_converter(settings_with(f"a:{KEY_A}"))
    [encrypted] = await converter.encode(["pay 10 EUR"])
    altered = Payload(metadata=encrypted.metadata, data=encrypted.data[:-1] + bytes([encrypted.data[-1] ^ 1]))

    with pytest.raises(ApplicationError, match="it was altered"):
        await converter.decode([altered], [str])


# --- the context store's blobs ------------------------------------------------------------------


def keyring(keys: str) -> Keyring:
    settings = settings_with(keys)
    return Keyring(settings.encryption_keys)


async def test_context_blobs_are_encrypted_and_read_after_rotation(tmp_path: Path) -> None:
    written = ContextStore(FileBlobStore(tmp_path, keyring(f"a:{KEY_A}")))
    message = UserMessage(content="marker-context", timestamp=1)
    manifest = await written.save(Manifest(), [message])

    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert b"marker-context" not in path.read_bytes()
            assert digest_of(path.read_bytes()) != path.name  # stored as ciphertext, addressed by plaintext
    rotated = ContextStore(FileBlobStore(tmp_path, keyring(f"b:{KEY_B},a:{KEY_A}")))
    _, [read] = await rotated.load(manifest)
    assert read == message


async def test_a_context_blob_without_its_key_is_missing_but_kept(tmp_path: Path) -> None:
    digest = digest_of(b'{"role": "user"}')
    FileBlobStore(tmp_path, keyring(f"a:{KEY_A}")).write(digest, b'{"role": "user"}')

    for reader in (FileBlobStore(tmp_path), FileBlobStore(tmp_path, keyring(f"b:{KEY_B}"))):
        with pytest.raises(BlobMissing, match="encrypted"):
            reader.read(digest)

    assert FileBlobStore(tmp_path, keyring(f"a:{KEY_A}")).read(digest) == b'{"role": "user"}'


def test_a_plaintext_blob_from_before_encryption_still_reads(tmp_path: Path) -> None:
    data = b'{"role": "user", "content": "old"}'
    FileBlobStore(tmp_path).write(digest_of(data), data)

    assert FileBlobStore(tmp_path, keyring(f"a:{KEY_A}")).read(digest_of(data)) == data


# --- a conversation on a worker with a key ------------------------------------------------------


@dataclass
class EncryptedWorker:
    """A worker process with encryption keys, its own task queue and store."""

    env: dict[str, str]
    store: Path
    log: Path
    process: Any = None

    def start(self, keys: str) -> EncryptedWorker:
        self.env["AGENT_ENCRYPTION_KEYS"] = keys
        self.process = start_worker(self.env, ["tests.support.tools"], self.log)
        return self

    def stop(self) -> None:
        stop_process(self.process)

    async def client(self, dev_server: DevServer, keys: str) -> Client:
        overrides = settings_with(keys).encryption_keys
        return await connect(
            Settings.from_env(address=dev_server.address, storage_dir=self.store, encryption_keys=overrides)
        )


@pytest.fixture
def encrypted_worker(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, artifacts: Path
) -> Iterator[EncryptedWorker]:
    store = tmp_path_factory.mktemp("encrypted-store")
    queue = f"agent-encrypted-{uuid.uuid4().hex[:6]}"
    env = {**worker_env, "TEMPORAL_TASK_QUEUE": queue, "AGENT_STORAGE_DIR": str(store)}
    worker = EncryptedWorker(env, store, artifacts / "encrypted-worker.log")
    yield worker
    worker.stop()


async def start_on(worker: EncryptedWorker, client: Client, input: dict[str, Any], name: str) -> Any:
    """An AgentWorkflow with ``input`` on ``worker``'s task queue, started by ``client``."""
    return await client.start_workflow(
        "AgentWorkflow",
        input,
        id=f"{name}-{uuid.uuid4().hex[:8]}",
        task_queue=worker.env["TEMPORAL_TASK_QUEUE"],
    )


def stack_for(
    client: Client, worker: EncryptedWorker, model_server: ScriptedModelServer, server: DevServer
) -> Stack:
    return Stack(
        client, model_server, worker.env["TEMPORAL_TASK_QUEUE"], f"enc-{uuid.uuid4().hex[:8]}", server
    )


def raw_history_payloads(history: Any) -> list[Payload]:
    return [p for event in history.events for p in raw_payloads(event)]


def assert_no_plaintext(blob: bytes, marker: str) -> None:
    assert marker.encode() not in blob
    try:  # nor inside anything merely compressed
        assert marker.encode() not in zlib.decompress(blob)
    except zlib.error:
        pass


@pytest.fixture
async def codec_with_key(encrypted_worker: EncryptedWorker, artifacts: Path) -> AsyncIterator[CodecServer]:
    server = CodecServer(
        env={
            "AGENT_STORAGE_DIR": str(encrypted_worker.store),
            "AGENT_ENCRYPTION_KEYS": f"a:{KEY_A}",
            "AGENT_CODEC_TOKEN": "codec-token-for-tests",
        },
        log_path=artifacts / "encrypted-codec.log",
    ).start()
    yield server
    server.stop()


async def test_history_and_stores_hold_no_plaintext_and_the_codec_server_reads_it(
    client: Client,
    dev_server: DevServer,
    model_server: ScriptedModelServer,
    encrypted_worker: EncryptedWorker,
    codec_with_key: CodecServer,
) -> None:
    encrypted_worker.start(f"a:{KEY_A}")
    keyed = await encrypted_worker.client(dev_server, f"a:{KEY_A}")
    stack = stack_for(keyed, encrypted_worker, model_server, dev_server)
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    stack.script(
        {"tool_calls": [{"id": "e1", "name": "echo", "arguments": {"text": marker}}]},
        # A large tool result, stored outside the history.
        {"tool_calls": [{"id": "b1", "name": "bulky", "arguments": {"tag": marker, "kib": 400}}]},
        {"fault": {"kind": "400", "message": f"the model refused {marker}"}},
    )
    handle = await stack.start(prompt=f"Say {marker}", closeWhenIdle=True)

    messages = (await handle.result()).messages

    # The conversation worked, and this client (with the key) reads all of it.
    assert messages[2].content[0].text == f"echo: {marker}"
    assert messages[4].content[0].text == f"output-{marker}"
    assert messages[-1].error_message == f"The model server answered 400: the model refused {marker}"
    # The server's history: every payload encrypted (or a reference to an encrypted one), no marker anywhere.
    history = await handle.fetch_history()
    payloads = raw_history_payloads(history)
    plain = [
        (EventType.Name(e.event_type), p.data[:80])
        for e in history.events
        for p in raw_payloads(e)
        if p.metadata.get("encoding") != ENCRYPTED and p.metadata.get("messageType") != REFERENCE_TYPE
    ]
    # Only the SDK's own records stay plain: patch markers and the search attribute
    # listing the patches (names from the workflow's code, never conversation data).
    assert plain and {kind for kind, _ in plain} <= SDK_RECORDS, plain
    assert any(p.metadata.get("messageType") == REFERENCE_TYPE for p in payloads)
    for event in history.events:
        assert_no_plaintext(event.SerializeToString(), marker)
    # The stores on disk: external payloads and context blobs, all ciphertext.
    stored = [p for p in encrypted_worker.store.rglob("*") if p.is_file()]
    assert any("context" in p.parts for p in stored) and any("default" in p.parts for p in stored)
    for path in stored:
        assert_no_plaintext(path.read_bytes(), marker)
    # The codec server with the key decodes it for the UI and the CLI, behind its token.
    endpoint = Endpoint(codec_with_key.url)
    status, _ = await endpoint.call("decode", "{}")
    assert status == 401
    decoded = await endpoint.payloads(
        "decode", payloads, {"Authorization": "Bearer codec-token-for-tests", "X-Namespace": "default"}
    )
    texts = [p.data.decode(errors="replace") for p in decoded]
    assert any(f"echo: {marker}" in t for t in texts)
    assert any(f"output-{marker}" in t for t in texts)  # the stored payload, fetched and decrypted


async def test_a_conversation_goes_on_after_the_key_is_rotated(
    client: Client,
    dev_server: DevServer,
    model_server: ScriptedModelServer,
    encrypted_worker: EncryptedWorker,
) -> None:
    encrypted_worker.start(f"a:{KEY_A}")
    stack = stack_for(
        await encrypted_worker.client(dev_server, f"a:{KEY_A}"), encrypted_worker, model_server, dev_server
    )
    stack.script(
        {"tool_calls": [{"id": "r1", "name": "echo", "arguments": {"text": "before"}}]}, {"text": "under a"}
    )
    handle = await stack.start(prompt="first")
    await handle.execute_update("wait_for_idle")
    encrypted_worker.stop()

    # New worker and client: B encrypts, A still decrypts (history, stored context, stored payloads).
    encrypted_worker.start(f"b:{KEY_B},a:{KEY_A}")
    rotated = replace(stack, client=await encrypted_worker.client(dev_server, f"b:{KEY_B},a:{KEY_A}"))
    rotated.script({"text": "under b"})
    after = rotated.client.get_workflow_handle(handle.id)
    idle = await after.execute_update("prompt", "second")
    events = await rotated.events(handle.id, from_offset=idle["eventOffset"])
    await after.signal("close")

    assert events[-1]["messages"][-1]["content"][0]["text"] == "under b"
    request = rotated.requests()[-1]
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "tool", "assistant", "user"]
    history = await after.fetch_history()
    key_ids = {p.metadata.get(KEY_ID) for p in raw_history_payloads(history)}
    assert {b"a", b"b"} <= key_ids
    # The context came from the store (blobs under a), not resent inline after a failed read.
    assert not [e for e in history.events if e.HasField("activity_task_failed_event_attributes")]


@pytest.mark.expect_task_failures
@pytest.mark.parametrize("walk", ["on", "off"])  # off: the SDK's own payload passes
async def test_a_worker_without_a_key_its_history_needs_fails_the_task_naming_it_and_goes_on_with_it(
    client: Client,
    dev_server: DevServer,
    model_server: ScriptedModelServer,
    encrypted_worker: EncryptedWorker,
    walk: str,
) -> None:
    """A worker restarted with key a removed too early replayed the
    conversation into another path: its workflow task failed with a
    nondeterminism error that hid the reason (a storage audit). It fails
    with the sentence naming the key, and the conversation goes on once
    the worker has the key again."""
    encrypted_worker.env["AGENT_PAYLOAD_WALK"] = walk
    encrypted_worker.start(f"a:{KEY_A}")
    stack = stack_for(
        await encrypted_worker.client(dev_server, f"a:{KEY_A}"), encrypted_worker, model_server, dev_server
    )
    stack.script({"text": "under a"}, {"text": "after the key came back"})
    handle = await stack.start(prompt="first")
    await handle.execute_update("wait_for_idle")
    encrypted_worker.stop()

    encrypted_worker.start(f"b:{KEY_B}")  # a is gone: the history cannot be read
    await handle.signal("steer", "second")
    failure = None
    for _ in range(100):
        history = await handle.fetch_history()
        failed = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
        if failed:
            failure = failed[-1].workflow_task_failed_event_attributes.failure
            break
        await asyncio.sleep(0.1)
    assert failure is not None, "no workflow task failed"
    reader = await encrypted_worker.client(dev_server, f"b:{KEY_B},a:{KEY_A}")  # the failure is encrypted too
    error: BaseException | None = await reader.data_converter.decode_failure(failure)
    chain = []
    while error is not None:
        chain.append(str(error))
        error = error.__cause__
    said = " / ".join(chain)
    assert "is encrypted with key 'a', which is not among this process's keys" in said, said
    assert "Nondeterminism" not in said
    assert (await handle.describe()).status.name == "RUNNING"
    # What `state` and `prompt` quote of the failing task: the client with
    # the keys reads the sentence, not the history's "Encoded failure".
    _, quoted = await Conversation.attach(reader, handle.id)._last_task_failure()
    assert "is encrypted with key 'a', which is not among this process's keys" in quoted, quoted

    encrypted_worker.stop()
    encrypted_worker.start(f"b:{KEY_B},a:{KEY_A}")
    after = reader.get_workflow_handle(handle.id)
    idle = await asyncio.wait_for(after.execute_update("wait_for_idle"), 60)
    assert idle["messages"][-1]["content"][0]["text"] == "after the key came back"
    await after.signal("close")


async def test_the_starter_without_the_key_says_so_in_one_line(
    dev_server: DevServer, model_server: ScriptedModelServer, encrypted_worker: EncryptedWorker
) -> None:
    """A key missing during a rotation: the starter says it cannot read the
    answer (and that what it sent was delivered), not a traceback."""
    encrypted_worker.start(f"a:{KEY_A}")
    stack = stack_for(
        await encrypted_worker.client(dev_server, f"a:{KEY_A}"), encrypted_worker, model_server, dev_server
    )
    handle = await stack.start()
    env = {**encrypted_worker.env, "AGENT_ENCRYPTION_KEYS": ""}
    env.pop("AGENT_ENCRYPTION_KEYS_FILE", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "starter.py",
        "state",
        handle.id,
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    await handle.signal("close")
    assert (process.returncode, stdout) == (2, b"")
    line = stderr.decode()
    assert (
        line.startswith("error: The conversation's answer could not be read here") and line.count("\n") == 1
    )
    assert "encrypted" in line, line


async def test_a_failed_conversation_tells_its_reason_through_the_client(
    client: Client,
    dev_server: DevServer,
    model_server: ScriptedModelServer,
    encrypted_worker: EncryptedWorker,
) -> None:
    """With keys set, the server keeps a failure's message encrypted (the UI
    and the CLI show "Encoded failure"): this project's client, which has
    the keys, says why the conversation failed, and `state` says `closed`."""
    encrypted_worker.start(f"a:{KEY_A}")
    keyed = await encrypted_worker.client(dev_server, f"a:{KEY_A}")
    handle = await start_on(encrypted_worker, keyed, {"prompt": "hi", "sytemPrompt": "Be brief."}, "enc-bad")
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 30)
    history = await client.get_workflow_handle(handle.id).fetch_history()
    failure = history.events[-1].workflow_execution_failed_event_attributes.failure
    assert failure.message == "Encoded failure"  # what the server (and the UI) hold

    chat = Conversation.attach(keyed, handle.id)
    with pytest.raises(ConversationNotFound) as ended:
        await chat.steer("anyone there?")
    assert str(ended.value).startswith(
        f"Conversation {handle.id} failed (Unknown start input key(s) sytemPrompt"
    ), ended.value
    # A refused start left no transcript to fork (an operator audit).
    assert str(ended.value).endswith(": start a new one."), ended.value
    assert (await chat.state()).status == "closed"


async def test_the_state_of_a_conversation_no_worker_can_replay_is_one_sentence(
    client: Client, dev_server: DevServer, encrypted_worker: EncryptedWorker
) -> None:
    """A conversation that failed because its worker could not read its start
    input cannot be replayed to answer a query: `state` and `messages` raised
    WorkflowQueryFailedError ("Expected workflow input. This is a Python SDK
    bug.") and starter.py printed a traceback (a storage audit)."""
    encrypted_worker.start(f"b:{KEY_B}")
    # The client writes under a and reads what the worker writes under b.
    keyed = await encrypted_worker.client(dev_server, f"a:{KEY_A},b:{KEY_B}")
    handle = await start_on(encrypted_worker, keyed, {"prompt": "hi"}, "enc-unread")
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 30)
    chat = Conversation.attach(keyed, handle.id)
    for read in (chat.state, chat.messages):
        with pytest.raises(Refused) as refused:
            await read()
        said = str(refused.value)
        assert said.startswith(f"Conversation {handle.id} failed (A payload is encrypted with key 'a'"), said
        assert "a worker could not read its state: " in said and "\n" not in said


async def test_a_client_with_another_key_is_told_what_to_give_it(
    dev_server: DevServer, model_server: ScriptedModelServer, encrypted_worker: EncryptedWorker
) -> None:
    """A client whose key the workers lack sent a prompt the workflow had
    to refuse, and the refusal, encrypted by the worker, read only
    "Encoded failure" (a storage audit)."""
    encrypted_worker.start(f"b:{KEY_B}")
    right = await encrypted_worker.client(dev_server, f"b:{KEY_B}")
    handle = await start_on(encrypted_worker, right, {"model": "m"}, "enc-other")
    other = Conversation.attach(await encrypted_worker.client(dev_server, f"a:{KEY_A}"), handle.id)
    with pytest.raises(Refused) as refused:
        await other.prompt("hello", wait=False)
    assert str(refused.value) == (
        "Refused, for a reason encrypted with a key this client does not have (give it the workers' "
        "AGENT_ENCRYPTION_KEYS)."
    )
    await handle.signal("close")


async def test_context_blobs_in_s3_are_encrypted_and_read_after_rotation(
    monkeypatch: pytest.MonkeyPatch, fake_s3: tuple[str, dict[str, bytes]]
) -> None:
    """With AGENT_ENCRYPTION_KEYS the payload store holds only ciphertext: the
    context store's blobs in S3 too, as its files are (they pass no codec)."""
    url, objects = fake_s3
    use_fake_s3(monkeypatch, url)
    env = {**os.environ, "AGENT_STORAGE": "s3://bucket/pre", "AGENT_ENCRYPTION_KEYS": f"a:{KEY_A}"}
    data = b'{"role": "user", "content": "marker-s3-context"}'
    digest = digest_of(data)
    store = blob_store(Settings.from_env(env))
    assert isinstance(store, S3BlobStore)

    await store.put_many({digest: data})

    [stored] = objects.values()
    assert b"marker-s3-context" not in stored
    rotated = blob_store(Settings.from_env({**env, "AGENT_ENCRYPTION_KEYS": f"b:{KEY_B},a:{KEY_A}"}))
    assert rotated is not None and await rotated.get(digest) == data


@pytest.mark.parametrize(
    "data", [b"", b"short", os.urandom(12), os.urandom(27)], ids=["empty", "5", "12", "27"]
)
async def test_an_encrypted_payload_too_short_to_hold_a_nonce_and_tag_is_refused(data: bytes) -> None:
    """Anyone who may signal can send ``binary/encrypted`` with any data: one
    too short to be AES-GCM is refused with the sentence, as an altered one,
    not raised from the codec (which fails the workflow task on every retry)."""

    converter = data_converter(settings_with(f"a:{KEY_A}"))
    forged = Payload(metadata={"encoding": ENCRYPTED, KEY_ID: b"a"}, data=data)

    with pytest.raises(ApplicationError) as refused:
        await converter.decode([forged], [str])

    assert refused.value.type == "PayloadRefused" and "it was altered" in refused.value.message


async def test_the_s3_probe_refusal_shows_no_secret_the_store_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker prints the probe's refusal at start (logs, a terminal):
    an S3 error body that echoes a credential is scrubbed as every error text is."""

    secret = "plain-words-secret-value"

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        body = f"<Error><Code>AccessDenied</Code><Message>Access Denied for {secret}</Message></Error>"
        return web.Response(status=403, body=body.encode(), content_type="application/xml")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with serving(app, shutdown_timeout=0.1) as url:
        use_fake_s3(monkeypatch, url)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        with pytest.raises(SettingsError) as refused:
            await probe_s3_storage(
                Settings.from_env({**os.environ, "AGENT_STORAGE": "s3://bucket"}), timeout=10
            )

    assert "AccessDenied" in str(refused.value)
    assert secret not in str(refused.value)


BLOB = b'{"role": "user", "content": "audit"}'


# --- the keyring --------------------------------------------------------------------------------


def test_a_keyring_without_keys_is_refused() -> None:
    """A keyring built from no keys says so, rather than failing on its first use."""
    with pytest.raises(ValueError, match="at least one key"):
        Keyring([])


def test_each_encryption_uses_a_fresh_nonce() -> None:
    """AES-GCM is safe only if no nonce repeats under a key: one plaintext encrypts differently."""
    keys = keyring(f"a:{KEY_A}")

    (_, first), (_, second) = (keys.encrypt(b"same", b"ctx") for _ in range(2))

    assert first[:12] != second[:12] and first != second


def test_a_plaintext_blob_opens_as_none() -> None:
    """``open_blob`` tells a blob written before encryption (no prefix) from a sealed one."""
    assert keyring(f"a:{KEY_A}").open_blob(BLOB, digest_of(BLOB)) is None


def test_a_sealed_blob_moved_under_another_digest_does_not_open(tmp_path: Path) -> None:
    """A sealed blob is bound to its address: copied under another name it does not decrypt."""
    keys = keyring(f"a:{KEY_A}")
    other = digest_of(b"other content")
    sealed = keys.seal_blob(BLOB, digest_of(BLOB))

    with pytest.raises(Undecryptable):
        keys.open_blob(sealed, other)
    store = FileBlobStore(tmp_path, keys)
    store.path(other).parent.mkdir(parents=True)
    store.path(other).write_bytes(sealed)
    with pytest.raises(BlobMissing, match="cannot be decrypted"):
        store.read(other)


def test_a_sealed_blob_whose_key_id_is_not_utf8_is_an_unknown_key() -> None:
    """``open_blob`` raises one of its documented errors for any key id bytes, not UnicodeDecodeError."""
    blob = SEALED_PREFIX + bytes([2]) + b"\xff\xfe" + os.urandom(40)

    with pytest.raises(UnknownKey):
        keyring(f"a:{KEY_A}").open_blob(blob, digest_of(BLOB))


# --- the codec ----------------------------------------------------------------------------------


async def test_a_payload_relabelled_with_another_key_id_does_not_decrypt() -> None:
    """The key id is bound into the ciphertext: relabelled to another id of the same key, refused."""
    converter = data_converter(settings_with(f"a:{KEY_A},b:{KEY_A}"))
    [encrypted] = await converter.encode(["pay 10 EUR"])
    relabelled = Payload(metadata={"encoding": ENCRYPTED, KEY_ID: b"b"}, data=encrypted.data)

    with pytest.raises(ApplicationError, match="does not decrypt with key 'b'"):
        await converter.decode([relabelled], [str])


async def test_the_refusal_without_a_key_names_the_missing_key() -> None:
    """A process without keys is told which key id the payload needs."""
    [encrypted] = await data_converter(settings_with(f"2025-01:{KEY_A}")).encode(["secret"])

    with pytest.raises(ApplicationError) as refused:
        await data_converter(Settings(storage="off")).decode([encrypted], [str])

    assert "(binary/encrypted, key '2025-01') but no encryption key is set here" in refused.value.message


async def test_the_refusal_for_an_unknown_key_says_where_to_add_it() -> None:
    """A process lacking the key a payload names is told its own key ids and the setting to add the key to."""
    [encrypted] = await data_converter(settings_with(f"a:{KEY_A}")).encode(["secret"])

    with pytest.raises(ApplicationError) as refused:
        await data_converter(settings_with(f"b:{KEY_B},c:{KEY_A}")).decode([encrypted], [str])

    assert refused.value.message == (
        "A payload is encrypted with key 'a', which is not among this process's keys (b, c): "
        "add it to AGENT_ENCRYPTION_KEYS."
    )


async def test_an_encrypted_payload_that_holds_no_payload_is_refused_not_raised() -> None:
    """Data that decrypts under the right key but is no protobuf Payload is refused with a sentence."""
    keys = keyring(f"a:{KEY_A}")
    _, sealed = keys.encrypt(b"\xff\xff\xff", _payload_context("a"))
    forged = Payload(metadata={"encoding": ENCRYPTED, KEY_ID: b"a"}, data=sealed)

    with pytest.raises(ApplicationError) as refused:
        await data_converter(settings_with(f"a:{KEY_A}")).decode([forged], [str])

    assert refused.value.type == "PayloadRefused"
    assert "decrypts with key 'a' but holds no payload" in refused.value.message


async def test_a_key_id_that_is_not_utf8_is_refused_not_raised() -> None:
    """Anyone who may signal can send any key id bytes: the codec refuses them, it does not raise."""
    forged = Payload(metadata={"encoding": ENCRYPTED, KEY_ID: b"\xff\xfe"}, data=os.urandom(40))

    with pytest.raises(ApplicationError) as refused:
        await data_converter(settings_with(f"a:{KEY_A}")).decode([forged], [str])

    assert (
        refused.value.type == "PayloadRefused"
        and "not among this process's keys (a)" in refused.value.message
    )


# --- the blob store -----------------------------------------------------------------------------


def test_a_number_of_64_digits_is_not_a_digest() -> None:
    """A digest read from a history must be a string: a JSON number of 64 digits is refused as one."""
    with pytest.raises(ValueError, match="is not a content digest"):
        checked_digest(int("1" * 64))


@pytest.mark.parametrize(
    "blob",
    [SEALED_PREFIX, SEALED_PREFIX + b"\x01a" + b"torn"],
    ids=["prefix-only", "torn"],
)
def test_a_sealed_blob_that_is_cut_short_reads_as_missing(tmp_path: Path, blob: bytes) -> None:
    """A torn encrypted blob (an unsynced context file after a power cut) reads as missing."""
    store = FileBlobStore(tmp_path, keyring(f"a:{KEY_A}"), durable=False)
    store.path(digest_of(BLOB)).parent.mkdir(parents=True)
    store.path(digest_of(BLOB)).write_bytes(blob)

    with pytest.raises(BlobMissing, match="cannot be decrypted"):
        store.read(digest_of(BLOB))


def test_a_blob_sealed_with_another_key_of_the_same_id_reads_as_missing(tmp_path: Path) -> None:
    """Two processes with different keys under one id: the blob reads as missing, not an error."""
    FileBlobStore(tmp_path, keyring(f"a:{KEY_A}")).write(digest_of(BLOB), BLOB)

    with pytest.raises(BlobMissing, match="cannot be decrypted"):
        FileBlobStore(tmp_path, keyring(f"a:{KEY_B}")).read(digest_of(BLOB))


class _FailingSealer:
    def seal_blob(self, data: bytes, digest: str) -> bytes:
        raise RuntimeError("sealing failed")

    def open_blob(self, blob: bytes, digest: str) -> bytes | None:
        return None


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path: Path) -> None:
    """A failed write (here, sealing) removes its temporary file: the store does not fill with debris."""
    store = FileBlobStore(tmp_path, _FailingSealer())

    with pytest.raises(RuntimeError, match="sealing failed"):
        store.write(digest_of(BLOB), BLOB)

    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_blob_already_stored_is_not_rewritten(tmp_path: Path) -> None:
    """Content-addressed: a second write of the same digest leaves the stored file as it is."""
    store = FileBlobStore(tmp_path, keyring(f"a:{KEY_A}"))
    store.write(digest_of(BLOB), BLOB)
    before = store.path(digest_of(BLOB)).read_bytes()

    store.write(digest_of(BLOB), BLOB)

    assert store.path(digest_of(BLOB)).read_bytes() == before  # sealing again would pick a new nonce


class _RecordingS3:
    """The S3 client's two calls, objects kept in a dict."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        self.objects[key] = data

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        return self.objects[key]


async def test_s3_put_refuses_a_name_that_is_not_a_digest_and_writes_nothing() -> None:
    """A digest comes from a history a client may have written: no object is written under any other name."""
    client = _RecordingS3()

    with pytest.raises(ValueError, match="is not a content digest"):
        await S3BlobStore(client, "bucket").put_many({"../../manifest": BLOB})

    assert client.objects == {}


# --- the payload converter ---------------------------------------------------------------------


class _Note(BaseModel):
    text: str


def _json(data: bytes) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


def test_json_the_strict_parser_refuses_is_still_read_into_its_type() -> None:
    """A lone surrogate escape (other encoders write it) reads as the model asked for, not a dict."""
    [note] = AgentPayloadConverter().from_payloads([_json(b'{"text": "a \\ud800 b"}')], [_Note])

    assert isinstance(note, _Note) and note.text == "a \ud800 b"


def test_json_nested_beyond_any_parser_fails_for_good_with_the_nesting_advice() -> None:
    """JSON nested past Python's recursion limit fails for good with the sentence, not a retry loop."""
    deep = _json(b"[" * 100_000 + b"]" * 100_000)

    with pytest.raises(ApplicationError) as refused:
        AgentPayloadConverter().from_payloads([deep], [list])

    assert refused.value.type == "PayloadDecodeError" and refused.value.non_retryable
    assert refused.value.message.endswith("Send plain JSON nested at most 64 levels deep.")


def test_a_value_of_the_wrong_type_is_left_to_the_caller() -> None:
    """A readable payload of the wrong type raises pydantic's ValidationError for the caller to word."""
    with pytest.raises(ValidationError):
        AgentPayloadConverter().from_payloads([_json(b'{"text": 5}')], [_Note])


def test_a_payload_in_no_encoding_is_refused_for_good_with_a_sentence() -> None:
    """A payload with no encoding ends the conversation with a sentence naming it and the SDK's reason."""
    with pytest.raises(ApplicationError) as refused:
        AgentPayloadConverter().from_payloads([Payload(data=b"x")], [str])

    assert refused.value.type == "PayloadDecodeError" and refused.value.non_retryable
    assert refused.value.message.startswith(
        "A payload could not be read (encoding none: 'Unknown payload encoding"
    )


def test_a_protobuf_payload_without_its_type_is_refused_with_the_reason() -> None:
    """The refusal quotes why the SDK could not read it, not the SDK's wrapper ("Payload at index 0 ...")."""
    typeless = Payload(metadata={"encoding": b"json/protobuf"}, data=b"{}")

    with pytest.raises(ApplicationError) as refused:
        AgentPayloadConverter().from_payloads([typeless], [str])

    assert refused.value.message == (
        "A payload could not be read (encoding json/protobuf: Unknown Protobuf type <unknown>). "
        "Send plain JSON (json/plain)."
    )


def test_a_refusal_reads_as_one_sentence_ending_in_one_full_stop() -> None:
    """A codec's reason that ends in a full stop is not doubled when the converter words the refusal."""
    with pytest.raises(ApplicationError) as refused:
        AgentPayloadConverter().from_payloads([refused_payload("was refused by the test.")], [str])

    assert refused.value.message == "A payload was refused by the test."


def test_a_refusal_reason_is_cut_to_500_characters() -> None:
    """Anyone who may signal can send ``binary/refused`` with any text: the refusal stays short."""
    forged = Payload(metadata={"encoding": REFUSED}, data=b"x" * 100_000)

    with pytest.raises(ApplicationError) as refused:
        AgentPayloadConverter().from_payloads([forged], [str])

    assert refused.value.message == "A payload " + "x" * 500 + "."


# --- key settings -------------------------------------------------------------------------------


def test_a_key_longer_than_32_bytes_is_refused() -> None:
    """AES-256 takes exactly 32 bytes: a longer key is refused at start with the sentence."""
    longer = base64.b64encode(os.urandom(48)).decode()

    with pytest.raises(SettingsError, match="must be 32 random bytes in base64"):
        Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"a:{longer}"})


def test_the_id_derived_for_a_single_key_reveals_none_of_it_and_is_stable() -> None:
    """AGENT_ENCRYPTION_KEY's derived id goes into every payload's metadata: it must not leak the key, and
    every process with the key derives the same id."""
    [(key_id, key)] = Settings.from_env({"AGENT_ENCRYPTION_KEY": KEY_A}).encryption_keys
    [(again, _)] = Settings.from_env({"AGENT_ENCRYPTION_KEY": KEY_A}).encryption_keys

    assert key_id == again == key_id_of(key)
    encodings = (KEY_A, base64.urlsafe_b64encode(key).decode(), key.hex())
    assert not any(key_id[i : i + 8] in e for e in encodings for i in range(len(key_id) - 7))


def test_a_key_file_under_the_home_directory_is_found(tmp_path: Path) -> None:
    """AGENT_ENCRYPTION_KEY_FILE=~/keys reads the file in the HOME the settings are given."""
    (tmp_path / "keys").write_text(f"a:{KEY_A}\n")

    settings = Settings.from_env({"AGENT_ENCRYPTION_KEY_FILE": "~/keys", "HOME": str(tmp_path)})

    assert settings.encryption_keys == (("a", base64.b64decode(KEY_A)),)


def test_spaces_around_the_colon_of_a_key_entry_are_ignored() -> None:
    """``id : BASE64`` (as a person types it) is the same key as ``id:BASE64``."""
    settings = Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"a : {KEY_A}"})

    assert settings.encryption_keys == (("a", base64.b64decode(KEY_A)),)
