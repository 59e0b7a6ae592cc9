"""Every setting of the worker, the clients and the codec server, read once
from the environment into one typed object and passed in from there.

No other module reads ``os.environ``: a part that needs a setting takes it
as an argument (``Settings.from_env()`` is called by each entry point).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

GRPC_COMPRESSIONS = ("gzip", "none")
MAX_MODEL_CALL_SECONDS = 7 * 86_400
"""The longest AGENT_MODEL_CALL_TIMEOUT: a week."""
MAX_STORAGE_THRESHOLD = 1024 * 1024
"""The largest AGENT_STORAGE_THRESHOLD_BYTES: Temporal refuses payloads
above 2 MB, and a workflow task's commands together above 4 MB; payloads
up to half of one leave room for the rest of a model call's input."""


class SettingsError(ValueError):
    """A setting has a value that cannot be used (the message names it)."""


def grpc_compression_name(value: str) -> str:
    """AGENT_GRPC_COMPRESSION's value as one of ``GRPC_COMPRESSIONS``, or a
    ``SettingsError`` naming the setting and the value as written."""
    name = value.lower()
    if name not in GRPC_COMPRESSIONS:
        raise SettingsError(f"AGENT_GRPC_COMPRESSION must be 'gzip' or 'none', got {value!r}.")
    return name


# A compressed payload may expand to at most this many bytes when read: a
# payload is at most 2 MB in the history, a stored one a few MB of JSON, so
# anything far larger is a decompression bomb.
DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the agent keeps its data by default: the user's data directory
    (``$XDG_DATA_HOME/durable-agent``, else ``~/.local/share/durable-agent``),
    never inside a tool's workspace; read from ``env`` (default
    ``os.environ``)."""
    env = os.environ if env is None else env
    base = (env.get("XDG_DATA_HOME") or "").strip() or str(Path(_home(env)) / ".local" / "share")
    return Path(base).resolve() / "durable-agent"


def _home(env: Mapping[str, str]) -> str:
    """The home directory ``~`` stands for in ``env``'s paths: its ``HOME``."""
    return (env.get("HOME") or "").strip() or str(Path.home())


