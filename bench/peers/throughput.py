"""Many conversations at once: turns per second of each row's one worker,
and the CPU per turn that bounds it (``python -m bench.peers --concurrency N``).

Each round, every row (in an order rotated each round) runs ``n``
conversations of the scenario at once, its model answering each step after
``latency_ms``; a row's figures are turns per second (model calls of the
completed conversations over the wall clock of all ``n``), CPU per turn of
each process, and how many of the machine's cores they kept busy together.
Once the cores are all busy, turns per second are the cores divided by the
CPU a turn costs: the rows' ratios to the floor, round by round, are then
the figures to read (the machine's speed moves them all alike).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.peers.measure import CPU_HEADER, CpuMeter, cpu_cells, median_and_middle_half
from bench.peers.rows import Row, Stack
from bench.peers.scenario import steps

CONVERSATIONS_TIMEOUT_S = 600


@dataclass
class Burst:
    """One round of one row: ``n`` conversations started together."""

    round: int
    conversations: int
    completed: int
    turns: int  # model calls of the completed conversations
    seconds: float
    cpu_ms: dict[str, float]  # by role, all conversations together
    errors: list[str] = field(default_factory=list)

    @property
    def turns_per_second(self) -> float:
        return self.turns / self.seconds if self.seconds > 0 else 0.0

    @property
    def cores_busy(self) -> float:
        return sum(self.cpu_ms.values()) / 1000 / self.seconds if self.seconds > 0 else 0.0


async def burst(
    row: Row, key: str, stack: Stack, meter: CpuMeter, n: int, rounds: int, latency_ms: int, run: int
) -> Burst:
    """``n`` conversations of ``row`` at once, each scripted on a model of its own."""
    models = [f"{key}-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    for model in models:
        await stack.model_server.script(model, steps(rounds, latency_ms))
    before = meter.read()
    started = time.monotonic()
    tasks = [asyncio.ensure_future(row.converse(model)) for model in models]
    _, pending = await asyncio.wait(tasks, timeout=CONVERSATIONS_TIMEOUT_S)
    seconds = time.monotonic() - started
    for task in pending:  # counted as failed, not waited for
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    cpu = CpuMeter.by_row(CpuMeter.spent(before, meter.read()), key, len(row.workers))
    errors: list[str] = []
    turns = completed = 0
    for task in tasks:
        if task in pending:
            errors.append(f"not done after {CONVERSATIONS_TIMEOUT_S} s")
            continue
        error = task.exception()
        if error is not None:
            errors.append(f"{type(error).__name__}: {error}")
            continue
        outcome = task.result()
        if outcome.turns != rounds + 1:
            errors.append(f"{outcome.turns} model calls, expected {rounds + 1}")
        else:
            completed += 1
            turns += outcome.turns
    return Burst(run, n, completed, turns, seconds, cpu, errors)


async def run_bursts(
    stack: Stack, rows: dict[str, Row], runs: int, n: int, rounds: int, latency_ms: int, meter: CpuMeter
) -> dict[str, list[Burst]]:
    """Every row's bursts: a warm-up round (dropped), then ``runs`` rounds,
    the rows' order rotated each round."""
    bursts: dict[str, list[Burst]] = {key: [] for key in rows}
    order = list(rows)
    for run in range(runs + 1):
        for key in order[run % len(order) :] + order[: run % len(order)]:
            # The warm-up round is small: it loads the workers, not the machine.
            size = n if run else min(n, 10)
            result = await burst(rows[key], key, stack, meter, size, rounds, latency_ms, run)
            if run:
                bursts[key].append(result)
    return bursts


def summarise(bursts: list[Burst], floor: list[Burst] | None) -> dict[str, Any]:
    """A row's medians over its rounds, and its turns per second against the
    floor's of the same round (median of the rounds' ratios, and their middle half)."""
    if not bursts:
        return {}
    out: dict[str, Any] = {
        "conversations": sum(b.conversations for b in bursts),
        "failed": sum(b.conversations - b.completed for b in bursts),
        "errors": sorted({error for b in bursts for error in b.errors})[:3],
        "turns_per_second": round(statistics.median(b.turns_per_second for b in bursts), 1),
        "cpu_ms_per_turn": {
            role: round(statistics.median(b.cpu_ms[role] / b.turns for b in bursts if b.turns), 2)
            for role in bursts[0].cpu_ms
        }
        if any(b.turns for b in bursts)
        else {},
        "cores_busy": round(statistics.median(b.cores_busy for b in bursts), 2),
        "cores": os.cpu_count(),
    }
    if floor is not None:
        by_round = {b.round: b for b in floor}
        median, middle_half = median_and_middle_half(
            [
                b.turns_per_second / by_round[b.round].turns_per_second
                for b in bursts
                if b.round in by_round and by_round[b.round].turns_per_second > 0
            ]
        )
        if median is not None:
            out["turns_per_second_to_floor"] = median
        if middle_half is not None:
            out["turns_per_second_to_floor_spread"] = middle_half
    return out


def print_table(summary: dict[str, Any]) -> None:
    print(
        f"{summary['concurrency']} conversations at once per row, K={summary['rounds']} rounds, "
        f"{summary['latency_ms']} ms of model latency per step, medians of {summary['runs']} runs"
    )
    print(f"{'row':28} {'turns/s':>8} {'x floor':>16} {'failed':>6} | {CPU_HEADER} | {'cores busy':>10}")
    for row in summary["rows"].values():
        if "turns_per_second" not in row:
            print(f"{row['name']:28} no figures")
            continue
        ratio = row.get("turns_per_second_to_floor", "-")
        spread = row.get("turns_per_second_to_floor_spread")
        cell = f"{ratio} ({spread[0]}-{spread[1]})" if spread else str(ratio)
        print(
            f"{row['name']:28} {row['turns_per_second']:>8} {cell:>16} {row['failed']:>6} | "
            f"{cpu_cells(row['cpu_ms_per_turn'])} | {row['cores_busy']:>5} of {row['cores']}"
        )
        for error in row["errors"]:
            print(f"  failed: {error}")
