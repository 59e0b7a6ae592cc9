"""The agent worker: runs ``AgentWorkflow`` and its activities.

    python worker.py [--tools pkg.module[,pkg.other]] [--tools ...]

Configured by the environment (read once, into ``runtime.settings.Settings``):
TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_TASK_QUEUE, AGENT_TOOLS
(comma-separated tool modules), AGENT_MODEL, OPENAI_BASE_URL and
OPENAI_API_KEY; the README lists the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import replace
from datetime import timedelta

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.plugin import SimplePlugin
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities import builtin_tools
from activities.context_store import ContextStore
from activities.llm import ContextTransform, LlmActivities, LlmConverter
from activities.session import SessionActivities
from activities.tool_runner import ToolActivities
from activities.tools import ToolSpec, declarations, registered_tools
from runtime import payload_walk
from runtime.connect import ServerUnreachable, connect
from runtime.payloads import blob_store, probe_s3_storage
from runtime.repair import repair_loop
from runtime.sandbox import workflow_runner
from runtime.settings import Settings, SettingsError, comma_separated
from runtime.telemetry import metrics_runtime, tracing_interceptors
from workflows.agent import AgentWorkflow
from workflows.bindings import BindingsInterceptor, WorkflowBindings
from workflows.contract import SEARCH_ATTRIBUTES
from workflows.hooks import AgentHooks


class ToolModuleError(Exception):
    """A tool module named with --tools or AGENT_TOOLS failed to import."""


def load_tool_modules(names: Sequence[str]) -> None:
    """Import each tool module (its ``@tool`` functions register themselves)."""
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name and not (name == err.name or name.startswith(f"{err.name}.")):
                raise ToolModuleError(
                    f"Cannot load tool module {name!r}: it imports {err.name!r}, which is not installed "
                    "where the worker runs."
                ) from None
            raise ToolModuleError(
                f"Cannot load tool module {name!r}: {err}. "
                "Check the module path (it must be importable from the worker's directory)."
            ) from None
        except Exception as err:  # the module's own code, a tool declaration refused included
            raise ToolModuleError(
                f"Cannot load tool module {name!r}: {type(err).__name__}: {str(err).rstrip('.')}."
            ) from None


def build_worker(
    client: Client,
    settings: Settings,
    *,
    hooks: AgentHooks | None = None,
    transform_context: ContextTransform | None = None,
    convert_to_llm: LlmConverter | None = None,
    llm: LlmActivities | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
    workflows: Sequence[type] = (AgentWorkflow,),
    search_attributes: bool = False,
) -> Worker:
    """The worker with every workflow and activity of the agent.

    ``hooks`` are bound into every conversation this worker runs (workflow
    code: deterministic, versioned like the workflow). ``transform_context``
    and ``convert_to_llm`` run in the LLM activity (pi's hooks of those
    names: what one model call sees); ``llm`` replaces that activity's
    holder altogether (then it needs the settings' key and URL itself). ``tools`` defaults to
    every registered tool; their declarations are what new conversations
    record. ``search_attributes``: the server has the agent's search
    attributes (``missing_search_attributes``), so new conversations keep
    them up to date. A killed worker's cached workflows move to another
    worker after one second (not the default ten), and heartbeats reach the
    server at least once a second, so an abort or a dead worker is noticed
    quickly. Refuses (``SettingsError``) a payload store inside the tools'
    workspace.
    """
    settings.check_workspace()
    tools = dict(registered_tools() if tools is None else tools)
    unknown_local = sorted(settings.local_tools - {"*", *tools})
    if unknown_local:
        logging.warning(
            "AGENT_LOCAL_TOOLS names %s, which this worker does not declare (it declares %s)",
            ", ".join(unknown_local),
            ", ".join(sorted(tools)) or "none",
        )
    declared = declarations(tools, set(settings.local_tools))
    bindings = WorkflowBindings(
        hooks=hooks or AgentHooks(),
        argument_shims={
            name: spec.prepare_arguments for name, spec in tools.items() if spec.prepare_arguments
        },
        # Conversations from before declarations were recorded ran every
        # tool as a plain activity.
        legacy_tools={d.name: d.model_copy(update={"local": False}) for d in declared},
        default_model=settings.default_model,
        track_subscribers=not settings.sdk_fallbacks,
    )
    if llm is not None and (transform_context or convert_to_llm):
        raise ValueError("Pass transform_context and convert_to_llm to LlmActivities when you pass llm.")
    if llm is None:
        blobs = blob_store(settings)
        llm = LlmActivities(
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url,
            transform_context=transform_context,
            convert_to_llm=convert_to_llm,
            read_timeout=settings.llm_read_timeout,
            context_store=(
                ContextStore(blobs, cache_bytes=settings.context_cache_mb * 1024 * 1024) if blobs else None
            ),
            tools=tools,
            secrets=settings.known_secrets(),
            direct_post=settings.direct_model_post and not settings.sdk_fallbacks,
        )
    llm.warm_up()
    # Process-wide: every worker in this process walks alike.
    payload_walk.install(settings.payload_walk and not settings.sdk_fallbacks)
    if settings.sdk_fallbacks:
        logging.info(
            "SDK fallbacks forced on: stock workflow sandbox and payload passes, stream without "
            "subscriber tracking, model calls through the openai client's post"
        )
    builtin_tools.set_workspace(settings.workspace)
    tool_activities = ToolActivities(
        tools,
        output_cap=settings.tool_output_cap,
        output_dir=settings.tool_output_dir,
        secrets=settings.known_secrets(),
    )
    session = SessionActivities(
        settings.default_model,
        declared,
        search_attributes=search_attributes,
        track_subscribers=not settings.sdk_fallbacks,
        model_call_timeout=settings.model_call_timeout,
    )
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=list(workflows),
        workflow_runner=workflow_runner(
            precompile=settings.sandbox_precompile and not settings.sdk_fallbacks
        ),
        activities=[llm.stream_assistant_response, tool_activities.execute_tool, session.session_defaults],
        interceptors=[BindingsInterceptor(bindings)],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        default_heartbeat_throttle_interval=timedelta(seconds=1),
        graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace),
        max_concurrent_activities=settings.max_concurrent_activities,
        # Its model client closes with the worker's run (left to the garbage
        # collector, it could close inside a later workflow task).
        plugins=[SimplePlugin("agent.model-client", run_context=llm.in_use)],
    )


def what_must_match(settings: Settings) -> str:
    """What every worker on the task queue must have alike (README
    "Running it in production"), for the log: tools, payload store and the
    ids (never the keys) of the encryption keys."""
    store = str(settings.storage_dir) if settings.storage == "file" else settings.storage
    keys = ", ".join(key_id for key_id, _ in settings.encryption_keys) or "none"
    return f"Tools: {', '.join(sorted(registered_tools()))}; payload store: {store}; encryption keys: {keys}"


async def missing_search_attributes(client: Client, namespace: str) -> list[str]:
    """The agent's search attributes the server does not have (all of them
    when it cannot tell)."""
    try:
        response = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:  # the worker could only fail later, less clearly
            raise SettingsError(
                f"TEMPORAL_NAMESPACE={namespace}: {err.message.rstrip('.')} on this server. Create it "
                f"(`temporal operator namespace create --namespace {namespace}`) or name one it has."
            ) from None
        logging.warning("Cannot list the server's search attributes: %s", err.message)
        return list(SEARCH_ATTRIBUTES)
    return [name for name in SEARCH_ATTRIBUTES if name not in response.custom_attributes]


QUIET_LOGGERS = ("botocore.credentials", "aiobotocore.credentials", "httpx", "httpx2")


def configure_logging(settings: Settings) -> None:
    """The worker's log at ``LOG_LEVEL``; below DEBUG without the
    lines of libraries that say little and may say too much: botocore's
    "Found credentials in environment variables." at each start, and the
    HTTP client's "HTTP Request: POST <url>" for every model call, whose
    URL holds OPENAI_BASE_URL's password when it has one (a security audit)."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(message)s")
    if settings.log_level != "DEBUG":
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def core_threads(settings: Settings, environ: MutableMapping[str, str] = os.environ) -> Iterator[str]:
    """How many threads the SDK's Rust core runs (its RPCs, polls and
    workflow state machines: about a quarter of a busy worker's CPU, the
    Python thread the rest), for the runtime made inside this block:
    AGENT_CORE_THREADS, else TOKIO_WORKER_THREADS as set, else 1. The
    core's default, a thread per CPU, hands its work between threads: on
    the bench machine that cost ~0.5 ms of CPU per turn for no throughput
    (bench/README.md); one thread keeps up while the single Python thread
    is the limit. The environment is as it was afterwards: processes a
    tool starts do not inherit the setting."""
    before = environ.get("TOKIO_WORKER_THREADS")
    if settings.core_threads is not None:
        environ["TOKIO_WORKER_THREADS"] = str(settings.core_threads)
    else:
        environ.setdefault("TOKIO_WORKER_THREADS", "1")
    try:
        yield environ["TOKIO_WORKER_THREADS"]
    finally:
        if before is None:
            environ.pop("TOKIO_WORKER_THREADS", None)
        else:
            environ["TOKIO_WORKER_THREADS"] = before


