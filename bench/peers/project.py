"""This project's row and the in-process baseline, started as ``bench.run``
starts them (its helpers: ``stack_env``, ``start_worker``, ``connect``,
``baseline_conversation``). The only module here that imports the project.

The conversation is driven as ``bench.run.durable_conversation`` drives it
(start, a subscriber following the ``events`` topic to ``agent_end``, then
the result), without its first-token bookkeeping and history fetch, which
would land in the measured CPU, and keeping the workflow id."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import openai

from activities.model_http import ChatPoster
from bench import run as bench_run
from bench.peers.rows import Conversation, Row, Stack, finish
from bench.peers.scenario import PROMPT
from client import follow, start_conversation
from runtime.connect import connect
from runtime.settings import Settings
from testbed.local_stack import start_worker

TASK_QUEUE = "peers-project"


@dataclass
class ProjectRow(Row):
    name: str = "this project"
    local_tools: str = ""
    """AGENT_LOCAL_TOOLS of its worker ("*": the fast path, tools as local activities)."""
    follow: bool = True
    """Follow the events topic to ``agent_end`` (as the chat does); else only
    wait for the result, as the floor's client does. A subscriber reads a
    busy stream at most every 200 ms; the end of the run cuts that short
    (one update waits for it), so it sees the end a long poll after it was
    published."""
    task_queue: str = TASK_QUEUE
    extra_env: dict[str, str] = field(default_factory=dict)
    """Settings of its worker over the stack's (``--variant``: one change measured side by side)."""

    async def start(self, stack: Stack) -> None:
        # The worker refuses a payload store inside the tools' workspace (by
        # default its working directory, which holds bench.run's store).
        workspace = (stack.data / "workspace").resolve()
        workspace.mkdir(parents=True, exist_ok=True)
        env = {
            **bench_run.stack_env(stack.dev, stack.model_server),  # type: ignore[arg-type]  # reads base_url
            "TEMPORAL_TASK_QUEUE": self.task_queue,
            "AGENT_WORKSPACE": str(workspace),
            "AGENT_LOCAL_TOOLS": self.local_tools,
            **self.extra_env,
        }
        self.payload_store = Path(env["AGENT_STORAGE_DIR"])
        self.workers = [start_worker(env, log_path=stack.data / f"worker-{self.task_queue}.log")]
        self.client = await connect(Settings.from_env({**os.environ, **env}))

    async def converse(self, model: str) -> Conversation:
        assert self.client is not None
        client = self.client  # narrowed, for the reader below
        workflow_id = f"project-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        handle = await start_conversation(
            self.client,
            workflow_id,
            {"model": model, "prompt": PROMPT, "closeWhenIdle": True},
            task_queue=self.task_queue,
        )

        async def read_to_end() -> None:
            async for _offset, event in follow(client, workflow_id):
                if event["type"] == "agent_end":
                    break

        return await finish(
            handle,
            started,
            workflow_id,
            lambda r: sum(1 for message in r.messages if message.role == "assistant"),
            read_to_end if self.follow else None,
        )


@dataclass
class BaselineRow(Row):
    """``bench.run``'s in-process loop: the same ``openai`` client, streaming,
    the tools called concurrently in the same process."""

    name: str = "in-process baseline"
    _model_client: ChatPoster | None = None

    async def start(self, stack: Stack) -> None:
        self._model_client = ChatPoster(
            openai.AsyncOpenAI(base_url=stack.model_base_url, api_key="bench", max_retries=0)
        )

    async def converse(self, model: str) -> Conversation:
        assert self._model_client is not None
        started = time.monotonic()
        turns = await bench_run.baseline_conversation(self._model_client, model)
        return Conversation(seconds=time.monotonic() - started, turns=turns)
