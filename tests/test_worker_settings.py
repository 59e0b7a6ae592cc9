"""A worker started with a setting it cannot work with says so in one line
naming the setting, and exits 2 before it takes any work (found by a
walk-through of the README: some were accepted and failed every model call
or every large payload later, blamed on a tool, or printed "worker ready"
and then a traceback)."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import GrpcCompression

from activities.llm import LlmActivities
from activities.redact import scrub
from runtime.connect import ServerUnreachable, connect
from runtime.settings import Settings, SettingsError
from testbed.local_stack import ROOT, DevServer, free_port
from tests.support.s3 import denying_s3
from tests.support.stack import Stack, finished_on_own_worker
from worker import build_worker, what_must_match


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("AGENT_LLM_READ_TIMEOUT", "0", "AGENT_LLM_READ_TIMEOUT must be above 0, got '0'."),
        ("AGENT_LLM_READ_TIMEOUT", "nan", "AGENT_LLM_READ_TIMEOUT must be a finite number, got 'nan'."),
        ("AGENT_MODEL_CALL_TIMEOUT", "0", "AGENT_MODEL_CALL_TIMEOUT must be above 0, got '0'."),
        ("AGENT_MODEL_CALL_TIMEOUT", "1e9", "AGENT_MODEL_CALL_TIMEOUT must be at most 604800"),
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
        ("AGENT_CONTEXT_CACHE_MB", "0", "AGENT_CONTEXT_CACHE_MB must be above 0, got '0'."),
        ("AGENT_CONTEXT_CACHE_MB", "1.5", "AGENT_CONTEXT_CACHE_MB must be a whole number"),
        ("AGENT_GRPC_COMPRESSION", "zstd", "AGENT_GRPC_COMPRESSION must be 'gzip' or 'none', got 'zstd'."),
        # A worker that would look for wedged conversations without pause, or never.
        ("AGENT_REPAIR_INTERVAL_SECONDS", "0", "AGENT_REPAIR_INTERVAL_SECONDS must be above 0, got '0'."),
        ("AGENT_REPAIR_INTERVAL_SECONDS", "1e9", "AGENT_REPAIR_INTERVAL_SECONDS must be at most 86400"),
        ("AGENT_REPAIR_WEDGED", "sometimes", "AGENT_REPAIR_WEDGED must be on or off, got 'sometimes'."),
        # Found by an operator audit: a panic and a traceback, or the SDK's
        # words naming no setting, or taken and failing unseen later.
        ("TOKIO_WORKER_THREADS", "abc", "TOKIO_WORKER_THREADS must be a whole number"),
        ("TOKIO_WORKER_THREADS", "0", "TOKIO_WORKER_THREADS must be above 0, got '0'."),
        ("TEMPORAL_ADDRESS", "localhost:abc", "TEMPORAL_ADDRESS must be HOST:PORT (such as localhost:7233)"),
        ("TEMPORAL_ADDRESS", "::::", "TEMPORAL_ADDRESS must be HOST:PORT"),
        ("TEMPORAL_ADDRESS", "localhost", "TEMPORAL_ADDRESS must be HOST:PORT"),
        ("TEMPORAL_UI_URL", "notaurl", "TEMPORAL_UI_URL must be an http:// or https:// URL, got 'notaurl'."),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "notaurl",
            "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https://",
        ),
        ("AGENT_CODEC_CORS_ORIGINS", "http://ok:1,notaurl", "AGENT_CODEC_CORS_ORIGINS holds 'notaurl'"),
    ],
)
def test_a_setting_no_worker_can_use_is_refused_naming_it(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({name: value})
    assert str(refused.value).startswith(message)


def test_addresses_of_every_form_a_server_has_are_taken() -> None:
    for address in ("localhost:7233", "[::1]:7233", "10.0.0.5:7233", "my-ns.a1b2c.tmprl.cloud:7233"):
        assert Settings.from_env({"TEMPORAL_ADDRESS": address}).address == address


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


async def run_worker_py(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str, str]:
    """``worker.py args`` with ``env``: its exit code, stdout and stderr."""
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "worker.py"),
        *args,
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
    assert worker.returncode is not None
    return worker.returncode, out.decode(), err.decode()


async def worker_refusal(env: dict[str, str], tmp_path: Path) -> str:
    """What the worker prints on stderr; it must exit 2 before "worker ready"."""
    code, out, err = await run_worker_py([], env, tmp_path)
    assert code == 2, (out, err)
    assert "worker ready" not in out and "Traceback" not in err, err
    assert err.count("\n") == 1, err
    return err


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


@pytest.mark.parametrize("value", ["gzip", "GZIP", "none"])
async def test_the_clients_grpc_compression_is_agent_grpc_compression(
    dev_server: DevServer, value: str
) -> None:
    """Calls to the server go uncompressed unless AGENT_GRPC_COMPRESSION=gzip
    (the SDK's own default, which gzips every call); either way the server
    answers."""
    settings = Settings.from_env({"AGENT_GRPC_COMPRESSION": value}, address=dev_server.address)
    client = await connect(settings)
    assert client.service_client.config.grpc_compression == (
        GrpcCompression.GZIP if value.lower() == "gzip" else GrpcCompression.NONE
    )
    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    assert info.server_version


async def test_a_compression_set_without_from_env_is_refused_naming_the_setting() -> None:
    """Settings built directly skip ``check``: the connection still names
    the setting instead of raising a KeyError."""
    with pytest.raises(SettingsError, match="AGENT_GRPC_COMPRESSION must be 'gzip' or 'none', got 'Zstd'"):
        await connect(Settings(grpc_compression="Zstd"))


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


def test_a_tls_file_that_cannot_be_read_is_refused_in_one_sentence(tmp_path: Path) -> None:
    """It used to pass the check (it is a file) and fail later, in the
    connection, with a traceback and exit code 1."""
    unreadable = "/proc/self/mem"  # a file whose read fails, even for root

    with pytest.raises(SettingsError, match=r"^TEMPORAL_TLS_CA=/proc/\d+/mem cannot be read \(.+\)\.$"):
        Settings.from_env({"AGENT_DATA_DIR": str(tmp_path), "TEMPORAL_TLS_CA": unreadable})


def test_a_tilde_in_a_path_setting_is_the_given_environments_home(tmp_path: Path) -> None:
    """As the default data directory is: one HOME for every path of the settings."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")

    settings = Settings.from_env(
        {"HOME": str(home), "AGENT_DATA_DIR": "~/data", "AGENT_WORKSPACE": "~", "TEMPORAL_TLS_CA": "~/ca.pem"}
    )

    assert settings.storage_dir == home / "data" / "payloads"
    assert settings.workspace == home
    assert settings.tls_ca == home / "ca.pem"