def _expanded(raw: str, env: Mapping[str, str]) -> Path:
    """``raw`` with a leading ``~`` (not ``~user``) as ``env``'s home."""
    if raw == "~" or raw.startswith("~/"):
        return Path(_home(env), raw[2:])
    return Path(raw).expanduser()


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
    grpc_compression: str = "none"
    """AGENT_GRPC_COMPRESSION: "none" or "gzip" (the SDK's own default), for
    this process's calls to the Temporal server. None by default: payloads
    of 2 KB or more are compressed by the codec already, and gzip on every
    call cost ~1.5-6% of the worker's CPU and ~3-10% of the server's per turn
    (bench/README.md, change 38)."""
    # The model
    default_model: str = "gpt-4o-mini"
    openai_api_key: str | None = field(default=None, repr=False)
    openai_base_url: str | None = None
    llm_read_timeout: float = 60.0
    model_call_timeout: float = 1800.0
    """Seconds one attempt of a model call may take in all (the activity's
    start-to-close timeout), recorded by each conversation when it starts."""
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
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    # AES-256-GCM keys as (key id, 32 bytes): the first encrypts, all decrypt.
    encryption_keys: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    encryption_key_file: Path | None = None
    # The worker
    sandbox_precompile: bool = True
    payload_walk: bool = True
    direct_model_post: bool = True
    sdk_fallbacks: bool = False
    max_concurrent_activities: int = 200
    context_cache_mb: int = 64
    """AGENT_CONTEXT_CACHE_MB: stored context (as JSON) the worker keeps parsed in memory."""
    core_threads: int | None = None
    """AGENT_CORE_THREADS: threads of the SDK's Rust core (None: unset; see ``worker.core_threads``)."""
    tokio_worker_threads: int | None = None
    """TOKIO_WORKER_THREADS as given (the Rust core reads it from the environment; checked here)."""
    shutdown_grace: float = 5.0
    repair_wedged: bool = True
    """AGENT_REPAIR_WEDGED: reset conversations the SDK core's update fault wedged (runtime/repair.py)."""
    repair_interval: float = 30.0
    """AGENT_REPAIR_INTERVAL_SECONDS: how often the worker looks for them."""
    log_level: str = "INFO"
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    otel_endpoint: str | None = None
    # The codec server (codec_server.py); no origins: its defaults
    codec_token: str | None = field(default=None, repr=False)
    codec_cors_origins: tuple[str, ...] = ()
    # S3 / MinIO (keys come from the AWS_* variables boto reads itself)
    aws_endpoint_url: str | None = None
    aws_region: str | None = None
    # Only to scrub it from error texts; boto reads its own keys.
    aws_secret_access_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``env`` (default ``os.environ``); ``overrides`` win."""
        env = os.environ if env is None else env

        def text(name: str, default: str | None = None) -> str | None:
            value = env.get(name, "").strip()
            return value or default

        def path(name: str, default: Path) -> Path:
            raw = text(name)
            return _expanded(raw, env).resolve() if raw else default.resolve()

        def optional_path(name: str) -> Path | None:
            raw = text(name)
            return _expanded(raw, env).resolve() if raw else None

        data_dir = path("AGENT_DATA_DIR", default_data_dir(env))
        settings = cls(
            address=text("TEMPORAL_ADDRESS", "localhost:7233") or "",
            namespace=text("TEMPORAL_NAMESPACE", "default") or "",
            task_queue=text("TEMPORAL_TASK_QUEUE", "agent") or "",
            ui_url=text("TEMPORAL_UI_URL", "http://localhost:8233") or "",
            tls_cert=optional_path("TEMPORAL_TLS_CERT"),
            tls_key=optional_path("TEMPORAL_TLS_KEY"),
            tls_ca=optional_path("TEMPORAL_TLS_CA"),
            temporal_api_key=text("TEMPORAL_API_KEY"),
            grpc_compression=text("AGENT_GRPC_COMPRESSION", "none") or "none",
            default_model=text("AGENT_MODEL", "gpt-4o-mini") or "",
            openai_api_key=text("OPENAI_API_KEY"),
            openai_base_url=text("OPENAI_BASE_URL"),
            llm_read_timeout=_number(env, "AGENT_LLM_READ_TIMEOUT", 60.0, positive=True, maximum=86_400),
            model_call_timeout=_number(
                env, "AGENT_MODEL_CALL_TIMEOUT", 1800.0, positive=True, maximum=MAX_MODEL_CALL_SECONDS
            ),
            tool_modules=tuple(comma_separated(text("AGENT_TOOLS"))),
            local_tools=frozenset(comma_separated(text("AGENT_LOCAL_TOOLS"))),
            tool_output_cap=int(_number(env, "AGENT_TOOL_OUTPUT_CAP", 50_000, whole=True)),
            tool_output_dir=path("AGENT_TOOL_OUTPUT_DIR", data_dir / "tool-output"),
            workspace=path("AGENT_WORKSPACE", Path.cwd()),
            storage=text("AGENT_STORAGE", "file") or "file",
            storage_dir=path("AGENT_STORAGE_DIR", data_dir / "payloads"),
            storage_threshold=int(
                _number(
                    env,
                    "AGENT_STORAGE_THRESHOLD_BYTES",
                    256 * 1024,
                    whole=True,
                    # Temporal refuses a payload above 2 MB: a larger one kept in the
                    # history jams its workflow task (TMPRL1103) on every attempt.
                    maximum=MAX_STORAGE_THRESHOLD,
                )
            ),
            compress_threshold=_optional_bytes(env, "AGENT_COMPRESS_THRESHOLD_BYTES", 2048),
            max_decompressed_bytes=int(
                _number(env, "AGENT_MAX_DECOMPRESSED_BYTES", DEFAULT_MAX_DECOMPRESSED_BYTES, whole=True)
            ),
            encryption_keys=encryption_keys(env),
            encryption_key_file=optional_path("AGENT_ENCRYPTION_KEY_FILE"),
            sandbox_precompile=_switch(env, "AGENT_SANDBOX_PRECOMPILE", True),
            payload_walk=_switch(env, "AGENT_PAYLOAD_WALK", True),
            direct_model_post=_switch(env, "AGENT_DIRECT_MODEL_POST", True),
            sdk_fallbacks=_switch(env, "AGENT_SDK_FALLBACKS", False),
            # 0 would start a worker that never runs a model call: every conversation waits.
            max_concurrent_activities=int(
                _number(env, "AGENT_MAX_CONCURRENT_ACTIVITIES", 200, whole=True, positive=True)
            ),
            # 0 would read every stored context from disk and parse it again at each model call.
            context_cache_mb=int(_number(env, "AGENT_CONTEXT_CACHE_MB", 64, whole=True, positive=True)),
            core_threads=(
                int(_number(env, "AGENT_CORE_THREADS", 1, whole=True, positive=True, maximum=256))
                if text("AGENT_CORE_THREADS")
                else None
            ),
            # Read by the SDK's Rust core itself, where a bad value is a panic
            # and a traceback (an operator audit): checked here, not kept.
            tokio_worker_threads=(
                int(_number(env, "TOKIO_WORKER_THREADS", 1, whole=True, positive=True, maximum=256))
                if text("TOKIO_WORKER_THREADS")
                else None
            ),
            shutdown_grace=_number(env, "AGENT_SHUTDOWN_GRACE_SECONDS", 5.0, maximum=86_400),
            repair_wedged=_switch(env, "AGENT_REPAIR_WEDGED", True),
            repair_interval=_number(
                env, "AGENT_REPAIR_INTERVAL_SECONDS", 30.0, positive=True, maximum=86_400
            ),
            log_level=(text("LOG_LEVEL", "INFO") or "INFO").upper(),
            metrics_port=_port(env, "AGENT_METRICS_PORT"),
            metrics_host=text("AGENT_METRICS_HOST", "127.0.0.1") or "127.0.0.1",
            otel_endpoint=text("OTEL_EXPORTER_OTLP_ENDPOINT"),
            codec_token=text("AGENT_CODEC_TOKEN"),
            codec_cors_origins=tuple(
                origin.rstrip("/") for origin in comma_separated(text("AGENT_CODEC_CORS_ORIGINS"))
            ),
            aws_endpoint_url=text("AWS_ENDPOINT_URL"),
            aws_region=text("AWS_REGION"),
            aws_secret_access_key=text("AWS_SECRET_ACCESS_KEY"),
        )
        settings.check()
        return replace(settings, **overrides) if overrides else settings

    def check(self) -> None:
        host, colon, port = self.address.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            # The SDK's own words ("invalid target URL") named no setting,
            # and from starter.py came with a traceback (an operator audit).
            raise SettingsError(
                f"TEMPORAL_ADDRESS must be HOST:PORT (such as localhost:7233), got {self.address!r}."
            )
        for name, url in (
            ("TEMPORAL_UI_URL", self.ui_url),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.otel_endpoint),
        ):
            if url is not None and not _is_http_url(url):
                raise SettingsError(f"{name} must be an http:// or https:// URL, got {url!r}.")
        for origin in self.codec_cors_origins:
            if not _is_http_url(origin):
                raise SettingsError(
                    f"AGENT_CODEC_CORS_ORIGINS holds {origin!r}: each origin is an http:// or https:// "
                    "URL such as http://localhost:8233."
                )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError(
                "TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY go together (mutual TLS): set both or neither."
            )
        for name, path in (
            ("TEMPORAL_TLS_CERT", self.tls_cert),
            ("TEMPORAL_TLS_KEY", self.tls_key),
            ("TEMPORAL_TLS_CA", self.tls_ca),
        ):
            if path is None:
                continue
            if not path.is_file():
                raise SettingsError(f"{name}={path} is not a readable file.")
            try:
                path.read_bytes()  # read by the connection later, where a failure is a traceback
            except OSError as err:
                raise SettingsError(f"{name}={path} cannot be read ({err.strerror or err}).") from None
        if self.max_decompressed_bytes < 1024 * 1024:
            raise SettingsError(
                f"AGENT_MAX_DECOMPRESSED_BYTES={self.max_decompressed_bytes} is below 1 MiB: "
                "payloads of up to 2 MB must still read."
            )
        grpc_compression_name(self.grpc_compression)
        if self.storage not in ("file", "off") and not self.storage.startswith("s3://"):
            raise SettingsError(
                f"AGENT_STORAGE must be 'file', 'off' or 's3://bucket/prefix', got {self.storage!r}."
            )
        if self.storage.startswith("s3://") and not self.storage.removeprefix("s3://").partition("/")[0]:
            raise SettingsError(
                f"AGENT_STORAGE={self.storage!r} names no bucket; use s3://bucket or s3://bucket/prefix."
            )
        if self.openai_base_url and not self.openai_base_url.lower().startswith(("http://", "https://")):
            raise SettingsError(
                f"OPENAI_BASE_URL must be an http:// or https:// URL such as http://localhost:11434/v1, "
                f"got {self.openai_base_url!r}."
            )
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            raise SettingsError(
                f"LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR or CRITICAL, got {self.log_level!r}."
            )

    def check_workspace(self) -> None:
        """For a process that runs tools (the worker): its tools must not
        reach the payload store or the full outputs of other conversations'
        tools. Clients and the codec server run no tools and do not ask
        (their default workspace, the working directory, may well hold the
        default store: run from the home directory)."""
        kept = (
            [("The payload store", self.storage_dir, "AGENT_STORAGE_DIR")] if self.storage == "file" else []
        )
        kept.append(("The tool output directory", self.tool_output_dir, "AGENT_TOOL_OUTPUT_DIR"))
        for what, path, setting in kept:
            if self.workspace in (path, *path.parents):
                raise SettingsError(
                    f"{what} {path} is inside the tools' workspace {self.workspace}: tools could read "
                    f"other conversations. Point {setting} (or AGENT_DATA_DIR) outside AGENT_WORKSPACE."
                )
            if path in self.workspace.parents:
                raise SettingsError(
                    f"The tools' workspace {self.workspace} is inside {what.lower()} {path}: tools could "
                    f"read other conversations. Point AGENT_WORKSPACE outside {setting} (or AGENT_DATA_DIR)."
                )
        if not self.workspace.is_dir():
            raise SettingsError(
                f"AGENT_WORKSPACE={self.workspace} is not a directory: the file tools read inside it."
            )
        for setting, key_file in (
            ("AGENT_ENCRYPTION_KEY_FILE", self.encryption_key_file),
            ("TEMPORAL_TLS_KEY", self.tls_key),
        ):
            if key_file is not None and self.workspace in key_file.parents:
                raise SettingsError(
                    f"{setting} {key_file} is inside the tools' workspace {self.workspace}: "
                    "tools could read the key. Keep it outside AGENT_WORKSPACE."
                )

    def check_writable(self) -> None:
        """For the worker, before it takes work: the directories it writes
        (the payload store, full tool outputs) can be written, so a wrong
        path is one line at start, not every large payload failing later
        (blamed on whichever tool produced it)."""
        if self.storage == "file":  # every model call writes its context there
            problem = _unwritable(self.storage_dir)
            if problem:
                raise SettingsError(
                    f"AGENT_STORAGE_DIR={self.storage_dir} cannot be written: {problem}. "
                    "Point it (or AGENT_DATA_DIR) at a directory this user can write."
                )
        problem = _unwritable(self.tool_output_dir)
        if problem:  # written only for an output over the cap: a read-only file system may never need it
            logging.warning(
                "AGENT_TOOL_OUTPUT_DIR=%s cannot be written (%s): a tool output over "
                "AGENT_TOOL_OUTPUT_CAP will be cut without its full text kept",
                self.tool_output_dir,
                problem,
            )

    def check_key_file(self) -> None:
        """For the processes that hold the keys (the worker, the codec
        server): a warning when ``AGENT_ENCRYPTION_KEY_FILE`` can be read by
        other users of the machine, as ``ssh`` says of a private key. Not
        refused: a Kubernetes secret volume mounts its files 0644 unless
        told otherwise (``defaultMode: 0400``)."""
        if self.encryption_key_file is None:
            return
        try:
            mode = self.encryption_key_file.stat().st_mode  # through a symlink, as it was read
        except OSError:
            return  # it was read a moment ago; a file gone meanwhile is the next start's error
        if mode & 0o077:
            logging.warning(
                "AGENT_ENCRYPTION_KEY_FILE=%s can be read by other users (mode %s): anyone who "
                "can read it can read every conversation. Make it the owner's alone "
                "(chmod 600; a Kubernetes secret volume: defaultMode: 0400)",
                self.encryption_key_file,
                oct(stat.S_IMODE(mode)),
            )

    def known_secrets(self) -> tuple[str, ...]:
        """The secret values this process holds, to scrub from error texts verbatim."""
        values = (
            self.openai_api_key,
            self.temporal_api_key,
            self.codec_token,
            self.aws_secret_access_key,
            *_url_secrets(self.openai_base_url),
        )
        # Every way a key may be written (taken in standard or URL-safe
        # base64, with or without padding): a URL-safe one in a file a tool
        # read went to the model (a security audit).
        keys = tuple(
            form
            for _, key in self.encryption_keys
            for encoded in (base64.b64encode(key).decode(), base64.urlsafe_b64encode(key).decode())
            for form in (encoded, encoded.rstrip("="))
        )
        return tuple(dict.fromkeys(v for v in (*values, *keys) if v))

    def workflow_url(self, workflow_id: str) -> str:
        """The conversation's page in the Temporal UI."""
        return f"{self.ui_url.rstrip('/')}/namespaces/{self.namespace}/workflows/{workflow_id}"


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot take a new file (made if missing, 0700), or None."""
    from activities.blobs import private_dirs  # the worker's: settings stay importable alone

    try:
        private_dirs(path)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".writable-"):
            pass
    except OSError as err:
        return str(err.strerror or err)
    return None


def comma_separated(raw: str | None) -> list[str]:
    """The names of a comma-separated setting, blanks dropped."""
    return [name.strip() for name in (raw or "").split(",") if name.strip()]


def _number(
    env: Mapping[str, str],
    name: str,
    default: float,
    *,
    whole: bool = False,
    positive: bool = False,
    maximum: float | None = None,
) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise SettingsError(f"{name} must be {kind}, got {raw!r}.") from None
    if not math.isfinite(value):
        raise SettingsError(f"{name} must be a finite number, got {raw!r}.")
    if value < 0:
        raise SettingsError(f"{name} must not be negative, got {raw!r}.")
    if positive and value == 0:
        raise SettingsError(f"{name} must be above 0, got {raw!r}.")
    if maximum is not None and value > maximum:
        limit = str(int(maximum)) if float(maximum).is_integer() else f"{maximum:g}"
        raise SettingsError(f"{name} must be at most {limit}, got {raw!r}.")
    return value


_SWITCH_WORDS = {
    "on": True,
    "true": True,
    "yes": True,
    "1": True,
    "off": False,
    "false": False,
    "no": False,
    "0": False,
}


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    """An on/off setting: ``on``/``off`` (or true/false, yes/no, 1/0); any
    other value is refused rather than read as one of them."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    value = _SWITCH_WORDS.get(raw.lower())
    if value is None:
        raise SettingsError(f"{name} must be on or off, got {raw!r}.")
    return value


