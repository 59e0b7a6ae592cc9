"""bench/context.py compares like with like."""

from __future__ import annotations

import json

from activities import openai_chat
from activities.model_http import request_body
from bench.context import call_cost, context, stored_context


def test_both_ways_of_the_bench_send_the_same_bytes() -> None:
    messages = context(3, 40)
    kept = request_body(
        {
            "model": "m",
            "messages": openai_chat.to_openai_messages("s", messages, openai_chat.ConversionMemo()),
        }
    )
    whole = json.dumps(
        {"model": "m", "messages": openai_chat.to_openai_messages("s", messages)},
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()
    assert kept == whole
    shared = openai_chat._SHARED
    _, size_before = call_cost(messages, False, 1)
    _, size_after = call_cost(messages, True, 1)
    assert size_before == size_after > len(whole)  # the bench's body also holds the stream fields
    assert openai_chat._SHARED is shared  # the bench's "before" is undone


async def test_the_bench_stores_a_context_listed_and_merged_and_undoes_its_before() -> None:
    from activities import context_store

    listed = await stored_context(40, 8, 1, merge=False)
    merged = await stored_context(40, 8, 1, merge=True)
    assert listed.segments == 41 > merged.segments  # the prompt's segment, one a call
    assert set(listed.read_ms) == {"one per segment", "at once"} and set(merged.read_ms) == {"at once"}
    assert context_store.MERGE_FANOUT == 16  # the bench's "before" is undone
