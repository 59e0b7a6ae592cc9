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