def _is_http_url(text: str) -> bool:
    """Whether ``text`` is an http(s) URL with a host."""
    scheme, _, rest = text.partition("://")
    return scheme.lower() in ("http", "https") and bool(rest.split("/", 1)[0])


def _port(env: Mapping[str, str], name: str) -> int | None:
    if not env.get(name, "").strip():
        return None
    port = int(_number(env, name, 0, whole=True))
    if not 0 < port < 65536:
        raise SettingsError(f"{name} must be a port number from 1 to 65535, got {port}.")
    return port


def _optional_bytes(env: Mapping[str, str], name: str, default: int) -> int | None:
    raw = env.get(name, "").strip()
    if raw.lower() == "off":
        return None
    return int(_number(env, name, default, whole=True))


# --- encryption keys ----------------------------------------------------------------

_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
KEY_BYTES = 32  # AES-256


def encryption_keys(env: Mapping[str, str]) -> tuple[tuple[str, bytes], ...]:
    """The payload encryption keys, first one first, from one of:

    - ``AGENT_ENCRYPTION_KEYS=id1:BASE64,id2:BASE64`` (rotation: the first
      encrypts, every one decrypts);
    - ``AGENT_ENCRYPTION_KEY_FILE=path``: the same, one ``id:BASE64`` per
      line (``#`` starts a comment), for secrets mounted as files;
    - ``AGENT_ENCRYPTION_KEY=BASE64``: one key, its id derived from it.

    Each key is 32 random bytes in base64 (``openssl rand -base64 32``).
    """
    given = {name: env.get(name, "").strip() for name in _KEY_SETTINGS}
    named = [name for name, value in given.items() if value]
    if len(named) > 1:
        raise SettingsError(f"Set one of {', '.join(_KEY_SETTINGS)}, not {' and '.join(named)}.")
    if not named:
        return ()
    name, value = named[0], given[named[0]]
    if name == "AGENT_ENCRYPTION_KEY":
        key = _key_bytes(value, name)
        return ((key_id_of(key), key),)
    if name == "AGENT_ENCRYPTION_KEY_FILE":
        path = _expanded(value, env)
        try:
            text = path.read_text()
        except OSError as err:
            raise SettingsError(
                f"AGENT_ENCRYPTION_KEY_FILE={path} cannot be read ({err.strerror})."
            ) from None
        entries = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    else:
        entries = value.split(",")
    keys: list[tuple[str, bytes]] = []
    for number, entry in enumerate((e.strip() for e in entries), start=1):
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        key_id = key_id.strip()
        if not sep or not _KEY_ID.fullmatch(key_id):
            raise SettingsError(
                f"{name}: entry {number} is not ID:BASE64 (an ID of letters, digits, '.', '_' "
                "or '-', a colon, the key), e.g. 2025-01:$(openssl rand -base64 32)."
            )
        if any(key_id == known for known, _ in keys):
            raise SettingsError(f"{name}: key id {key_id!r} is given twice; each key needs its own id.")
        keys.append((key_id, _key_bytes(encoded.strip(), f"{name} (key {key_id!r})")))
    if not keys:
        raise SettingsError(f"{name} is set but holds no key; give at least one ID:BASE64.")
    return tuple(keys)


