"""The worker's workflow sandbox: faster glue, same restrictions."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import sys
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError
from temporalio.converter import (
    ActivitySerializationContext,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
)
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

import runtime.sandbox as sandbox_runner
from runtime.sandbox import PrecompiledSandboxedWorkflowRunner, workflow_runner


@workflow.defn(sandboxed=True)
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return text.upper()


@workflow.defn(sandboxed=True)
class WallClockWorkflow:
    @workflow.run
    async def run(self) -> str:
        return datetime.now().isoformat()  # not allowed in workflow code


def test_worker_runs_workflows_in_the_precompiled_sandbox() -> None:
    assert isinstance(workflow_runner(), PrecompiledSandboxedWorkflowRunner)


async def test_sandbox_compiles_each_glue_snippet_once(client: Client) -> None:
    sandbox_runner._compiled.cache_clear()
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[EchoWorkflow], workflow_runner=workflow_runner()):
        for i in range(3):
            result = await client.execute_workflow(
                EchoWorkflow.run, f"run {i}", id=f"echo-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            assert result == f"RUN {i}"
    info = sandbox_runner._compiled.cache_info()
    assert info.hits > info.misses > 0
    assert info.currsize <= 8  # a fixed set of snippets, not one per call


@pytest.mark.expect_task_failures("the sandbox refusing a wall-clock read fails the workflow task")
async def test_sandbox_still_rejects_a_wall_clock_read(client: Client) -> None:
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=queue, workflows=[WallClockWorkflow], workflow_runner=workflow_runner()
    ):
        handle = await client.start_workflow(
            WallClockWorkflow.run,
            id=f"clock-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            execution_timeout=timedelta(seconds=30),
        )
        # A restricted call fails the workflow task (retried, never completes):
        # poll the history for the failure instead of waiting for a result.
        for _ in range(100):
            history = await handle.fetch_history()
            failed = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
            if failed:
                message = failed[0].workflow_task_failed_event_attributes.failure.message
                assert "Cannot access datetime.datetime.now" in message
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the sandbox let datetime.now() run in workflow code")
        await handle.terminate()
        with pytest.raises(WorkflowFailureError):
            await handle.result()


# --- payload contexts: looked up once per command and workflow task, never mixed up ---

SEEN_CONTEXTS: list[tuple[str, str]] = []


class RecordingCodec(PayloadCodec, WithSerializationContext):
    """Records which activity's context each activity payload is encoded with."""

    def __init__(self, context: SerializationContext | None = None) -> None:
        self.context = context

    def with_context(self, context: SerializationContext) -> RecordingCodec:
        return RecordingCodec(context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if isinstance(self.context, ActivitySerializationContext) and not self.context.is_local:
            SEEN_CONTEXTS.extend((self.context.activity_id or "", p.data.decode()) for p in payloads)
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


@activity.defn(name="shout")
async def shout(text: str) -> str:
    return text.upper()


@workflow.defn(sandboxed=True)
class FanOutWorkflow:
    @workflow.run
    async def run(self, words: list[str]) -> list[str]:
        # All scheduled in one workflow task: one completion, several commands.
        handles = [
            workflow.start_activity(
                shout, word, activity_id=f"id-{word}", start_to_close_timeout=timedelta(seconds=10)
            )
            for word in words
        ]
        return list(await asyncio.gather(*handles))


async def test_each_payload_is_encoded_with_its_own_commands_context(client: Client) -> None:
    SEEN_CONTEXTS.clear()
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    converter = dataclasses.replace(client.data_converter, payload_codec=RecordingCodec())
    codec_client = Client(**{**client.config(), "data_converter": converter})
    words = ["alpha", "beta", "gamma", "delta"]
    async with Worker(
        codec_client,
        task_queue=queue,
        workflows=[FanOutWorkflow],
        activities=[shout],
        workflow_runner=workflow_runner(),
    ):
        for _ in range(2):
            result = await codec_client.execute_workflow(
                FanOutWorkflow.run, words, id=f"fan-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            assert result == [w.upper() for w in words]
    # Each activity's input (encoded by the workflow) and result (by the
    # activity worker) carried that activity's own context.
    expected = {(f"id-{w}", f'"{w}"') for w in words} | {(f"id-{w}", f'"{w.upper()}"') for w in words}
    assert set(SEEN_CONTEXTS) == expected


# --- workflow modules: compiled once, executed afresh for each workflow ---

FRESH_MODULE = """
from temporalio import workflow

COUNTER = []


@workflow.defn(sandboxed=True)
class FreshModuleWorkflow:
    @workflow.run
    async def run(self) -> int:
        COUNTER.append(1)  # a fresh module each time: always 1 long
        return len(COUNTER)
"""


async def test_sandbox_compiles_a_workflow_module_once_and_runs_it_afresh(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No .pyc (as under PYTHONDONTWRITEBYTECODE=1): without the cache each
    # workflow instance would compile the module's source again.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    name = f"fresh_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(FRESH_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    compiled = sandbox_runner._CachingSourceLoader.compiled
    reused = sandbox_runner._CachingSourceLoader.reused
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[module.FreshModuleWorkflow],
        workflow_runner=workflow_runner(),
        max_cached_workflows=0,  # every task builds a new instance
    ):
        for _ in range(3):
            result = await client.execute_workflow(
                module.FreshModuleWorkflow.run, id=f"fresh-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            assert result == 1
    assert sandbox_runner._CachingSourceLoader.compiled - compiled == 1
    assert sandbox_runner._CachingSourceLoader.reused - reused >= 2
    assert not (tmp_path / "__pycache__").exists()


def test_precompile_off_gives_the_sdks_stock_sandbox() -> None:
    """AGENT_SANDBOX_PRECOMPILE=off (and AGENT_SDK_FALLBACKS=on, which CI
    runs) must leave none of the overrides of private SDK code in use."""
    assert type(workflow_runner(precompile=False)) is SandboxedWorkflowRunner


def test_an_edited_workflow_module_is_compiled_again(tmp_path: Path) -> None:
    """The compiled code is shared per path and source text: a module
    edited under a running worker gets its new code, not the old."""
    path = tmp_path / "edited_module.py"
    loader = sandbox_runner._CachingSourceLoader("edited_module", str(path))
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    exec(loader.source_to_code(b"VALUE = 1\n", str(path)), before)
    exec(loader.source_to_code(b"VALUE = 2\n", str(path)), after)
    assert (before["VALUE"], after["VALUE"]) == (1, 2)
