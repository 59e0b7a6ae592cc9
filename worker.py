"""The agent worker: runs ``AgentWorkflow`` and its activities.

    python worker.py [--tools pkg.module ...]

Configured by the environment: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
TEMPORAL_TASK_QUEUE, AGENT_TOOLS (comma-separated tool modules), AGENT_MODEL,
OPENAI_BASE_URL and OPENAI_API_KEY (read by the LLM activity at call time).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

import activities.builtin_tools  # noqa: F401  (registers the example tools)
from activities.context_store import ContextStore, blob_store_from_env
from activities.llm import LlmActivities
from activities.session import session_defaults
from activities.tool_runner import execute_tool
from config import Config, ServerUnreachable, connect
from sandbox_runner import workflow_runner
from workflows.agent import AgentWorkflow


class ToolModuleError(Exception):
    """A tool module named with --tools or AGENT_TOOLS failed to import."""


def load_tool_modules(names: list[str]) -> None:
    """Import each tool module (its ``@tool`` functions register themselves)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:
            raise ToolModuleError(
                f"Cannot load tool module {name!r}: {type(err).__name__}: {err}. "
                "Check the module path (it must be importable from the worker's directory)."
            ) from None


def build_worker(
    client: Client,
    config: Config,
    llm: LlmActivities | None = None,
    workflows: Sequence[type] = (AgentWorkflow,),
) -> Worker:
    """The worker with every workflow and activity of the agent
    (``workflows``: ``AgentWorkflow`` or subclasses that override its hooks).

    A killed worker's cached workflows move to another worker after one
    second (not the default ten), and heartbeats reach the server at least
    once a second, so an abort or a dead worker is noticed quickly.
    """
    if llm is None:
        blobs = blob_store_from_env()
        llm = LlmActivities(context_store=ContextStore(blobs) if blobs else None)
    return Worker(
        client,
        task_queue=config.task_queue,
        workflows=list(workflows),
        workflow_runner=workflow_runner(),
        activities=[llm.stream_assistant_response, execute_tool, session_defaults],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        default_heartbeat_throttle_interval=timedelta(seconds=1),
        graceful_shutdown_timeout=timedelta(seconds=5),
        max_concurrent_activities=int(os.environ.get("AGENT_MAX_CONCURRENT_ACTIVITIES", "200")),
    )


async def run_worker(tool_modules: list[str]) -> None:
    load_tool_modules(tool_modules)
    config = Config()
    client = await connect(config)
    worker = build_worker(client, config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        logging.info("Worker polling task queue %r on %s", config.task_queue, config.address)
        print(f"worker ready: task queue {config.task_queue!r} on {config.address}", flush=True)
        await stop.wait()
        logging.info("Shutting down: finishing running activities")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tools", action="append", default=[], metavar="MODULE", help="tool module to load (repeatable)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(message)s"
    )
    env_modules = [m.strip() for m in os.environ.get("AGENT_TOOLS", "").split(",") if m.strip()]
    code = 0
    try:
        asyncio.run(run_worker(env_modules + args.tools))
    except (ServerUnreachable, ToolModuleError, ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the SDK can crash at interpreter exit (sdk-python #300)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
