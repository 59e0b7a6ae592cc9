"""What the worker tells the outside world about itself: Prometheus metrics
(the SDK's own, plus the agent's: tokens, cost, model and tool latency and
errors, turns, approvals) and, optionally, OpenTelemetry traces through the
SDK's contrib interceptor."""

from __future__ import annotations

import logging
from typing import Any

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from runtime.settings import Settings, SettingsError

log = logging.getLogger(__name__)


def metrics_runtime(settings: Settings) -> Runtime | None:
    """A Temporal runtime serving Prometheus metrics on
    ``AGENT_METRICS_HOST:AGENT_METRICS_PORT`` (None: no metrics endpoint).
    One per process, made before the worker's client connects."""
    if settings.metrics_port is None:
        return None
    address = f"{settings.metrics_host}:{settings.metrics_port}"
    try:
        return Runtime(
            telemetry=TelemetryConfig(
                metrics=PrometheusConfig(
                    bind_address=address, counters_total_suffix=True, durations_as_seconds=True
                )
            )
        )
    except (RuntimeError, ValueError) as err:
        detail = str(err).splitlines()[0].rstrip(".")
        hint = (
            " (AGENT_METRICS_HOST takes an IP address such as 127.0.0.1)"
            if "address syntax" in detail
            else ""
        )
        raise SettingsError(
            f"Cannot serve metrics on {address} (AGENT_METRICS_HOST:AGENT_METRICS_PORT): {detail}{hint}."
        ) from None


def tracing_interceptors(settings: Settings, span_exporter: Any = None) -> list[Any]:
    """The SDK's OpenTelemetry ``TracingInterceptor`` sending spans to
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (OTLP over HTTP), or to ``span_exporter``
    (tests); none when neither is given. Needs the ``otel`` extra."""
    if span_exporter is None and not settings.otel_endpoint:
        return []
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from temporalio.contrib.opentelemetry import TracingInterceptor
    except ImportError as err:
        raise ImportError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set but {err.name} is missing: pip install -e '.[otel]'."
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": "durable-agent-worker"}))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otel_endpoint.rstrip("/") + "/v1/traces"  # type: ignore[union-attr]
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    log.info("Tracing to %s", settings.otel_endpoint or span_exporter)
    return [TracingInterceptor(tracer=provider.get_tracer("durable-agent"))]
