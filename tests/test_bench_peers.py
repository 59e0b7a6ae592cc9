"""The benchmark's comparison adapters (``bench/peers``) import; a peer whose
``bench`` extra is not installed is skipped. The benchmark itself is not a
test: ``python -m bench.peers``."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

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


def test_rows_are_compared_with_the_floor_of_the_same_round() -> None:
    from bench.peers.__main__ import Sample, paired_ratios
    from bench.peers.rows import Conversation

    def sample(round_: int, seconds: float, server: float, worker: float) -> Sample:
        cpu = {
            "dev server": server,
            "worker": worker,
            "client": 0.0,
            "model server": 0.0,
            "idle workers": 0.0,
        }
        return Sample(round_, Conversation(seconds=seconds, turns=10), cpu, None, None)

    # The machine slows down from round to round; the row stays at 0.9x the
    # floor of its own round. Round 3 of the row failed (no sample): the
    # floor's round 3 must not be paired with anything.
    floor = [sample(r, 1.0 * r, 10.0 * r, 20.0 * r) for r in (1, 2, 3, 4)]
    row = [sample(r, 0.9 * r, 11.0 * r, 18.0 * r) for r in (1, 2, 4)]
    ratios = paired_ratios(row, floor)
    spread = ratios.pop("spread")
    assert ratios == {"rounds": 3, "ms_per_turn": 0.9, "dev_server_cpu": 1.1, "worker_client_cpu": 0.9}
    assert spread == {
        "ms_per_turn": [0.9, 0.9],
        "dev_server_cpu": [1.1, 1.1],
        "worker_client_cpu": [0.9, 0.9],
    }
    # Medians of each row alone would mix rounds of different speeds.
    assert paired_ratios(row, floor[:1])["rounds"] == 1


def test_the_spread_of_paired_ratios_is_their_middle_half() -> None:
    from bench.peers.__main__ import Sample, _ratio_cell, paired_ratios
    from bench.peers.rows import Conversation

    def sample(round_: int, server: float) -> Sample:
        cpu = {"dev server": server, "worker": 10.0, "client": 0.0, "model server": 0.0, "idle workers": 0.0}
        return Sample(round_, Conversation(seconds=1.0, turns=10), cpu, None, None)

    floor = [sample(r, 10.0) for r in range(1, 6)]
    # Server CPU against the floor, round by round: 0.9, 1.0, 1.1, 1.2, 1.5.
    row = [sample(r, 10.0 * ratio) for r, ratio in zip(range(1, 6), (0.9, 1.0, 1.1, 1.2, 1.5), strict=True)]
    ratios = paired_ratios(row, floor)
    assert ratios["dev_server_cpu"] == 1.1
    assert ratios["spread"]["dev_server_cpu"] == [1.0, 1.2]
    assert _ratio_cell(ratios, "dev_server_cpu") == "1.1 (1.0-1.2)"
    # One round gives a median and no spread.
    one = paired_ratios(row[:1], floor)
    assert "spread" not in one and _ratio_cell(one, "dev_server_cpu") == "0.9"


def test_a_variant_row_is_the_project_row_with_the_settings_given() -> None:
    from bench.peers.__main__ import available_rows, parse_variant
    from bench.peers.project import ProjectRow

    variant = parse_variant(["AGENT_DIRECT_MODEL_POST=off", "TOKIO_WORKER_THREADS=1"])
    assert variant == {"AGENT_DIRECT_MODEL_POST": "off", "TOKIO_WORKER_THREADS": "1"}
    rows, _ = available_rows(variant)
    row = rows["project-variant"]
    assert isinstance(row, ProjectRow) and row.extra_env == variant
    project = rows["project"]
    assert isinstance(project, ProjectRow)
    assert row.task_queue != project.task_queue  # its own worker
    assert len(row.task_queue) == len(project.task_queue)  # histories of the same size
    plain_rows, plain_missing = available_rows()
    assert "project-variant" not in plain_rows
    assert "--variant" in plain_missing["project-variant"]
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_variant(["AGENT_DIRECT_MODEL_POST"])


def test_the_floor_twin_is_the_floor_on_its_own_worker() -> None:
    """The ``floor-twin`` row measures the floor against itself (the bench's
    resolution): the same workflow on a worker of its own, on a queue named
    as long as the floor's, so its histories are the same size."""
    from bench.peers.__main__ import ROW_KEYS, available_rows
    from bench.peers.floor.starter import FloorRow

    rows, _ = available_rows()
    floor, twin = rows["floor"], rows["floor-twin"]
    assert isinstance(floor, FloorRow) and isinstance(twin, FloorRow)
    assert twin.task_queue != floor.task_queue
    assert len(twin.task_queue) == len(floor.task_queue)
    assert twin.name != floor.name  # told apart in the table
    assert dataclasses.replace(twin, name=floor.name, task_queue=floor.task_queue) == floor  # nothing else
    assert "floor-twin" in ROW_KEYS


