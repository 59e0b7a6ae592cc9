"""Secured connections to Temporal (issue 12): the worker, this project's
clients and the starter connect over TLS (and mutual TLS) as
TEMPORAL_TLS_CA / TEMPORAL_TLS_CERT / TEMPORAL_TLS_KEY say. The dev server
has no TLS option, so a TLS-terminating proxy with a throwaway CA stands
in front of it; a conversation runs end to end through it, and a wrong or
missing certificate gets one sentence that says what to set."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from temporalio.client import Client

from runtime.connect import ServerUnreachable, _unreachable, connect
from runtime.settings import Settings
from testbed.local_stack import ROOT, DevServer, start_worker, stop_process
from testbed.scripted_model import ScriptedModelServer
from tests.support.stack import Stack
from tests.support.tls import Authority, Issued, TlsProxy, _name, _write


@dataclass
class Pki:
    ca: Authority
    server: Issued
    client: Issued
    stranger: Authority  # a CA nobody here trusts

    def env(self, address: str) -> dict[str, str]:
        return {
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_TLS_CA": str(self.ca.ca_file),
            "TEMPORAL_TLS_CERT": str(self.client.cert),
            "TEMPORAL_TLS_KEY": str(self.client.key),
        }


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = Authority(root / "ca")
    return Pki(
        ca,
        ca.issue("server", server=True),
        ca.issue("worker", server=False),
        Authority(root / "stranger", name="a stranger CA"),
    )


@pytest.fixture
async def mutual_tls(dev_server: DevServer, pki: Pki) -> AsyncIterator[TlsProxy]:
    """The dev server behind a proxy that wants a client certificate from our CA."""
    proxy = await TlsProxy(pki.server, dev_server.port, client_ca=pki.ca.ca_file).start()
    yield proxy
    await proxy.stop()


async def test_a_conversation_runs_end_to_end_over_mutual_tls(
    client: Client,
    dev_server: DevServer,
    model_server: ScriptedModelServer,
    worker_env: dict[str, str],
    mutual_tls: TlsProxy,
    pki: Pki,
    artifacts: Path,
) -> None:
    queue = f"agent-tls-{uuid.uuid4().hex[:6]}"
    env = {**worker_env, **pki.env(mutual_tls.address), "TEMPORAL_TASK_QUEUE": queue}
    # The proxy runs on this event loop: wait for the worker in a thread.
    worker = await asyncio.to_thread(start_worker, env, ["tests.support.tools"], artifacts / "tls-worker.log")
    try:
        secured = await connect(
            Settings.from_env(
                address=mutual_tls.address,
                tls_ca=pki.ca.ca_file,
                tls_cert=pki.client.cert,
                tls_key=pki.client.key,
            )
        )
        stack = Stack(secured, model_server, queue, f"tls-{uuid.uuid4().hex[:8]}", dev_server)
        stack.script(
            {"tool_calls": [{"id": "t1", "name": "calculator", "arguments": {"expression": "6*7"}}]},
            {"text": "42, over TLS."},
        )
        handle = await stack.start(prompt="What is 6*7?", closeWhenIdle=True)
        events = await stack.events(handle.id)
        result = await handle.result()

        assert events[-1]["type"] == "agent_end"
        assert result.messages[2].content[0].text == "6*7 = 42"
        assert result.messages[-1].content[0].text == "42, over TLS."
        # The starter, through the same settings.
        starter = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "starter.py"),
            "messages",
            handle.id,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(starter.communicate(), 60)
        assert starter.returncode == 0, err.decode()
        assert json.loads(out)[-1]["content"][0]["text"] == "42, over TLS."
    finally:
        await asyncio.to_thread(stop_process, worker)


async def test_a_server_certificate_from_another_ca_is_refused_with_a_sentence(
    mutual_tls: TlsProxy, pki: Pki
) -> None:
    settings = Settings.from_env(
        address=mutual_tls.address,
        tls_ca=pki.stranger.ca_file,
        tls_cert=pki.client.cert,
        tls_key=pki.client.key,
    )

    with pytest.raises(ServerUnreachable) as refused:
        await connect(settings)

    assert str(refused.value) == (
        f"TLS to the Temporal server at {mutual_tls.address} failed: its certificate is not signed by "
        f"TEMPORAL_TLS_CA={pki.stranger.ca_file} (UnknownIssuer). "
        "Set TEMPORAL_TLS_CA to the CA certificate that signed the server's."
    )


async def test_no_client_certificate_where_one_is_wanted_says_what_to_set(
    mutual_tls: TlsProxy, pki: Pki
) -> None:
    with pytest.raises(ServerUnreachable, match="set TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY"):
        await connect(Settings.from_env(address=mutual_tls.address, tls_ca=pki.ca.ca_file))


async def test_plain_tcp_to_a_tls_server_says_to_set_the_ca(mutual_tls: TlsProxy) -> None:
    with pytest.raises(ServerUnreachable, match="if it speaks TLS, set TEMPORAL_TLS_CA"):
        await connect(Settings.from_env(address=mutual_tls.address))


async def test_the_worker_refuses_a_wrong_ca_with_one_line(
    mutual_tls: TlsProxy, pki: Pki, worker_env: dict[str, str]
) -> None:
    env = {**worker_env, **pki.env(mutual_tls.address), "TEMPORAL_TLS_CA": str(pki.stranger.ca_file)}
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "worker.py"),
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(worker.communicate(), 60)

    assert worker.returncode == 2
    assert err.decode().startswith("error: TLS to the Temporal server at")
    assert "Set TEMPORAL_TLS_CA" in err.decode() and "Traceback" not in err.decode()


def server_certificate_for(ca: Authority, host: str) -> Issued:
    """A server certificate from ``ca`` that names only ``host``."""
    assert ca.cert is not None
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(host))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return _write(ca.directory, f"server-{host}", cert, key)


async def test_a_server_certificate_for_another_host_name_says_to_fix_the_address(tmp_path: Path) -> None:
    """The certificate is signed by the CA given, so the sentence must not blame TEMPORAL_TLS_CA."""
    ca = Authority(tmp_path)
    proxy = await TlsProxy(server_certificate_for(ca, "elsewhere.test"), upstream_port=9).start()
    try:
        with pytest.raises(ServerUnreachable) as refused:
            await connect(Settings.from_env({}, address=proxy.address, tls_ca=ca.ca_file))
    finally:
        await proxy.stop()
    assert "its certificate is not valid for that host name" in str(refused.value)
    assert str(refused.value).endswith("Set TEMPORAL_ADDRESS to a name the certificate lists.")


async def test_a_private_ca_behind_an_api_key_says_the_system_roots_do_not_trust_it(tmp_path: Path) -> None:
    """With an API key and no TEMPORAL_TLS_CA, TLS checks the system's roots: the sentence says so."""
    ca = Authority(tmp_path)
    proxy = await TlsProxy(ca.issue("server", server=True), upstream_port=9).start()
    try:
        with pytest.raises(ServerUnreachable) as refused:
            await connect(Settings.from_env({}, address=proxy.address, temporal_api_key="key"))
    finally:
        await proxy.stop()
    assert str(refused.value) == (
        f"TLS to the Temporal server at {proxy.address} failed: its certificate is not signed by "
        "the system's CA certificates (UnknownIssuer). "
        "Set TEMPORAL_TLS_CA to the CA certificate that signed the server's."
    )


