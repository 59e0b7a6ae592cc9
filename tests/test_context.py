"""The model's context goes by reference: each message is stored once and
model calls carry a manifest digest plus the new messages, so the history
grows linearly with the turns, not with their square."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from activities.blobs import FileBlobStore, digest_of
from activities.context_store import MERGE_FANOUT, ContextMissing, ContextStore, Manifest
from runtime.settings import Settings
from tests.support.stack import EventLog, Stack
from workflows.models import MessageAdapter, UserMessage


def llm_inputs(history: Any) -> list[bytes]:
    return [
        e.activity_task_scheduled_event_attributes.input.payloads[0].data
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "stream_assistant_response"
    ]


async def test_model_calls_carry_a_reference_not_the_transcript(stack: Stack) -> None:
    turns = 12
    stack.script(
        *[
            {"tool_calls": [{"id": f"c{i}", "name": "echo", "arguments": {"text": f"{i}"}}]}
            for i in range(turns - 1)
        ],
        {"text": "done"},
    )
    marker = "UNIQUE-PROMPT-MARKER " * 20
    handle = await stack.start(prompt=marker, closeWhenIdle=True)
    await handle.result()
    inputs = llm_inputs(await handle.fetch_history())
    assert len(inputs) == turns
    assert marker.encode() in inputs[0]
    assert not any(marker.encode() in data for data in inputs[1:])
    assert max(len(d) for d in inputs[1:]) < 2 * min(len(d) for d in inputs[1:])
    # The model still saw the whole transcript every time.
    assert all(r["messages"][0]["content"] == marker for r in stack.requests())
    assert len(stack.requests()[-1]["messages"]) == 1 + 2 * (turns - 1)


async def _remove_whole(directory: Path) -> None:
    """Remove ``directory``; the shared worker may write another
    conversation's blob into it meanwhile ("Directory not empty")."""
    for _ in range(100):
        shutil.rmtree(directory, ignore_errors=True)
        if not directory.exists():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{directory} could not be removed")


async def test_lost_stored_context_is_resent_inline(stack: Stack, worker_env: dict[str, str]) -> None:
    stack.script({"text": "first"}, {"text": "second"})
    handle = await stack.start(prompt="remember me")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("agent_end")
    await _remove_whole(Path(worker_env["AGENT_STORAGE_DIR"]) / "context")
    await handle.execute_update("prompt", "still there?")
    await log.wait_for_type("agent_end", count=2)
    log.close()
    messages = await stack.messages(handle)
    assert messages[-1].text == "second"
    assert [m["content"] for m in stack.requests()[-1]["messages"] if m["role"] == "user"] == [
        "remember me",
        "still there?",
    ]
    await handle.signal("close")


async def test_a_long_run_merges_its_stored_context_and_the_model_sees_all_of_it(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """Past 16 model calls the worker merges the context's segments (in its
    model activity, writing in the background): every call still sends the
    whole transcript, and the merged context reads back whole, cold."""
    calls = 2 * MERGE_FANOUT + 3
    stack.script(
        *[
            {"tool_calls": [{"id": f"m{i}", "name": "echo", "arguments": {"text": f"r{i}"}}]}
            for i in range(calls - 1)
        ],
        {"text": "all done"},
    )
    marker = f"MERGE-MARKER {uuid.uuid4()}"
    handle = await stack.start(prompt=marker, closeWhenIdle=True)
    await handle.result()
    sent = [r["messages"] for r in stack.requests() if r["messages"][0]["content"] == marker]
    assert [len(messages) for messages in sent] == [1 + 2 * i for i in range(calls)]
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(sent))
    store = ContextStore(FileBlobStore(Path(worker_env["AGENT_STORAGE_DIR"]) / "context"))
    merged = []
    for path in (Path(worker_env["AGENT_STORAGE_DIR"]) / "context").rglob("*"):
        data = path.read_bytes() if path.is_file() and not path.name.startswith(".") else b""
        if data.startswith(b"{") and b'"spans"' in data:
            try:
                manifest, messages = await store.load(path.name)
            except ContextMissing:
                continue  # another test's, with its parts removed
            if messages and messages[0].content == marker:
                merged.append((sum(manifest.segment_spans()), manifest, messages))
    _, manifest, messages = max(merged, key=lambda found: found[0])
    assert len(manifest.segments) < calls // 4
    transcript = await stack.messages(handle)
    assert [m.model_dump(mode="json") for m in messages] == [m.model_dump(mode="json") for m in transcript]


