"""The dev server's CPU per call with the client's gRPC gzip on and off.

    .venv/bin/python -m bench.grpc_gzip [--blocks 6] [--signals 300] [--fetches 30]

temporalio 1.35 gzips every call by default and asks the server to gzip
its answers; this project turns that off (``AGENT_GRPC_COMPRESSION``,
bench/README.md change 38). One dev server, two clients that differ only
in ``grpc_compression``, alternating blocks (the order swapped each
block). Each block starts a workflow no worker runs, sends it signals
carrying ~1 KB of JSON (a request the server decompresses), then fetches
its whole history again and again (an answer the server compresses), and
reads the server's CPU (``/proc/<pid>/stat``) around each part. Prints
the medians per call and every block's figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.service import GrpcCompression

from bench.peers.measure import process_cpu_ms
from testbed.local_stack import DevServer

DATA = Path(".agent-data/bench")


async def main(blocks: int, signals: int, fetches: int) -> dict[str, dict[str, list[float]]]:
    DATA.mkdir(parents=True, exist_ok=True)
    dev = DevServer(log_path=DATA / "server-grpc-gzip.log").start()
    try:
        assert dev.process is not None
        pid = dev.process.pid
        clients = {
            "gzip": await Client.connect(dev.address, grpc_compression=GrpcCompression.GZIP),
            "none": await Client.connect(dev.address, grpc_compression=GrpcCompression.NONE),
        }
        body = {"text": "lorem ipsum dolor sit amet " * 40}
        figures: dict[str, dict[str, list[float]]] = {k: {"signal": [], "history": []} for k in clients}
        for block in range(blocks):
            order = list(clients.items()) if block % 2 == 0 else list(reversed(clients.items()))
            for name, client in order:
                handle = await client.start_workflow(
                    "NoWorkerRunsThis", id=f"gzip-{uuid.uuid4().hex[:8]}", task_queue="bench-no-worker"
                )
                before = process_cpu_ms(pid)
                for _ in range(signals):
                    await handle.signal("s", body)
                signalled = process_cpu_ms(pid)
                for _ in range(fetches):
                    await handle.fetch_history()
                fetched = process_cpu_ms(pid)
                figures[name]["signal"].append((signalled - before) / signals)
                figures[name]["history"].append((fetched - signalled) / fetches)
                await handle.terminate()
        return figures
    finally:
        dev.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=6, help="blocks per client (alternated)")
    parser.add_argument("--signals", type=int, default=300, help="signals per block")
    parser.add_argument("--fetches", type=int, default=30, help="history fetches per block")
    args = parser.parse_args()
    result = asyncio.run(main(args.blocks, args.signals, args.fetches))
    parts = (("signal", "per signal of ~1 KB"), ("history", f"per fetch of a {args.signals}-signal history"))
    for name, figures in result.items():
        for part, what in parts:
            values = figures[part]
            print(
                f"{name:4}  dev-server CPU {statistics.median(values):.3f} ms {what} (median; blocks: "
                f"{', '.join(f'{v:.3f}' for v in values)})"
            )
    os._exit(0)  # the SDK can crash at interpreter exit (sdk-python #300)
