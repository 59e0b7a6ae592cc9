"""Numbers on a dashboard: the worker's Prometheus endpoint, after a
conversation, counts its tokens, cost, model calls, tool calls and errors,
turns and approvals, beside the SDK's own metrics; and traces go to
OpenTelemetry when asked."""

from __future__ import annotations

import asyncio
import datetime
import re
import socket
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import opentelemetry.exporter.otlp.proto.http.trace_exporter as otlp_http
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.connect import connect
from runtime.settings import Settings, SettingsError
from runtime.telemetry import metrics_runtime, tracing_interceptors
from testbed.local_stack import free_port, start_ready_process, stop_process
from tests.support.stack import EventLog, Stack


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def value(text: str, name: str, **labels: str) -> float:
    """The sample ``name{labels...}`` (labels matched as a subset); 0 if absent."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def eventually(port: int, check: Any, timeout: float = 10) -> str:
    """Metrics are exported asynchronously: scrape until ``check`` holds."""
    text = ""
    for _ in range(int(timeout / 0.2)):
        text = scrape(port)
        if check(text):
            return text
        await asyncio.sleep(0.2)
    return text


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


async def test_the_metrics_endpoint_counts_a_conversation(stack: Stack, metrics_port: int) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 20}
    stack.script(
        {"tool_calls": [call("c1", "calculator", expression="1+1"), call("x1", "explode")], "usage": usage},
        {"tool_calls": [call("g1", "guarded_echo", text="ok")], "usage": usage},
        {"fault": {"kind": "status", "status": 400, "message": "bad"}},
    )
    handle = await stack.start(prompt="go")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_approval_request")
    await handle.execute_update("approve_tool", {"toolCallId": "g1", "approved": True})
    await log.wait_for_type("agent_end")
    log.close()
    model = stack.model

    text = await eventually(metrics_port, lambda t: value(t, "agent_turns_total", model=model) >= 3)
    assert value(text, "agent_turns_total", model=model) == 3
    assert value(text, "agent_model_tokens_input_total", model=model) == 200
    assert value(text, "agent_model_tokens_output_total", model=model) == 40
    assert value(text, "agent_model_errors_total", model=model, error_class="ModelHttp400") == 1
    assert value(text, "agent_model_call_latency_count", model=model) == 2
    assert value(text, "agent_tool_errors_total", tool="explode") >= 1
    assert value(text, "agent_tool_latency_count", tool="calculator") >= 1
    assert value(text, "agent_approvals_total", tool="guarded_echo", outcome="approved") >= 1
    assert value(text, "agent_approval_wait_count", tool="guarded_echo") >= 1
    assert "agent_model_cost_microdollars_total" in text
    # The SDK's own runtime metrics are there too.
    assert "temporal_workflow_task_execution_latency" in text or "temporal_request" in text
    await handle.signal("close")


async def test_traces_go_to_opentelemetry(stack: Stack, worker_env: dict[str, str]) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from client import start_conversation
    from worker import build_worker

    exporter = InMemorySpanExporter()
    queue = f"traced-{uuid.uuid4().hex[:6]}"
    settings = Settings.from_env(worker_env, task_queue=queue)
    client = await connect(settings, interceptors=tracing_interceptors(settings, span_exporter=exporter))
    stack.script({"tool_calls": [call("t1", "calculator", expression="2*2")]}, {"text": "4"})
    async with build_worker(client, settings):
        handle = await start_conversation(
            client,
            f"traced-{uuid.uuid4().hex[:6]}",
            {"model": stack.model, "prompt": "2*2?", "closeWhenIdle": True},
            task_queue=queue,
        )
        await asyncio.wait_for(handle.result(), 30)
    names = {span.name for span in exporter.get_finished_spans()}
    assert "StartWorkflow:AgentWorkflow" in names
    assert "RunActivity:execute_tool" in names and "RunActivity:stream_assistant_response" in names


async def test_the_metrics_port_flag_serves_metrics_without_the_variable(
    stack: Stack, worker_env: dict[str, str], artifacts: Path
) -> None:
    """``worker.py --metrics-port`` does what AGENT_METRICS_PORT does."""
    port = free_port()
    env = {k: v for k, v in worker_env.items() if k != "AGENT_METRICS_PORT"}
    env["TEMPORAL_TASK_QUEUE"] = f"metrics-flag-{uuid.uuid4().hex[:6]}"
    for log in ("worker-metrics-flag.log", "worker-no-metrics.log"):
        (artifacts / log).unlink(missing_ok=True)  # appended to: only this run's lines
    process = start_ready_process(
        [sys.executable, "worker.py", "--metrics-port", str(port)], env, artifacts / "worker-metrics-flag.log"
    )
    try:
        text = await asyncio.to_thread(scrape, port)
        assert "temporal_" in text or "agent_" in text
    finally:
        stop_process(process)
    assert f"metrics: http://127.0.0.1:{port}/metrics" in await logged(artifacts / "worker-metrics-flag.log")

    env["TEMPORAL_TASK_QUEUE"] = f"metrics-none-{uuid.uuid4().hex[:6]}"
    stop_process(start_ready_process([sys.executable, "worker.py"], env, artifacts / "worker-no-metrics.log"))
    # It printed "metrics: http://127.0.0.1:None/metrics" without a port.
    assert "metrics:" not in await logged(artifacts / "worker-no-metrics.log")


async def logged(path: Path) -> str:
    """A stopped worker's log, once the thread copying its output is done."""
    await asyncio.sleep(1)
    return path.read_text()


