"""Behaviour of the scripted model server, exercised with the real `openai` client."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from testbed.scripted_model import ScriptedModelServer, ScriptStep, respond

PROJECT_ROOT = Path(__file__).resolve().parent.parent
USER_HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
CALCULATOR_TOOL = {
    "type": "function",
    "function": {"name": "calculator", "parameters": {"type": "object"}},
}
READ_FILE_TOOL = {
    "type": "function",
    "function": {"name": "read_file", "parameters": {"type": "object"}},
}


@pytest.fixture(scope="module")
def running_server() -> Iterator[ScriptedModelServer]:
    """One server for the whole module; starting it per test would be wasteful."""
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
def srv(running_server: ScriptedModelServer) -> Iterator[ScriptedModelServer]:
    """The shared server, emptied before each test so tests cannot leak steps."""
    running_server.reset()
    yield running_server


def client(srv: ScriptedModelServer) -> openai.AsyncOpenAI:
    """A real OpenAI client pointed at the scripted server, without retries."""
    return openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0)


async def stream_chunks(srv: ScriptedModelServer, model: str, **kwargs: Any) -> list[ChatCompletionChunk]:
    """All chunks of one streamed completion, with usage requested."""
    async with client(srv) as api:
        stream = await api.chat.completions.create(
            model=model,
            messages=kwargs.pop("messages", USER_HI),
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
        return [chunk async for chunk in stream]


def assembled_text(chunks: list[ChatCompletionChunk]) -> str:
    """The concatenated `delta.content` of a stream."""
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def delta_piece(chunk: ChatCompletionChunk) -> tuple[str, str] | None:
    """`("reasoning", text)` or `("content", text)` for a chunk carrying either."""
    delta = chunk.choices[0].delta
    reasoning = (delta.model_extra or {}).get("reasoning_content")
    if reasoning:
        return ("reasoning", str(reasoning))
    return ("content", delta.content) if delta.content else None


def finish_reason(chunks: list[ChatCompletionChunk]) -> str | None:
    """The finish reason of the last choice chunk."""
    return [c for c in chunks if c.choices][-1].choices[0].finish_reason


async def control(srv: ScriptedModelServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """Call the HTTP control API like an out-of-process test would."""
    root = srv.base_url.removesuffix("/v1")
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, root + path, json=body) as response,
    ):
        return response.status, await response.json()


@pytest.mark.asyncio
async def test_streamed_text_assembles_to_scripted_text_with_usage(
    srv: ScriptedModelServer,
) -> None:
    srv.script(
        "m",
        [
            {
                "text": "Hello world",
                "usage": {"prompt_tokens": 10, "completion_tokens": 20},
            }
        ],
    )
    chunks = await stream_chunks(srv, "m")
    assert assembled_text(chunks) == "Hello world"
    assert finish_reason(chunks) == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        10,
        20,
        30,
    )


@pytest.mark.asyncio
async def test_every_stream_chunk_is_a_chunk_object_of_one_response(
    srv: ScriptedModelServer,
) -> None:
    srv.script("m", [{"text": "abcdefghij", "chunk_chars": 3}])
    chunks = await stream_chunks(srv, "m")
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert {c.model for c in chunks} == {"m"}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].delta.content for c in chunks[1:5]] == [
        "abc",
        "def",
        "ghi",
        "j",
    ]


@pytest.mark.asyncio
async def test_two_parallel_tool_calls_stream_ids_names_and_arguments(
    srv: ScriptedModelServer,
) -> None:
    calls = [
        {"id": "call_1", "name": "calculator", "arguments": {"expression": "2+2"}},
        {"id": "call_2", "name": "read_file", "arguments": {"path": "README.md"}},
    ]
    srv.script("m", [{"tool_calls": calls}])
    chunks = await stream_chunks(srv, "m")
    assembled: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = assembled.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += (delta.function and delta.function.name) or ""
            call["arguments"] += (delta.function and delta.function.arguments) or ""
    assert assembled == {
        0: {"id": "call_1", "name": "calculator", "arguments": '{"expression": "2+2"}'},
        1: {"id": "call_2", "name": "read_file", "arguments": '{"path": "README.md"}'},
    }
    assert finish_reason(chunks) == "tool_calls"


@pytest.mark.asyncio
async def test_reasoning_streams_as_reasoning_content_before_text(
    srv: ScriptedModelServer,
) -> None:
    srv.script("m", [{"reasoning": "let me think", "text": "answer"}])
    chunks = await stream_chunks(srv, "m")
    pieces = [delta_piece(c) for c in chunks if c.choices]
    assert [p for p in pieces if p] == [
        ("reasoning", "let "),
        ("reasoning", "me t"),
        ("reasoning", "hink"),
        ("content", "answ"),
        ("content", "er"),
    ]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 3


@pytest.mark.asyncio
async def test_rate_limit_fault_raises_with_retry_after_then_next_call_succeeds(
    srv: ScriptedModelServer,
) -> None:
    srv.script("m", [{"fault": {"kind": "429", "retry_after": 1}}, {"text": "ok"}])
    with pytest.raises(openai.RateLimitError) as raised:
        await stream_chunks(srv, "m")
    assert raised.value.response.headers["retry-after"] == "1"
    assert raised.value.code == "rate_limit_exceeded"
    assert assembled_text(await stream_chunks(srv, "m")) == "ok"


@pytest.mark.asyncio
async def test_status_400_fault_raises_bad_request_error_with_message(
    srv: ScriptedModelServer,
) -> None:
    srv.script("m", [{"fault": {"kind": "status", "status": 400, "message": "bad tools"}}])
    with pytest.raises(openai.BadRequestError, match="bad tools"):
        await stream_chunks(srv, "m")


@pytest.mark.asyncio
async def test_drop_fault_cuts_the_stream_with_a_connection_error(
    srv: ScriptedModelServer,
) -> None:
    srv.script(
        "m",
        [
            {
                "text": "Hello world, long text",
                "fault": {"kind": "drop", "after_chunks": 3},
            }
        ],
    )
    received: list[ChatCompletionChunk] = []
    async with client(srv) as api:
        stream = await api.chat.completions.create(model="m", messages=USER_HI, stream=True)
        with pytest.raises(openai.APIConnectionError):
            async for chunk in stream:
                received.append(chunk)
    assert assembled_text(received) == "Hello wo"


@pytest.mark.asyncio
async def test_malformed_fault_makes_the_client_raise(srv: ScriptedModelServer) -> None:
    srv.script("m", [{"text": "Hello", "fault": {"kind": "malformed", "after_chunks": 2}}])
    with pytest.raises(json.JSONDecodeError):
        await stream_chunks(srv, "m")


@pytest.mark.asyncio
async def test_stall_fault_pauses_the_stream_then_completes(
    srv: ScriptedModelServer,
) -> None:
    srv.script(
        "m",
        [
            {
                "text": "abcdefgh",
                "fault": {"kind": "stall", "after_chunks": 2, "seconds": 0.3},
            }
        ],
    )
    arrivals: list[float] = []
    async with client(srv) as api:
        stream = await api.chat.completions.create(model="m", messages=USER_HI, stream=True)
        async for _ in stream:
            arrivals.append(time.monotonic())
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert gaps[1] >= 0.25
    assert max(gaps[:1] + gaps[2:]) < 0.2
    assert len(arrivals) == 4


@pytest.mark.asyncio
async def test_first_delay_holds_back_the_first_chunk(srv: ScriptedModelServer) -> None:
    srv.script("m", [{"text": "hi", "first_delay_ms": 200}])
    started = time.monotonic()
    await stream_chunks(srv, "m")
    assert time.monotonic() - started >= 0.18


@pytest.mark.asyncio
async def test_scripted_length_finish_reason_is_delivered(
    srv: ScriptedModelServer,
) -> None:
    srv.script("m", [{"text": "truncat", "finish_reason": "length"}])
    assert finish_reason(await stream_chunks(srv, "m")) == "length"


@pytest.mark.asyncio
async def test_raw_string_arguments_are_sent_verbatim(srv: ScriptedModelServer) -> None:
    srv.script("m", [{"tool_calls": [{"name": "calculator", "arguments": '{"expression": '}]}])
    chunks = await stream_chunks(srv, "m")
    arguments = "".join(
        d.function.arguments or ""
        for c in chunks
        if c.choices
        for d in c.choices[0].delta.tool_calls or []
        if d.function
    )
    assert arguments == '{"expression": '


@pytest.mark.asyncio
async def test_non_streaming_request_returns_a_chat_completion(
    srv: ScriptedModelServer,
) -> None:
    srv.script("m", [{"text": "done", "tool_calls": [{"id": "c1", "name": "calculator"}]}])
    async with client(srv) as api:
        completion = await api.chat.completions.create(model="m", messages=USER_HI)
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.message.content == "done"
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    assert choice.message.tool_calls[0].id == "c1"
    assert completion.usage is not None and completion.usage.total_tokens > 0


@pytest.mark.asyncio
async def test_requests_endpoint_records_request_bodies_in_order(
    srv: ScriptedModelServer,
) -> None:
    model = "org/model:latest"
    await stream_chunks(srv, model, messages=[{"role": "user", "content": "first"}])
    await stream_chunks(srv, model, messages=[{"role": "user", "content": "second"}])
    status, bodies = await control(srv, "GET", f"/_requests/{model}")
    assert status == 200
    assert [b["messages"][0]["content"] for b in bodies] == ["first", "second"]
    assert bodies[0]["stream_options"] == {"include_usage": True}
    assert srv.requests(model) == bodies


@pytest.mark.asyncio
async def test_http_control_api_queues_and_clears_steps(
    srv: ScriptedModelServer,
) -> None:
    model = "org/model:latest"
    status, _ = await control(srv, "POST", f"/_scripts/{model}", {"steps": [{"text": "a"}, {"text": "b"}]})
    assert status == 200
    assert assembled_text(await stream_chunks(srv, model)) == "a"
    assert (await control(srv, "GET", f"/_scripts/{model}"))[1] == {"steps": [{"text": "b"}]}
    assert (await control(srv, "DELETE", f"/_scripts/{model}"))[1]["cleared"] == 1
    assert srv.pending(model) == []


@pytest.mark.asyncio
async def test_invalid_step_is_rejected_with_400(srv: ScriptedModelServer) -> None:
    status, body = await control(srv, "POST", "/_scripts/m", {"steps": [{"txt": "typo"}]})
    assert status == 400
    assert "txt" in body["error"]["message"]


@pytest.mark.asyncio
async def test_models_endpoint_lists_the_demo_model(srv: ScriptedModelServer) -> None:
    async with client(srv) as api:
        models = [model.id async for model in api.models.list()]
    assert "scripted-demo" in models


@pytest.mark.asyncio
async def test_demo_brain_calls_calculator_for_each_expression(
    srv: ScriptedModelServer,
) -> None:
    messages = [{"role": "user", "content": "What is 2 + 2 and (3*4)/2?"}]
    chunks = await stream_chunks(srv, "scripted-demo", messages=messages, tools=[CALCULATOR_TOOL])
    calls = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or [] if d.id]
    assert [(d.index, d.function and d.function.name) for d in calls] == [
        (0, "calculator"),
        (1, "calculator"),
    ]
    step = respond({"messages": messages, "tools": [CALCULATOR_TOOL]})
    assert [call.arguments for call in step.tool_calls] == [
        {"expression": "2 + 2"},
        {"expression": "(3*4)/2"},
    ]
    assert [call.id for call in step.tool_calls] == [d.id for d in calls]


def test_demo_brain_reads_a_mentioned_file() -> None:
    request = {
        "messages": [{"role": "user", "content": "Summarise docs/intro.md please"}],
        "tools": [CALCULATOR_TOOL, READ_FILE_TOOL],
    }
    step = respond(request)
    assert [(c.name, c.arguments) for c in step.tool_calls] == [("read_file", {"path": "docs/intro.md"})]


def test_demo_brain_summarises_tool_results() -> None:
    messages = [
        {"role": "user", "content": "2+2 and 3*3"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": "{}"},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "4"},
        {"role": "tool", "tool_call_id": "b", "content": "9\nmore detail"},
    ]
    step = respond({"messages": messages, "tools": [CALCULATOR_TOOL]})
    assert step.text == "calculator returned 4; calculator returned 9."
    assert step.tool_calls == []


def test_demo_brain_quotes_a_plain_message() -> None:
    step = respond({"messages": [{"role": "user", "content": "hello there"}]})
    assert step.text is not None
    assert 'You said: "hello there"' in step.text
    assert "OPENAI_API_KEY" in step.text


def test_demo_brain_is_deterministic() -> None:
    request = {
        "messages": [{"role": "user", "content": "1+1"}],
        "tools": [CALCULATOR_TOOL],
    }
    assert respond(request) == respond(request)
    assert isinstance(respond(request), ScriptStep)


def test_main_prints_the_url_and_exits_zero_on_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "testbed.scripted_model", "--host", "127.0.0.1", "--port", "0"],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("scripted model listening on http://127.0.0.1:")
        assert line.rstrip().endswith("/v1")
        asyncio.run(_list_models(line.split()[-1]))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
        assert process.stdout.read() == ""
    finally:
        process.kill()
        process.wait()


async def _list_models(base_url: str) -> None:
    """Prove the subprocess serves the OpenAI API at the announced URL."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as api:
        assert [m.id async for m in api.models.list()] == ["scripted-demo"]
