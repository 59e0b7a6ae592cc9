"""Secured connections to Temporal (issue 12): the worker, this project's
clients and the starter connect over TLS (and mutual TLS) as
TEMPORAL_TLS_CA / TEMPORAL_TLS_CERT / TEMPORAL_TLS_KEY say. The dev server
has no TLS option, so a TLS-terminating proxy with a throwaway CA stands
in front of it; a conversation runs end to end through it, and a wrong or
missing certificate gets one sentence that says what to set."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.client import Client

from runtime.connect import ServerUnreachable, connect
from runtime.settings import Settings
from testbed.local_stack import ROOT, DevServer, start_worker, stop_process
from testbed.scripted_model import ScriptedModelServer
from tests.support.stack import Stack
from tests.support.tls import Authority, Issued, TlsProxy


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
