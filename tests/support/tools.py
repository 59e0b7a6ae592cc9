"""Tools the tests load into the worker with ``--tools tests.support.tools``."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from activities.tools import ToolResult, report_progress, tool, tool_context
from workflows.models import ImageContent, TextContent


class EchoArgs(BaseModel):
    text: str
    delay: float = 0.0


@tool(description="Echo the text after an optional delay (seconds).")
async def echo(args: EchoArgs) -> str:
    await asyncio.sleep(args.delay)
    return f"echo: {args.text}"


@tool(description="Echo, but always one call at a time.", execution_mode="sequential")
async def sequential_echo(args: EchoArgs) -> str:
    await asyncio.sleep(args.delay)
    return f"sequential: {args.text}"


class SlowArgs(BaseModel):
    seconds: float
    steps: int = 4


@tool(description="Work for a while, reporting progress; records each start in AGENT_TEST_LEDGER.")
async def slow(args: SlowArgs) -> str:
    ledger = os.environ.get("AGENT_TEST_LEDGER")
    if ledger:
        with Path(ledger).open("a") as f:
            f.write(f"{tool_context().idempotency_key}\n")
    for step in range(args.steps):
        await asyncio.sleep(args.seconds / args.steps)
        report_progress(f"step {step + 1}/{args.steps}")
    return f"slept {args.seconds}s"


class NoArgs(BaseModel):
    pass


@tool(description="Finish the task: the loop stops when every call of the batch finishes.")
async def finish(args: NoArgs) -> ToolResult:
    return ToolResult(content="done", terminate=True)


@tool(description="Always raises.")
async def explode(args: NoArgs) -> str:
    raise RuntimeError("the tool blew up")


@tool(description="Raises asyncio.CancelledError itself, as a library leaking a cancellation might.")
async def cancels_itself(args: NoArgs) -> str:
    raise asyncio.CancelledError("a library's own cancellation")


class ExitArgs(BaseModel):
    code: int = 1


@tool(description="Calls sys.exit, as a command-line library might.")
async def exits(args: ExitArgs) -> str:
    raise SystemExit(args.code)


@tool(description="Fails quoting the worker's credentials, as a careless library might.")
async def leaky(args: NoArgs) -> str:
    key = os.environ.get("OPENAI_API_KEY", "")
    raise RuntimeError(f"cannot connect to postgres://agent:{key}@db:5432 (api_key={key}, token {key})")


@tool(description="Prints the worker's environment, as a debugging tool or a `cat .env` might.")
async def printenv(args: NoArgs) -> ToolResult:
    env = f"OPENAI_API_KEY={os.environ.get('OPENAI_API_KEY', '')}\nHOME={os.environ.get('HOME', '')}"
    report_progress({"content": [{"type": "text", "text": env}]})
    await asyncio.sleep(0.1)  # the progress is sent on its own (a signal), not with the result
    return ToolResult(content=env, details={"environment": env})


@tool(description="Report the idempotency key of this call.")
async def whoami(args: NoArgs) -> ToolResult:
    context = tool_context()
    return ToolResult(
        content=context.idempotency_key,
        details={"toolCallId": context.tool_call_id, "key": context.idempotency_key},
    )


PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


@tool(description="Take a picture: a caption and a one-pixel PNG.")
async def picture(args: NoArgs) -> ToolResult:
    return ToolResult(
        content=[TextContent(text="a picture"), ImageContent(data=PIXEL_PNG, mime_type="image/png")]
    )


class SizeArgs(BaseModel):
    megabytes: float


@tool(description="Return this many megabytes of text.")
async def big_output(args: SizeArgs) -> str:
    return "x" * int(args.megabytes * 1_000_000)


@tool(description="Return a small text with this many megabytes of details.")
async def big_details(args: SizeArgs) -> ToolResult:
    return ToolResult(content="see details", details={"blob": "y" * int(args.megabytes * 1_000_000)})


@tool(
    description="Return a small text with details of this many million characters of three UTF-8 bytes each."
)
async def wide_details(args: SizeArgs) -> ToolResult:
    return ToolResult(content="see details", details={"blob": "中" * int(args.megabytes * 1_000_000)})


@tool(description="Needs a person's approval before it runs.", requires_approval=True)
async def guarded_echo(args: EchoArgs) -> str:
    return f"approved: {args.text}"


def guarded_call(call_id: str, text: str) -> dict[str, Any]:
    """A scripted model's call of ``guarded_echo``."""
    return {"id": call_id, "name": "guarded_echo", "arguments": {"text": text}}


class BulkyArgs(BaseModel):
    tag: str
    kib: int


@tool(description="Answer output-<tag>, with kib KiB of incompressible details (a big result).")
async def bulky(args: BulkyArgs) -> ToolResult:
    noise = base64.b64encode(os.urandom(args.kib * 1024 * 3 // 4)).decode()
    return ToolResult(content=f"output-{args.tag}", details={"noise": noise})
