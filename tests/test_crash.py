"""Crash survival: SIGKILL the worker process while the model streams and
while a tool runs; a new worker finishes the conversation with the same
transcript as an undisturbed run."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from local_stack import start_worker, stop_process
from tests.support.stack import EventLog, Stack
from workflows.contract import SessionResult


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
    handle = await stack.client.start_workflow(
        "AgentWorkflow",
        {"model": stack.model, "prompt": "work slowly", "closeWhenIdle": True},
        id=f"crash-ref-{uuid.uuid4().hex[:6]}",
        task_queue=workers.env["TEMPORAL_TASK_QUEUE"],
        result_type=SessionResult,
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
    await log.wait_until(lambda es: sum(e["type"] == "tool_execution_update" for e in es) >= 2, timeout=30)
    resumed_after = time.monotonic() - killed_at
    await log.wait_for_type("agent_end", timeout=60)
    log.close()
    assert comparable((await handle.result()).messages) == reference
    # The tool ran again with the same idempotency key, so it can make its effect happen once.
    ledger = (artifacts / "ledger.txt").read_text().splitlines()
    key = f"{handle.id}/tool-k1"
    assert ledger.count(key) == 2
    with capsys.disabled():
        print(f"\n[crash] SIGKILL during a tool: resumed after {resumed_after:.2f} s")


async def start_on(stack: Stack, workers: Workers, prompt: str) -> Any:
    return await stack.client.start_workflow(
        "AgentWorkflow",
        {"model": stack.model, "prompt": prompt, "closeWhenIdle": True},
        id=f"crash-{uuid.uuid4().hex[:6]}",
        task_queue=workers.env["TEMPORAL_TASK_QUEUE"],
        result_type=SessionResult,
    )
