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


def test_a_burst_counts_the_turns_of_completed_conversations_and_each_failure() -> None:
    """``--concurrency``: a row's turns per second count only conversations
    that completed the scenario; one that raised, made the wrong number of
    model calls or was still running at the deadline is a failure with its
    reason, and the others' figures stand."""
    import asyncio

    from bench.peers import throughput
    from bench.peers.rows import Conversation, Row

    scripted: dict[str, list[dict[str, object]]] = {}

    class Model:
        async def script(self, model: str, steps: list[dict[str, object]]) -> None:
            scripted[model] = steps

    class Stack:
        model_server = Model()

    class Meter:
        reads = 0

        def read(self) -> dict[str, float]:
            self.reads += 1
            cpu = 100.0 * self.reads
            return {"dev server": cpu, "model server": cpu / 10, "client": cpu / 20, "fl#0": cpu}

    calls = 0

    class Flaky(Row):
        async def converse(self, model: str) -> Conversation:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise RuntimeError("refused")
            if calls == 3:
                return Conversation(seconds=0.1, turns=2)  # stopped early
            if calls == 4:
                await asyncio.sleep(3600)  # never ends
            return Conversation(seconds=0.1, turns=4)

    row = Flaky(name="flaky")
    row.workers = [object()]  # type: ignore[list-item]
    original = throughput.CONVERSATIONS_TIMEOUT_S
    throughput.CONVERSATIONS_TIMEOUT_S = 0.2  # type: ignore[assignment]
    try:
        burst = asyncio.run(throughput.burst(row, "fl", Stack(), Meter(), 6, 3, 200, run=1))  # type: ignore[arg-type]
    finally:
        throughput.CONVERSATIONS_TIMEOUT_S = original
    assert (burst.conversations, burst.completed, burst.turns) == (6, 3, 12)
    assert sorted(burst.errors) == [
        "2 model calls, expected 4",
        "RuntimeError: refused",
        "not done after 0.2 s",
    ]
    assert burst.cpu_ms["worker"] == 100.0 and burst.cpu_ms["dev server"] == 100.0
    # Each conversation had a model of its own, answering after the latency asked for.
    assert len(scripted) == 6
    assert all(step["first_delay_ms"] == 200 for steps in scripted.values() for step in steps)


def test_throughput_is_compared_with_the_floor_of_the_same_round() -> None:
    from bench.peers.throughput import Burst, summarise

    def burst(round_: int, turns: int, seconds: float, failed: int = 0) -> Burst:
        cpu = {"dev server": 10.0 * turns, "worker": 8.0 * turns, "client": 1.0 * turns}
        return Burst(round_, 100, 100 - failed, turns, seconds, cpu, ["X: y"] * failed)

    # The machine slows from round to round; the row does 0.9x the floor's
    # turns per second in each round it ran (round 2 of the floor failed wholly).
    floor = [burst(1, 400, 8.0), burst(3, 400, 10.0), burst(4, 400, 12.0)]
    row = [
        burst(1, 400, 8.0 / 0.9),
        burst(2, 396, 9.0, failed=1),
        burst(3, 400, 10.0 / 0.9),
        burst(4, 400, 12 / 0.9),
    ]
    summary = summarise(row, floor)
    assert summary["turns_per_second_to_floor"] == 0.9
    assert summary["turns_per_second_to_floor_spread"] == [0.9, 0.9]
    assert summary["failed"] == 1 and summary["errors"] == ["X: y"]
    assert summary["cpu_ms_per_turn"] == {"dev server": 10.0, "worker": 8.0, "client": 1.0}
    # All processes' CPU over the wall clock, median over the rounds: 19 ms a turn.
    busy = sorted(19 * b.turns / 1000 / b.seconds for b in row)
    assert summary["cores_busy"] == round((busy[1] + busy[2]) / 2, 2)
    assert "turns_per_second_to_floor" not in summarise(floor, None)


def test_the_scenario_answers_after_the_latency_asked_for() -> None:
    from bench.peers.scenario import steps

    assert all("first_delay_ms" not in step for step in steps(3))
    delayed = steps(3, 200)
    assert len(delayed) == 4 and all(step["first_delay_ms"] == 200 for step in delayed)
    assert [{k: v for k, v in step.items() if k != "first_delay_ms"} for step in delayed] == steps(3)
