"""The entry point every row's worker process shares: its arguments, and
running a worker until the benchmark sends SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal

from temporalio.worker import Worker


def worker_arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--address", required=True, help="the Temporal server, host:port")
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--model-base-url", required=True, help="the scripted model's /v1 URL")
    return parser.parse_args()


async def run_until_terminated(worker: Worker) -> None:
    """Poll until SIGTERM or SIGINT; say ``worker ready`` once polling."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        print("worker ready", flush=True)
        await stop.wait()
