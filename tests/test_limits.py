"""Durability at the limits: a dev server restart mid-run, a transcript
above Temporal's 2 MB payload limit, and tool output above the cap."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from runtime.connect import connect
from runtime.settings import Settings
from testbed.local_stack import DevServer, free_port, start_worker, stop_process
from testbed.scripted_model import ScriptedModelServer
from tests.support.stack import EventLog, Stack
from workflows.contract import SessionResult


async def test_dev_server_restart_during_a_run(
    model_server: ScriptedModelServer,
    worker_env: dict[str, str],
    artifacts: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = DevServer(
        port=free_port(),
        ui_port=free_port(),
        db_filename=str(tmp_path / "temporal.db"),
        log_path=artifacts / "restart-server.log",
    ).start()
    env = {**worker_env, "TEMPORAL_ADDRESS": server.address, "TEMPORAL_TASK_QUEUE": "agent-restart"}
    worker = start_worker(env, ["tests.support.tools"], artifacts / "restart-worker.log")
    model = f"restart-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model,
        [
            {"tool_calls": [{"id": "r1", "name": "slow", "arguments": {"seconds": 4, "steps": 4}}]},
            {"text": "survived the restart"},
        ],
    )
    try:
        client = await connect(Settings.from_env(address=server.address))
        handle = await client.start_workflow(
            "AgentWorkflow",
            {"model": model, "prompt": "work", "closeWhenIdle": True},
            id=f"restart-{uuid.uuid4().hex[:6]}",
            task_queue="agent-restart",
            result_type=SessionResult,
        )
        log = EventLog(client, handle.id)
        await log.wait_until(lambda es: any(e["type"] == "tool_execution_update" for e in es))
        log.close()
        stopped_at = time.monotonic()
        server.stop()  # SIGTERM: the file-backed server shuts down cleanly
        server.start()
        restarted_after = time.monotonic() - stopped_at
        client = await connect(Settings.from_env(address=server.address))
        handle = client.get_workflow_handle(handle.id, result_type=SessionResult)
        result = await handle.result()
        finished_after = time.monotonic() - stopped_at
        assert [m.role for m in result.messages] == ["user", "assistant", "toolResult", "assistant"]
        assert result.messages[-1].text == "survived the restart"
        with capsys.disabled():
            print(
                f"\n[restart] dev server back after {restarted_after:.1f} s; "
                f"conversation finished {finished_after:.1f} s after the SIGTERM"
            )
    finally:
        stop_process(worker)
        server.stop()


async def test_transcript_above_two_megabytes_runs_several_turns(stack: Stack) -> None:
    prior: list[dict[str, Any]] = []
    for i in range(30):
        prior.append({"role": "user", "content": f"chapter {i}: " + "lorem ipsum " * 7000, "timestamp": 1})
        prior.append(
            {"role": "assistant", "content": [{"type": "text", "text": f"noted {i}"}], "timestamp": 1}
        )
    stack.script(
        {"tool_calls": [{"id": "big1", "name": "calculator", "arguments": {"expression": "1+1"}}]},
        {"tool_calls": [{"id": "big2", "name": "echo", "arguments": {"text": "again"}}]},
        {"text": "still here"},
    )
    handle = await stack.start(messages=prior, prompt="summarise", closeWhenIdle=True)
    result = await handle.result()
    assert len(result.messages) == len(prior) + 6
    assert result.messages[-1].text == "still here"
    size = sum(len(m.model_dump_json()) for m in result.messages)
    assert size > 2_500_000
    # Every model call got the whole transcript.
    assert all(len(r["messages"]) >= len(prior) for r in stack.requests())
    history = await handle.fetch_history()
    assert len(history.to_json()) < 2_000_000


async def test_tool_output_above_the_cap_is_cut_with_a_note(stack: Stack) -> None:
    stack.script(
        {"tool_calls": [{"id": "cap1", "name": "echo", "arguments": {"text": "x" * 60_000}}]},
        {"text": "ok"},
    )
    handle = await stack.start(prompt="shout", closeWhenIdle=True)
    result = await handle.result()
    tool_result = result.messages[2]
    text = tool_result.content[0].text
    assert len(text) < 51_000 and "[Output truncated: 60006 characters" in text
    full = Path(tool_result.details["fullOutputPath"]).read_text()
    assert full == "echo: " + "x" * 60_000


async def test_a_turn_of_large_tool_results_continues_as_new(
    stack: Stack, worker_env: dict[str, str], artifacts: Path
) -> None:
    """A continue-as-new carries the stream's last event whatever its size,
    and a turn's `turn_end` holds all its tool results (base64 in the
    carry): 150 results of 200 KiB took the next run's input past
    AGENT_MAX_DECOMPRESSED_BYTES, its start failed, and the conversation
    with it, for good (a chaos audit). The same at a limit of 8 MiB: 24
    results of 150 KiB (a 4.9 MB turn_end) with a switch after every turn;
    a continued run's input is read without the bound."""
    from client import Conversation

    queue = f"agent-carry-{uuid.uuid4().hex[:6]}"
    env = {**worker_env, "TEMPORAL_TASK_QUEUE": queue, "AGENT_MAX_DECOMPRESSED_BYTES": str(8 * 1024 * 1024)}
    process = start_worker(env, ["tests.support.tools"], artifacts / "worker-carry.log")
    try:
        calls = bulky_calls(24, kib=150)
        stack.script({"tool_calls": calls}, {"text": "all read"}, {"text": "still here"})
        settings = Settings.from_env(task_queue=queue)
        chat = await Conversation.start(
            stack.client,
            settings,
            id=f"carry-{uuid.uuid4().hex[:8]}",
            model=stack.model,
            continue_as_new_after_turns=1,
        )
        new = await chat.prompt("Run the bulky tool.")
        assert [m.role for m in new].count("toolResult") == 24 and new[-1].text == "all read"
        assert (await chat.prompt("anyone there?"))[-1].text == "still here"
        state = await chat.state()
        assert state.status == "idle" and state.runs == 2
        assert await runs_of(stack, chat.id) >= 2  # it did continue as new
    finally:
        stop_process(process)