# What the SDK (temporalio's Rust core) says, first line, in each case.
PLAIN_SERVER = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
    "ConnectError(Custom { kind: InvalidData, error: InvalidMessage(InvalidContentType) }))"
)
CLOSED_AFTER_HANDSHAKE = (
    'Failed client connect: `get_system_info` call error after connection: Status { code: Unknown, message: "'
    'transport error", source: Some(tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: '
    'UnexpectedEof, error: "peer closed connection without sending TLS close_notify: https://docs.rs/rustls/'
    'latest/rustls/manual/_03_howto/index.html#unexpected-eof" }))) }'
)


def tls_files(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    for path in paths.values():
        path.write_text("pem")
    return paths


@pytest.mark.parametrize(
    ("given", "named"),
    [(("ca",), "TEMPORAL_TLS_CA"), (("cert", "key"), "TEMPORAL_TLS_CERT")],
)
def test_tls_to_a_plain_server_names_the_tls_setting_that_is_set(
    tmp_path: Path, given: tuple[str, ...], named: str
) -> None:
    """Whichever of the TLS settings turned TLS on is the one to unset."""
    files = tls_files(tmp_path)
    settings = Settings.from_env({}, address="h:7233", **{f"tls_{name}": files[name] for name in given})
    message = _unreachable(settings, PLAIN_SERVER)
    assert f"TLS is on because {named} is set." in message


def test_a_client_certificate_the_server_refuses_says_to_check_it(tmp_path: Path) -> None:
    """With a client certificate set, a server closing the connection means it does not trust it."""
    files = tls_files(tmp_path)
    settings = Settings.from_env(
        {}, address="h:7233", tls_ca=files["ca"], tls_cert=files["cert"], tls_key=files["key"]
    )
    assert _unreachable(settings, CLOSED_AFTER_HANDSHAKE) == (
        "TLS to the Temporal server at h:7233 failed (the server closed the connection): check that "
        "TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY are a client certificate the server trusts."
    )


async def test_the_client_is_given_the_namespace_api_key_and_tls_the_settings_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Temporal Cloud: TEMPORAL_NAMESPACE and TEMPORAL_API_KEY reach the connection, with TLS on."""
    seen: dict[str, Any] = {}

    async def connecting(address: str, **options: Any) -> str:
        seen.update(options, address=address)
        return "client"

    monkeypatch.setattr(Client, "connect", connecting)
    settings = Settings.from_env(
        {}, address="ns.acct.tmprl.cloud:7233", namespace="ns.acct", temporal_api_key="secret"
    )
    assert await connect(settings) == "client"
    assert seen["address"] == "ns.acct.tmprl.cloud:7233"
    assert (seen["namespace"], seen["api_key"], seen["tls"]) == ("ns.acct", "secret", True)