def test_metric_durations_are_in_seconds() -> None:
    """README: agent_model_call_latency and agent_tool_latency are histograms in seconds."""
    port = free_port()
    runtime = metrics_runtime(Settings.from_env({}, metrics_host="127.0.0.1", metrics_port=port))
    assert runtime is not None
    latency = runtime.metric_meter.create_histogram_timedelta("audit_latency", "a duration")
    latency.record(datetime.timedelta(seconds=2))
    text = ""
    for _ in range(50):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        if "audit_latency_sum" in text:
            break
        time.sleep(0.1)
    sums = [line for line in text.splitlines() if line.startswith("audit_latency_sum")]
    assert sums and float(sums[0].rsplit(" ", 1)[1]) == 2


def test_a_metrics_port_in_use_is_refused_naming_the_settings() -> None:
    """A second worker on the same host and port gets one sentence saying what to change, not a traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SettingsError) as refused:
            metrics_runtime(Settings.from_env({}, metrics_port=port))
    assert str(refused.value).startswith(
        f"Cannot serve metrics on 127.0.0.1:{port} (AGENT_METRICS_HOST:AGENT_METRICS_PORT): "
    )
    assert "Address already in use" in str(refused.value)


def test_traces_go_to_the_collectors_v1_traces_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT is the collector's base URL (a trailing slash or not), as OTLP says."""
    endpoints: list[str] = []

    class Exporter(InMemorySpanExporter):
        def __init__(self, endpoint: str) -> None:
            super().__init__()
            endpoints.append(endpoint)

    monkeypatch.setattr(otlp_http, "OTLPSpanExporter", Exporter)
    for given in ("http://collector:4318", "http://collector:4318/"):
        assert len(tracing_interceptors(Settings.from_env({}, otel_endpoint=given))) == 1
    assert endpoints == ["http://collector:4318/v1/traces"] * 2


def test_spans_name_the_worker_as_their_service() -> None:
    """A tracing UI lists the worker's spans under service.name durable-agent-worker."""
    exporter = InMemorySpanExporter()
    [interceptor] = tracing_interceptors(Settings.from_env({}), span_exporter=exporter)
    interceptor.tracer.start_span("a span").end()
    [span] = exporter.get_finished_spans()
    assert span.resource.attributes["service.name"] == "durable-agent-worker"