async def test_a_carry_larger_than_the_decompression_bound_is_read(
    stack: Stack, worker_env: dict[str, str], artifacts: Path
) -> None:
    """The next run's input is the conversation's own state: 38 queued steering
    messages of 1.9 MB each (or approvals with megabytes of arguments, or a
    transcript past 64 MiB) made it decompress past AGENT_MAX_DECOMPRESSED_BYTES,
    and the next run failed as it started, the conversation for good (a limits
    audit). A continued run's input is read without the bound (no client can
    send one). Here 6 steers of 1.5 MB at a bound of 8 MiB, one per turn, a
    switch after every turn."""
    from client import Conversation

    queue = f"agent-carry-bound-{uuid.uuid4().hex[:6]}"
    env = {**worker_env, "TEMPORAL_TASK_QUEUE": queue, "AGENT_MAX_DECOMPRESSED_BYTES": str(8 * 1024 * 1024)}
    process = start_worker(env, ["tests.support.tools"], artifacts / "worker-carry-bound.log")
    try:
        stack.script(
            {"tool_calls": [{"id": "s1", "name": "slow", "arguments": {"seconds": 2}}]},
            *({"text": f"read note {i}"} for i in range(6)),
            {"text": "still here"},
        )
        chat = await Conversation.start(
            stack.client,
            Settings.from_env(task_queue=queue),
            id=f"carry-bound-{uuid.uuid4().hex[:8]}",
            model=stack.model,
            continue_as_new_after_turns=1,
        )
        await chat.prompt("work", wait=False)
        log = EventLog(stack.client, chat.id)
        await log.wait_for_type("tool_execution_start")
        for i in range(6):
            await chat.steer(f"note {i}: " + "lorem ipsum " * 125_000)
        await asyncio.wait_for(chat.wait_for_idle(), 90)
        log.close()
        messages = await chat.messages()
        assert sum(1 for m in messages if m.role == "user" and "lorem ipsum" in str(m.content)) == 6
        assert messages[-1].text == "read note 5"
        assert (await chat.prompt("anyone there?"))[-1].text == "still here"
        described = await chat.handle.describe()
        assert described.status is not None and described.status.name == "RUNNING"
        assert await runs_of(stack, chat.id) >= 2
    finally:
        stop_process(process)


async def test_a_prompt_reads_its_runs_end_across_an_idle_switch(
    stack: Stack, worker_env: dict[str, str], artifacts: Path
) -> None:
    """A run of 200 tool calls passes the 500 events after which an idle
    conversation continues as new at once, before a reader behind has read
    its agent_end (all 200 results, 6 MB): the carry keeps the last event
    whatever its size, so `prompt` gets it (a trial that left it behind
    when over 4 MB left the prompt waiting for good)."""
    from client import Conversation

    queue = f"agent-idle-end-{uuid.uuid4().hex[:6]}"
    process = start_worker({**worker_env, "TEMPORAL_TASK_QUEUE": queue}, ["tests.support.tools"])
    try:
        calls = bulky_calls(200, kib=24)
        stack.script({"tool_calls": calls}, {"text": "all read"}, {"text": "still here"})
        settings = Settings.from_env(task_queue=queue)
        chat = await Conversation.start(
            stack.client, settings, id=f"idle-end-{uuid.uuid4().hex[:8]}", model=stack.model
        )
        new = await asyncio.wait_for(chat.prompt("Run the bulky tool."), 60)
        assert [m.role for m in new].count("toolResult") == 200 and new[-1].text == "all read"
        assert (await chat.prompt("anyone there?"))[-1].text == "still here"
        assert await runs_of(stack, chat.id) >= 2  # it did continue as new
    finally:
        stop_process(process)


async def runs_of(stack: Stack, workflow_id: str) -> int:
    """How many runs the conversation has had (continue-as-new makes one more)."""
    return len([run async for run in stack.client.list_workflows(f"WorkflowId = '{workflow_id}'")])


def bulky_calls(count: int, *, kib: int) -> list[dict[str, Any]]:
    """One answer's calls of the test tool ``bulky``, ``kib`` KiB of output each."""
    return [{"id": f"b{i}", "name": "bulky", "arguments": {"tag": f"t{i}", "kib": kib}} for i in range(count)]
