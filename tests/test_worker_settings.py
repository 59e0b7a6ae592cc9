"""A worker started with a setting it cannot work with says so in one line
naming the setting, and exits 2 before it takes any work (found by a
walk-through of the README: some were accepted and failed every model call
or every large payload later, blamed on a tool, or printed "worker ready"
and then a traceback)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from runtime.connect import ServerUnreachable, connect
from runtime.settings import Settings, SettingsError
from testbed.local_stack import ROOT, DevServer
from tests.support.s3 import denying_s3


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("AGENT_LLM_READ_TIMEOUT", "0", "AGENT_LLM_READ_TIMEOUT must be above 0, got '0'."),
        ("AGENT_LLM_READ_TIMEOUT", "nan", "AGENT_LLM_READ_TIMEOUT must be a finite number, got 'nan'."),
        ("AGENT_STORAGE_THRESHOLD_BYTES", "1e999", "AGENT_STORAGE_THRESHOLD_BYTES must be a whole number"),
        ("AGENT_SHUTDOWN_GRACE_SECONDS", "1e308", "AGENT_SHUTDOWN_GRACE_SECONDS must be at most 86400"),
        # Found by a storage audit: each was taken and failed later (a jammed
        # workflow task; a client's traceback).
        ("AGENT_STORAGE_THRESHOLD_BYTES", "5000000", "AGENT_STORAGE_THRESHOLD_BYTES must be at most 1048576"),
        ("AGENT_STORAGE", "s3://", "AGENT_STORAGE='s3://' names no bucket; use s3://bucket"),
        ("AGENT_STORAGE", "s3:///prefix", "AGENT_STORAGE='s3:///prefix' names no bucket"),
        ("AGENT_METRICS_PORT", "0", "AGENT_METRICS_PORT must be a port number from 1 to 65535, got 0."),
        ("AGENT_METRICS_PORT", "99999", "AGENT_METRICS_PORT must be a port number from 1 to 65535"),
        ("LOG_LEVEL", "bogus", "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR or CRITICAL"),
        ("OPENAI_BASE_URL", "not-a-url", "OPENAI_BASE_URL must be an http:// or https:// URL"),
        # Found by a design audit: each left the switch as it was, silently.
        ("AGENT_PAYLOAD_WALK", "banana", "AGENT_PAYLOAD_WALK must be on or off, got 'banana'."),
        ("AGENT_SDK_FALLBACKS", "enabled", "AGENT_SDK_FALLBACKS must be on or off, got 'enabled'."),
        # Found by a README audit: taken, and the worker said ready but never ran an activity.
        ("AGENT_MAX_CONCURRENT_ACTIVITIES", "0", "AGENT_MAX_CONCURRENT_ACTIVITIES must be above 0, got '0'."),
    ],
)
def test_a_setting_no_worker_can_use_is_refused_naming_it(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({name: value})
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("value", "on"), [("off", False), ("FALSE", False), ("0", False), ("no", False), ("On", True)]
)
def test_a_switch_reads_off_as_users_write_it(value: str, on: bool) -> None:
    """`AGENT_PAYLOAD_WALK=false` left the walk on: only `off` switched it off."""
    for name in (
        "AGENT_SANDBOX_PRECOMPILE",
        "AGENT_PAYLOAD_WALK",
        "AGENT_DIRECT_MODEL_POST",
        "AGENT_SDK_FALLBACKS",
    ):
        settings = Settings.from_env({name: value})
        field = name.removeprefix("AGENT_").lower()
        assert getattr(settings, field) is on, name


def test_log_level_and_base_url_are_read_as_users_write_them() -> None:
    settings = Settings.from_env({"LOG_LEVEL": "debug", "OPENAI_BASE_URL": "HTTPS://api.example.com/v1"})
    assert settings.log_level == "DEBUG"


async def worker_refusal(env: dict[str, str], tmp_path: Path) -> str:
    """What the worker prints on stderr; it must exit 2 before "worker ready"."""
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "worker.py"),
        cwd=tmp_path,
        env={**os.environ, "AGENT_DATA_DIR": str(tmp_path / "data"), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(worker.communicate(), 60)
    except TimeoutError:
        worker.kill()  # it took the setting and is running: no refusal
        await worker.wait()
        raise
    assert worker.returncode == 2, (out, err)
    assert b"worker ready" not in out and b"Traceback" not in err, err
    assert err.decode().count("\n") == 1, err
    return err.decode()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


async def test_the_worker_refuses_a_namespace_the_server_lacks(
    dev_server: DevServer, tmp_path: Path, workspace: Path
) -> None:
    env = {
        "TEMPORAL_ADDRESS": dev_server.address,
        "TEMPORAL_NAMESPACE": "no-such-namespace",
        "AGENT_WORKSPACE": str(workspace),
    }
    err = await worker_refusal(env, tmp_path)
    assert err.startswith("error: TEMPORAL_NAMESPACE=no-such-namespace: Namespace no-such-namespace is not")
    assert "temporal operator namespace create --namespace no-such-namespace" in err


def test_a_tool_output_dir_that_cannot_be_written_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Written only for an output over the cap: a deployment on a read-only
    file system (AGENT_STORAGE=off or S3) may never need it."""
    settings = Settings.from_env({"AGENT_STORAGE": "off", "AGENT_TOOL_OUTPUT_DIR": "/proc/no-outputs"})
    settings.check_writable()
    assert "AGENT_TOOL_OUTPUT_DIR=/proc/no-outputs cannot be written" in caplog.text


