"""Benchmark: the durable agent against an in-process loop, side by side.

    .venv/bin/python -m bench.run [--runs 3] [--concurrency 100]

Both talk to the scripted OpenAI-compatible server (zero model latency)
with the same ``openai`` client and the same tools. Scenario: one prompt,
then K rounds in which the model asks for two parallel tool calls, then a
streamed final answer of ~200 tokens; K = 5 and K = 20, interleaved runs,
medians. The durable agent runs on a local dev server with one worker
process and a subscriber reading the ``events`` topic, as a UI would.
Prints a table, then a JSON summary. Ratios are the figures to read:
absolute times are noise on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import openai
from temporalio.client import Client

import activities.builtin_tools  # noqa: F401  (the same tools, in-process)
from activities.model_http import ChatPoster
from activities.openai_chat import StreamAssembler, to_openai_messages
from activities.tools import registered_tools
from bench.peers.measure import own_cpu_ms, process_cpu_ms, tree_bytes
from client import Conversation
from runtime.connect import connect
from runtime.settings import Settings
from testbed.local_stack import DevServer, start_worker, stop_process
from testbed.scripted_model import ScriptedModelServer
from workflows.models import AgentMessage, AssistantMessage, TextContent, ToolResultMessage, UserMessage

DATA = Path(".agent-data/bench")
TASK_QUEUE = "bench"
ANSWER = "The durable agent streamed this answer token by token. " * 15  # ~200 tokens of 4 chars


def scenario(rounds: int, first_delay_ms: int = 0) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"id": f"r{i}a", "name": "calculator", "arguments": {"expression": f"{i}*7"}},
                {"id": f"r{i}b", "name": "calculator", "arguments": {"expression": f"{i}+7"}},
            ],
            "first_delay_ms": first_delay_ms,
        }
        for i in range(rounds)
    ]
    steps.append({"text": ANSWER, "chunk_chars": 4, "first_delay_ms": first_delay_ms})
    return steps


# --- the in-process baseline -----------------------------------------------------------


async def baseline_conversation(poster: ChatPoster, model: str) -> int:
    """A plain asyncio agent loop: stream, run the tool calls concurrently, repeat."""
    tools = registered_tools()
    schemas = [spec.openai_tool() for spec in tools.values()]
    messages: list[AgentMessage] = [UserMessage(content="run the scenario")]
    turns = 0
    while True:
        # The same fast path as the LLM activity: the body posted as built,
        # chunks as JSON (the baseline stays the leanest loop).
        stream = await poster.stream(
            {
                "model": model,
                "messages": to_openai_messages(None, messages),
                "tools": schemas,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assembler = StreamAssembler(model)
        async for chunk in stream:
            assembler.feed(chunk)
        message, _, _ = assembler.finish()
        messages.append(message)
        turns += 1
        if not message.tool_calls:
            return turns

        async def run(call: Any) -> ToolResultMessage:
            spec = tools[call.name]
            output = await spec.function(spec.args_model.model_validate(call.arguments))
            return ToolResultMessage(
                tool_call_id=call.id, tool_name=call.name, content=[TextContent(text=str(output))]
            )

        messages += await asyncio.gather(*(run(c) for c in message.tool_calls))


# --- the durable agent ---------------------------------------------------------------------


@dataclass
class DurableRun:
    seconds: float
    turns: int
    history_events: int
    history_bytes: int
    first_token_ms: list[float] = field(default_factory=list)


async def durable_conversation(
    client: Client, settings: Settings, server: ScriptedModelServer, model: str
) -> DurableRun:
    """One conversation of the scenario on ``settings.task_queue``, followed to its end."""
    started = time.monotonic()
    conversation = await Conversation.start(
        client,
        settings,
        id=f"bench-{uuid.uuid4().hex[:8]}",
        prompt="run the scenario",
        model=model,
        close_when_idle=True,
    )
    seen_first: list[float] = []
    streaming = False
    async for _offset, event in conversation.events():
        kind = event["type"]
        if kind == "message_start" and event["message"]["role"] == "assistant":
            streaming = True
        elif kind == "message_update" and streaming:
            seen_first.append(time.time())
            streaming = False
        elif kind == "agent_end":
            break
    elapsed = time.monotonic() - started
    result = await conversation.result()
    history = await conversation.history()
    sent = server.store.first_tokens(model)
    latencies = [(seen - sent_at) * 1000 for seen, sent_at in zip(seen_first, sent, strict=False)]
    return DurableRun(
        seconds=elapsed,
        turns=sum(1 for m in result.messages if m.role == "assistant"),
        history_events=len(history.events),
        history_bytes=sum(e.ByteSize() for e in history.events),
        first_token_ms=latencies,
    )


# --- the measurements -------------------------------------------------------------------------


async def compare(
    client: Client, settings: Settings, server: ScriptedModelServer, runs: int, pids: dict[str, int]
) -> dict[str, Any]:
    """Both sides, interleaved; wall clock and CPU per process per turn.
    ``pids``: the dev server's and the worker's. This process's CPU is the
    baseline's whole loop, or the durable side's client (starter and
    subscriber); both include the scripted model server, which runs here."""
    llm = ChatPoster(openai.AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0))
    out: dict[str, Any] = {}
    samples: dict[int, dict[str, list[Any]]] = {
        k: {"baseline": [], "durable": [], "baseline_cpu": [], "durable_cpu": []} for k in (5, 20)
    }

    def cpu() -> dict[str, float]:
        return {"this process": own_cpu_ms(), **{role: process_cpu_ms(pid) for role, pid in pids.items()}}

    def per_turn(before: dict[str, float], turns: int) -> dict[str, float]:
        after = cpu()
        return {role: (after[role] - before[role]) / turns for role in after}

    for _ in range(runs):
        for rounds in (5, 20):  # interleaved, so drift hits both sides alike
            model = f"base-{uuid.uuid4().hex[:6]}"
            server.script(model, scenario(rounds))
            before, t = cpu(), time.monotonic()
            turns = await baseline_conversation(llm, model)
            samples[rounds]["baseline"].append((time.monotonic() - t) * 1000 / turns)
            samples[rounds]["baseline_cpu"].append(per_turn(before, turns))
            model = f"dur-{uuid.uuid4().hex[:6]}"
            server.script(model, scenario(rounds))
            before = cpu()
            run = await durable_conversation(client, settings, server, model)
            samples[rounds]["durable"].append(run)
            samples[rounds]["durable_cpu"].append(per_turn(before, run.turns))
    for rounds, sample in samples.items():
        durable: list[DurableRun] = sample["durable"]
        base_ms = statistics.median(sample["baseline"])
        dur_ms = statistics.median(r.seconds * 1000 / r.turns for r in durable)
        turns = durable[0].turns
        out[f"K={rounds}"] = {
            "turns": turns,
            "baseline_ms_per_turn": round(base_ms, 2),
            "durable_ms_per_turn": round(dur_ms, 2),
            "overhead_ms_per_turn": round(dur_ms - base_ms, 2),
            "ratio": round(dur_ms / base_ms, 2),
            "baseline_cpu_ms_per_turn": _median_by_role(sample["baseline_cpu"]),
            "durable_cpu_ms_per_turn": _median_by_role(sample["durable_cpu"]),
            "history_events_per_turn": round(statistics.median(r.history_events for r in durable) / turns, 1),
            "history_bytes_per_turn": round(statistics.median(r.history_bytes for r in durable) / turns),
            "history_bytes": statistics.median(r.history_bytes for r in durable),
            "first_token_ms": [round(x, 1) for r in durable for x in r.first_token_ms],
        }
    out["history_bytes_growth_K5_to_K20"] = round(
        out["K=20"]["history_bytes"] / out["K=5"]["history_bytes"], 2
    )
    return out


def _median_by_role(samples: list[dict[str, float]]) -> dict[str, float]:
    return {role: round(statistics.median(s[role] for s in samples), 1) for role in samples[0]}


async def first_token_latency(
    client: Client, settings: Settings, server: ScriptedModelServer
) -> dict[str, float]:
    """The model waits 300 ms before its first token, so the stream is idle
    when it comes (the realistic case); time from send to subscriber."""
    latencies: list[float] = []
    for _ in range(5):
        model = f"ftl-{uuid.uuid4().hex[:6]}"
        server.script(model, scenario(1, first_delay_ms=300))
        latencies += (await durable_conversation(client, settings, server, model)).first_token_ms
    return {
        "median_ms": round(statistics.median(latencies), 1),
        "max_ms": round(max(latencies), 1),
        "samples": len(latencies),
    }


async def kill_to_resume(
    client: Client, settings: Settings, server: ScriptedModelServer, env: dict[str, str]
) -> dict[str, float]:
    """SIGKILL the worker streaming an answer; seconds until the retried call
    is on the stream again and until its first token is, with a standby
    worker already polling (the usual deployment: more than one worker)."""
    queue = f"kill-{uuid.uuid4().hex[:6]}"
    worker_env = {**env, "TEMPORAL_TASK_QUEUE": queue}
    victim = start_worker(worker_env, log_path=DATA / "worker-victim.log")
    standby = None
    model = f"kill-{uuid.uuid4().hex[:6]}"
    slow = {"text": ANSWER * 3, "chunk_chars": 4, "delay_ms": 20}  # ~12 s of tokens
    server.script(model, [slow, slow])
    conversation = await Conversation.start(
        client,
        replace(settings, task_queue=queue),
        id=f"kill-{uuid.uuid4().hex[:6]}",
        prompt="go",
        model=model,
        close_when_idle=True,
    )
    killed_at = retry_seen = tokens_again = 0.0
    try:
        async for _offset, event in conversation.events():
            kind = event["type"]
            if kind == "message_update" and not killed_at:
                # The victim is the only worker on the queue, so it holds the
                # stream; start the standby, then kill the victim.
                standby = await asyncio.to_thread(start_worker, worker_env, None, DATA / "worker-standby.log")
                victim.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
            elif kind == "message_retry" and killed_at and not retry_seen:
                retry_seen = time.monotonic() - killed_at
            elif kind == "message_update" and retry_seen and not tokens_again:
                tokens_again = time.monotonic() - killed_at
            elif kind == "agent_end":
                break
    finally:
        stop_process(victim)
        if standby is not None:
            stop_process(standby)
    if not tokens_again:
        raise RuntimeError("the killed stream never resumed: see .agent-data/bench/worker-standby.log")
    return {"retry_started_s": round(retry_seen, 2), "tokens_again_s": round(tokens_again, 2)}


async def concurrency(
    client: Client, settings: Settings, server: ScriptedModelServer, pids: dict[str, int], n: int
) -> dict[str, Any]:
    """n conversations at once on one worker, 200 ms of model latency per
    turn. ``pids``: the dev server's and the worker's. With the CPU each
    process spent per turn, and how many cores all of them kept busy: turns
    per second are bound by the machine's cores once they are all busy."""
    rounds = 3

    async def one() -> tuple[bool, float, int]:
        model = f"conc-{uuid.uuid4().hex[:8]}"
        server.script(model, scenario(rounds, first_delay_ms=200))
        started = time.monotonic()
        try:
            conversation = await Conversation.start(
                client,
                settings,
                id=f"conc-{uuid.uuid4().hex[:8]}",
                prompt="go",
                model=model,
                close_when_idle=True,
            )
            result = await conversation.result()
        except Exception:
            return False, time.monotonic() - started, 0
        last = result.messages[-1]
        ok = isinstance(last, AssistantMessage) and last.stop_reason == "stop"
        return ok, time.monotonic() - started, rounds + 1

    def cpu() -> dict[str, float]:
        return {**{role: process_cpu_ms(pid) for role, pid in pids.items()}, "this process": own_cpu_ms()}

    before = cpu()
    started = time.monotonic()
    outcomes = await asyncio.gather(*(one() for _ in range(n)))
    wall = time.monotonic() - started
    after = cpu()
    completed = [o for o in outcomes if o[0]]
    total_turns = sum(o[2] for o in completed)
    spent = {role: after[role] - before[role] for role in after}
    overhead = sorted((seconds / turns - 0.2) * 1000 for ok, seconds, turns in completed if turns)
    return {
        "conversations": n,
        "completed": len(completed),
        "failed": n - len(completed),
        "turns_per_second": round(total_turns / wall, 1),
        "overhead_ms_per_turn_p50": round(overhead[len(overhead) // 2], 1) if overhead else None,
        "overhead_ms_per_turn_p99": round(overhead[min(len(overhead) - 1, int(len(overhead) * 0.99))], 1)
        if overhead
        else None,
        "worker_rss_mb": round(_rss_kb(pids["worker"]) / 1024, 1),
        "cpu_ms_per_turn": {
            role: round(ms / total_turns, 2) if total_turns else None for role, ms in spent.items()
        },
        "cores_busy": round(sum(spent.values()) / 1000 / wall, 2),
        "cores": os.cpu_count(),
    }


async def abort_latency(client: Client, settings: Settings, server: ScriptedModelServer) -> dict[str, float]:
    """The model streams slowly (a token every 50 ms); time from sending
    ``abort`` to the subscriber seeing ``agent_end``."""
    samples: list[float] = []
    for _ in range(5):
        model = f"abort-{uuid.uuid4().hex[:6]}"
        server.script(model, [{"text": ANSWER * 2, "chunk_chars": 4, "delay_ms": 50}])
        conversation = await Conversation.start(client, settings, prompt="talk", model=model)
        sent_at = 0.0
        async for _offset, event in conversation.events():
            if event["type"] == "message_update" and not sent_at:
                await asyncio.sleep(0.3)
                sent_at = time.monotonic()
                await conversation.abort()
            elif event["type"] == "agent_end":
                samples.append((time.monotonic() - sent_at) * 1000)
                break
        await conversation.close()
    return {"median_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1)}


async def steering_latency(
    client: Client, settings: Settings, server: ScriptedModelServer
) -> dict[str, float]:
    """A steer queued while the model thinks (after the run's first steering
    poll): time from the last tool's end to the steering message's start,
    both as the subscriber receives them."""
    samples: list[float] = []
    for _ in range(5):
        model = f"steer-{uuid.uuid4().hex[:6]}"
        call = {"id": "w", "name": "calculator", "arguments": {"expression": "1+1"}}
        server.script(model, [{"tool_calls": [call], "first_delay_ms": 300}, {"text": "steered"}])
        conversation = await Conversation.start(client, settings, prompt="go", model=model)
        await asyncio.sleep(0.1)
        await conversation.steer("change course")
        tool_ended = 0.0
        async for _offset, event in conversation.events():
            kind = event["type"]
            if kind == "tool_execution_end":
                tool_ended = time.monotonic()
            elif kind == "message_start" and event.get("queue") == "steering":
                samples.append((time.monotonic() - tool_ended) * 1000)
            elif kind == "agent_end":
                break
        await conversation.close()
    return {"median_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1)}


async def idle_conversations(
    client: Client, settings: Settings, server: ScriptedModelServer, env: dict[str, str], n: int
) -> dict[str, Any]:
    """n conversations that answered once and went idle, on one worker:
    its memory; then a long one (hundreds of tool rounds) answered, idle,
    and evicted (a new worker with an empty cache): time from its next
    prompt to the first token."""
    queue = f"idle-{uuid.uuid4().hex[:6]}"
    worker_env = {**env, "TEMPORAL_TASK_QUEUE": queue}
    idle_settings = replace(settings, task_queue=queue)
    worker = start_worker(worker_env, log_path=DATA / "worker-idle.log")
    try:
        baseline_rss = _rss_kb(worker.pid)
        model = f"idle-{uuid.uuid4().hex[:6]}"
        server.script(model, [{"text": "hello"}] * n)
        started = time.monotonic()
        conversations = await asyncio.gather(
            *(Conversation.start(client, idle_settings, prompt="hi", model=model) for _ in range(n))
        )
        for batch in range(0, n, 100):
            await asyncio.gather(*(c.wait_for_idle() for c in conversations[batch : batch + 100]))
        rss = _rss_kb(worker.pid)
        idle_seconds = time.monotonic() - started

        long_model = f"long-{uuid.uuid4().hex[:6]}"
        server.script(
            long_model, [*scenario(240)[:-1], {"text": "done"}, {"text": "again", "chunk_chars": 2}]
        )
        long = await Conversation.start(client, idle_settings, prompt="go", model=long_model)
        await long.wait_for_idle()
        history_events = 0
        async for execution in client.list_workflows(f"WorkflowId = '{long.id}'"):
            history = await client.get_workflow_handle(long.id, run_id=execution.run_id).fetch_history()
            history_events = max(history_events, len(history.events))
        current = len((await client.get_workflow_handle(long.id).fetch_history()).events)
    finally:
        stop_process(worker)
    fresh = start_worker(worker_env, log_path=DATA / "worker-idle.log")
    try:
        sent = time.monotonic()
        result = await long.send_prompt("once more")
        first = 0.0
        async for _offset, event in long.run_events(result):
            if event["type"] == "message_update":
                first = (time.monotonic() - sent) * 1000
                break
        await asyncio.gather(*(c.close() for c in [*conversations, long]))
    finally:
        stop_process(fresh)
    return {
        "idle_conversations": n,
        "worker_rss_mb": round(rss / 1024, 1),
        "worker_rss_mb_before": round(baseline_rss / 1024, 1),
        "started_and_answered_s": round(idle_seconds, 1),
        "long_history_events_max": history_events,
        "long_history_events_when_idle": current,
        "first_token_after_eviction_ms": round(first, 1),
    }


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


OLD_STORES = DATA / "old-payloads"
OLD_STORES_LIMIT = 1 << 30  # bytes kept aside before the oldest go


def fresh_payload_store() -> None:
    """Start the benchmark's payload store empty, without deleting anything.

    Every benchmark starts an in-memory dev server, so what earlier runs
    stored is unreachable; kept in place, it grew by thousands of files a
    run, and ``bench.peers`` walks the store before and after each
    conversation to count what it wrote (seconds per conversation once it
    held ~30,000 files). So the old store is renamed aside, into
    ``OLD_STORES``, and deleted by ``prune_old_payload_stores`` at the end
    of a run, after the measurements.

    Not deleted here, because a bulk delete slows down every file the
    worker then creates: on ext4 without a journal (this machine's
    root filesystem) the kernel will not reuse an inode deleted in the last
    one to six minutes, and each new file scans past every such inode
    (``recently_deleted`` in ``fs/ext4/ialloc.c``). Deleting the last run's
    ~1,000-2,000 files at the start cost the project's worker 5-10% more
    CPU per turn in a run that followed (bench/README.md, change 39). A
    worker in service never deletes its store."""
    store = DATA / "payloads"
    if store.exists():
        OLD_STORES.mkdir(parents=True, exist_ok=True)
        store.rename(OLD_STORES / f"{time.time_ns()}")


def prune_old_payload_stores(limit: int = OLD_STORES_LIMIT) -> None:
    """Delete the oldest stores set aside until what is left is under
    ``limit`` bytes. Called after a run's measurements: most runs delete
    nothing, so the next run's first minutes rarely pay for a delete."""
    if not OLD_STORES.exists():
        return
    stores = sorted(OLD_STORES.iterdir(), key=lambda path: path.name)
    sizes = {store: tree_bytes(store) for store in stores}
    total = sum(sizes.values())
    for store in stores:
        if total <= limit:
            break
        shutil.rmtree(store, ignore_errors=True)
        total -= sizes[store]


def stack_env(dev: DevServer, server: ScriptedModelServer) -> dict[str, str]:
    """Worker settings for the benchmark's stack; the payload store is shared
    with this process (its client reads stored payloads too). The tools'
    workspace is a directory of its own: the worker refuses one that holds
    the payload store (by default its working directory, which does)."""
    workspace = (DATA / "workspace").resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    env = {
        "TEMPORAL_ADDRESS": dev.address,
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "bench",
        "AGENT_STORAGE_DIR": str((DATA / "payloads").resolve()),
        "AGENT_WORKSPACE": str(workspace),
        "LOG_LEVEL": "WARNING",
    }
    for name in ("AGENT_STORAGE_DIR", "AGENT_WORKSPACE"):  # this process's settings check them too
        os.environ[name] = env[name]
    return env


async def main(runs: int, n: int, idle: int = 1000) -> dict[str, Any]:
    DATA.mkdir(parents=True, exist_ok=True)
    fresh_payload_store()
    dev = DevServer(log_path=DATA / "server.log").start()
    server = ScriptedModelServer().start()
    env = {**stack_env(dev, server), "TEMPORAL_TASK_QUEUE": TASK_QUEUE}
    worker = start_worker(env, log_path=DATA / "worker.log")
    try:
        settings = Settings.from_env(address=dev.address, task_queue=TASK_QUEUE)
        client = await connect(settings)
        pids = {"dev server": dev.process.pid, "worker": worker.pid}  # type: ignore[union-attr]
        summary = await compare(client, settings, server, runs, pids)
        summary["first_token"] = await first_token_latency(client, settings, server)
        summary["kill_to_resume"] = await kill_to_resume(client, settings, server, env)
        summary["concurrency"] = await concurrency(client, settings, server, pids, n)
        summary["abort"] = await abort_latency(client, settings, server)
        summary["steering"] = await steering_latency(client, settings, server)
        summary["idle"] = await idle_conversations(client, settings, server, env, idle)
        return summary
    finally:
        stop_process(worker)
        server.stop()
        dev.stop()
        prune_old_payload_stores()


def print_table(summary: dict[str, Any]) -> None:
    print(
        f"{'':6} {'turns':>5} {'base ms/turn':>13} {'durable ms/turn':>16} {'overhead':>9} {'ratio':>6} "
        f"{'hist ev/turn':>12} {'hist B/turn':>11}"
    )
    for key in ("K=5", "K=20"):
        row = summary[key]
        print(
            f"{key:6} {row['turns']:>5} {row['baseline_ms_per_turn']:>13} {row['durable_ms_per_turn']:>16} "
            f"{row['overhead_ms_per_turn']:>9} {row['ratio']:>6} {row['history_events_per_turn']:>12} "
            f"{row['history_bytes_per_turn']:>11}"
        )
    print(
        "CPU ms/turn by process (this process: the baseline's loop, or the durable side's client;"
        " both with the model server)"
    )
    for key in ("K=5", "K=20"):
        row = summary[key]
        base, dur = row["baseline_cpu_ms_per_turn"], row["durable_cpu_ms_per_turn"]
        print(
            f"{key:6} baseline: this process {base['this process']}"
            f" | durable: this process {dur['this process']}, worker {dur['worker']},"
            f" dev server {dur['dev server']}"
        )
    print(f"history bytes growth K=5 -> K=20: {summary['history_bytes_growth_K5_to_K20']} (turns grow 3.5x)")
    ft = summary["first_token"]
    print(f"first token, model -> subscriber: median {ft['median_ms']} ms, max {ft['max_ms']} ms")
    k = summary["kill_to_resume"]
    print(
        f"kill-to-resume after SIGKILL mid-stream: retried call on the stream after "
        f"{k['retry_started_s']} s, tokens again after {k['tokens_again_s']} s"
    )
    c = summary["concurrency"]
    print(
        f"{c['conversations']} concurrent conversations (200 ms model latency): {c['completed']} completed, "
        f"{c['failed']} failed, {c['turns_per_second']} turns/s, overhead/turn p50 "
        f"{c['overhead_ms_per_turn_p50']} ms p99 {c['overhead_ms_per_turn_p99']} ms, "
        f"worker RSS {c['worker_rss_mb']} MB"
    )
    cpu = c["cpu_ms_per_turn"]
    print(
        f"  CPU ms/turn: worker {cpu['worker']}, dev server {cpu['dev server']}, this process "
        f"{cpu['this process']} (clients and model server); {c['cores_busy']} of {c['cores']} cores busy"
    )
    a, st, i = summary["abort"], summary["steering"], summary["idle"]
    print(f"abort -> agent_end at the subscriber: median {a['median_ms']} ms, max {a['max_ms']} ms")
    print(f"last tool end -> steering message_start: median {st['median_ms']} ms, max {st['max_ms']} ms")
    print(
        f"{i['idle_conversations']} idle conversations: worker RSS {i['worker_rss_mb']} MB "
        f"(from {i['worker_rss_mb_before']} MB); a conversation of {i['long_history_events_max']} history "
        f"events at most per run ({i['long_history_events_when_idle']} when idle), evicted: first token "
        f"{i['first_token_after_eviction_ms']} ms after its next prompt"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--idle", type=int, default=1000, help="idle conversations on one worker")
    args = parser.parse_args()
    result = asyncio.run(main(args.runs, args.concurrency, args.idle))
    for key in ("K=5", "K=20"):
        result[key]["first_token_ms"] = sorted(result[key]["first_token_ms"])[:5]
    print_table(result)
    print(json.dumps(result, indent=2))
    sys.stdout.flush()
    os._exit(0)
