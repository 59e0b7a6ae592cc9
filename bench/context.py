"""A conversation's context as it grows: a model call's body, a cold read.

    .venv/bin/python -m bench.context [--repeat 5]

Each model call sends the whole context, and the worker keeps a
conversation's messages and what they were converted to
(``ConversionMemo``). Two costs that grew with the context, each side by
side in one process, for contexts of K tool rounds (two ``read_file``
calls each, outputs of a given size):

- The request body (bench/README.md change 41): it was serialised whole
  every call; now each kept message keeps its JSON as sent (``WirePart``)
  and a call encodes only its new messages. Process CPU per call of the
  conversion plus the encoding, the best of ``--repeat`` timings of many
  calls: the kept JSON against the whole body (``json.dumps`` of the
  memo's plain dicts, as before).
- The stored context (changes 42 and 43): a manifest listed one segment
  per model call, so each call wrote a manifest that grew with the
  conversation and a cold read (a worker that starts, or whose cache let
  the context go) made one request (one thread hop) per segment. Now a
  cold read asks for all at once, and segments merge as calls add up. For
  each context, saved call by call as the worker saves it: the segments
  its last manifest lists, the bytes the store holds (manifests included),
  and the wall time of ``ContextStore.load`` from a new store over the
  same files, the best of ``--repeat``: every segment listed (as before
  change 43) read one request per segment (before change 42) and at once,
  and merged, read at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from activities import context_store, openai_chat
from activities.blobs import FileBlobStore
from activities.context_store import ContextStore, Manifest
from activities.model_http import request_body
from workflows.models import (
    AgentMessage,
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

CASES = ((20, 8), (20, 2_000), (100, 2_000), (150, 8_000))  # (tool rounds, bytes per tool output)
COLD_CASES = (
    (50, 8),
    (460, 8),
    (150, 2_000),
    (2_000, 8),
)  # 460 rounds: ~3,700 history events, near continue-as-new


def context(rounds: int, output: int) -> list[AgentMessage]:
    messages: list[AgentMessage] = [UserMessage(content="work through the files")]
    for i in range(rounds):
        calls = [
            ToolCall(id=f"call_{i}_{j}", name="read_file", arguments={"path": f"/src/m{i}_{j}.py"})
            for j in range(2)
        ]
        messages.append(AssistantMessage(content=list(calls), stop_reason="toolUse"))
        text = "x = 'é'\n" * (output // 8)
        messages += [
            ToolResultMessage(tool_call_id=c.id, tool_name="read_file", content=[TextContent(text=text)])
            for c in calls
        ]
    return messages


def call_cost(messages: list[AgentMessage], kept_json: bool, repeat: int) -> tuple[float, int]:
    """CPU ms per call of converting ``messages`` and encoding the body; the body's size."""
    shared = openai_chat._SHARED
    if not kept_json:
        openai_chat._SHARED = openai_chat._FRESH  # memoised plain dicts: the body serialised whole
    try:
        memo = openai_chat.ConversionMemo()
        encode: Callable[[dict[str, object]], bytes] = (
            request_body
            if kept_json
            else lambda p: json.dumps(p, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        )

        def one() -> bytes:
            sent = openai_chat.to_openai_messages("You are a coding agent.", messages, memo)
            return encode(
                {"model": "m", "messages": sent, "stream": True, "stream_options": {"include_usage": True}}
            )

        size = len(one())  # the first call converts and encodes all: not timed
        calls = max(20, int(2_000 / (1 + size / 20_000)))
        best = float("inf")
        for _ in range(repeat):
            start = time.process_time()
            for _ in range(calls):
                one()
            best = min(best, (time.process_time() - start) / calls * 1_000)
        return best, size
    finally:
        openai_chat._SHARED = shared


class _OneReadPerBlob(FileBlobStore):
    """The file store read as before change 42: one request per blob."""

    async def get_many(self, digests: list[str]) -> dict[str, bytes]:
        return dict(zip(digests, await asyncio.gather(*(self.get(d) for d in digests)), strict=True))


@dataclass
class Stored:
    """A context written call by call, then read cold."""

    segments: int = 0
    store_bytes: int = 0  # all blobs written, manifests included
    read_ms: dict[str, float] = field(default_factory=dict)  # by way of reading


async def stored_context(rounds: int, output: int, repeat: int, merge: bool) -> Stored:
    """A context of ``rounds`` model calls saved as the worker saves it (one
    segment a call; merged, or every segment listed as before change 43),
    then loaded by new stores: the best of ``repeat`` for each way of reading."""
    fanout = context_store.MERGE_FANOUT
    if not merge:
        context_store.MERGE_FANOUT = 1 << 30
    try:
        with tempfile.TemporaryDirectory() as root:
            writer = ContextStore(FileBlobStore(Path(root), durable=False))
            manifest, digest = Manifest(), ""
            for messages in _rounds(context(rounds, output)):
                digest = await writer.save(manifest, messages)
                manifest, _ = await writer.load(digest)
            result = Stored(len(manifest.segments), sum(f.stat().st_size for f in Path(root).rglob("*")))
            ways = {"at once": FileBlobStore, "one per segment": _OneReadPerBlob}
            for name, kind in ways.items() if not merge else [("at once", FileBlobStore)]:
                best = float("inf")
                for _ in range(repeat):
                    store = ContextStore(kind(Path(root)))
                    start = time.perf_counter()
                    await store.load(digest)
                    best = min(best, (time.perf_counter() - start) * 1_000)
                result.read_ms[name] = best
            return result
    finally:
        context_store.MERGE_FANOUT = fanout


def _rounds(messages: list[AgentMessage]) -> list[list[AgentMessage]]:
    """The prompt, then each call's answer and its results: a segment each."""
    return [messages[:1], *(messages[i : i + 3] for i in range(1, len(messages), 3))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("rounds  output B   body KB | CPU ms per call: whole body  kept JSON  ratio")
    for rounds, output in CASES:
        messages = context(rounds, output)
        before, size = call_cost(messages, False, args.repeat)
        after, _ = call_cost(messages, True, args.repeat)
        print(
            f"{rounds:6d} {output:9,d} {size / 1000:9.1f} | "
            f"{before:27.3f} {after:10.3f} {after / before:6.2f}x"
        )
    print()
    print(
        "rounds  output B | every segment listed: segments  store MB  read ms: one per segment  at once"
        " | merged: segments  store MB  read ms"
    )
    for rounds, output in COLD_CASES:
        listed = asyncio.run(stored_context(rounds, output, args.repeat, merge=False))
        merged = asyncio.run(stored_context(rounds, output, args.repeat, merge=True))
        print(
            f"{rounds:6d} {output:9,d} | {listed.segments:30d} {listed.store_bytes / 1e6:9.2f}"
            f" {listed.read_ms['one per segment']:25.1f} {listed.read_ms['at once']:8.1f}"
            f" | {merged.segments:16d} {merged.store_bytes / 1e6:9.2f} {merged.read_ms['at once']:8.1f}"
        )


if __name__ == "__main__":
    main()