def test_server_requests_are_the_frontends_by_operation() -> None:
    """The bench counts what workers and clients asked of the server: the
    frontend's requests in the bench's namespace, not the server's own system workers'."""
    from bench.peers.measure import parse_server_requests

    text = "\n".join(
        [
            "# HELP service_requests service_requests counter",
            "# TYPE service_requests counter",
            'service_requests{namespace="default",operation="QueryWorkflow",service_name="frontend"} 3',
            'service_requests{namespace="temporal_system",operation="QueryWorkflow",'
            'service_name="frontend"} 2',
            'service_requests{namespace="default",operation="QueryWorkflow",service_name="history"} 7',
            'service_requests{namespace="default",operation="PollWorkflowTaskQueue",'
            'service_name="frontend"} 4e+01',
            'service_requests{namespace="default",operation="QueryWorkflow",service_name="frontend"} 1',
            'service_latency_count{namespace="default",operation="QueryWorkflow",service_name="frontend"} 9',
            'service_requests{namespace="default",service_name="frontend"} 5',
        ]
    )
    assert parse_server_requests(text) == {"QueryWorkflow": 4, "PollWorkflowTaskQueue": 40}
    assert parse_server_requests(text, "temporal_system") == {"QueryWorkflow": 2}


def test_queries_and_heartbeats_count_as_billed_actions() -> None:
    """Queries and activity heartbeats are billed but leave no event: a row's
    actions add them, from the server's requests of its counted conversations."""
    from collections import Counter

    from bench.peers.__main__ import Sample, _summarise
    from bench.peers.measure import History
    from bench.peers.rows import Conversation

    cpu = {"dev server": 1.0, "worker": 1.0, "client": 0.0, "model server": 0.0, "idle workers": 0.0}
    history = History(events=10, bytes=100, runs=1, actions=Counter({"workflow_starts": 1, "activities": 9}))
    sample = Sample(1, Conversation(seconds=1.0, turns=10), cpu, history, None)
    counted = [
        Counter({"QueryWorkflow": q, "RecordActivityTaskHeartbeat": 2, "RecordActivityTaskHeartbeatById": 1})
        | Counter({"RespondQueryTaskCompleted": q, "PollWorkflowTaskQueue": 40})
        for q in (2, 3, 9)
    ]
    row = _summarise("row", [sample], None, [], counted)
    actions = {"workflow_starts": 1, "activities": 9, "queries": 3, "heartbeats": 3}
    assert row["actions_per_conversation"] == actions
    assert row["actions_per_turn"] == 1.6  # (10 + 3 + 3) / 10 turns
    assert row["server_requests_per_conversation"]["QueryWorkflow"] == 3
    assert row["server_requests_all_per_conversation"] == 49  # the median of the totals 47, 49, 61
    assert _summarise("row", [sample], None, [])["actions_per_turn"] == 1.0  # nothing counted: history alone


def test_a_run_sets_the_last_store_aside_and_deletes_only_past_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is deleted as a run starts (a bulk delete slows every file the
    worker creates next, on ext4 without a journal); the stores set aside go,
    oldest first, once a run has measured and they pass the limit."""
    import bench.run as run

    data = tmp_path / "bench"
    monkeypatch.setattr(run, "DATA", data)
    monkeypatch.setattr(run, "OLD_STORES", data / "old-payloads")
    sizes = [3000, 2000, 1000]
    for size in sizes:
        store = data / "payloads"
        (store / "ab").mkdir(parents=True)
        (store / "ab" / "blob").write_bytes(b"x" * size)
        run.fresh_payload_store()
        assert not store.exists()
    aside = sorted(run.OLD_STORES.iterdir())
    assert [run.tree_bytes(path) for path in aside] == sizes  # all kept, in the order set aside

    run.prune_old_payload_stores(limit=6000)
    assert sorted(run.OLD_STORES.iterdir()) == aside
    run.prune_old_payload_stores(limit=3500)  # the oldest goes: 3000 bytes are left
    assert sorted(run.OLD_STORES.iterdir()) == aside[1:]
    run.prune_old_payload_stores(limit=1500)  # the next goes: 1000 bytes are left
    assert sorted(run.OLD_STORES.iterdir()) == aside[2:]
    run.fresh_payload_store()  # no store to set aside: nothing happens
    assert sorted(run.OLD_STORES.iterdir()) == aside[2:]
