"""The worker's workflow sandbox: faster glue, same restrictions."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

import sandbox_runner
from sandbox_runner import PrecompiledSandboxedWorkflowRunner, workflow_runner


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
