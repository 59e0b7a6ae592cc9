"""The model's context goes by reference: each message is stored once and
model calls carry a manifest digest plus the new messages, so the history
grows linearly with the turns, not with their square."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.support.stack import EventLog, Stack


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


async def test_lost_stored_context_is_resent_inline(stack: Stack, worker_env: dict[str, str]) -> None:
    stack.script({"text": "first"}, {"text": "second"})
    handle = await stack.start(prompt="remember me")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("agent_end")
    shutil.rmtree(Path(worker_env["AGENT_STORAGE_DIR"]) / "context")
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
    from runtime.settings import Settings
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