KEY = base64.b64encode(bytes(range(32))).decode()


@pytest.fixture
def defaults(tmp_path: Path) -> Settings:
    """What a user gets with nothing set (data under a throwaway XDG_DATA_HOME)."""
    return Settings.from_env({"XDG_DATA_HOME": str(tmp_path / "xdg")})


# README "## Configuration": | Variable | Default | ... |
@pytest.mark.parametrize(
    ("variable", "field", "readme_default"),
    [
        ("TEMPORAL_ADDRESS", "address", "localhost:7233"),
        ("TEMPORAL_NAMESPACE", "namespace", "default"),
        ("TEMPORAL_TASK_QUEUE", "task_queue", "agent"),
        ("TEMPORAL_UI_URL", "ui_url", "http://localhost:8233"),
        ("AGENT_MODEL", "default_model", "gpt-4o-mini"),
        ("AGENT_LLM_READ_TIMEOUT", "llm_read_timeout", 60),
        ("AGENT_TOOL_OUTPUT_CAP", "tool_output_cap", 50000),
        ("AGENT_STORAGE", "storage", "file"),
        ("AGENT_STORAGE_THRESHOLD_BYTES", "storage_threshold", 262144),
        ("AGENT_COMPRESS_THRESHOLD_BYTES", "compress_threshold", 2048),
        ("AGENT_MAX_DECOMPRESSED_BYTES", "max_decompressed_bytes", 67108864),
        ("AGENT_SANDBOX_PRECOMPILE", "sandbox_precompile", True),
        ("AGENT_PAYLOAD_WALK", "payload_walk", True),
        ("AGENT_DIRECT_MODEL_POST", "direct_model_post", True),
        ("AGENT_SDK_FALLBACKS", "sdk_fallbacks", False),
        ("AGENT_MAX_CONCURRENT_ACTIVITIES", "max_concurrent_activities", 200),
        ("AGENT_SHUTDOWN_GRACE_SECONDS", "shutdown_grace", 5),
        ("AGENT_REPAIR_WEDGED", "repair_wedged", True),
        ("AGENT_REPAIR_INTERVAL_SECONDS", "repair_interval", 30),
        ("AGENT_METRICS_PORT", "metrics_port", None),
        ("AGENT_METRICS_HOST", "metrics_host", "127.0.0.1"),
        ("LOG_LEVEL", "log_level", "INFO"),
        ("AGENT_GRPC_COMPRESSION", "grpc_compression", "none"),
    ],
)
def test_an_unset_variable_takes_the_default_the_readme_documents(
    defaults: Settings, variable: str, field: str, readme_default: object
) -> None:
    assert getattr(defaults, field) == readme_default, variable