async def test_a_turn_writes_one_segment_and_old_manifests_still_read(tmp_path: Path) -> None:
    """Each save writes the turn's messages as one segment plus a manifest;
    a manifest of per-message digests (the earlier format) still loads,
    and a store that lost its files says so (the workflow then resends)."""
    import json

    import pytest

    from activities.blobs import FileBlobStore, digest_of
    from activities.context_store import ContextMissing, ContextStore, Manifest
    from workflows.models import MessageAdapter, UserMessage

    blobs = FileBlobStore(tmp_path)
    first, second = UserMessage(content="one", timestamp=1), UserMessage(content="two", timestamp=2)
    old = [MessageAdapter.dump_json(first), MessageAdapter.dump_json(second)]
    old_manifest = json.dumps([digest_of(d) for d in old]).encode()
    blobs.write_all({digest_of(d): d for d in [*old, old_manifest]})

    store = ContextStore(blobs)
    manifest, messages = await store.load(digest_of(old_manifest))
    assert [m.content for m in messages] == ["one", "two"]
    files_before = {p for p in tmp_path.rglob("*") if p.is_file()}
    third = UserMessage(content="three", timestamp=3)
    fourth = UserMessage(content="four", timestamp=4)
    new_digest = await store.save(manifest, [third, fourth])
    written = {p for p in tmp_path.rglob("*") if p.is_file()} - files_before
    assert len(written) == 2, "one segment and one manifest"

    fresh = ContextStore(FileBlobStore(tmp_path))
    _, messages = await fresh.load(new_digest)
    assert [m.content for m in messages] == ["one", "two", "three", "four"]

    for path in written:
        path.unlink()
    with pytest.raises(ContextMissing):
        await ContextStore(FileBlobStore(tmp_path)).load(new_digest)
    assert isinstance(Manifest.from_json(old_manifest), Manifest)


async def test_a_context_this_worker_saved_is_read_from_its_cache(tmp_path: Path) -> None:
    """A conversation staying on one worker: its segments come from the
    cache, in order (the files gone makes no difference); a fresh store
    reads the same messages from the files."""
    from activities.blobs import FileBlobStore
    from activities.context_store import ContextStore, Manifest
    from workflows.models import UserMessage

    store = ContextStore(FileBlobStore(tmp_path))
    manifest, digest = Manifest(), ""
    for turn in range(4):
        digest = await store.save(
            manifest, [UserMessage(content=f"{turn}-{i}", timestamp=turn) for i in range(2)]
        )
        manifest, _ = await store.load(digest)
    _, fresh = await ContextStore(FileBlobStore(tmp_path)).load(digest)
    shutil.rmtree(tmp_path)
    _, cached = await store.load(digest)
    expected = [f"{turn}-{i}" for turn in range(4) for i in range(2)]
    assert [m.content for m in cached] == [m.content for m in fresh] == expected


