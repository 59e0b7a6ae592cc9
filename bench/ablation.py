"""Before/after of each optimisation, side by side in one run.

    .venv/bin/python -m bench.ablation [--runs 8]

One dev server, one worker per variant (each on its own task queue), the
in-process baseline, and the benchmark's scenario at K = 5 and K = 20,
interleaved; medians. Each variant switches one change off through its
setting, so the row shows what that change is worth:

- ``all on``: the defaults;
- ``context inline``: ``AGENT_STORAGE=off``, the LLM activity gets the whole
  transcript every turn (no content-addressed context);
- ``no compression``: ``AGENT_COMPRESS_THRESHOLD_BYTES=off``;
- ``stock sandbox``: ``AGENT_SANDBOX_PRECOMPILE=off`` (glue compiled per call,
  payload contexts looked up per payload, workflow module compiled per instance);
- ``stock payload passes``: ``AGENT_PAYLOAD_WALK=off`` (each workflow task's
  payloads walked in the SDK's three passes per direction);
- ``model call through client.post``: ``AGENT_DIRECT_MODEL_POST=off`` (the
  ``openai`` client builds each request and decodes the stream itself);
- ``gzipped calls``: ``AGENT_GRPC_COMPRESSION=gzip`` (the worker's calls to
  the server gzipped, the SDK's default).
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
from dataclasses import replace
from typing import Any

import openai

from activities.model_http import ChatPoster
from bench import run as bench
from runtime.connect import connect
from runtime.settings import Settings
from testbed.local_stack import DevServer, start_worker, stop_process
from testbed.scripted_model import ScriptedModelServer

VARIANTS: dict[str, dict[str, str]] = {
    "all on": {},
    "context inline": {"AGENT_STORAGE": "off"},
    "no compression": {"AGENT_COMPRESS_THRESHOLD_BYTES": "off"},
    "stock sandbox": {"AGENT_SANDBOX_PRECOMPILE": "off"},
    "stock payload passes": {"AGENT_PAYLOAD_WALK": "off"},
    "model call through client.post": {"AGENT_DIRECT_MODEL_POST": "off"},
    "gzipped calls": {"AGENT_GRPC_COMPRESSION": "gzip"},
}
ROUNDS = (5, 20)


async def main(runs: int) -> dict[str, Any]:
    bench.DATA.mkdir(parents=True, exist_ok=True)
    bench.fresh_payload_store()
    dev = DevServer(log_path=bench.DATA / "server.log").start()
    server = ScriptedModelServer().start()
    env = bench.stack_env(dev, server)
    queues = {name: f"ablation-{i}" for i, name in enumerate(VARIANTS)}
    workers = [
        start_worker(
            {**env, **settings, "TEMPORAL_TASK_QUEUE": queues[name]},
            log_path=bench.DATA / f"worker-{queues[name]}.log",
        )
        for name, settings in VARIANTS.items()
    ]
    llm = ChatPoster(openai.AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0))
    base: dict[int, list[float]] = {k: [] for k in ROUNDS}
    durable: dict[tuple[str, int], list[bench.DurableRun]] = {(v, k): [] for v in VARIANTS for k in ROUNDS}
    try:
        settings = Settings.from_env(address=dev.address)
        client = await connect(settings)
        for run in range(runs + 1):  # the first round warms every worker up and is dropped
            for rounds in ROUNDS:
                model = f"base-{uuid.uuid4().hex[:6]}"
                server.script(model, bench.scenario(rounds))
                started = time.monotonic()
                turns = await bench.baseline_conversation(llm, model)
                if run:
                    base[rounds].append((time.monotonic() - started) * 1000 / turns)
                names = list(VARIANTS)
                names = (
                    names[run % len(names) :] + names[: run % len(names)]
                )  # rotate: no variant always first
                for name in names:
                    model = f"dur-{uuid.uuid4().hex[:6]}"
                    server.script(model, bench.scenario(rounds))
                    on_queue = replace(settings, task_queue=queues[name])
                    result = await bench.durable_conversation(client, on_queue, server, model)
                    if run:
                        durable[(name, rounds)].append(result)
    finally:
        for worker in workers:
            stop_process(worker)
        server.stop()
        dev.stop()
        bench.prune_old_payload_stores()
    out: dict[str, Any] = {
        "baseline_ms_per_turn": {f"K={k}": round(statistics.median(base[k]), 2) for k in ROUNDS}
    }
    for name in VARIANTS:
        row: dict[str, Any] = {}
        for rounds in ROUNDS:
            samples = durable[(name, rounds)]
            ms = statistics.median(r.seconds * 1000 / r.turns for r in samples)
            row[f"K={rounds}"] = {
                "durable_ms_per_turn": round(ms, 2),
                "ratio": round(ms / statistics.median(base[rounds]), 2),
                "history_bytes": statistics.median(r.history_bytes for r in samples),
                "history_bytes_per_turn": round(
                    statistics.median(r.history_bytes / r.turns for r in samples)
                ),
            }
        row["history_bytes_growth_K5_to_K20"] = round(
            row["K=20"]["history_bytes"] / row["K=5"]["history_bytes"], 2
        )
        out[name] = row
    return out


def print_table(summary: dict[str, Any]) -> None:
    base = summary["baseline_ms_per_turn"]
    print(f"in-process baseline: {base['K=5']} ms/turn at K=5, {base['K=20']} ms/turn at K=20")
    print(
        f"{'variant':16} {'ms/turn K=20':>12} {'ratio K=20':>10} {'ratio K=5':>9} "
        f"{'hist B/turn K=20':>16} {'growth K5->K20':>14}"
    )
    for name in VARIANTS:
        row = summary[name]
        print(
            f"{name:16} {row['K=20']['durable_ms_per_turn']:>12} {row['K=20']['ratio']:>10} "
            f"{row['K=5']['ratio']:>9} {row['K=20']['history_bytes_per_turn']:>16} "
            f"{row['history_bytes_growth_K5_to_K20']:>14}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    result = asyncio.run(main(args.runs))
    print_table(result)
    print(json.dumps(result, indent=2))
    sys.stdout.flush()
    os._exit(0)