def test_the_payload_store_and_tool_outputs_default_to_the_data_directory(tmp_path: Path) -> None:
    settings = Settings.from_env({"AGENT_DATA_DIR": str(tmp_path / "data")})
    assert settings.storage_dir == tmp_path / "data" / "payloads"
    assert settings.tool_output_dir == tmp_path / "data" / "tool-output"


def test_tool_modules_and_local_tools_are_comma_separated_names_with_spaces_ignored() -> None:
    settings = Settings.from_env(
        {"AGENT_TOOLS": " tools.a , tools.b,,", "AGENT_LOCAL_TOOLS": "calculator, echo ,"}
    )
    assert settings.tool_modules == ("tools.a", "tools.b")
    assert settings.local_tools == {"calculator", "echo"}


def test_a_star_in_agent_local_tools_is_kept_for_every_tool() -> None:
    assert Settings.from_env({"AGENT_LOCAL_TOOLS": "*"}).local_tools == {"*"}


@pytest.mark.parametrize(
    "name",
    [
        "AGENT_LLM_READ_TIMEOUT",
        "AGENT_SHUTDOWN_GRACE_SECONDS",
        "AGENT_TOOL_OUTPUT_CAP",
        "AGENT_STORAGE_THRESHOLD_BYTES",
        "AGENT_MAX_CONCURRENT_ACTIVITIES",
    ],
)
def test_a_negative_number_is_refused_naming_the_setting(name: str) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({name: "-1"})
    assert str(refused.value) == f"{name} must not be negative, got '-1'."


def test_a_zero_shutdown_grace_is_taken_as_no_grace() -> None:
    """README: AGENT_SHUTDOWN_GRACE_SECONDS=0 is a grace of none (not refused like a 0 timeout)."""
    assert Settings.from_env({"AGENT_SHUTDOWN_GRACE_SECONDS": "0"}).shutdown_grace == 0


def test_the_largest_storage_threshold_the_readme_allows_is_taken() -> None:
    settings = Settings.from_env({"AGENT_STORAGE_THRESHOLD_BYTES": "1048576"})
    assert settings.storage_threshold == 1048576


@pytest.mark.parametrize(("port", "taken"), [("1", True), ("65535", True), ("65536", False)])
def test_a_metrics_port_is_taken_from_1_to_65535(port: str, taken: bool) -> None:
    if taken:
        assert Settings.from_env({"AGENT_METRICS_PORT": port}).metrics_port == int(port)
    else:
        with pytest.raises(SettingsError, match="AGENT_METRICS_PORT must be a port number from 1 to 65535"):
            Settings.from_env({"AGENT_METRICS_PORT": port})


def test_agent_core_threads_over_256_is_refused_naming_it() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"AGENT_CORE_THREADS": "257"})
    assert str(refused.value) == "AGENT_CORE_THREADS must be at most 256, got '257'."


def test_a_read_timeout_over_a_day_is_refused_naming_it() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"AGENT_LLM_READ_TIMEOUT": "86401"})
    assert str(refused.value) == "AGENT_LLM_READ_TIMEOUT must be at most 86400, got '86401'."


@pytest.mark.parametrize("value", ["off", "OFF", "Off"])
def test_compression_is_switched_off_by_off_in_any_case(value: str) -> None:
    assert Settings.from_env({"AGENT_COMPRESS_THRESHOLD_BYTES": value}).compress_threshold is None


