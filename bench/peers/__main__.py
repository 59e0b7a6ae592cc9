"""The benchmark's comparison rows side by side: the in-process baseline, the
floor (the loop moved into a workflow as plainly as possible), this project,
and the peers whose packages are installed (``pip install -e '.[bench]'``).

    .venv/bin/python -m bench.peers [--runs 5] [--rounds 20] [--rows floor,project]
    .venv/bin/python -m bench.peers --concurrency 100 --rounds 3 [--latency-ms 200]

One dev server (dispatch rate limit lifted), one scripted model server (zero
latency), one worker process per row on its own task queue. Scenario: K
rounds of two parallel ``calculator`` calls, then an answer of a few tokens.
One warm-up conversation per row, then ``--runs`` rounds in which every row
runs one conversation, in an order rotated each round; medians. Per row:
ms per turn (a turn is a model call) until the client has the final answer,
CPU ms per turn of each process, history bytes, events and billable actions
per turn (all runs of the conversation; queries and heartbeats, which
leave no event, counted from the server's requests), the server's requests
by operation per conversation, and each row against the floor
round by round (the median of the rounds' ratios: the machine's load moves
every row of a round alike, so a ratio of one round to the same round's
floor holds still where each row's own median does not). The
``floor-twin`` row runs the floor again on a worker of its own: its ratios
are those of identical work, the bench's resolution. Prints a table, then
a JSON summary. With ``--concurrency N`` it measures throughput instead:
each row runs N conversations at once per round (``bench/peers/throughput.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers import throughput
from bench.peers.measure import (
    ACTION_KINDS,
    CPU_HEADER,
    SERVER_ACTIONS,
    CpuMeter,
    History,
    cpu_cells,
    fetch_history,
    median_and_middle_half,
    server_actions,
    server_requests,
    tree_bytes,
)
from bench.peers.rows import Conversation, Row, ScriptedModel, Stack
from bench.peers.scenario import steps
from testbed.local_stack import DevServer, free_port

DATA = Path(".agent-data/bench/peers")
CONVERSATION_TIMEOUT_S = 180
REQUESTS_SETTLE_S = 1.2
COUNTED = 3  # conversations per row whose server requests are counted
ROW_KEYS = (
    "baseline",
    "floor",
    "floor-twin",
    "project",
    "project-result",
    "project-local",
    "project-local-result",
    "project-variant",
    "agents",
    "agents-run",
    "pydantic-ai",
    "pydantic-ai-run",
)


@dataclass
class Sample:
    round: int  # the round it ran in (rows run one conversation each per round)
    conversation: Conversation
    cpu_ms: dict[str, float]  # by role
    history: History | None
    stored_bytes: int | None


def available_rows(variant: dict[str, str] | None = None) -> tuple[dict[str, Row], dict[str, str]]:
    """Every row whose packages are installed, by key; the others, with why not.
    ``variant``: the settings of the ``project-variant`` row's worker (without
    them the row is not offered)."""
    from bench.peers.floor.starter import FloorRow
    from bench.peers.project import BaselineRow, ProjectRow

    rows: dict[str, Row] = {
        "baseline": BaselineRow(),
        "floor": FloorRow(),
        # The floor against itself, on its own worker (a queue named as long: histories
        # of the same size, to within a few bytes): the spread of its ratios is the
        # bench's resolution.
        "floor-twin": FloorRow(name="floor, again", task_queue="peers-twin1"),
        "project": ProjectRow(),
        "project-result": ProjectRow(
            name="this project, no subscriber", follow=False, task_queue="peers-project-result"
        ),
        "project-local": ProjectRow(
            name="this project, local tools", local_tools="*", task_queue="peers-project-local"
        ),
        "project-local-result": ProjectRow(
            name="local tools, no subscriber",
            local_tools="*",
            follow=False,
            task_queue="peers-project-local-result",
        ),
    }
    missing: dict[str, str] = {}
    if variant:
        changes = " ".join(f"{k}={v}" for k, v in variant.items())
        rows["project-variant"] = ProjectRow(
            # A task queue named as long as the project row's: the same history bytes.
            name=f"project, {changes}"[:28],
            extra_env=variant,
            task_queue="peers-variant",
        )
    else:
        missing["project-variant"] = "no --variant given"
    try:
        from bench.peers.agents_sdk.starter import AgentsSdkRow, AgentsSdkUnstreamedRow

        rows |= {"agents": AgentsSdkRow(), "agents-run": AgentsSdkUnstreamedRow()}
    except ImportError as err:
        missing["agents"] = missing["agents-run"] = f"{err} (pip install -e '.[bench]')"
    try:
        from bench.peers.pydantic_ai_agent.starter import PydanticAiRow, PydanticAiUnstreamedRow

        rows |= {"pydantic-ai": PydanticAiRow(), "pydantic-ai-run": PydanticAiUnstreamedRow()}
    except ImportError as err:
        missing["pydantic-ai"] = missing["pydantic-ai-run"] = f"{err} (pip install -e '.[bench]')"
    return rows, missing


async def measure(row: Row, key: str, stack: Stack, meter: CpuMeter, rounds: int, run: int) -> Sample:
    model = f"{key}-{uuid.uuid4().hex[:8]}"
    await stack.model_server.script(model, steps(rounds))
    stored_before = None if row.payload_store is None else tree_bytes(row.payload_store)
    before = meter.read()
    conversation = await asyncio.wait_for(row.converse(model), CONVERSATION_TIMEOUT_S)
    after = meter.read()
    stored_after = None if row.payload_store is None else tree_bytes(row.payload_store)
    if conversation.turns != rounds + 1 or await stack.model_server.pending(model):
        raise RuntimeError(f"{row.name}: {conversation.turns} model calls, expected {rounds + 1}")
    history = None
    if row.client is not None and conversation.workflow_id:
        history = await fetch_history(row.client, conversation.workflow_id, conversation.first_run_id)
    cpu = CpuMeter.by_row(CpuMeter.spent(before, after), key, len(row.workers))
    stored = None if stored_before is None or stored_after is None else stored_after - stored_before
    return Sample(run, conversation, cpu, history, stored)


async def count_requests(row: Row, key: str, stack: Stack, url: str, rounds: int) -> Counter[str]:
    """The server's requests (frontend, by operation) for one conversation
    of ``row``, run alone after the measured rounds: the server publishes
    its counters once a second, so each count waits that out after the
    answer (a subscriber's last acknowledgement comes just after it too).
    Kept out of the measured rounds, whose CPU windows run back to back as
    before: a pause after each would leave its late work (timers, a
    collection) to no window."""
    model = f"{key}-{uuid.uuid4().hex[:8]}"
    await stack.model_server.script(model, steps(rounds))
    await asyncio.sleep(REQUESTS_SETTLE_S)  # the last measured conversation's requests published
    before = server_requests(url)
    conversation = await asyncio.wait_for(row.converse(model), CONVERSATION_TIMEOUT_S)
    await asyncio.sleep(REQUESTS_SETTLE_S)
    counts = server_requests(url) - before
    if conversation.turns != rounds + 1 or await stack.model_server.pending(model):
        raise RuntimeError(f"{row.name}: {conversation.turns} model calls, expected {rounds + 1}")
    return counts


async def main(
    runs: int,
    rounds: int,
    keys: list[str],
    variant: dict[str, str] | None = None,
    concurrency: int = 0,
    latency_ms: int = 0,
) -> dict[str, Any]:
    """The rows' figures, one conversation at a time; with ``concurrency``,
    their throughput with that many conversations at once instead."""
    started = time.monotonic()
    DATA.mkdir(parents=True, exist_ok=True)
    # bench.run imports the project, as this project's row does
    from bench.run import fresh_payload_store, prune_old_payload_stores

    fresh_payload_store()
    rows, missing = available_rows(variant)
    rows = {key: rows[key] for key in keys if key in rows}
    dev = DevServer(log_path=DATA / "server.log", metrics_port=free_port()).start()
    try:
        model_server = ScriptedModel.start(DATA / "scripted-model.log")
        try:
            stack = Stack(dev, model_server, DATA)
            if concurrency:
                bursts = await run_throughput(stack, rows, runs, concurrency, rounds, latency_ms)
            else:
                samples, errors, requests = await run_rows(stack, rows, runs, rounds)
        finally:
            await model_server.stop()
    finally:
        dev.stop()
        prune_old_payload_stores()
    summary: dict[str, Any] = {"rounds": rounds, "runs": runs, "rows": {}}
    if concurrency:
        summary |= {"concurrency": concurrency, "latency_ms": latency_ms}
        for key, row in rows.items():
            floor = bursts.get("floor") if key != "floor" else None
            summary["rows"][key] = {"name": row.name} | throughput.summarise(bursts[key], floor)
        summary["missing"] = {key: missing[key] for key in keys if key in missing}
        summary["seconds"] = round(time.monotonic() - started, 1)
        return summary
    base = samples.get("baseline")
    base_ms = statistics.median(_ms_per_turn(s) for s in base) if base else None
    for key, row in rows.items():
        summary["rows"][key] = _summarise(row.name, samples[key], base_ms, errors[key], requests[key])
        if key not in ("floor", "baseline") and samples.get("floor") and samples[key]:
            summary["rows"][key]["to_floor_by_round"] = paired_ratios(samples[key], samples["floor"])
    summary["missing"] = {key: missing[key] for key in keys if key in missing}
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


async def run_throughput(
    stack: Stack, rows: dict[str, Row], runs: int, n: int, rounds: int, latency_ms: int
) -> dict[str, list[throughput.Burst]]:
    """Each row's bursts of ``n`` conversations at once (``throughput.run_bursts``)."""
    try:
        for row in rows.values():
            await row.start(stack)
        return await throughput.run_bursts(stack, rows, runs, n, rounds, latency_ms, _meter(stack, rows))
    finally:
        for row in rows.values():
            await row.stop()


def _meter(stack: Stack, rows: dict[str, Row]) -> CpuMeter:
    """CPU of the dev server, the model server and every row's workers, by role."""
    assert stack.dev.process is not None
    children = {"dev server": stack.dev.process.pid, "model server": stack.model_server.process.pid}
    for key, row in rows.items():
        children |= {f"{key}#{i}": worker.pid for i, worker in enumerate(row.workers)}
    return CpuMeter(children)


async def run_rows(
    stack: Stack, rows: dict[str, Row], runs: int, rounds: int
) -> tuple[dict[str, list[Sample]], dict[str, list[str]], dict[str, list[Counter[str]]]]:
    """Each row's samples (and failures), rows interleaved, the order
    rotated each round; then, with the server's metrics, each row's
    requests over ``COUNTED`` conversations more (``count_requests``)."""
    samples: dict[str, list[Sample]] = {key: [] for key in rows}
    errors: dict[str, list[str]] = {key: [] for key in rows}
    requests: dict[str, list[Counter[str]]] = {key: [] for key in rows}
    try:
        for row in rows.values():
            await row.start(stack)
        meter = _meter(stack, rows)
        order = list(rows)
        for run in range(runs + 1):  # the first round warms every row up and is dropped
            for key in order[run % len(order) :] + order[: run % len(order)]:
                try:
                    sample = await measure(rows[key], key, stack, meter, rounds, run)
                except Exception as err:  # one failed conversation must not lose the others' figures
                    errors[key].append(f"{type(err).__name__}: {err}")
                    continue
                if run:
                    samples[key].append(sample)
        url = stack.dev.metrics_url
        for key, row in rows.items():
            for _ in range(COUNTED if url else 0):
                try:
                    requests[key].append(await count_requests(row, key, stack, url or "", rounds))
                except Exception as err:  # told apart from the measured conversations' failures
                    errors[key].append(f"counting the server's requests: {type(err).__name__}: {err}")
    finally:
        for row in rows.values():
            await row.stop()
    return samples, errors, requests


def _ms_per_turn(sample: Sample) -> float:
    return sample.conversation.seconds * 1000 / sample.conversation.turns


PAIRED = {
    "ms_per_turn": _ms_per_turn,
    "dev_server_cpu": lambda s: s.cpu_ms["dev server"] / s.conversation.turns,
    "worker_client_cpu": lambda s: (s.cpu_ms["worker"] + s.cpu_ms["client"]) / s.conversation.turns,
}


def paired_ratios(samples: list[Sample], floor: list[Sample]) -> dict[str, Any]:
    """The median over the rounds both rows ran in of ``row / floor`` for
    ms per turn, dev-server CPU and worker + client CPU per turn; under
    ``spread``, the middle half of those rounds' ratios (first and third
    quartiles), so a reader sees how far one run's median can be trusted."""
    floor_by_round = {s.round: s for s in floor}
    pairs = [(s, floor_by_round[s.round]) for s in samples if s.round in floor_by_round]
    out: dict[str, Any] = {"rounds": len(pairs)}
    spread: dict[str, list[float]] = {}
    for name, measure_of in PAIRED.items():
        median, middle_half = median_and_middle_half(
            [measure_of(s) / measure_of(f) for s, f in pairs if measure_of(f) > 0]
        )
        if median is not None:
            out[name] = median
        if middle_half is not None:
            spread[name] = middle_half
    if spread:
        out["spread"] = spread
    return out


def _ratio_cell(ratios: dict[str, Any], key: str) -> str:
    """``median (first-third quartile)`` of a row's paired ratios, or what there is."""
    if key not in ratios:
        return "-"
    spread = ratios.get("spread", {}).get(key)
    return f"{ratios[key]} ({spread[0]}-{spread[1]})" if spread else str(ratios[key])


def _summarise(
    name: str,
    samples: list[Sample],
    base_ms: float | None,
    errors: list[str],
    requests: list[Counter[str]] | None = None,
) -> dict[str, Any]:
    """A row's medians. ``requests``: the server's requests of its counted
    conversations; the billed actions among them that leave no event
    (queries, heartbeats) join the history's in the action counts."""
    out: dict[str, Any] = {"name": name, "conversations": len(samples), "errors": errors}
    if not samples:
        return out

    def median(values: Any, digits: int = 1) -> float:
        return round(statistics.median(values), digits)

    ms = statistics.median(_ms_per_turn(s) for s in samples)
    out["turns"] = samples[0].conversation.turns
    out["ms_per_turn"] = round(ms, 1)
    out["ratio_to_baseline"] = round(ms / base_ms, 2) if base_ms else None
    out["cpu_ms_per_turn"] = {
        role: median(s.cpu_ms[role] / s.conversation.turns for s in samples) for role in samples[0].cpu_ms
    }
    histories = [(s.history, s.conversation.turns) for s in samples if s.history is not None]
    unlogged = [server_actions(counts) for counts in requests or []]
    if histories:
        out["history_bytes_per_turn"] = round(statistics.median(h.bytes / t for h, t in histories))
        out["history_events_per_turn"] = median(h.events / t for h, t in histories)
        out["history_runs"] = median((h.runs for h, _ in histories), 0)
        logged = statistics.median(h.total_actions / t for h, t in histories)
        extra = {kind: statistics.median(c[kind] for c in unlogged) for kind in SERVER_ACTIONS if unlogged}
        out["actions_per_turn"] = round(logged + sum(extra.values()) / out["turns"], 2)
        out["actions_per_conversation"] = {
            kind: median((h.actions[kind] for h, _ in histories), 0)
            for kind in ACTION_KINDS
            if any(h.actions[kind] for h, _ in histories)
        } | {kind: round(count) for kind, count in extra.items() if count}
    if requests:
        operations = sorted(set().union(*requests))
        out["server_requests_per_conversation"] = {
            operation: median(counts[operation] for counts in requests) for operation in operations
        }
        out["server_requests_all_per_conversation"] = median(sum(counts.values()) for counts in requests)
    stored = [s.stored_bytes / s.conversation.turns for s in samples if s.stored_bytes is not None]
    if stored:
        out["payload_store_bytes_per_turn"] = round(statistics.median(stored))
    return out


def parse_variant(items: list[str]) -> dict[str, str]:
    """``--variant NAME=VALUE`` arguments as the settings they name."""
    variant: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--variant {item!r}: expected NAME=VALUE")
        variant[name.strip()] = value
    return variant


def print_table(summary: dict[str, Any]) -> None:
    print(f"K={summary['rounds']} rounds of two parallel tool calls, medians of {summary['runs']} runs")
    print(
        f"{'row':28} {'ms/turn':>8} {'x base':>6} | {CPU_HEADER} | {'hist B/turn':>11} {'ev/turn':>7} "
        f"{'actions/turn':>12}"
    )
    for row in summary["rows"].values():
        if "ms_per_turn" not in row:
            print(f"{row['name']:28} failed: {row['errors'][:1]}")
            continue
        ratio = row["ratio_to_baseline"] if row["ratio_to_baseline"] is not None else "-"
        hist_bytes, events = row.get("history_bytes_per_turn", "-"), row.get("history_events_per_turn", "-")
        print(
            f"{row['name']:28} {row['ms_per_turn']:>8} {ratio:>6} | {cpu_cells(row['cpu_ms_per_turn'])} | "
            f"{hist_bytes:>11} {events:>7} {row.get('actions_per_turn', '-'):>12}"
        )
    paired = {
        row["name"]: row["to_floor_by_round"]
        for row in summary["rows"].values()
        if "to_floor_by_round" in row
    }
    if paired:
        print("against the floor, round by round (median of the rounds' ratios; middle half of them):")
        print(f"  {'row':26} {'ms/turn':>18} {'server CPU':>18} {'worker+client CPU':>18}")
        for name, ratios in paired.items():
            cells = [_ratio_cell(ratios, key) for key in PAIRED]
            print(f"  {name:26} " + " ".join(f"{cell:>18}" for cell in cells))
    print("billable actions per conversation (from history; queries, heartbeats from the server's requests):")
    for row in summary["rows"].values():
        actions = row.get("actions_per_conversation")
        if actions:
            print(f"  {row['name']:26} " + ", ".join(f"{kind} {count:g}" for kind, count in actions.items()))
    print_server_requests(summary)
    for row in summary["rows"].values():
        if row.get("payload_store_bytes_per_turn"):
            print(
                f"{row['name']} also wrote {row['payload_store_bytes_per_turn']} B/turn to its payload store"
            )
    for key, reason in summary["missing"].items():
        print(f"not run: {key}: {reason}")
    print(f"took {summary['seconds']} s")


def print_server_requests(summary: dict[str, Any]) -> None:
    """The server's requests per conversation by operation, one column per
    row (medians; operations under half a request in every row left out)."""
    rows = [row for row in summary["rows"].values() if row.get("server_requests_per_conversation")]
    if not rows:
        return
    counts = [row["server_requests_per_conversation"] for row in rows]
    operations = [op for op in sorted(set().union(*counts)) if max(c.get(op, 0) for c in counts) >= 0.5]
    print("server requests per conversation (frontend, by operation; medians):")
    print(f"  {'operation':34} " + " ".join(f"{row['name'][:14]:>14}" for row in rows))
    for op in operations:
        print(f"  {op:34} " + " ".join(f"{c.get(op, 0):>14g}" for c in counts))
    totals = [row["server_requests_all_per_conversation"] for row in rows]
    print(f"  {'all (median of the totals)':34} " + " ".join(f"{total:>14g}" for total in totals))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--rounds", type=int, default=20, help="K: tool rounds per conversation")
    parser.add_argument(
        "--rows",
        default=",".join(key for key in ROW_KEYS if key != "project-variant"),
        help=f"a subset of {','.join(ROW_KEYS)}",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=0,
        metavar="N",
        help="measure throughput instead: N conversations at once per row and round "
        "(with --rounds 3 and --latency-ms 200, bench.run's 100-conversation scenario)",
    )
    parser.add_argument(
        "--latency-ms",
        type=int,
        default=200,
        help="with --concurrency: the scripted model's latency before each answer (default 200)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the project-variant row's worker (repeatable): the project's row with one "
        "change, measured side by side with it, e.g. --variant AGENT_DIRECT_MODEL_POST=off "
        "--rows floor,project,project-variant",
    )
    args = parser.parse_args()
    try:
        variant = parse_variant(args.variant)
    except ValueError as err:
        parser.error(str(err))
    keys = [key.strip() for key in args.rows.split(",") if key.strip()]
    unknown = sorted(set(keys) - set(ROW_KEYS))
    if unknown:
        parser.error(f"unknown rows {unknown}: choose from {', '.join(ROW_KEYS)}")
    if "project-variant" in keys and not variant:
        parser.error("the project-variant row needs --variant NAME=VALUE")
    if args.concurrency < 0 or args.latency_ms < 0:
        parser.error("--concurrency and --latency-ms cannot be negative")
    latency_ms = args.latency_ms if args.concurrency else 0
    result = asyncio.run(main(args.runs, args.rounds, keys, variant, args.concurrency, latency_ms))
    (throughput.print_table if args.concurrency else print_table)(result)
    print(json.dumps(result, indent=2))
    sys.stdout.flush()
    os._exit(0)
