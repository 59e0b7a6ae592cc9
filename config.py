"""Settings from the environment, and the Temporal client every entry point
uses (pydantic data converter, so pi's camelCase JSON goes over the wire)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle

from storage import data_converter_from_env
from workflows.contract import SessionResult

# How long the server waits for a worker that took a workflow task before
# giving it to another. This workflow's tasks take milliseconds, but a worker
# that dies while holding one (SIGKILL, OOM, node loss) stalls the
# conversation for this long; the server's default is 10 s. 4 s leaves room
# for replaying a long history on a busy worker (100 concurrent
# conversations on one worker saw no timeouts, bench/README.md).
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=4)


@dataclass(frozen=True)
class Config:
    """Where the Temporal server is and which task queue the agent uses."""

    address: str = field(default_factory=lambda: os.environ.get("TEMPORAL_ADDRESS", "localhost:7233"))
    namespace: str = field(default_factory=lambda: os.environ.get("TEMPORAL_NAMESPACE", "default"))
    task_queue: str = field(default_factory=lambda: os.environ.get("TEMPORAL_TASK_QUEUE", "agent"))
    ui_url: str = field(default_factory=lambda: os.environ.get("TEMPORAL_UI_URL", "http://localhost:8233"))

    def workflow_url(self, workflow_id: str) -> str:
        """The conversation's page in the Temporal UI."""
        return f"{self.ui_url.rstrip('/')}/namespaces/{self.namespace}/workflows/{workflow_id}"


class ServerUnreachable(Exception):
    """The Temporal server could not be reached (the message says what to do)."""


async def connect(config: Config) -> Client:
    try:
        return await Client.connect(
            config.address, namespace=config.namespace, data_converter=data_converter_from_env()
        )
    except RuntimeError as err:
        raise ServerUnreachable(
            f"Cannot reach the Temporal server at {config.address} ({str(err).splitlines()[0]}). "
            "Start one (`temporal server start-dev`) or set TEMPORAL_ADDRESS."
        ) from None


async def start_conversation(
    client: Client, workflow_id: str, input: dict[str, Any], *, task_queue: str, **options: Any
) -> WorkflowHandle[Any, SessionResult]:
    """Start an ``AgentWorkflow`` conversation (camelCase ``input``) with the
    project's workflow task timeout; ``options`` go to ``start_workflow``."""
    return await client.start_workflow(
        "AgentWorkflow",
        input,
        id=workflow_id,
        task_queue=task_queue,
        task_timeout=WORKFLOW_TASK_TIMEOUT,
        result_type=SessionResult,
        **options,
    )
