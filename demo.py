"""The main job: a durable agent conversation in under a minute, no key needed.

    python demo.py

Starts an embedded Temporal dev server (with its UI, reading payloads
through the codec server), the scripted model
(unless OPENAI_API_KEY is set, then the real model is used) and a worker,
then runs one conversation that shows the point of the product: parallel
tool calls, a steering message injected mid-run, a queued follow-up, and
the worker killed with SIGKILL mid-answer and replaced, the conversation
finishing as if nothing happened. It ends with the conversation's link in
the Temporal UI (the servers stay up until Ctrl-C when run in a terminal).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console

from client import Conversation
from console.render import EventRenderer, output_console
from runtime.connect import connect
from runtime.settings import Settings
from testbed.local_stack import (
    CodecServer,
    DevServer,
    start_scripted_model,
    start_worker,
    stop_process,
    temporal_cli,
)

DATA = Path(".agent-data")
LOCAL = "127.0.0.1,localhost"
PROMPT = "Compute 17*23 and 2**10-1 with the calculator, and list the files of this project."
STEER = "Also tell me which of the two numbers is larger."
FOLLOW_UP = "Now sum it all up in one sentence."


def demo_script() -> list[dict[str, Any]]:
    """What the scripted model answers, turn by turn."""
    answer = {
        "text": "17*23 = 391 and 2**10-1 = 1023, so 1023 is the larger one. The project has "
        "workflows/, activities/, a worker and a starter: the agent loop runs as a Temporal workflow.",
        "delay_ms": 45,
        "chunk_chars": 3,
    }
    return [
        {
            "reasoning": "Two calculations and a listing: I can run all three tools at once.",
            "delay_ms": 40,
            "tool_calls": [
                {"id": "calc_1", "name": "calculator", "arguments": {"expression": "17*23"}},
                {"id": "calc_2", "name": "calculator", "arguments": {"expression": "2**10-1"}},
                {"id": "list_1", "name": "list_files", "arguments": {"path": "."}},
            ],
        },
        answer,
        answer,  # the worker dies while this streams: the retried call is answered again
        {
            "text": "Two numbers computed in parallel, the larger found, and the project listed.",
            "delay_ms": 30,
        },
    ]


def script_model(base_url: str, model: str, steps: list[dict[str, Any]]) -> None:
    control = base_url.removesuffix("/v1")
    request = urllib.request.Request(
        f"{control}/_scripts/{model}",
        data=json.dumps({"steps": steps}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    # The model server is on this machine: never through an http_proxy the user set.
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5).read()


async def run_demo(console: Console, outcome: list[int] | None = None) -> int:
    """The demo; its exit code, also left in ``outcome[0]`` once known (a
    Ctrl-C while the servers stay up for the UI ends ``asyncio.run`` with
    KeyboardInterrupt, not with this return)."""
    # A closed terminal (SIGHUP) or a `kill` (SIGTERM) stops the servers as
    # Ctrl-C does: before, they were left running.
    main_task = asyncio.current_task()
    assert main_task is not None
    for sig in (signal.SIGHUP, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, main_task.cancel)
    DATA.mkdir(exist_ok=True)
    server = DevServer(
        db_filename=str(DATA / "demo-temporal.db"),
        log_path=DATA / "demo-server.log",
        # The worker's storage settings are the codec server's too: both inherit this environment.
        codec=CodecServer(log_path=DATA / "demo-codec.log"),
    )
    console.print("[dim]starting the Temporal dev server…[/]")
    server.start()
    model_process: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = []
    try:
        env = {"TEMPORAL_ADDRESS": server.address, "TEMPORAL_TASK_QUEUE": "agent-demo"}
        configured = Settings.from_env()  # the AGENT_MODEL and OPENAI_API_KEY the worker reads
        model = configured.default_model
        if not configured.openai_api_key:
            model_process, base_url = start_scripted_model(DATA / "demo-model.log")
            model = f"scripted-demo-{uuid.uuid4().hex[:6]}"
            script_model(base_url, model, demo_script())
            # The model server is on this machine: never through an http_proxy the user set.
            users = os.environ.get("no_proxy") or os.environ.get("NO_PROXY")
            no_proxy = f"{users},{LOCAL}" if users else LOCAL
            env |= {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "offline"}
            env |= {"no_proxy": no_proxy, "NO_PROXY": no_proxy}
            console.print("[dim]no OPENAI_API_KEY: using the scripted offline model[/]")
        workers.append(start_worker(env, log_path=DATA / "demo-worker.log"))
        settings = Settings.from_env(address=server.address, task_queue="agent-demo", ui_url=server.ui_url)
        conversation = await Conversation.start(
            await connect(settings),
            settings,
            id=f"demo-{uuid.uuid4().hex[:6]}",
            prompt=PROMPT,
            model=model,
            close_when_idle=True,
        )
        workflow_id = conversation.id
        renderer = EventRenderer(console)
        steered = killed = False
        assistant_starts = 0
        failure: str | None = None
        async for _offset, event in conversation.events():
            renderer.render(event)
            kind = event["type"]
            if kind == "message_update" and not steered:
                steered = True
                await conversation.steer(STEER)
                await conversation.follow_up(FOLLOW_UP)
                renderer.end_line()
                console.print(f"[magenta]» steering sent mid-run:[/] {STEER}")
                console.print(f"[magenta]» follow-up queued:[/] {FOLLOW_UP}")
            if kind == "message_start" and event["message"]["role"] == "assistant":
                assistant_starts += 1
            if kind == "message_end" and event["message"]["role"] == "assistant":
                ended = event["message"]
                failure = (
                    ended.get("errorMessage") or "no reason given"
                    if ended.get("stopReason") == "error"
                    else None
                )
            if kind == "message_update" and assistant_starts == 2 and steered and not killed:
                killed = True
                await asyncio.sleep(0.6)
                workers[0].send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
                renderer.end_line()
                console.print("[bold red]✂ worker killed with SIGKILL mid-answer; starting a new one…[/]")
                workers.append(start_worker(env, log_path=DATA / "demo-worker.log"))
            if kind == "message_retry" and killed:
                console.print(f"[dim](resumed {time.monotonic() - killed_at:.1f} s after the kill)[/]")
            if kind == "agent_end":
                break
        renderer.end_line()
        console.print()
        if failure is not None:
            console.print(f"[bold red]The demo failed: the model call failed ({failure}).[/]")
        # soft_wrap: a link or command cut at the terminal's width (or at 80
        # columns when piped) cannot be copied (a README audit).
        link = settings.workflow_url(workflow_id)
        console.print(f"[bold]See every step in the Temporal UI:[/] {link}", soft_wrap=True)
        if server.codec is not None:
            console.print(
                f"[dim]or from the CLI: {_temporal_command()} workflow query --address {server.address} "
                f"--workflow-id {workflow_id} --type messages --codec-endpoint {server.codec.url}[/]",
                soft_wrap=True,
            )
        if not sys.stdin.isatty():
            console.print("[dim](input is not a terminal: the servers stop now, and the link with them)[/]")
        code = 0 if failure is None else 1
        if outcome is not None:
            outcome[0] = code
        if sys.stdin.isatty():
            console.print("[dim]Servers stay up for the UI; press Ctrl-C to stop.[/]")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass
        return code
    finally:
        for worker in workers:
            stop_process(worker)
        stop_process(model_process)
        server.stop()


def _temporal_command() -> str:
    """How to run the Temporal CLI from this shell: ``temporal`` when it is on
    PATH, else the virtualenv's (``.venv/bin/temporal``, from the checkout;
    the bare name failed in a fresh shell, a new user's audit)."""
    path = temporal_cli()
    if shutil.which("temporal") == path:
        return "temporal"
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path


def main() -> None:
    console = output_console()
    outcome = [0]  # interrupted before the end: 0, as a Ctrl-C always was
    try:
        code = asyncio.run(run_demo(console, outcome))
    except (KeyboardInterrupt, asyncio.CancelledError):
        code = outcome[0]
    sys.stdout.flush()
    os._exit(code)  # the SDK can crash at interpreter exit (sdk-python #300)


if __name__ == "__main__":
    main()
