"""Shared fixtures: a real Temporal dev server (its UI reading payloads
through the codec server), the scripted model server and a real worker
process, started once per test session."""

from __future__ import annotations

import hashlib
import os
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.client import Client

from runtime.connect import connect
from runtime.settings import Settings
from testbed.local_stack import CodecServer, DevServer, free_port, start_worker, stop_process
from testbed.scripted_model import ScriptedModelServer
from tests.support.serving import serving
from tests.support.stack import Stack

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
# Outside the tools' workspace (the project), as the worker insists; one per
# checkout, so test runs of two clones never share (or delete) a store.
_CHECKOUT = hashlib.sha256(str(Path(__file__).resolve().parent.parent).encode()).hexdigest()[:8]
DATA = Path(tempfile.gettempdir()) / f"durable-agent-tests-{os.getuid()}-{_CHECKOUT}"
# The payload store of the worker, the codec server and the clients in this process.
PAYLOADS = DATA / "payloads"

# Tests press Ctrl-C in the CLIs they start (SIGINT). A suite started in the
# background by a non-interactive shell (`cmd &`, without job control)
# inherits SIGINT ignored, and its children would too: a starter would then
# never see the Ctrl-C and the test would time out. A handler here is reset
# to the default in each child, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def dev_server(artifacts: Path) -> Iterator[DevServer]:
    codec = CodecServer(env={"AGENT_STORAGE_DIR": str(PAYLOADS)}, log_path=artifacts / "codec-server.log")
    server = DevServer(log_path=artifacts / "dev-server.log", codec=codec).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def model_server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture(scope="session")
def worker_env(dev_server: DevServer, model_server: ScriptedModelServer, artifacts: Path) -> dict[str, str]:
    return {
        "TEMPORAL_ADDRESS": dev_server.address,
        "TEMPORAL_TASK_QUEUE": "agent-tests",
        "OPENAI_BASE_URL": model_server.base_url,
        "OPENAI_API_KEY": "test-key-never-in-history",
        "AGENT_MODEL": "scripted-default",
        "AGENT_LLM_READ_TIMEOUT": "3",
        "AGENT_MODEL_CALL_TIMEOUT": "1500",  # test_continue_as_new: it reaches every model call
        "AGENT_TEST_LEDGER": str(artifacts / "ledger.txt"),
        "AGENT_WORKSPACE": str(Path(__file__).resolve().parent.parent),
        "AGENT_TOOL_OUTPUT_DIR": str(DATA / "tool-output"),
        "AGENT_STORAGE_DIR": str(PAYLOADS),
    }


@pytest.fixture(scope="session")
def metrics_port(worker: int) -> int:
    """Where the shared worker serves its Prometheus metrics."""
    return worker


@pytest.fixture(scope="session")
def worker(worker_env: dict[str, str], artifacts: Path) -> Iterator[int]:
    """The real worker process, shared by the tests that do not kill it
    (the only one serving metrics: on the port it yields). The port is
    chosen once the dev server holds its own, and chosen again if it was
    taken meanwhile (the worker then exits at once: "Address already in use")."""
    for attempt in range(1, 4):
        port = free_port()
        env = {**worker_env, "AGENT_METRICS_PORT": str(port)}
        try:
            process = start_worker(env, ["tests.support.tools"], artifacts / "worker.log")
            break
        except RuntimeError:
            if attempt == 3:
                raise
    yield port
    stop_process(process)


@pytest.fixture(scope="session")
async def client(dev_server: DevServer) -> AsyncIterator[Client]:
    yield await connect(Settings.from_env(address=dev_server.address))


@pytest.fixture
async def stack(
    client: Client, model_server: ScriptedModelServer, worker: int, dev_server: DevServer
) -> Stack:
    """A fresh model name (its own script queue) on the shared worker."""
    return Stack(client, model_server, "agent-tests", f"model-{uuid.uuid4().hex[:8]}", dev_server)


@pytest.fixture
async def fake_s3() -> AsyncIterator[tuple[str, dict[str, bytes]]]:
    """A loopback server answering S3's HEAD, PUT and GET object calls; yields its URL and objects."""
    objects: dict[str, bytes] = {}

    async def handle(request: web.Request) -> web.Response:
        path = request.path
        if request.method == "PUT":
            objects[path] = await request.read()
            return web.Response()
        if path not in objects:
            return web.Response(status=404)
        return web.Response(body=b"" if request.method == "HEAD" else objects[path])

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with serving(app) as url:
        yield url, objects


# Clients in this process read large payloads from the same store as the worker.
os.environ.setdefault("AGENT_TOOL_OUTPUT_DIR", str(DATA / "tool-output"))
os.environ.setdefault("AGENT_STORAGE_DIR", str(PAYLOADS))


# --- the history guard --------------------------------------------------------------

_BENIGN_CAUSES = {
    # The server refused a completion because a new event (a signal) arrived
    # meanwhile; the SDK runs the task again at once. Not a wedge.
    "WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND",
    # The server failed an in-flight task because more events arrived meanwhile
    # than it buffers (100: hundreds of tool activities completing at once);
    # the next task takes them all.
    "WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "expect_task_failures(reason): the test makes workflow tasks fail on purpose (say why)",
    )


_GUARD_CLIENTS: dict[str, Client] = {}


@pytest.fixture(autouse=True)
async def no_failed_workflow_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After each test that used the dev server, read the history of every
    workflow started during it and fail on any WorkflowTaskFailed event: a
    task that fails is retried forever, a wedged conversation for a user."""
    uses_server = bool({"client", "stack", "dev_server"} & set(request.fixturenames))
    if not uses_server or request.node.get_closest_marker("expect_task_failures"):
        yield
        return
    # Its own client: an autouse fixture is set up before the test's
    # fixtures, and an async fixture cannot set up another async one.
    dev_server: DevServer = request.getfixturevalue("dev_server")
    client = _GUARD_CLIENTS.get(dev_server.address)
    if client is None:
        client = await connect(Settings.from_env(address=dev_server.address))
        _GUARD_CLIENTS[dev_server.address] = client
    started = datetime.now(UTC)
    yield
    failures = await failed_workflow_tasks(client, started)
    assert not failures, "workflow tasks failed (a wedged conversation):\n" + "\n".join(failures)


async def failed_workflow_tasks(client: Client, since: datetime) -> list[str]:
    """``id: cause: message`` of each WorkflowTaskFailed event in the
    histories of workflows started since ``since``."""
    failures = []
    async for execution in client.list_workflows(f"StartTime >= '{since.isoformat()}'"):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_task_failed_event_attributes"):
                attributes = event.workflow_task_failed_event_attributes
                cause = WorkflowTaskFailedCause.Name(attributes.cause)
                if cause not in _BENIGN_CAUSES:
                    failures.append(f"{execution.id}: {cause}: {attributes.failure.message[:300]}")
    return failures
