"""Settings from the environment, and the Temporal client every entry point
uses (pydantic data converter, so pi's camelCase JSON goes over the wire)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from temporalio.client import Client

from storage import data_converter_from_env


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