async def test_the_worker_refuses_a_store_it_cannot_write_and_a_missing_workspace(
    dev_server: DevServer, tmp_path: Path, workspace: Path
) -> None:
    base = {"TEMPORAL_ADDRESS": dev_server.address, "AGENT_WORKSPACE": str(workspace)}
    err = await worker_refusal({**base, "AGENT_STORAGE_DIR": "/proc/no-store"}, tmp_path)
    assert err.startswith("error: AGENT_STORAGE_DIR=/proc/no-store cannot be written: ")
    err = await worker_refusal({**base, "AGENT_WORKSPACE": str(tmp_path / "gone")}, tmp_path)
    assert err.startswith(f"error: AGENT_WORKSPACE={tmp_path / 'gone'} is not a directory")


async def test_the_worker_refuses_s3_storage_it_cannot_write(tmp_path: Path, workspace: Path) -> None:
    """Before connecting to Temporal: wrong AWS credentials used to start a
    worker that failed every model call (each writes its context there)."""
    async with denying_s3() as url:
        env = {
            "TEMPORAL_ADDRESS": "127.0.0.1:1",  # never reached: the store is checked first
            "AGENT_WORKSPACE": str(workspace),
            "AGENT_STORAGE": "s3://agent-payloads/prod",
            "AWS_ENDPOINT_URL": url,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        }
        err = await worker_refusal(env, tmp_path)
    assert err.startswith(
        "error: AGENT_STORAGE=s3://agent-payloads/prod cannot be used: s3://agent-payloads/prod/context/"
    )
    assert "(AccessDenied) when calling the PutObject operation" in err
    assert "wJalrXUtnFEMI" not in err


async def test_the_worker_names_the_metrics_settings_when_it_cannot_serve_them(
    dev_server: DevServer, tmp_path: Path, workspace: Path
) -> None:
    env = {
        "TEMPORAL_ADDRESS": dev_server.address,
        "AGENT_WORKSPACE": str(workspace),
        "AGENT_METRICS_PORT": "9464",
        "AGENT_METRICS_HOST": "metrics.invalid",
    }
    err = await worker_refusal(env, tmp_path)
    assert err.startswith("error: Cannot serve metrics on metrics.invalid:9464 (AGENT_METRICS_HOST:")
    assert "takes an IP address" in err


async def test_tls_to_a_server_without_it_says_which_setting_turned_it_on(dev_server: DevServer) -> None:
    with pytest.raises(ServerUnreachable) as refused:
        await connect(Settings.from_env({}, address=dev_server.address, temporal_api_key="key"))
    assert "answers in plain TCP, not TLS, and TLS is on because TEMPORAL_API_KEY" in str(refused.value)


def test_a_worker_logs_what_every_worker_on_its_queue_must_share() -> None:
    """A worker with another key, store or tool set fails conversations
    that start on it (a deploy audit): its log says what it has, key ids
    only."""
    from worker import what_must_match

    key = "a2V5LWJ5dGVzLWtleS1ieXRlcy1rZXktYnl0ZXMtISE="
    settings = Settings.from_env(
        {"AGENT_ENCRYPTION_KEYS": f"k2:{key},k1:{key}", "AGENT_STORAGE_DIR": "/srv/agent/payloads"}
    )
    line = what_must_match(settings)
    assert "calculator" in line.split("; ")[0]
    assert line.endswith("; payload store: /srv/agent/payloads; encryption keys: k2, k1")
    assert key not in line


def test_the_cores_threads_are_agent_core_threads_else_tokios_own_setting_else_one() -> None:
    """And only while the runtime is made: a process a tool starts does not
    inherit the setting (a review)."""
    from worker import core_threads

    environ: dict[str, str] = {}
    with core_threads(Settings.from_env({}), environ) as threads:
        assert threads == "1" and environ == {"TOKIO_WORKER_THREADS": "1"}
    assert environ == {}
    environ = {"TOKIO_WORKER_THREADS": "4"}
    with core_threads(Settings.from_env({}), environ) as threads:
        assert threads == "4"
    with core_threads(Settings.from_env({"AGENT_CORE_THREADS": "3"}), environ) as threads:
        assert threads == "3" and environ["TOKIO_WORKER_THREADS"] == "3"
    assert environ == {"TOKIO_WORKER_THREADS": "4"}
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"AGENT_CORE_THREADS": "0"})
    assert str(refused.value) == "AGENT_CORE_THREADS must be above 0, got '0'."


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_worker_runs_the_sdk_core_on_the_threads_it_is_given(worker_env: dict[str, str]) -> None:
    """The setting reaches the SDK's Rust runtime (its threads are named
    tokio-rt-worker): a worker started with AGENT_CORE_THREADS=8 has seven
    more of them than one started with the default, give or take the
    runtime's blocking threads (named alike, made on demand: a CI run saw
    one more in one worker than in the other)."""
    import uuid

    from testbed.local_stack import start_worker, stop_process

    def core_threads(extra: dict[str, str]) -> int:
        env = {**worker_env, "TEMPORAL_TASK_QUEUE": f"threads-{uuid.uuid4().hex[:6]}", **extra}
        process = start_worker(env)
        try:
            names = [
                (task / "comm").read_text().strip() for task in Path(f"/proc/{process.pid}/task").iterdir()
            ]
        finally:
            stop_process(process)
        return names.count("tokio-rt-worker")

    assert core_threads({"AGENT_CORE_THREADS": "8"}) - core_threads({}) >= 5
