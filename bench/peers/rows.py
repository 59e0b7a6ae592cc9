"""What a row of the comparison is: something that runs one conversation of
the scenario against the shared stack, and the processes it runs in."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from temporalio.client import Client, WorkflowHandle

from testbed.local_stack import DevServer, start_ready_process, start_scripted_model, stop_process


@dataclass
class ScriptedModel:
    """The scripted model server as a child process (``start_scripted_model``),
    so its CPU is measured apart from the client's; scripted over HTTP."""

    process: subprocess.Popen[bytes]
    base_url: str  # .../v1, for the openai client
    _http: aiohttp.ClientSession | None = None

    @classmethod
    def start(cls, log_path: Path) -> ScriptedModel:
        process, base_url = start_scripted_model(log_path)
        return cls(process, base_url)

    @property
    def _scripts(self) -> str:
        return self.base_url.removesuffix("/v1") + "/_scripts"

    async def script(self, model: str, steps: list[dict[str, Any]]) -> None:
        self._http = self._http or aiohttp.ClientSession(raise_for_status=True)
        async with self._http.post(f"{self._scripts}/{model}", json={"steps": steps}):
            pass

    async def pending(self, model: str) -> int:
        """How many of the model's steps are still queued."""
        self._http = self._http or aiohttp.ClientSession(raise_for_status=True)
        async with self._http.get(f"{self._scripts}/{model}") as response:
            return len((await response.json())["steps"])

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        stop_process(self.process)


@dataclass
class Stack:
    """What every row shares: one dev server, one scripted model server."""

    dev: DevServer
    model_server: ScriptedModel
    data: Path  # logs go here

    @property
    def address(self) -> str:
        return self.dev.address

    @property
    def model_base_url(self) -> str:
        return self.model_server.base_url


@dataclass
class Conversation:
    """One conversation's outcome: wall clock until the client had the final
    answer, model calls made, and where its history is (durable rows)."""

    seconds: float
    turns: int
    workflow_id: str | None = None
    first_run_id: str | None = None


async def finish(
    handle: WorkflowHandle[Any, Any],
    started: float,
    workflow_id: str,
    turns: Callable[[Any], int],
    read_to_end: Callable[[], Awaitable[None]] | None = None,
) -> Conversation:
    """The conversation's outcome, timed from ``started`` (``time.monotonic``)
    until the client had the final answer: the end of the stream when
    ``read_to_end`` is given (a streamed row; the result is fetched after),
    else the result. ``turns`` counts the model calls in the result."""
    if read_to_end is not None:
        await read_to_end()
        seconds = time.monotonic() - started
        result = await handle.result()
    else:
        result = await handle.result()
        seconds = time.monotonic() - started
    return Conversation(
        seconds=seconds,
        turns=turns(result),
        workflow_id=workflow_id,
        first_run_id=handle.first_execution_run_id,
    )


@dataclass
class Row:
    """Base of every row: ``start`` brings up its worker(s), ``converse`` runs
    one conversation with the scripted model ``model``, ``stop`` cleans up."""

    name: str
    client: Client | None = None  # reads the history of durable rows
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    payload_store: Path | None = None  # where a row keeps payloads outside its history, if it does

    async def start(self, stack: Stack) -> None:
        raise NotImplementedError

    async def converse(self, model: str) -> Conversation:
        raise NotImplementedError

    async def stop(self) -> None:
        for worker in self.workers:
            stop_worker(worker)


def start_worker(
    module: str, args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``python -m module args`` as a child process; returns once it prints
    ``worker ready`` (it polls its task queue by then)."""
    return start_ready_process([sys.executable, "-m", module, *args], env, log_path)


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    stop_process(process)
