"""The embedded stack's own start-up: what the demo, the benchmark and the
tests stand on."""

from __future__ import annotations

import socket
from pathlib import Path

from testbed.local_stack import DevServer, free_port


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