_KEY_SETTINGS = ("AGENT_ENCRYPTION_KEYS", "AGENT_ENCRYPTION_KEY_FILE", "AGENT_ENCRYPTION_KEY")


def key_id_of(key: bytes) -> str:
    """The id of a key given without one: a fingerprint that does not reveal it."""
    return "k" + hashlib.sha256(b"durable-agent key id\0" + key).hexdigest()[:16]


def _key_bytes(encoded: str, name: str) -> bytes:
    """32 bytes from standard or URL-safe base64 (padding optional), else a sentence."""
    padded = encoded + "=" * (-len(encoded) % 4)
    key = b""
    for altchars in (None, b"-_"):
        try:
            key = base64.b64decode(padded, altchars=altchars, validate=True)
            break
        except (binascii.Error, ValueError):
            continue
    if len(key) != KEY_BYTES:
        raise SettingsError(
            f"{name} must be {KEY_BYTES} random bytes in base64 (make one with `openssl rand -base64 32`)."
        )
    return key


_KEY_PARAMETERS = re.compile(r"(?i)(?:^|[-_])(?:key|token|secret|password|sig|signature)$")


def _url_secrets(url: str | None) -> tuple[str, ...]:
    """The secrets a URL carries: its password (``http://user:PASSWORD@host``)
    and the values of query parameters named as keys (``?api-key=...``, as
    Azure's endpoints take one). A security audit found the password in the
    bare text of a model server's error."""
    if not url:
        return ()
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return ()
    keys = [value for name, value in parse_qsl(parts.query) if _KEY_PARAMETERS.search(name)]
    return tuple(v for v in (password, *keys) if v)
