"""The benchmark's comparison adapters (``bench/peers``) import; a peer whose
``bench`` extra is not installed is skipped. The benchmark itself is not a
test: ``python -m bench.peers``."""

from __future__ import annotations

import importlib

import pytest

ADAPTERS = {
    "floor": (None, ["workflows", "worker", "starter"]),
    "agents_sdk": ("temporalio.openai_agents", ["workflows", "worker", "starter"]),
    "pydantic_ai_agent": ("pydantic_ai.durable_exec.temporal", ["workflows", "worker", "starter"]),
}


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_bench_adapter_imports(adapter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    requirement, modules = ADAPTERS[adapter]
    if requirement:
        pytest.importorskip(requirement, reason="pip install -e '.[bench]'")
    # pydantic-ai's OpenAI provider wants a key when the agent is built at import.
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    for module in modules:
        importlib.import_module(f"bench.peers.{adapter}.{module}")


def test_bench_peers_entry_point_imports() -> None:
    importlib.import_module("bench.peers.__main__")