def test_a_decompression_limit_below_one_mebibyte_is_refused() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"AGENT_MAX_DECOMPRESSED_BYTES": str(1024 * 1024 - 1)})
    assert str(refused.value).startswith("AGENT_MAX_DECOMPRESSED_BYTES=1048575 is below 1 MiB")
    assert Settings.from_env({"AGENT_MAX_DECOMPRESSED_BYTES": str(1024 * 1024)}).max_decompressed_bytes


def test_an_unknown_storage_is_refused_naming_the_choices() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"AGENT_STORAGE": "disk"})
    assert str(refused.value) == "AGENT_STORAGE must be 'file', 'off' or 's3://bucket/prefix', got 'disk'."


def test_a_tls_certificate_without_its_key_is_refused(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("cert")
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"TEMPORAL_TLS_CERT": str(cert)})
    assert str(refused.value).startswith("TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY go together")


def test_a_tls_file_that_does_not_exist_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"TEMPORAL_TLS_CA": str(tmp_path / "missing-ca.pem")})
    assert str(refused.value) == f"TEMPORAL_TLS_CA={tmp_path / 'missing-ca.pem'} is not a readable file."


def test_paths_starting_with_a_tilde_are_under_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ca.pem").write_text("ca")
    settings = Settings.from_env(
        {
            "AGENT_DATA_DIR": "~/data",
            "AGENT_STORAGE_DIR": "~/store",
            "TEMPORAL_TLS_CA": "~/ca.pem",
        }
    )
    assert settings.storage_dir == tmp_path.resolve() / "store"
    assert settings.tool_output_dir == tmp_path.resolve() / "data" / "tool-output"
    assert settings.tls_ca == tmp_path.resolve() / "ca.pem"


def test_a_workspace_that_is_the_payload_store_itself_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    settings = Settings.from_env({"AGENT_STORAGE_DIR": str(store), "AGENT_WORKSPACE": str(store)})
    with pytest.raises(SettingsError) as refused:
        settings.check_workspace()
    assert str(refused.value).startswith(f"The payload store {store} is inside the tools' workspace {store}")


def test_a_workspace_holding_the_store_is_fine_when_payloads_go_to_s3(tmp_path: Path) -> None:
    """Only file storage keeps payloads in AGENT_STORAGE_DIR: with S3 its
    (unused) default inside the workspace is no reason to refuse."""
    settings = Settings.from_env(
        {
            "AGENT_STORAGE": "s3://bucket/prefix",
            "AGENT_WORKSPACE": str(tmp_path),
            "AGENT_STORAGE_DIR": str(tmp_path / "payloads"),
            "AGENT_TOOL_OUTPUT_DIR": str(tmp_path.parent / f"{tmp_path.name}-out"),
        }
    )
    settings.check_workspace()  # no refusal


def test_a_store_that_cannot_be_written_is_no_reason_to_refuse_without_file_storage() -> None:
    settings = Settings.from_env({"AGENT_STORAGE": "off", "AGENT_STORAGE_DIR": "/proc/no-store"})
    settings.check_writable()  # no refusal: nothing is written there


def test_a_store_that_cannot_be_written_is_refused_naming_it() -> None:
    settings = Settings.from_env({"AGENT_STORAGE_DIR": "/proc/no-store"})
    with pytest.raises(SettingsError, match=r"^AGENT_STORAGE_DIR=/proc/no-store cannot be written: "):
        settings.check_writable()


def test_the_conversation_link_has_one_slash_after_a_ui_url_ending_in_one() -> None:
    settings = Settings.from_env({"TEMPORAL_UI_URL": "http://ui.example:8080/", "TEMPORAL_NAMESPACE": "prod"})
    assert settings.workflow_url("chat-1") == "http://ui.example:8080/namespaces/prod/workflows/chat-1"


