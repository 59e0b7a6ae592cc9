"""The Temporal client every entry point uses: the worker, the clients, the
codec server's tests. One place builds it: address, namespace, TLS or an
API key (Temporal Cloud) as the settings say, and the project's data
converter (pi's camelCase JSON, compression, external storage)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.service import GrpcCompression, TLSConfig

from runtime.payloads import data_converter
from runtime.settings import Settings, grpc_compression_name

_COMPRESSIONS = {"gzip": GrpcCompression.GZIP, "none": GrpcCompression.NONE}


class ServerUnreachable(Exception):
    """The Temporal server could not be reached (the message says what to do)."""


def tls_config(settings: Settings) -> TLSConfig | bool:
    """The SDK's TLS options from TEMPORAL_TLS_* (False: plain TCP, True: TLS
    with the system's roots, as an API key needs)."""
    if not (settings.tls_cert or settings.tls_ca):
        return bool(settings.temporal_api_key)
    return TLSConfig(
        server_root_ca_cert=settings.tls_ca.read_bytes() if settings.tls_ca else None,
        client_cert=settings.tls_cert.read_bytes() if settings.tls_cert else None,
        client_private_key=settings.tls_key.read_bytes() if settings.tls_key else None,
    )


async def connect(
    settings: Settings, *, runtime: Runtime | None = None, interceptors: Sequence[Any] = ()
) -> Client:
    """A client of the server ``settings`` name, or ``ServerUnreachable``
    (``runtime``: the worker's metrics runtime; ``interceptors``: tracing)."""
    try:
        return await Client.connect(
            settings.address,
            namespace=settings.namespace,
            data_converter=data_converter(settings),
            tls=tls_config(settings),
            api_key=settings.temporal_api_key,
            runtime=runtime,
            interceptors=interceptors,
            # Checked here too: Settings built without from_env skip check().
            grpc_compression=_COMPRESSIONS[grpc_compression_name(settings.grpc_compression)],
        )
    except RuntimeError as err:
        raise ServerUnreachable(_unreachable(settings, str(err).splitlines()[0])) from None


def _unreachable(settings: Settings, detail: str) -> str:
    """What went wrong connecting, and what to set, in one sentence."""
    where = f"the Temporal server at {settings.address}"
    certificate = re.search(r"InvalidCertificate\((\w+)", detail)
    if certificate:
        problem = certificate.group(1)
        if problem.startswith("NotValidForName"):  # rustls 0.23 says NotValidForNameContext { .. }
            return (
                f"TLS to {where} failed: its certificate is not valid for that host name ({problem}). "
                "Set TEMPORAL_ADDRESS to a name the certificate lists."
            )
        trusted = f"TEMPORAL_TLS_CA={settings.tls_ca}" if settings.tls_ca else "the system's CA certificates"
        return (
            f"TLS to {where} failed: its certificate is not signed by {trusted} ({problem}). "
            "Set TEMPORAL_TLS_CA to the CA certificate that signed the server's."
        )
    if "InvalidContentType" in detail:  # a TLS handshake answered by a plain-TCP server
        why = next(
            name
            for name, value in (
                ("TEMPORAL_TLS_CERT", settings.tls_cert),
                ("TEMPORAL_TLS_CA", settings.tls_ca),
                ("TEMPORAL_API_KEY (an API key turns TLS on)", settings.temporal_api_key),
            )
            if value
        )
        return (
            f"TLS to {where} failed: the server answers in plain TCP, not TLS, and TLS is on because "
            f"{why} is set. Unset it for a server without TLS (the dev server), or point "
            "TEMPORAL_ADDRESS at the server's TLS endpoint."
        )
    if "transport error" in detail or "close_notify" in detail or "connection closed" in detail:
        short = "the server closed the connection"
        if settings.tls_cert:
            return (
                f"TLS to {where} failed ({short}): check that TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY "
                "are a client certificate the server trusts."
            )
        if tls_config(settings) is not False:
            return (
                f"TLS to {where} failed ({short}): if the server wants a client certificate "
                "(mutual TLS), set TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY."
            )
        return (
            f"Cannot talk to {where} ({short}): if it speaks TLS, set TEMPORAL_TLS_CA "
            "(and TEMPORAL_TLS_CERT/KEY for mutual TLS), or TEMPORAL_API_KEY for Temporal Cloud."
        )
    return (
        f"Cannot reach {where} ({detail}). Start one (`temporal server start-dev`) or set TEMPORAL_ADDRESS."
    )


def visibility_quoted(value: str) -> str:
    """``value`` as a string literal of a visibility (list) query."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
