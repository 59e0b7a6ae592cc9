"""The embedded stack's own start-up: what the demo, the benchmark and the
tests stand on."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from bench.peers.measure import server_requests
from testbed.local_stack import DevServer, free_port, start_ready_process


def test_a_dev_server_whose_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))  # held, not listening: the server's bind fails
    port = taken.getsockname()[1]
    server = DevServer(port=port, ui_port=free_port(), log_path=tmp_path / "server.log")
    try:
        server.start()
        assert server.port != port
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
        assert "address already in use" in (tmp_path / "server.log").read_text()
    finally:
        server.stop()
        taken.close()


def test_a_dev_server_with_a_metrics_port_counts_the_requests_it_answers(tmp_path: Path) -> None:
    """The benchmark reads the server's requests by operation from its metrics."""
    server = DevServer(log_path=tmp_path / "server.log", metrics_port=free_port())
    try:
        server.start()
        assert server.metrics_url == f"http://127.0.0.1:{server.metrics_port}/metrics"
        before = server_requests(server.metrics_url)

        async def describe() -> None:
            client = await Client.connect(server.address)
            await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace="default"))

        asyncio.run(describe())
        deadline = time.monotonic() + 10  # the server publishes its counters once a second
        while (server_requests(server.metrics_url) - before)["DescribeNamespace"] < 1:
            assert time.monotonic() < deadline, "the describe call was never counted"
            time.sleep(0.2)
    finally:
        server.stop()
    assert DevServer(metrics_port=None).metrics_url is None


def test_a_started_process_never_blocks_on_a_full_stdout(tmp_path: Path) -> None:
    """After its ready line, what a child writes to stdout goes to its log:
    a pipe nobody read filled at 64 KiB and froze a chatty worker."""
    script = "print('worker ready', flush=True); print('x' * 300_000, flush=True); print('done', flush=True)"
    log = tmp_path / "child.log"
    process = start_ready_process([sys.executable, "-c", script], None, log)
    assert process.wait(timeout=20) == 0
    deadline = time.monotonic() + 5
    while b"done" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_bytes().endswith(b"done\n")