@pytest.mark.parametrize(
    ("variable", "field"),
    [
        ("TEMPORAL_API_KEY", "temporal_api_key"),
        ("AGENT_CODEC_TOKEN", "codec_token"),
        ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
        ("OPENAI_API_KEY", "openai_api_key"),
    ],
)
def test_each_secret_setting_is_scrubbed_from_error_texts(variable: str, field: str) -> None:
    secret = f"secret-of-{variable.lower()}-1234"
    assert secret in Settings.from_env({variable: secret}).known_secrets()


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("http://user:Pa55wordXyz@127.0.0.1:8090/v1", "Pa55wordXyz"),
        ("https://me.openai.azure.com/openai/v1?api-version=2024-10&api-key=abcd1234efgh", "abcd1234efgh"),
    ],
)
def test_a_secret_in_the_model_servers_url_is_scrubbed_from_error_texts(url: str, secret: str) -> None:
    """A password in OPENAI_BASE_URL reached a conversation's history in the
    bare text of a model server's error (a security audit)."""
    settings = Settings.from_env({"OPENAI_BASE_URL": url})
    assert secret in settings.known_secrets()
    assert scrub(f"rejected pw={secret}", settings.known_secrets()) == "rejected pw=[redacted]"
    assert (
        Settings.from_env({"OPENAI_BASE_URL": "http://127.0.0.1:8090/v1?api-version=2024"}).known_secrets()
        == ()
    )


def test_an_encryption_key_is_scrubbed_in_every_way_it_may_be_written() -> None:
    key = bytes(range(250, 256)) + bytes(range(26))  # '+' and '/' in standard base64
    standard = base64.b64encode(key).decode()
    urlsafe = base64.urlsafe_b64encode(key).decode()
    secrets = Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"k1:{standard}"}).known_secrets()
    for form in (standard, standard.rstrip("="), urlsafe, urlsafe.rstrip("=")):
        assert form in secrets, form


def test_the_codec_servers_origins_are_compared_without_a_trailing_slash() -> None:
    settings = Settings.from_env({"AGENT_CODEC_CORS_ORIGINS": "https://ui.example/, http://localhost:8080"})
    assert settings.codec_cors_origins == ("https://ui.example", "http://localhost:8080")


def test_a_key_file_takes_comments_after_a_key(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# rotated monthly\nk1:{KEY} # current\n")
    settings = Settings.from_env({"AGENT_ENCRYPTION_KEY_FILE": str(key_file)})
    assert [key_id for key_id, _ in settings.encryption_keys] == ["k1"]


def test_a_key_file_that_cannot_be_read_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"AGENT_ENCRYPTION_KEY_FILE": str(tmp_path / "none")})
    assert str(refused.value) == (
        f"AGENT_ENCRYPTION_KEY_FILE={tmp_path / 'none'} cannot be read (No such file or directory)."
    )


def test_a_key_file_without_keys_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# no key yet\n")
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"AGENT_ENCRYPTION_KEY_FILE": str(key_file)})
    assert str(refused.value) == (
        "AGENT_ENCRYPTION_KEY_FILE is set but holds no key; give at least one ID:BASE64."
    )


@pytest.mark.parametrize(
    "form",
    [
        base64.urlsafe_b64encode(bytes(range(250, 256)) + bytes(range(26))).decode(),
        base64.b64encode(bytes(range(32))).decode().rstrip("="),
    ],
    ids=["url-safe", "unpadded"],
)
def test_a_key_is_taken_in_url_safe_or_unpadded_base64(form: str) -> None:
    ((_, key),) = Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"k1:{form}"}).encryption_keys
    assert len(key) == 32


def test_a_key_id_of_64_characters_is_taken_and_65_refused() -> None:
    assert Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"{'a' * 64}:{KEY}"}).encryption_keys
    with pytest.raises(SettingsError, match="entry 1 is not ID:BASE64"):
        Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"{'a' * 65}:{KEY}"})


def test_a_key_without_its_id_is_refused_naming_the_entry() -> None:
    """Even a key whose unpadded base64 could pass for an id (letters and digits only)."""
    bare = base64.b64encode(bytes(32)).decode().rstrip("=")  # "AAAA...": 43 letters
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"k1:{KEY},{bare}"})
    assert str(refused.value).startswith("AGENT_ENCRYPTION_KEYS: entry 2 is not ID:BASE64")


def test_overrides_win_over_the_environment() -> None:
    assert Settings.from_env({"TEMPORAL_TASK_QUEUE": "env"}, task_queue="given").task_queue == "given"