def test_the_context_cache_skips_fsync_and_a_torn_blob_reads_as_missing(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Stored context is a cache of what the workflow holds, so its files are
    not fsynced (two a model call); a file torn by a power failure fails its
    digest and reads as missing, which makes the workflow resend inline.
    External payloads are the only copy of a payload: those are fsynced."""
    import asyncio
    import os

    import pytest

    from activities.context_store import ContextMissing, ContextStore, Manifest
    from runtime.payloads import FileSystemStorageDriver, blob_store
    from workflows.models import UserMessage

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    blobs = blob_store(Settings.from_env({"AGENT_STORAGE_DIR": str(tmp_path)}))
    assert blobs is not None
    store = ContextStore(blobs)
    digest = asyncio.run(store.save(Manifest(), [UserMessage(content="one", timestamp=1)]))
    written = [p for p in (tmp_path / "context").rglob("*") if p.is_file()]
    assert len(written) == 2 and not synced

    FileSystemStorageDriver(tmp_path / "payloads").blobs("default").write("a" * 64, b"payload")
    assert len(synced) == 1

    for path in written:
        path.write_bytes(path.read_bytes()[:5])  # torn: a prefix of the content survived
    with pytest.raises(ContextMissing):
        asyncio.run(ContextStore(blobs).load(digest))  # a fresh store: nothing cached


def user(text: str) -> UserMessage:
    return UserMessage(content=text, timestamp=1)


def texts(messages: list[Any]) -> list[str]:
    return [m.content for m in messages]


def put(root: Path, data: bytes) -> str:
    """Store ``data`` under its digest, as another worker (or version) would have."""
    digest = digest_of(data)
    FileBlobStore(root).write_all({digest: data})
    return digest


class StalledBlobs(FileBlobStore):
    """A store whose writes hang until released (a slow or hung S3)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = asyncio.Event()

    async def put_many(self, blobs: dict[str, bytes]) -> None:
        await self.release.wait()
        await super().put_many(blobs)


class FailingBlobs(FileBlobStore):
    async def put_many(self, blobs: dict[str, bytes]) -> None:
        raise OSError("the store is down")


class SlowBlobs(FileBlobStore):
    async def put_many(self, blobs: dict[str, bytes]) -> None:
        await asyncio.sleep(0.1)
        await super().put_many(blobs)


# --- context_store.py --------------------------------------------------------


@pytest.mark.parametrize("content", [b'"a string"', b"42", b"not json at all"])
async def test_a_manifest_that_is_not_a_json_object_reads_as_missing(tmp_path: Path, content: bytes) -> None:
    """A stored context that is unreadable makes the workflow resend inline; it never fails the call."""
    digest = put(tmp_path, content)
    with pytest.raises(ContextMissing, match="cannot be read"):
        await ContextStore(FileBlobStore(tmp_path)).load(digest)


async def test_a_context_reference_that_is_not_a_digest_reads_as_missing(tmp_path: Path) -> None:
    """A reference from a history (which a client may have written) is checked, not used as a path."""
    with pytest.raises(ContextMissing, match="not a content digest"):
        await ContextStore(FileBlobStore(tmp_path)).load("../../etc/passwd")


@pytest.mark.parametrize("segment", [b'[{"role": "user"}]', b'{"not": "a list"}'])
async def test_a_segment_of_messages_this_version_cannot_read_reads_as_missing(
    tmp_path: Path, segment: bytes
) -> None:
    """A segment written by another version (a rollback) gets the workflow to resend, not a crash."""
    manifest = Manifest(segments=(put(tmp_path, segment),))
    digest = put(tmp_path, manifest.to_json())
    with pytest.raises(ContextMissing, match="cannot be read"):
        await ContextStore(FileBlobStore(tmp_path)).load(digest)


async def test_an_old_manifest_saved_on_and_reread_by_one_worker_keeps_its_messages(tmp_path: Path) -> None:
    """A conversation from before segments, continued on one worker: its old and new
    messages come back in order, from the cache (the files gone make no difference)."""
    old = [MessageAdapter.dump_json(user("one")), MessageAdapter.dump_json(user("two"))]
    old_manifest = put(tmp_path, json.dumps([put(tmp_path, d) for d in old]).encode())
    store = ContextStore(FileBlobStore(tmp_path))
    manifest, _ = await store.load(old_manifest)
    digest = await store.save(manifest, [user("three"), user("four")])
    shutil.rmtree(tmp_path)
    _, messages = await store.load(digest)
    assert texts(messages) == ["one", "two", "three", "four"]


async def test_a_context_partly_written_by_another_worker_is_read_whole(tmp_path: Path) -> None:
    """A conversation that moved between workers: one segment in this worker's cache, one not."""
    here = ContextStore(FileBlobStore(tmp_path))
    first = await here.save(Manifest(), [user("here")])
    there = ContextStore(FileBlobStore(tmp_path))
    manifest, _ = await there.load(first)
    second = await there.save(manifest, [user("there")])
    _, messages = await here.load(second)
    assert texts(messages) == ["here", "there"]


async def test_a_context_read_once_is_read_again_from_the_cache(tmp_path: Path) -> None:
    """The store caches what it read as well as what it wrote (content never changes)."""
    digest = await ContextStore(FileBlobStore(tmp_path)).save(Manifest(), [user("a"), user("b")])
    store = ContextStore(FileBlobStore(tmp_path))
    await store.load(digest)
    shutil.rmtree(tmp_path)
    _, messages = await store.load(digest)
    assert texts(messages) == ["a", "b"]


@pytest.mark.parametrize("blobs", [StalledBlobs, FailingBlobs])
async def test_a_context_saved_soon_is_read_on_this_worker_before_its_write_ends(
    tmp_path: Path, blobs: type[FileBlobStore], caplog: pytest.LogCaptureFixture
) -> None:
    """save_soon: the next model call on this worker reads the context from the cache,
    however slow or broken the store; a failed write is a warning, not an error."""
    stored = blobs(tmp_path)
    store = ContextStore(stored)
    digest = store.save_soon(Manifest(), [user("one")])
    manifest, _ = await store.load(digest)
    digest = store.save_soon(manifest, [user("two")])
    with caplog.at_level(logging.WARNING, logger="activities.context_store"):
        _, messages = await store.load(digest)
        await asyncio.sleep(0.05)
    assert texts(messages) == ["one", "two"]
    if isinstance(stored, FailingBlobs):
        assert "Storing context failed: the store is down" in caplog.text
    else:
        stored.release.set()
    await asyncio.wait_for(store.flush(), 5)


async def test_a_long_conversation_on_one_worker_is_read_from_its_cache(tmp_path: Path) -> None:
    """The default cache holds a long conversation's segments while their writes are pending."""
    stalled = StalledBlobs(tmp_path)
    store = ContextStore(stalled)
    manifest, digest = Manifest(), ""
    for turn in range(200):
        digest = store.save_soon(manifest, [user(f"q{turn}"), user(f"a{turn}")])
        manifest, _ = await store.load(digest)
    _, messages = await store.load(digest)
    assert len(messages) == 400 and messages[0].content == "q0"
    stalled.release.set()
    await asyncio.wait_for(store.flush(), 30)


async def test_flush_waits_for_the_background_writes_and_then_returns(tmp_path: Path) -> None:
    """flush returns once every write (one begun while it waits too) is on disk, for other workers."""
    store = ContextStore(SlowBlobs(tmp_path))
    first = store.save_soon(Manifest(), [user("first")])
    flushing = asyncio.create_task(store.flush())
    await asyncio.sleep(0.05)
    second = store.save_soon(Manifest(), [user("second")])
    await asyncio.wait_for(flushing, 5)
    fresh = ContextStore(FileBlobStore(tmp_path))
    assert texts((await fresh.load(first))[1]) == ["first"]
    assert texts((await fresh.load(second))[1]) == ["second"]
    await asyncio.wait_for(store.flush(), 5)  # nothing pending: returns at once


async def test_the_context_cache_is_bounded_and_keeps_what_was_used_last(tmp_path: Path) -> None:
    """A worker's memory stays bounded; the conversations it serves stay cached, the idle one goes."""
    store = ContextStore(FileBlobStore(tmp_path), cache_size=4)  # two contexts of one segment each
    a = await store.save(Manifest(), [user("a")])
    b = await store.save(Manifest(), [user("b")])
    await store.load(a)  # a is in use again: b is now the least recently used
    c = await store.save(Manifest(), [user("c")])
    shutil.rmtree(tmp_path)
    assert texts((await store.load(a))[1]) == ["a"]
    assert texts((await store.load(c))[1]) == ["c"]
    with pytest.raises(ContextMissing):
        await store.load(b)


async def test_the_context_cache_is_bounded_by_bytes_as_well(tmp_path: Path) -> None:
    """Entries alone did not bound memory: 20,000 segments of a 20 KB tool
    output each kept ~330 MB. Past ``cache_bytes`` of stored JSON the least
    recently used go; a segment larger than the whole bound is read from the
    store whenever it is needed."""
    store = ContextStore(FileBlobStore(tmp_path), cache_bytes=3_000)
    big = [user("x" * 1_000)]
    a = await store.save(Manifest(), big)
    b = await store.save(Manifest(), [user("y" * 1_000)])
    await store.load(a)  # a is in use again: b is now the least recently used
    c = await store.save(Manifest(), [user("z" * 1_000)])
    huge = await store.save(Manifest(), [user("w" * 5_000)])
    assert store._cached_bytes <= 3_000
    shutil.rmtree(tmp_path)
    assert texts((await store.load(a))[1]) == ["x" * 1_000]
    assert texts((await store.load(c))[1]) == ["z" * 1_000]
    for gone in (b, huge):
        with pytest.raises(ContextMissing):
            await store.load(gone)


async def test_a_context_read_again_is_counted_once(tmp_path: Path) -> None:
    """Reading what is cached, or saving the same content again, does not
    grow the count of cached bytes (else the bound would shrink in use)."""
    store = ContextStore(FileBlobStore(tmp_path))
    digest = await store.save(Manifest(), [user("a"), user("b")])
    counted = store._cached_bytes
    for _ in range(3):
        await store.load(digest)
        assert await store.save(Manifest(), [user("a"), user("b")]) == digest
    assert store._cached_bytes == counted > 0


async def test_the_worker_bounds_its_context_cache_by_its_setting(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """AGENT_CONTEXT_CACHE_MB reaches the store the model calls read from."""
    from worker import build_worker

    for env, expected in (({}, 64), ({"AGENT_CONTEXT_CACHE_MB": "3"}, 3)):
        settings = Settings.from_env({**worker_env, **env}, task_queue=f"context-cache-{expected}")
        worker = build_worker(stack.client, settings)
        llm = next(
            getattr(a, "__self__", None)
            for a in worker.config()["activities"]
            if getattr(a, "__name__", "") == "stream_assistant_response"
        )
        assert llm._context._cache_bytes == expected * 1024 * 1024


async def test_a_segment_too_large_to_cache_is_read_once_its_write_ends(tmp_path: Path) -> None:
    """save_soon of a segment past the byte bound: the next model call on this
    worker waits for the write under way rather than finding it missing
    (which would have the workflow resend the whole context inline)."""
    stalled = StalledBlobs(tmp_path)
    store = ContextStore(stalled, cache_bytes=500)
    digest = store.save_soon(Manifest(), [user("x" * 1_000)])
    loading = asyncio.create_task(store.load(digest))
    await asyncio.sleep(0.05)
    assert not loading.done()  # waiting for the write, not failed
    stalled.release.set()
    _, messages = await asyncio.wait_for(loading, 5)
    assert texts(messages) == ["x" * 1_000]
    await asyncio.wait_for(store.flush(), 5)
    assert not store._pending


class CountingBlobs(FileBlobStore):
    """A store that counts its reads and can run something while one is under way."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[int] = []  # blobs asked for, per request
        self.during_reads: list[Any] = []  # what to run in each next request (None: nothing)

    async def get(self, digest: str) -> bytes:
        self.reads.append(1)
        return await super().get(digest)

    async def get_many(self, digests: list[str]) -> dict[str, bytes]:
        self.reads.append(len(digests))
        action = self.during_reads.pop(0) if self.during_reads else None
        if action is not None:
            action()
        return await super().get_many(digests)


async def test_a_long_context_is_read_cold_in_one_request_to_the_store(tmp_path: Path) -> None:
    """A new worker (or one whose cache let the context go) reads all of a
    long conversation's segments at once, not one request per segment."""
    writer = ContextStore(FileBlobStore(tmp_path))
    manifest, digest = Manifest(), ""
    for turn in range(100):
        digest = await writer.save(manifest, [user(f"q{turn}"), user(f"a{turn}")])
        manifest, _ = await writer.load(digest)
    counting = CountingBlobs(tmp_path)
    _, messages = await ContextStore(counting).load(digest)
    assert len(messages) == 200 and messages[0].content == "q0" and messages[-1].content == "a99"
    assert len(manifest.segments) > 1
    assert counting.reads == [1, len(manifest.segments)]  # the manifest, then its segments


async def test_a_context_pushed_out_of_the_cache_during_a_cold_read_is_read_whole(tmp_path: Path) -> None:
    """Other model calls on the worker may fill its cache while a cold read
    waits on the store: what was cached when the read began is still used."""
    shared = ContextStore(FileBlobStore(tmp_path))
    first = await shared.save(Manifest(), [user("cached here")])
    manifest, _ = await shared.load(first)
    counting = CountingBlobs(tmp_path)
    store = ContextStore(counting, cache_size=4)
    await store.load(first)  # "cached here" is now in this worker's cache
    digest = await shared.save(manifest, [user("written elsewhere")])

    def other_calls() -> None:
        for n in range(8):  # more than the cache holds
            store.save_soon(Manifest(), [user(f"other {n}")])

    counting.during_reads = [None, other_calls]  # the manifest's read, then the segment's
    _, messages = await store.load(digest)
    assert texts(messages) == ["cached here", "written elsewhere"]
    assert counting.reads[-1] == 1  # only the segment it did not hold
    await store.flush()


async def test_a_long_conversations_manifest_stays_short_and_names_every_message(tmp_path: Path) -> None:
    """Segments merge as the calls add up: a conversation of 1,000 model
    calls lists a few dozen segments, not 1,000, and the store holds a
    few copies of each message rather than a manifest per call that
    grows with the conversation (which made the store grow with its square)."""
    store = ContextStore(FileBlobStore(tmp_path))
    manifest, digest, sizes, stored = Manifest(), "", [], {}
    for call in range(1, 1_001):
        digest = await store.save(manifest, [user(f"q{call}"), user(f"a{call}")])
        manifest, messages = await store.load(digest)
        sizes.append(len(manifest.to_json()))
        if call in (500, 1_000):
            stored[call] = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
    assert texts(messages) == [t for call in range(1, 1_001) for t in (f"q{call}", f"a{call}")]
    assert len(manifest.segments) <= 3 * (MERGE_FANOUT - 1) and max(sizes) < 4_000
    # Twice the calls, about twice the bytes (listing every segment: four times).
    assert stored[1_000] < 2.5 * stored[500]
    # Read cold by another worker, and by one that ignores ``spans`` (an
    # earlier version): the same context.
    _, cold = await ContextStore(FileBlobStore(tmp_path)).load(digest)
    assert texts(cold) == texts(messages)
    plain = json.loads((tmp_path / digest[:2] / digest).read_bytes())
    assert set(plain) == {"messages", "segments", "spans"}
    older = put(tmp_path, json.dumps({"messages": [], "segments": plain["segments"]}).encode())
    _, read_by_older = await ContextStore(FileBlobStore(tmp_path)).load(older)
    assert texts(read_by_older) == texts(messages)


async def test_segments_too_large_to_cache_are_left_unmerged_and_still_read(tmp_path: Path) -> None:
    store = ContextStore(FileBlobStore(tmp_path), cache_bytes=2_000)
    manifest, digest = Manifest(), ""
    for call in range(MERGE_FANOUT + 3):
        text = "x" * 3_000 if call == 2 else f"m{call}"  # one segment past the cache's bound
        digest = await store.save(manifest, [user(text)])
        manifest, _ = await store.load(digest)
    # The first three were not merged (one was not held here); the sixteen after it were.
    assert manifest.segment_spans() == (1, 1, 1, MERGE_FANOUT)
    _, messages = await ContextStore(FileBlobStore(tmp_path)).load(digest)
    assert len(messages) == MERGE_FANOUT + 3 and messages[2].content == "x" * 3_000


@pytest.mark.parametrize("spans", ['"many"', "[0]", "[1, 2]", "[1.5]", "[true]"])
async def test_a_manifest_with_spans_it_cannot_use_reads_as_one_call_each(tmp_path: Path, spans: str) -> None:
    segment = put(tmp_path, json.dumps([MessageAdapter.dump_python(user("only"), mode="json")]).encode())
    digest = put(tmp_path, f'{{"messages": [], "segments": ["{segment}"], "spans": {spans}}}'.encode())
    manifest, messages = await ContextStore(FileBlobStore(tmp_path)).load(digest)
    assert texts(messages) == ["only"] and manifest.segment_spans() == (1,)
