"""Crash survival: SIGKILL the worker process while the model streams and
while a tool runs; a new worker finishes the conversation with the same
transcript as an undisturbed run."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Conversation, start_conversation
from testbed.local_stack import start_worker, stop_process
from tests.support.stack import EventLog, Stack


class Workers:
    """Worker processes on a task queue of their own, killed at will."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = {**env, "TEMPORAL_TASK_QUEUE": f"agent-crash-{uuid.uuid4().hex[:6]}"}
        self.log = log_dir / "crash-workers.log"
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        process = start_worker(self.env, ["tests.support.tools"], self.log)
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            stop_process(process)


@pytest.fixture
def workers(worker_env: dict[str, str], artifacts: Path) -> Iterator[Workers]:
    pool = Workers(worker_env, artifacts)
    yield pool
    pool.stop_all()


def comparable(messages: list[Any]) -> list[dict[str, Any]]:
    """A transcript without what legitimately differs between two runs."""
    out = []
    for message in messages:
        data = message.model_dump()
        data.pop("timestamp", None)
        data.pop("model", None)
        details = data.get("details")
        if isinstance(details, dict):
            details.pop("fullOutputPath", None)
        out.append(data)
    return out


SCRIPT_TOOL_THEN_ANSWER = [
    {"tool_calls": [{"id": "k1", "name": "slow", "arguments": {"seconds": 3, "steps": 3}}]},
    {"text": "The slow tool finished. " * 8, "delay_ms": 60, "chunk_chars": 6},
]


async def run_undisturbed(stack: Stack, workers: Workers) -> list[dict[str, Any]]:
    stack.script(*SCRIPT_TOOL_THEN_ANSWER)
    handle = await start_conversation(
        stack.client,
        f"crash-ref-{uuid.uuid4().hex[:6]}",
        {"model": stack.model, "prompt": "work slowly", "closeWhenIdle": True},
        task_queue=workers.env["TEMPORAL_TASK_QUEUE"],
    )
    return comparable((await handle.result()).messages)


async def test_worker_killed_while_the_model_streams(
    stack: Stack, workers: Workers, capsys: pytest.CaptureFixture[str]
) -> None:
    first = workers.start()
    reference = await run_undisturbed(stack, workers)

    # The retried call is answered the same way, as a real model would be asked again.
    stack.script(SCRIPT_TOOL_THEN_ANSWER[0], SCRIPT_TOOL_THEN_ANSWER[1], SCRIPT_TOOL_THEN_ANSWER[1])
    handle = await start_on(stack, workers, "work slowly")
    log = EventLog(stack.client, handle.id)
    await log.wait_until(
        lambda es: sum(e["type"] == "message_update" for e in es) > 8 and es[-1]["type"] == "message_update"
    )
    killed_at = time.monotonic()
    first.send_signal(signal.SIGKILL)
    first.wait()
    workers.start()
    await log.wait_until(lambda es: any(e["type"] == "message_retry" for e in es), timeout=30)
    resumed_after = time.monotonic() - killed_at
    retry = next(e for e in log.events if e["type"] == "message_retry")
    assert retry["reason"] == "its worker stopped, or it ran out of time"
    await log.wait_for_type("agent_end", timeout=60)
    log.close()
    assert comparable((await handle.result()).messages) == reference
    with capsys.disabled():
        print(f"\n[crash] SIGKILL during the LLM stream: resumed after {resumed_after:.2f} s")


