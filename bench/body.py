"""A model call's request body: CPU per call as the context grows.

    .venv/bin/python -m bench.body [--repeat 5]

Each model call sends the whole context. The worker keeps a conversation's
messages and what they were converted to (``ConversionMemo``); the body
was still serialised whole every call. Since bench/README.md change 41
each kept message also keeps its JSON as sent (``WirePart``), and a call
encodes only its new messages. Side by side in one process, for contexts
of K tool rounds (two ``read_file`` calls each, outputs of a given size):
the conversion plus the body's encoding per call, the kept JSON against
the whole body (``json.dumps`` of the memo's plain dicts, as before).
Process CPU, the best of ``--repeat`` timings of many calls.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from activities import openai_chat
from activities.model_http import request_body
from workflows.models import (
    AgentMessage,
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

CASES = ((20, 8), (20, 2_000), (100, 2_000), (150, 8_000))  # (tool rounds, bytes per tool output)


def context(rounds: int, output: int) -> list[AgentMessage]:
    messages: list[AgentMessage] = [UserMessage(content="work through the files")]
    for i in range(rounds):
        calls = [
            ToolCall(id=f"call_{i}_{j}", name="read_file", arguments={"path": f"/src/m{i}_{j}.py"})
            for j in range(2)
        ]
        messages.append(AssistantMessage(content=list(calls), stop_reason="toolUse"))
        text = "x = 'é'\n" * (output // 8)
        messages += [
            ToolResultMessage(tool_call_id=c.id, tool_name="read_file", content=[TextContent(text=text)])
            for c in calls
        ]
    return messages


def call_cost(messages: list[AgentMessage], kept_json: bool, repeat: int) -> tuple[float, int]:
    """CPU ms per call of converting ``messages`` and encoding the body; the body's size."""
    shared = openai_chat._SHARED
    if not kept_json:
        openai_chat._SHARED = openai_chat._FRESH  # memoised plain dicts: the body serialised whole
    try:
        memo = openai_chat.ConversionMemo()
        encode: Callable[[dict[str, object]], bytes] = (
            request_body
            if kept_json
            else lambda p: json.dumps(p, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        )

        def one() -> bytes:
            sent = openai_chat.to_openai_messages("You are a coding agent.", messages, memo)
            return encode(
                {"model": "m", "messages": sent, "stream": True, "stream_options": {"include_usage": True}}
            )

        size = len(one())  # the first call converts and encodes all: not timed
        calls = max(20, int(2_000 / (1 + size / 20_000)))
        best = float("inf")
        for _ in range(repeat):
            start = time.process_time()
            for _ in range(calls):
                one()
            best = min(best, (time.process_time() - start) / calls * 1_000)
        return best, size
    finally:
        openai_chat._SHARED = shared


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("rounds  output B   body KB | CPU ms per call: whole body  kept JSON  ratio")
    for rounds, output in CASES:
        messages = context(rounds, output)
        before, size = call_cost(messages, False, args.repeat)
        after, _ = call_cost(messages, True, args.repeat)
        print(
            f"{rounds:6d} {output:9,d} {size / 1000:9.1f} | "
            f"{before:27.3f} {after:10.3f} {after / before:6.2f}x"
        )


if __name__ == "__main__":
    main()