async def run_worker(settings: Settings) -> None:
    settings.check_workspace()  # before connecting: one line, at once
    settings.check_writable()
    settings.check_key_file()
    await probe_s3_storage(settings)
    load_tool_modules(settings.tool_modules)
    with core_threads(settings):  # the process's one runtime, made now
        runtime = metrics_runtime(settings) or Runtime.default()
    client = await connect(settings, runtime=runtime, interceptors=tracing_interceptors(settings))
    missing = await missing_search_attributes(client, settings.namespace)
    if missing:
        register = " ".join(f"--name {name} --type {SEARCH_ATTRIBUTES[name]}" for name in missing)
        print(
            f"warning: the server lacks the search attribute(s) {', '.join(missing)}: conversations run "
            "without them (no AgentStatus filter in the UI or `starter.py list`). Register them with "
            f"`temporal operator search-attribute create {register}` and restart the worker.",
            file=sys.stderr,
            flush=True,
        )
    if not settings.openai_api_key:
        # Not a refusal (what a local server takes is not known here), but
        # said now, not first at a user's run (an operator audit).
        print(
            "warning: OPENAI_API_KEY is not set: every model call this worker makes fails until it "
            "is (any value for a local server such as Ollama or vLLM).",
            file=sys.stderr,
            flush=True,
        )
    worker = build_worker(client, settings, search_attributes=not missing)
    # What start-up made (modules, the SDK's and pydantic's tables) lives as
    # long as the process: out of the collector's way, a full collection
    # scans only what conversations made (bench: longest pause 86 ms -> 38-59).
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        logging.info("Worker polling task queue %r on %s", settings.task_queue, settings.address)
        print(f"worker ready: task queue {settings.task_queue!r} on {settings.address}", flush=True)
        logging.info("%s", what_must_match(settings))
        if settings.storage == "off":
            logging.warning(
                "AGENT_STORAGE=off: every payload stays in the history, and Temporal refuses one over its "
                "limit (2 MB by default), so a conversation whose transcript outgrows it stops until "
                "workers with a payload store (AGENT_STORAGE=file or s3://...) take it"
            )
        if settings.metrics_port is not None:
            print(f"metrics: http://{settings.metrics_host}:{settings.metrics_port}/metrics", flush=True)
        # Conversations the SDK core's update fault wedged, reset (runtime/repair.py).
        repairs = None
        if settings.repair_wedged:
            looking = repair_loop(client, settings.task_queue, stop, settings.repair_interval)
            repairs = asyncio.create_task(looking)
        await stop.wait()
        logging.info("Shutting down: finishing running activities")
        if repairs is not None:
            repairs.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="MODULE[,MODULE]",
        help="tool modules to load (comma-separated, as AGENT_TOOLS; repeatable)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics (default AGENT_METRICS_PORT)",
    )
    args = parser.parse_args(argv)
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        parser.error(f"--metrics-port must be a port number (1-65535), not {args.metrics_port}")
    flagged = [name for flag in args.tools for name in comma_separated(flag)]  # a comma list each
    code = 0
    try:
        settings = Settings.from_env()
        settings = replace(
            settings,
            tool_modules=(*settings.tool_modules, *flagged),  # flags add to AGENT_TOOLS
            metrics_port=settings.metrics_port if args.metrics_port is None else args.metrics_port,
        )
        configure_logging(settings)
        asyncio.run(run_worker(settings))
    except (ServerUnreachable, ToolModuleError, SettingsError, ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        code = 2
    except RuntimeError as err:
        if not str(err).startswith("Worker validation failed"):
            raise
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)  # what the server refused
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the SDK can crash at interpreter exit (sdk-python #300)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