async def test_worker_killed_while_a_tool_runs(
    stack: Stack, workers: Workers, artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = workers.start()
    reference = await run_undisturbed(stack, workers)

    stack.script(*SCRIPT_TOOL_THEN_ANSWER)
    handle = await start_on(stack, workers, "work slowly")
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_update" for e in es))
    killed_at = time.monotonic()
    first.send_signal(signal.SIGKILL)
    first.wait()
    workers.start()
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_retry" for e in es), timeout=30)
    resumed_after = time.monotonic() - killed_at
    await log.wait_for_type("agent_end", timeout=60)
    log.close()
    assert comparable((await handle.result()).messages) == reference
    # Subscribers are told that the tool starts over (its progress repeats) before it does.
    kinds = [e["type"] for e in log.events if e["type"].startswith("tool_execution")]
    retry = kinds.index("tool_execution_retry")
    assert kinds.count("tool_execution_retry") == 1
    assert "tool_execution_update" in kinds[:retry] and "tool_execution_update" in kinds[retry:]
    marked = next(e for e in log.events if e["type"] == "tool_execution_retry")
    assert {k: v for k, v in marked.items() if k != "offset"} == {
        "type": "tool_execution_retry",
        "toolCallId": "k1",
        "toolName": "slow",
        "attempt": 2,
        "reason": "its worker stopped, or it ran out of time",
    }
    # The tool ran again with the same idempotency key, so it can make its effect happen once.
    ledger = (artifacts / "ledger.txt").read_text().splitlines()
    key = f"{handle.id}/tool-k1"
    assert ledger.count(key) == 2
    with capsys.disabled():
        print(f"\n[crash] SIGKILL during a tool: resumed after {resumed_after:.2f} s")


async def test_worker_killed_while_a_local_tool_runs(
    stack: Stack, workers: Workers, artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local tool (the fast path) runs inside a workflow task, and nothing
    of it is recorded before that task completes: killed mid-call, the next
    worker runs the call again from the start, as attempt 1, so no
    ``tool_execution_retry`` marks it (README, the events). Its progress
    comes with its result, before its ``tool_execution_end``: sent as
    signals, it reached subscribers only after the task ended, after the
    result (this test, before the change)."""
    workers.env["AGENT_LOCAL_TOOLS"] = "slow"
    first = workers.start()
    reference = await run_undisturbed(stack, workers)

    stack.script(*SCRIPT_TOOL_THEN_ANSWER)
    handle = await start_on(stack, workers, "work slowly")
    log = EventLog(stack.client, handle.id)
    ledger = artifacts / "ledger.txt"
    key = f"{handle.id}/tool-k1"
    for _ in range(300):  # the tool has started: its workflow task holds the events till it ends
        if key in ledger.read_text().splitlines():
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    killed_at = time.monotonic()
    first.send_signal(signal.SIGKILL)
    first.wait()
    workers.start()
    await log.wait_for_type("tool_execution_end", timeout=30)
    resumed_after = time.monotonic() - killed_at
    await log.wait_for_type("agent_end", timeout=60)
    log.close()
    assert comparable((await handle.result()).messages) == reference
    assert ledger.read_text().splitlines().count(key) == 2  # it ran again
    kinds = [e["type"] for e in log.events if e.get("toolCallId") == "k1"]
    assert kinds == ["tool_execution_start", "tool_execution_update", "tool_execution_end"], kinds
    progress = next(e for e in log.events if e["type"] == "tool_execution_update")
    assert progress["partialResult"]["content"][0]["text"] == "step 3/3"  # the latest
    with capsys.disabled():
        print(f"\n[crash] SIGKILL during a local tool: resumed after {resumed_after:.2f} s")


async def test_an_aborted_call_retried_on_a_new_worker_publishes_nothing_after_its_run(
    stack: Stack, workers: Workers
) -> None:
    """The worker dies mid-answer and the conversation is aborted while no
    worker is up. The run ends aborted on the next worker, which also
    starts the model call's retry before hearing of the cancel: that
    attempt's `message_retry` and deltas reached the stream after the run's
    `agent_end`, and into the next run's answer (found by a chaos audit)."""
    first = workers.start()
    slow = {"text": "old answer " * 30, "delay_ms": 60, "chunk_chars": 6}
    stack.script(slow, slow, {"text": "the new answer"})
    handle = await start_conversation(
        stack.client,
        f"crash-abort-{uuid.uuid4().hex[:6]}",
        {"model": stack.model, "prompt": "talk"},
        task_queue=workers.env["TEMPORAL_TASK_QUEUE"],
    )
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: sum(e["type"] == "message_update" for e in es) > 2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    await handle.signal("abort")
    await asyncio.sleep(3.5)  # past the heartbeat timeout: the server retries the call
    workers.start()
    await handle.execute_update("wait_for_idle")
    await handle.execute_update("prompt", "again")
    await log.wait_for_type("agent_end", count=2)
    await asyncio.sleep(1.5)  # what the retried attempt would still send
    events = await log.wait_for_type("agent_end", count=2)
    log.close()
    first_end = next(i for i, e in enumerate(events) if e["type"] == "agent_end")
    after = events[first_end + 1 :]
    assert after[0]["type"] == "agent_start" and after[-1]["type"] == "agent_end"
    assert not [e for e in after if e["type"] == "message_retry"]
    deltas = [
        e["assistantMessageEvent"].get("delta", "")
        for e in after
        if e["type"] == "message_update" and e["assistantMessageEvent"]["type"] == "text_delta"
    ]
    answer = next(
        e["message"] for e in after if e["type"] == "message_end" and e["message"]["role"] == "assistant"
    )
    assert "".join(deltas) == answer["content"][0]["text"]
    await handle.signal("close")


async def start_on(stack: Stack, workers: Workers, prompt: str) -> Any:
    return await start_conversation(
        stack.client,
        f"crash-{uuid.uuid4().hex[:6]}",
        {"model": stack.model, "prompt": prompt, "closeWhenIdle": True},
        task_queue=workers.env["TEMPORAL_TASK_QUEUE"],
    )


async def test_a_reader_is_told_when_the_only_worker_died_and_reads_on_when_one_returns(
    stack: Stack, workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader of a conversation whose only worker died mid-answer was told
    nothing until a worker came back (a durability audit). Now
    ``Conversation.on_slow_update`` (printed by the CLI as a note) hears
    once which step waits, and the events go on when a worker returns."""
    notes: list[str] = []
    monkeypatch.setattr(Conversation, "on_slow_update", notes.append)
    first = workers.start()
    answer = {"text": "slowly " * 40, "delay_ms": 100, "chunk_chars": 7}
    stack.script(answer, answer)
    handle = await start_on(stack, workers, "talk slowly")
    conversation = Conversation.attach(stack.client, handle.id)
    events: list[dict[str, Any]] = []

    async def read() -> None:
        async for _, event in conversation.events():
            events.append(event)

    reader = asyncio.create_task(read())
    try:
        await _until(lambda: sum(e["type"] == "message_update" for e in events) > 3, 30)
        first.send_signal(signal.SIGKILL)
        first.wait()
        await _until(lambda: notes, 60)
        assert not any(e["type"] == "agent_end" for e in events)
        workers.start()
        await _until(lambda: any(e["type"] == "agent_end" for e in events), 60)
    finally:
        reader.cancel()
    queue = workers.env["TEMPORAL_TASK_QUEUE"]
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"{handle.id} waits for a worker on task queue {queue!r}: its "), notes
    assert notes[0].endswith(
        " s: no worker runs there, or all are busy. The conversation goes on when one takes it."
    ), notes
    assert any(e["type"] == "message_retry" for e in events)


async def _until(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_worker_killed_while_idle(stack: Stack, workers: Workers) -> None:
    first = workers.start()
    handle = await start_conversation(
        stack.client,
        f"crash-idle-{uuid.uuid4().hex[:6]}",
        {"model": stack.model, "prompt": "hello"},
        task_queue=workers.env["TEMPORAL_TASK_QUEUE"],
    )
    stack.script({"text": "first answer"}, {"text": "second answer"})
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("agent_end")
    first.send_signal(signal.SIGKILL)
    first.wait()
    workers.start()
    await handle.execute_update("prompt", "are you still there?")
    await log.wait_for_type("agent_end", count=2)
    log.close()
    await handle.signal("close")
    messages = (await handle.result()).messages
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[-1].text == "second answer"


async def test_two_workers_share_the_load_and_survive_losing_one(
    stack: Stack, workers: Workers, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = workers.start(), workers.start()
    conversations = 6
    for _ in range(conversations):
        stack.script(
            {"tool_calls": [{"id": "w", "name": "slow", "arguments": {"seconds": 2, "steps": 2}}]},
            {"text": "finished"},
        )
    handles = [await start_on(stack, workers, f"job {i}") for i in range(conversations)]
    await asyncio.sleep(1.0)
    first.send_signal(signal.SIGKILL)
    first.wait()
    results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 90)
    assert all(r.messages[-1].text == "finished" for r in results)
    # The conversations were spread over both workers.
    identities = set()
    for handle in handles:
        history = await handle.fetch_history()
        identities |= {
            e.activity_task_started_event_attributes.identity
            for e in history.events
            if e.HasField("activity_task_started_event_attributes")
        }
    assert len(identities) >= 2
    assert second.poll() is None
    with capsys.disabled():
        print(f"\n[crash] {conversations} conversations on two workers, one killed: all finished")


async def test_an_aborted_call_publishes_nothing_into_the_run_that_continues_as_new_after_it(
    stack: Stack,
) -> None:
    """An aborted model call goes on streaming until its activity hears of
    the cancel. When the conversation continued as new as soon as it was
    idle (a long history), the late deltas reached the new run, which did
    not know their publisher, and were published after `agent_end` (found
    by a chaos audit): the publishers of aborted calls are carried over."""
    stack.script(
        {"text": "old answer " * 60, "delay_ms": 40, "chunk_chars": 6},
        {"text": "the new answer"},
    )
    handle = await stack.start(prompt="talk", continueAsNewAfterTurns=1)
    log = EventLog(stack.client, handle.id)
    await log.wait_until(lambda es: sum(e["type"] == "message_update" for e in es) > 2)
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    for _ in range(100):
        runs = [e async for e in stack.client.list_workflows(f"WorkflowId = '{handle.id}'")]
        if len(runs) > 1:
            break
        await asyncio.sleep(0.05)
    assert len(runs) == 2  # it continued as new once idle
    await asyncio.sleep(1.5)  # what the aborted call would still send
    latest = stack.client.get_workflow_handle(handle.id)
    await latest.execute_update("prompt", "again")
    events = await log.wait_for_type("agent_end", count=2)
    log.close()
    first_end = next(i for i, e in enumerate(events) if e["type"] == "agent_end")
    after = events[first_end + 1 :]
    assert after[0]["type"] == "agent_start", [e["type"] for e in after[:5]]
    deltas = [
        e["assistantMessageEvent"].get("delta", "")
        for e in after
        if e["type"] == "message_update" and e["assistantMessageEvent"]["type"] == "text_delta"
    ]
    assert "".join(deltas) == "the new answer"
    await latest.signal("close")


async def test_a_stopped_worker_lets_a_tool_finish_within_the_shutdown_grace(
    stack: Stack, workers: Workers, artifacts: Path
) -> None:
    """SIGTERM: the worker stops taking work and gives running activities
    AGENT_SHUTDOWN_GRACE_SECONDS (5 s by default, here 30) before it
    cancels them; a 7 s tool ends on it, once, and the worker exits 0."""
    workers.env["AGENT_SHUTDOWN_GRACE_SECONDS"] = "30"
    ledger = artifacts / f"ledger-{uuid.uuid4().hex[:6]}.txt"
    workers.env["AGENT_TEST_LEDGER"] = str(ledger)
    first = workers.start()
    stack.script(
        {"tool_calls": [{"id": "g1", "name": "slow", "arguments": {"seconds": 7, "steps": 7}}]},
        {"text": "done"},
    )
    handle = await start_on(stack, workers, "work")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_update")
    first.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(first.wait, 60) == 0
    workers.start()  # for the workflow tasks that follow
    events = await log.wait_for_type("agent_end")
    log.close()
    ends = [e for e in events if e["type"] == "tool_execution_end"]
    assert [e["result"]["content"][0]["text"] for e in ends] == ["slept 7.0s"]
    updates = [e["partialResult"] for e in events if e["type"] == "tool_execution_update"]
    assert len(updates) == 7  # one attempt: its progress did not start over
    assert len(ledger.read_text().splitlines()) == 1
