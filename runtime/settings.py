"""Every setting of the worker, the clients and the codec server, read once
from the environment into one typed object and passed in from there.

No other module reads ``os.environ``: a part that needs a setting takes it
as an argument (``Settings.from_env()`` is called by each entry point).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


class SettingsError(ValueError):
    """A setting has a value that cannot be used (the message names it)."""


def default_data_dir() -> Path:
    """Where the agent keeps its data by default: the user's data directory
    (``$XDG_DATA_HOME/durable-agent``), never inside a tool's workspace."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).resolve() / "durable-agent"


@dataclass(frozen=True)
class Settings:
    # Temporal
    address: str = "localhost:7233"
    namespace: str = "default"
    task_queue: str = "agent"
    ui_url: str = "http://localhost:8233"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    temporal_api_key: str | None = field(default=None, repr=False)
    # The model
    default_model: str = "gpt-4o-mini"
    openai_api_key: str | None = field(default=None, repr=False)
    openai_base_url: str | None = None
    llm_read_timeout: float = 60.0
    # Tools
    tool_modules: tuple[str, ...] = ()
    local_tools: frozenset[str] = frozenset()
    tool_output_cap: int = 50_000
    tool_output_dir: Path = field(default_factory=lambda: default_data_dir() / "tool-output")
    workspace: Path = field(default_factory=lambda: Path.cwd().resolve())
    # Payloads
    storage: str = "file"
    storage_dir: Path = field(default_factory=lambda: default_data_dir() / "payloads")
    storage_threshold: int = 256 * 1024
    compress_threshold: int | None = 2048
    # The worker
    sandbox_precompile: bool = True
    sdk_fallbacks: bool = False
    max_concurrent_activities: int = 200
    log_level: str = "INFO"
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    otel_endpoint: str | None = None
    # S3 / MinIO (keys come from the AWS_* variables boto reads itself)
    aws_endpoint_url: str | None = None
    aws_region: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``env`` (default ``os.environ``); ``overrides`` win."""
        env = os.environ if env is None else env

        def text(name: str, default: str | None = None) -> str | None:
            value = env.get(name, "").strip()
            return value or default

        data_dir = Path(text("AGENT_DATA_DIR") or default_data_dir()).expanduser().resolve()
        settings = cls(
            address=text("TEMPORAL_ADDRESS", "localhost:7233") or "",
            namespace=text("TEMPORAL_NAMESPACE", "default") or "",
            task_queue=text("TEMPORAL_TASK_QUEUE", "agent") or "",
            ui_url=text("TEMPORAL_UI_URL", "http://localhost:8233") or "",
            tls_cert=_optional_path(text("TEMPORAL_TLS_CERT")),
            tls_key=_optional_path(text("TEMPORAL_TLS_KEY")),
            tls_ca=_optional_path(text("TEMPORAL_TLS_CA")),
            temporal_api_key=text("TEMPORAL_API_KEY"),
            default_model=text("AGENT_MODEL", "gpt-4o-mini") or "",
            openai_api_key=text("OPENAI_API_KEY"),
            openai_base_url=text("OPENAI_BASE_URL"),
            llm_read_timeout=_number(env, "AGENT_LLM_READ_TIMEOUT", 60.0),
            tool_modules=tuple(_names(text("AGENT_TOOLS"))),
            local_tools=frozenset(_names(text("AGENT_LOCAL_TOOLS"))),
            tool_output_cap=int(_number(env, "AGENT_TOOL_OUTPUT_CAP", 50_000, whole=True)),
            tool_output_dir=_path(text("AGENT_TOOL_OUTPUT_DIR"), data_dir / "tool-output"),
            workspace=_path(text("AGENT_WORKSPACE"), Path.cwd()),
            storage=text("AGENT_STORAGE", "file") or "file",
            storage_dir=_path(text("AGENT_STORAGE_DIR"), data_dir / "payloads"),
            storage_threshold=int(_number(env, "AGENT_STORAGE_THRESHOLD_BYTES", 256 * 1024, whole=True)),
            compress_threshold=_optional_bytes(env, "AGENT_COMPRESS_THRESHOLD_BYTES", 2048),
            sandbox_precompile=(text("AGENT_SANDBOX_PRECOMPILE", "on") or "on").lower() != "off",
            sdk_fallbacks=(text("AGENT_SDK_FALLBACKS", "off") or "off").lower() in ("1", "on", "true", "yes"),
            max_concurrent_activities=int(_number(env, "AGENT_MAX_CONCURRENT_ACTIVITIES", 200, whole=True)),
            log_level=text("LOG_LEVEL", "INFO") or "INFO",
            metrics_port=int(_number(env, "AGENT_METRICS_PORT", -1, whole=True))
            if text("AGENT_METRICS_PORT")
            else None,
            metrics_host=text("AGENT_METRICS_HOST", "127.0.0.1") or "127.0.0.1",
            otel_endpoint=text("OTEL_EXPORTER_OTLP_ENDPOINT"),
            aws_endpoint_url=text("AWS_ENDPOINT_URL"),
            aws_region=text("AWS_REGION"),
        )
        settings.check()
        return replace(settings, **overrides) if overrides else settings

    def check(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError(
                "TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY go together (mutual TLS): set both or neither."
            )
        for name, path in (
            ("TEMPORAL_TLS_CERT", self.tls_cert),
            ("TEMPORAL_TLS_KEY", self.tls_key),
            ("TEMPORAL_TLS_CA", self.tls_ca),
        ):
            if path is not None and not path.is_file():
                raise SettingsError(f"{name}={path} is not a readable file.")
        if self.storage not in ("file", "off") and not self.storage.startswith("s3://"):
            raise SettingsError(
                f"AGENT_STORAGE must be 'file', 'off' or 's3://bucket/prefix', got {self.storage!r}."
            )
        if self.storage == "file" and self.workspace in (self.storage_dir, *self.storage_dir.parents):
            raise SettingsError(
                f"The payload store {self.storage_dir} is inside the tools' workspace {self.workspace}: "
                "tools could read other conversations. Point AGENT_STORAGE_DIR (or AGENT_DATA_DIR) "
                "outside AGENT_WORKSPACE."
            )

    def workflow_url(self, workflow_id: str) -> str:
        """The conversation's page in the Temporal UI."""
        return f"{self.ui_url.rstrip('/')}/namespaces/{self.namespace}/workflows/{workflow_id}"


def _names(raw: str | None) -> list[str]:
    return [name.strip() for name in (raw or "").split(",") if name.strip()]


def _path(raw: str | None, default: Path) -> Path:
    return Path(raw).expanduser().resolve() if raw else default.resolve()


def _optional_path(raw: str | None) -> Path | None:
    return Path(raw).expanduser().resolve() if raw else None


def _number(env: Mapping[str, str], name: str, default: float, *, whole: bool = False) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise SettingsError(f"{name} must be {kind}, got {raw!r}.") from None
    if value < 0:
        raise SettingsError(f"{name} must not be negative, got {raw!r}.")
    return value


def _optional_bytes(env: Mapping[str, str], name: str, default: int) -> int | None:
    raw = env.get(name, "").strip()
    if raw.lower() == "off":
        return None
    return int(_number(env, name, default, whole=True))