def settings_for(tmp_path: Path, **env: str) -> Settings:
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    return Settings.from_env(
        {
            "AGENT_WORKSPACE": str(workspace),
            "AGENT_DATA_DIR": str(tmp_path / "data"),
            "AGENT_STORAGE": "off",
            # A queue of its own: the SDK refuses a second worker on one queue in a process.
            "TEMPORAL_TASK_QUEUE": f"audit-{uuid.uuid4().hex[:8]}",
            **env,
        }
    )


async def test_build_worker_refuses_a_payload_store_inside_the_tools_workspace(
    client: Client, tmp_path: Path
) -> None:
    """build_worker's docstring: a program embedding the worker gets the refusal too."""
    settings = Settings.from_env({"AGENT_WORKSPACE": str(tmp_path), "AGENT_DATA_DIR": str(tmp_path / "data")})
    with pytest.raises(SettingsError, match=r"inside the tools' workspace"):
        build_worker(client, settings)


async def test_a_local_tool_no_loaded_tool_has_gets_a_warning_naming_it(
    client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        build_worker(client, settings_for(tmp_path, AGENT_LOCAL_TOOLS="calculator,no_such_tool"))
    assert "AGENT_LOCAL_TOOLS names no_such_tool, which this worker does not declare" in caplog.text


async def test_a_star_in_agent_local_tools_gets_no_warning(
    client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        build_worker(client, settings_for(tmp_path, AGENT_LOCAL_TOOLS="*"))
    assert "AGENT_LOCAL_TOOLS" not in caplog.text


async def test_the_worker_gives_running_activities_the_shutdown_grace(client: Client, tmp_path: Path) -> None:
    worker = build_worker(client, settings_for(tmp_path, AGENT_SHUTDOWN_GRACE_SECONDS="42"))
    assert worker.config()["graceful_shutdown_timeout"] == timedelta(seconds=42)


async def test_the_worker_runs_at_most_agent_max_concurrent_activities(
    client: Client, tmp_path: Path
) -> None:
    worker = build_worker(client, settings_for(tmp_path, AGENT_MAX_CONCURRENT_ACTIVITIES="7"))
    assert worker.config()["max_concurrent_activities"] == 7


async def test_a_dead_workers_workflow_tasks_leave_its_sticky_queue_after_one_second(
    client: Client, tmp_path: Path
) -> None:
    """README Limits: "workflow tasks leave a dead worker's sticky queue after 1 s"."""
    worker = build_worker(client, settings_for(tmp_path))
    assert worker.config()["sticky_queue_schedule_to_start_timeout"] == timedelta(seconds=1)


async def test_heartbeats_reach_the_server_at_least_once_a_second(client: Client, tmp_path: Path) -> None:
    config = build_worker(client, settings_for(tmp_path)).config()
    assert config["max_heartbeat_throttle_interval"] == timedelta(seconds=1)
    assert config["default_heartbeat_throttle_interval"] == timedelta(seconds=1)


async def test_passing_llm_with_context_hooks_is_refused(client: Client, tmp_path: Path) -> None:
    llm = LlmActivities(api_key="x", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="Pass transform_context and convert_to_llm to LlmActivities"):
        build_worker(client, settings_for(tmp_path), llm=llm, transform_context=lambda context: context)


def test_the_worker_log_names_an_s3_store_by_its_url() -> None:
    line = what_must_match(Settings.from_env({"AGENT_STORAGE": "s3://agent-payloads/prod"}))
    assert line.endswith("; payload store: s3://agent-payloads/prod; encryption keys: none")


async def test_a_metrics_port_flag_outside_1_to_65535_is_refused(tmp_path: Path) -> None:
    code, out, err = await run_worker_py(
        ["--metrics-port", "70000"], {"TEMPORAL_ADDRESS": "127.0.0.1:1"}, tmp_path
    )
    assert code == 2 and "worker ready" not in out
    assert "--metrics-port must be a port number (1-65535), not 70000" in err


async def test_a_tool_module_that_does_not_load_stops_the_worker_in_one_line(tmp_path: Path) -> None:
    """Before it connects: the module is loaded first, and its error is one line, exit 2."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
        "AGENT_WORKSPACE": str(workspace),
        "AGENT_TOOLS": "no_such_tools_pkg",
    }
    code, _, err = await run_worker_py([], env, tmp_path)
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith("error: Cannot load tool module 'no_such_tools_pkg': ")
    assert err.count("\n") == 1, err


async def test_a_tool_output_over_agent_tool_output_cap_is_cut_for_the_model(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    import tests.support.tools  # noqa: F401  (registers echo in this process)

    env = {**worker_env, "AGENT_TOOL_OUTPUT_CAP": "20", "TEMPORAL_TASK_QUEUE": f"cap-{uuid.uuid4().hex[:6]}"}
    stack.script(
        {"tool_calls": [{"id": "c1", "name": "echo", "arguments": {"text": "long " * 40}}]},
        {"text": "done"},
    )
    _, result, _ = await finished_on_own_worker(stack, Settings.from_env(env), "go")
    (tool_result,) = [m for m in result.messages if m.role == "toolResult"]
    text = tool_result.content[0].text
    assert text.startswith("echo: long") and "[Output truncated: " in text
    assert len(text) < len("echo: " + "long " * 40)


async def test_tools_flags_add_to_agent_tools_rather_than_replace_them(tmp_path: Path) -> None:
    """README: --tools or AGENT_TOOLS; worker.py: "flags add to AGENT_TOOLS". A
    module in AGENT_TOOLS is loaded (here: fails to) when --tools names another."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
        "AGENT_WORKSPACE": str(workspace),
        "AGENT_TOOLS": "no_such_env_tools",
    }
    code, _, err = await run_worker_py(["--tools", "tests.support.tools"], env, tmp_path)
    assert code == 2
    assert err.startswith("error: Cannot load tool module 'no_such_env_tools': "), err


async def test_a_tools_flag_takes_a_comma_list_as_agent_tools_does(tmp_path: Path) -> None:
    """``--tools a,b`` was read as one module named "a,b" ("No module named
    'my_pkg.tools,my_pkg'", a README audit); AGENT_TOOLS takes a comma list.
    Here the second module of the list is the one that fails to load."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {"TEMPORAL_ADDRESS": "127.0.0.1:1", "AGENT_WORKSPACE": str(workspace)}
    code, _, err = await run_worker_py(["--tools", "tests.support.tools, no_such_flag_tools"], env, tmp_path)
    assert code == 2
    assert err.startswith("error: Cannot load tool module 'no_such_flag_tools': "), err


async def test_a_model_error_echoing_the_codec_token_is_stored_without_it(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """README: model server errors are scrubbed of the worker's own
    AGENT_CODEC_TOKEN (and TEMPORAL_API_KEY, AWS_SECRET_ACCESS_KEY, keys)
    verbatim, not only of OPENAI_API_KEY."""
    token = "tulip-garden-lamp"  # no shape the generic scrubber knows
    env = {**worker_env, "AGENT_CODEC_TOKEN": token, "TEMPORAL_TASK_QUEUE": f"tok-{uuid.uuid4().hex[:6]}"}
    stack.script({"fault": {"kind": "401", "message": f"The model said {token} twice."}})
    _, result, _ = await finished_on_own_worker(stack, Settings.from_env(env), "hi")
    answer = result.messages[-1]
    assert answer.error_message is not None and answer.error_message.startswith(
        "The model server answered 401"
    )
    assert token not in answer.error_message


async def test_read_file_is_rooted_at_agent_workspace_not_the_working_directory(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker started from one directory with AGENT_WORKSPACE naming another
    reads files there (the directory check_workspace vetted), not in its cwd."""
    from activities import builtin_tools

    monkeypatch.setattr(builtin_tools, "_workspace", builtin_tools.workspace_root())  # restored after
    settings = settings_for(tmp_path)
    (settings.workspace / "note.txt").write_text("hello from the workspace\n")
    build_worker(client, settings)
    result = await builtin_tools.read_file(builtin_tools.ReadFileArgs(path="note.txt"))
    assert "hello from the workspace" in str(result.content)


async def test_a_conversation_that_names_no_model_uses_agent_model(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    from client import start_conversation

    env = {**worker_env, "AGENT_MODEL": stack.model, "TEMPORAL_TASK_QUEUE": f"model-{uuid.uuid4().hex[:6]}"}
    settings = Settings.from_env(env)
    stack.script({"text": "answered by the default model"})
    async with build_worker(stack.client, settings):
        handle = await start_conversation(
            stack.client,
            f"no-model-{uuid.uuid4().hex[:6]}",
            {"prompt": "hi", "closeWhenIdle": True},
            task_queue=settings.task_queue,
        )
        result = await asyncio.wait_for(handle.result(), 30)
    assert result.messages[-1].text == "answered by the default model"


async def test_sdk_fallbacks_run_workflows_in_the_stock_sandbox(client: Client, tmp_path: Path) -> None:
    """README: AGENT_SDK_FALLBACKS=on uses the stock sandbox, whatever AGENT_SANDBOX_PRECOMPILE says."""
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    runner = build_worker(client, settings_for(tmp_path, AGENT_SDK_FALLBACKS="on")).config()[
        "workflow_runner"
    ]
    assert type(runner) is SandboxedWorkflowRunner


async def test_a_model_stream_silent_past_agent_llm_read_timeout_is_retried(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    env = {
        **worker_env,
        "AGENT_LLM_READ_TIMEOUT": "1",
        "TEMPORAL_TASK_QUEUE": f"stall-{uuid.uuid4().hex[:6]}",
    }
    stack.script(
        {"text": "the stalled answer", "fault": {"kind": "stall", "after_chunks": 1, "seconds": 5}},
        {"text": "the retried answer"},
    )
    _, result, _ = await finished_on_own_worker(stack, Settings.from_env(env), "hi")
    assert result.messages[-1].text == "the retried answer"


def test_a_key_file_others_can_read_is_warned_of_and_one_of_the_owners_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"k1:{KEY}\n")
    settings = Settings.from_env({"AGENT_ENCRYPTION_KEY_FILE": str(key_file)})

    for mode, warned in ((0o644, True), (0o640, True), (0o600, False), (0o400, False)):
        key_file.chmod(mode)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            settings.check_key_file()
        assert bool(caplog.records) is warned, oct(mode)
        if warned:
            assert caplog.records[0].getMessage() == (
                f"AGENT_ENCRYPTION_KEY_FILE={key_file} can be read by other users (mode {oct(mode)}): "
                "anyone who can read it can read every conversation. Make it the owner's alone "
                "(chmod 600; a Kubernetes secret volume: defaultMode: 0400)"
            )


async def test_the_worker_warns_of_a_key_file_others_can_read_before_it_connects(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"k1:{KEY}\n")
    key_file.chmod(0o644)
    workspace = tmp_path / "workspace"  # the key outside it, as the worker insists
    workspace.mkdir()
    env = {
        "AGENT_ENCRYPTION_KEY_FILE": str(key_file),
        "AGENT_WORKSPACE": str(workspace),
        "TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}",
    }

    code, _, err = await run_worker_py([], env, tmp_path)

    assert code != 0  # no server there
    assert f"AGENT_ENCRYPTION_KEY_FILE={key_file} can be read by other users (mode 0o644)" in err


def test_a_worker_without_an_api_key_says_so_when_it_starts(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """It started without a word, and only a user's first run said the key
    was missing (an operator audit). It still starts: what a local model
    server takes is not known here."""
    from testbed.local_stack import start_worker, stop_process

    log = tmp_path / "worker.log"
    env = {**worker_env, "OPENAI_API_KEY": "", "TEMPORAL_TASK_QUEUE": f"no-key-{uuid.uuid4().hex[:6]}"}
    worker = start_worker(env, [], log)
    stop_process(worker)
    assert "warning: OPENAI_API_KEY is not set: every model call this worker makes fails" in log.read_text()


def test_the_worker_log_leaves_out_the_url_of_each_model_request() -> None:
    """The HTTP client logged "HTTP Request: POST http://user:PASSWORD@..."
    at INFO for every model call (a security audit); at DEBUG it still does."""
    from worker import QUIET_LOGGERS, configure_logging

    before = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    try:
        configure_logging(Settings.from_env({"LOG_LEVEL": "INFO"}))
        assert not any(logging.getLogger(name).isEnabledFor(logging.INFO) for name in ("httpx", "httpx2"))
        logging.getLogger("httpx2").setLevel(logging.NOTSET)
        configure_logging(Settings.from_env({"LOG_LEVEL": "DEBUG"}))
        assert logging.getLogger("httpx2").level == logging.NOTSET  # asked for DEBUG: everything
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
