"""The guard every server test runs under (tests/conftest.py) finds a
workflow task that fails: otherwise a wedged conversation could pass."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from tests.conftest import failed_workflow_tasks


@workflow.defn(name="AlwaysFailingTask", sandboxed=False)
class AlwaysFailingTask:
    @workflow.run
    async def run(self) -> None:
        raise RuntimeError("a bug in workflow code")


@pytest.mark.expect_task_failures("this test makes one on purpose")
async def test_the_guard_finds_a_failed_workflow_task(client: Client) -> None:
    since = datetime.now(UTC) - timedelta(seconds=1)
    queue = f"guard-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=queue, workflows=[AlwaysFailingTask]):
        handle = await client.start_workflow(
            AlwaysFailingTask.run, id=f"guard-{uuid.uuid4().hex[:6]}", task_queue=queue
        )
        for _ in range(100):
            failures = await failed_workflow_tasks(client, since)
            if failures:
                break
            await asyncio.sleep(0.1)
    await handle.terminate()
    assert any(handle.id in f and "a bug in workflow code" in f for f in failures)
