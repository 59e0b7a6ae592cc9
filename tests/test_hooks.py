"""The overridable workflow hooks: before/after tool call and
should-stop-after-turn, in a subclass of ``AgentWorkflow`` run by an
in-process worker on its own task queue."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import Client

import activities.builtin_tools  # noqa: F401  (registers the example tools)
import tests.support.tools  # noqa: F401  (registers the test tools)
from config import Config
from scripted_model import ScriptedModelServer
from tests.support.guarded_workflow import GuardedAgentWorkflow
from worker import build_worker
from workflows.contract import SessionResult

TASK_QUEUE = "agent-hooks"


@pytest.fixture
async def hook_worker(
    client: Client, worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[None]:
    for key in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "AGENT_MODEL"):
        monkeypatch.setenv(key, worker_env[key])
    worker = build_worker(client, Config(task_queue=TASK_QUEUE), workflows=[GuardedAgentWorkflow])
    async with worker:
        yield


async def run_guarded(client: Client, model: str, prompt: str) -> SessionResult:
    return await client.execute_workflow(
        "GuardedAgentWorkflow",
        {"model": model, "prompt": prompt, "closeWhenIdle": True},
        id=f"hooks-{uuid.uuid4().hex[:8]}",
        task_queue=TASK_QUEUE,
        result_type=SessionResult,
    )


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def test_before_hook_blocks_a_call_and_after_hook_replaces_fields(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(
        model,
        [
            {"tool_calls": [call("b1", "explode"), call("b2", "echo", text="secret")]},
            {"text": "ok"},
        ],
    )
    result = await run_guarded(client, model, "go")
    blocked, rewritten = result.messages[2], result.messages[3]
    assert blocked.is_error and blocked.content[0].text == "explode is not allowed here"
    assert not rewritten.is_error
    assert rewritten.content[0].text == "redacted" and rewritten.details == {"redacted": True}


async def test_after_hook_failure_becomes_an_error_result(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(model, [{"tool_calls": [call("h1", "sequential_echo", text="x")]}, {"text": "ok"}])
    result = await run_guarded(client, model, "go")
    assert result.messages[2].is_error and result.messages[2].content[0].text == "after hook failed"


async def test_should_stop_after_turn_hook_ends_the_run(
    client: Client, model_server: ScriptedModelServer, hook_worker: None
) -> None:
    model = f"hooks-{uuid.uuid4().hex[:6]}"
    model_server.script(model, [{"tool_calls": [call("w1", "whoami")]}, {"text": "never requested"}])
    result = await run_guarded(client, model, "go")
    assert [m.role for m in result.messages] == ["user", "assistant", "toolResult"]
    assert len(model_server.requests(model)) == 1
