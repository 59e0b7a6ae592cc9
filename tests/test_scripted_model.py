"""Behaviour of the scripted model server, exercised with the real `openai` client."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import socket
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
from pydantic import ValidationError

from testbed.scripted_model import ScriptedModelServer, ScriptStep, respond
from testbed.scripted_model.server import tool_message_problem, tools_problem

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


def streamed_arguments(chunks: list[Any]) -> str:
    """The tool-call argument text of a stream, its deltas joined."""
    return "".join(
        d.function.arguments or ""
        for c in chunks
        if c.choices
        for d in c.choices[0].delta.tool_calls or []
        if d.function
    )


@pytest.mark.asyncio
async def test_raw_string_arguments_are_sent_verbatim(srv: ScriptedModelServer) -> None:
    srv.script("m", [{"tool_calls": [{"name": "calculator", "arguments": '{"expression": '}]}])
    chunks = await stream_chunks(srv, "m")
    arguments = streamed_arguments(chunks)
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


def test_demo_brain_calls_calculator_for_a_power() -> None:
    """The README's own example asks "And 2**10?": it was quoted back, not
    computed (an operator audit)."""
    step = respond({"messages": [{"role": "user", "content": "And 2**10?"}], "tools": [CALCULATOR_TOOL]})
    assert [call.arguments for call in step.tool_calls] == [{"expression": "2**10"}]


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


async def raw_post(srv: ScriptedModelServer, body: Any) -> tuple[int, dict[str, str], bytes, bool]:
    """POST a completion over plain HTTP: status, headers, the bytes received, and
    whether the body ended cleanly (False when the connection was cut)."""
    url = srv.base_url + "/chat/completions"
    received = b""
    async with aiohttp.ClientSession() as session:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as response:
            try:
                async for piece in response.content.iter_any():
                    received += piece
            except aiohttp.ClientPayloadError:
                return response.status, dict(response.headers), received, False
            return response.status, dict(response.headers), received, True


def sse_events(raw: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded where they are JSON."""
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            payload = block.removeprefix("data: ")
            try:
                events.append(json.loads(payload))
            except ValueError:
                events.append(payload)
    return events


def stream_body(model: str = "m", **extra: Any) -> dict[str, Any]:
    """A streamed request body for `model`."""
    return {"model": model, "messages": USER_HI, "stream": True, **extra}


# ---------------------------------------------------------------- store and control API


@pytest.mark.asyncio
async def test_requests_are_copies_a_test_cannot_change(srv: ScriptedModelServer) -> None:
    """A test that edits the list it got back does not rewrite what the server recorded."""
    await stream_chunks(srv, "m")
    srv.requests("m")[0]["model"] = "edited"
    srv.requests("m").clear()
    assert [body["model"] for body in srv.requests("m")] == ["m"]


@pytest.mark.asyncio
async def test_delete_requests_forgets_the_model_requests(srv: ScriptedModelServer) -> None:
    """`DELETE /_requests/{model}` says how many it forgot and forgets them."""
    await stream_chunks(srv, "org/m")
    await stream_chunks(srv, "other")
    assert await control(srv, "DELETE", "/_requests/org/m") == (200, {"model": "org/m", "cleared": 1})
    assert (await control(srv, "GET", "/_requests/org/m"))[1] == []
    assert len(srv.requests("other")) == 1


@pytest.mark.asyncio
async def test_reset_forgets_queued_steps_and_recorded_requests(srv: ScriptedModelServer) -> None:
    """`POST /_reset` empties every queue and every request log."""
    srv.script("m", [{"text": "queued"}])
    await stream_chunks(srv, "other")
    assert await control(srv, "POST", "/_reset") == (200, {"reset": True})
    assert srv.pending("m") == []
    assert srv.requests("other") == []


@pytest.mark.asyncio
async def test_models_endpoint_lists_models_that_were_only_called(srv: ScriptedModelServer) -> None:
    """`/v1/models` lists a model that was called without a script."""
    await stream_chunks(srv, "only-called")
    async with client(srv) as api:
        assert "only-called" in [model.id async for model in api.models.list()]


@pytest.mark.asyncio
async def test_a_refused_request_is_still_recorded(srv: ScriptedModelServer) -> None:
    """Every request body is recorded, also one refused with 400 (to see what the agent sent)."""
    bad_tool = {"type": "function", "function": {"name": "bad name!"}}
    async with client(srv) as api:
        with pytest.raises(openai.BadRequestError):
            await api.chat.completions.create(model="m", messages=USER_HI, tools=[bad_tool])  # type: ignore[list-item]
    assert [body["tools"] for body in srv.requests("m")] == [[bad_tool]]


@pytest.mark.asyncio
async def test_a_body_without_a_string_model_is_refused_with_400(srv: ScriptedModelServer) -> None:
    """A body that is not JSON, or whose model is not a string, gets a clear 400."""
    for body in (b"{not json", {"model": 7, "messages": USER_HI}):
        status, _, raw, _ = await raw_post(srv, body)
        assert status == 400
        assert "string 'model'" in json.loads(raw)["error"]["message"]


@pytest.mark.asyncio
async def test_a_body_larger_than_a_mebibyte_is_accepted(srv: ScriptedModelServer) -> None:
    """Long contexts (over aiohttp's 1 MiB default) are served, as real servers do."""
    messages = [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]
    srv.script("m", [{"text": "ok"}])
    assert assembled_text(await stream_chunks(srv, "m", messages=messages)) == "ok"


def test_starting_a_running_server_again_is_refused() -> None:
    """A second `start()` on a running server raises instead of leaking a loop."""
    with ScriptedModelServer() as server, pytest.raises(RuntimeError, match="already running"):
        server.start()


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_an_ipv6_host_gives_a_bracketed_base_url() -> None:
    """Bound to `::1`, the base URL is `http://[::1]:PORT/v1`, usable by a client."""
    with ScriptedModelServer(host="::1") as server:
        assert server.base_url.startswith("http://[::1]:")


# ---------------------------------------------------------------- wire format


@pytest.mark.asyncio
async def test_tool_call_id_type_and_name_come_only_in_the_first_delta_of_each_call(
    srv: ScriptedModelServer,
) -> None:
    """A call opens with index, id, type and name (empty arguments); its later deltas carry only
    index and argument pieces, as OpenAI streams them."""
    calls = [
        {"id": "c0", "name": "calculator", "arguments": {"expression": "2+2"}},
        {"id": "c1", "name": "read_file", "arguments": {"path": "a"}},
    ]
    srv.script("m", [{"tool_calls": calls}])
    _, _, raw, _ = await raw_post(srv, stream_body())
    deltas = [
        call
        for event in sse_events(raw)
        if isinstance(event, dict) and event["choices"]
        for call in event["choices"][0]["delta"].get("tool_calls", [])
    ]
    for index, (call_id, name) in enumerate([("c0", "calculator"), ("c1", "read_file")]):
        mine = [d for d in deltas if d["index"] == index]
        assert mine[0] == {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        assert len(mine) > 2
        assert all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in mine[1:])


@pytest.mark.asyncio
async def test_calls_without_scripted_ids_get_distinct_ids_across_calls_and_completions(
    srv: ScriptedModelServer,
) -> None:
    """Unscripted tool call ids never repeat, within a completion or across completions."""
    step = {"tool_calls": [{"name": "calculator"}, {"name": "calculator"}]}
    srv.script("m", [step, step])
    ids = []
    for _ in range(2):
        chunks = await stream_chunks(srv, "m")
        ids += [d.id for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or [] if d.id]
    assert len(ids) == 4 and len(set(ids)) == 4
    assert all(i.startswith("call_") and len(i) <= 40 for i in ids)


@pytest.mark.asyncio
async def test_no_usage_chunk_unless_include_usage_is_asked(srv: ScriptedModelServer) -> None:
    """Without `stream_options.include_usage` every chunk has a choice and no usage."""
    srv.script("m", [{"text": "hello"}])
    async with client(srv) as api:
        stream = await api.chat.completions.create(model="m", messages=USER_HI, stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(c.choices and c.usage is None for c in chunks)


@pytest.mark.asyncio
async def test_usage_estimate_rounds_a_partial_token_up(srv: ScriptedModelServer) -> None:
    """Unscripted completion tokens are chars/4 rounded up: 5 characters count as 2 tokens."""
    srv.script("m", [{"text": "abcde", "usage": {"prompt_tokens": 1}}])
    usage = (await stream_chunks(srv, "m"))[-1].usage
    assert usage is not None and (usage.completion_tokens, usage.total_tokens) == (2, 3)


@pytest.mark.asyncio
async def test_scripted_zero_token_counts_are_reported_as_zero(srv: ScriptedModelServer) -> None:
    """A scripted count of 0 is sent as 0, not replaced by the estimate."""
    srv.script("m", [{"text": "hello world", "usage": {"prompt_tokens": 0, "completion_tokens": 0}}])
    usage = (await stream_chunks(srv, "m"))[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        0,
        0,
        0,
    )


@pytest.mark.asyncio
async def test_stream_ends_with_done(srv: ScriptedModelServer) -> None:
    """A normal stream ends with `data: [DONE]` after the finish and usage chunks."""
    srv.script("m", [{"text": "hi"}])
    _, headers, raw, clean = await raw_post(srv, stream_body(stream_options={"include_usage": True}))
    assert clean and raw.endswith(b"data: [DONE]\n\n")
    assert headers["Content-Type"] == "text/event-stream"


@pytest.mark.asyncio
async def test_scripted_content_type_labels_the_stream(srv: ScriptedModelServer) -> None:
    """`content_type` replaces the stream's Content-Type (proxies that say application/json)."""
    srv.script("m", [{"text": "hi", "content_type": "application/json"}])
    _, headers, raw, _ = await raw_post(srv, stream_body())
    assert headers["Content-Type"] == "application/json"
    assert sse_events(raw)[-1] == "[DONE]"


@pytest.mark.asyncio
async def test_whole_step_answers_a_stream_request_with_one_json_completion(srv: ScriptedModelServer) -> None:
    """`whole: true` answers even a streamed request with one `chat.completion` JSON."""
    srv.script("m", [{"text": "all at once", "whole": True}])
    _, headers, raw, _ = await raw_post(srv, stream_body())
    assert headers["Content-Type"].startswith("application/json")
    completion = json.loads(raw)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"] == "all at once"


@pytest.mark.asyncio
async def test_delay_ms_paces_every_content_chunk(srv: ScriptedModelServer) -> None:
    """`delay_ms` is waited before each content chunk, streamed or not."""
    step = {"text": "abcdefgh", "chunk_chars": 2, "delay_ms": 60}
    srv.script("m", [step, step])
    started = time.monotonic()
    await stream_chunks(srv, "m")
    assert time.monotonic() - started >= 0.22
    started = time.monotonic()
    async with client(srv) as api:
        await api.chat.completions.create(model="m", messages=USER_HI)
    assert time.monotonic() - started >= 0.22


@pytest.mark.asyncio
async def test_non_streaming_completion_carries_reasoning_and_exact_arguments(
    srv: ScriptedModelServer,
) -> None:
    """A whole completion has `reasoning_content`, each call's arguments as scripted, and
    null content when there is no text (as OpenAI's tool-call answers)."""
    call = {"id": "c1", "name": "calculator", "arguments": {"expression": "6*7"}}
    srv.script("m", [{"reasoning": "think", "tool_calls": [call]}])
    async with client(srv) as api:
        completion = await api.chat.completions.create(model="m", messages=USER_HI)
    message = completion.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == "think"
    assert message.content is None
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.arguments == '{"expression": "6*7"}'  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_non_ascii_arguments_are_sent_as_is(srv: ScriptedModelServer) -> None:
    """Arguments with non-ASCII text stream unescaped, as OpenAI sends them."""
    srv.script("m", [{"tool_calls": [{"name": "read_file", "arguments": {"path": "Zürich.txt"}}]}])
    chunks = await stream_chunks(srv, "m")
    arguments = streamed_arguments(chunks)
    assert arguments == '{"path": "Zürich.txt"}'


@pytest.mark.asyncio
async def test_first_token_time_is_noted_for_a_streamed_answer(srv: ScriptedModelServer) -> None:
    """The benchmark reads when the first content chunk left (`store.first_tokens`)."""
    srv.script("m", [{"text": "hello"}])
    before = time.time()
    await stream_chunks(srv, "m")
    noted = srv.store.first_tokens("m")
    assert len(noted) == 1 and before <= noted[0] <= time.time()


# ---------------------------------------------------------------- faults


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "error_type", "code"),
    [
        (429, "requests", "rate_limit_exceeded"),
        (400, "invalid_request_error", None),
        (500, "server_error", None),
    ],
)
async def test_status_fault_error_type_and_code_follow_openai(
    srv: ScriptedModelServer, status: int, error_type: str, code: str | None
) -> None:
    """A status fault's error body has OpenAI's type and code for that status."""
    srv.script("m", [{"fault": {"kind": str(status)}}])
    got, _, raw, _ = await raw_post(srv, stream_body())
    error = json.loads(raw)["error"]
    assert (got, error["type"], error["code"]) == (status, error_type, code)
    assert error["message"].startswith(f"scripted {status} ")


@pytest.mark.asyncio
async def test_raw_body_fault_is_sent_as_html_or_text_with_retry_after(srv: ScriptedModelServer) -> None:
    """A raw body is sent as text/html when it starts with `<`, else text/plain, with Retry-After."""
    srv.script(
        "m",
        [
            {"fault": {"kind": "502", "body": "  <html>bad gateway</html>", "retry_after": 0.5}},
            {"fault": {"kind": "404", "body": "404 page not found"}},
        ],
    )
    status, headers, raw, _ = await raw_post(srv, stream_body())
    assert (status, raw) == (502, b"  <html>bad gateway</html>")
    assert headers["Content-Type"].startswith("text/html") and headers["Retry-After"] == "0.5"
    status, headers, raw, _ = await raw_post(srv, stream_body())
    assert (status, raw) == (404, b"404 page not found")
    assert headers["Content-Type"].startswith("text/plain") and "Retry-After" not in headers


@pytest.mark.asyncio
async def test_status_fault_outside_4xx_5xx_is_a_script_error(srv: ScriptedModelServer) -> None:
    """A status fault must be an HTTP error (400-599); a 200 or 600 is refused when scripted."""
    for status in (200, 600):
        with pytest.raises(ValidationError):
            srv.script("m", [{"fault": {"kind": "status", "status": status}}])
    assert srv.pending("m") == []


@pytest.mark.asyncio
async def test_malformed_fault_sends_a_broken_event_then_cuts_the_connection(
    srv: ScriptedModelServer,
) -> None:
    """After the broken `data: {not json` event the connection is cut, with no `[DONE]`."""
    srv.script("m", [{"text": "Hello", "fault": {"kind": "malformed", "after_chunks": 2}}])
    _, _, raw, clean = await raw_post(srv, stream_body())
    assert not clean
    assert raw.endswith(b"data: {not json\n\n")
    assert len(sse_events(raw)) == 3


@pytest.mark.asyncio
async def test_drop_fault_by_default_cuts_right_after_the_role_chunk(srv: ScriptedModelServer) -> None:
    """`{"kind": "drop"}` streams only the opening role chunk, then cuts."""
    srv.script("m", [{"text": "Hello", "fault": {"kind": "drop"}}])
    _, _, raw, clean = await raw_post(srv, stream_body())
    events = sse_events(raw)
    assert not clean
    assert [e["choices"][0]["delta"] for e in events] == [{"role": "assistant", "content": ""}]


@pytest.mark.asyncio
async def test_error_event_fault_sends_the_error_then_done(srv: ScriptedModelServer) -> None:
    """An error event comes after `after_chunks` chunks, in `{"error": {...}}` shape, then `[DONE]`."""
    srv.script("m", [{"text": "Hello", "fault": {"kind": "error_event", "after_chunks": 2, "code": 503}}])
    _, _, raw, clean = await raw_post(srv, stream_body())
    events = sse_events(raw)
    assert clean
    assert len(events) == 4
    assert events[2] == {"error": {"message": "scripted error mid-stream", "type": None, "code": 503}}
    assert events[3] == "[DONE]"


@pytest.mark.asyncio
async def test_faults_apply_to_non_streaming_requests_too(srv: ScriptedModelServer) -> None:
    """Non-streamed: a stall delays the answer, a drop cuts the connection, a malformed body
    is not JSON, an error event is a 200 with an error object."""
    srv.script(
        "m",
        [
            {"text": "late", "fault": {"kind": "stall", "seconds": 0.3}},
            {"text": "x", "fault": {"kind": "drop"}},
            {"text": "x", "fault": {"kind": "malformed"}},
            {"text": "x", "fault": {"kind": "error_event", "message": "overloaded"}},
        ],
    )
    body = {"model": "m", "messages": USER_HI}
    started = time.monotonic()
    status, _, raw, _ = await raw_post(srv, body)
    assert time.monotonic() - started >= 0.28
    assert json.loads(raw)["choices"][0]["message"]["content"] == "late"
    async with client(srv) as api:
        with pytest.raises(openai.APIConnectionError):
            await api.chat.completions.create(model="m", messages=USER_HI)
    status, _, raw, _ = await raw_post(srv, body)
    assert status == 200 and raw.startswith(b"{not json")
    status, _, raw, _ = await raw_post(srv, body)
    assert status == 200 and json.loads(raw)["error"]["message"] == "overloaded"


# ---------------------------------------------------------------- demo brain


def test_demo_brain_summarises_only_the_trailing_tool_results() -> None:
    """Only the tool results after the last assistant message are summarised."""
    call = {"id": "a", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
    call_b = {**call, "id": "b"}
    messages = [
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a", "content": "2"},
        {"role": "assistant", "content": None, "tool_calls": [call_b]},
        {"role": "tool", "tool_call_id": "b", "content": "\n\n  3  \n"},
    ]
    assert respond({"messages": messages}).text == "calculator returned 3."


def test_demo_brain_reads_each_path_once_and_ignores_numbers_with_slashes() -> None:
    """A path named twice is read once; `1/2` is not a path."""
    text = "compare notes.txt with notes.txt and src/app.py, half is 1/2"
    step = respond({"messages": [{"role": "user", "content": text}], "tools": [READ_FILE_TOOL]})
    assert [c.arguments for c in step.tool_calls] == [{"path": "notes.txt"}, {"path": "src/app.py"}]
    assert len({c.id for c in step.tool_calls}) == 2


def test_demo_brain_prefers_the_calculator_to_reading_files() -> None:
    """With both tools offered, arithmetic goes to the calculator even if a path is named."""
    text = "what is 2+3 in notes.txt"
    step = respond(
        {"messages": [{"role": "user", "content": text}], "tools": [READ_FILE_TOOL, CALCULATOR_TOOL]}
    )
    assert [(c.name, c.arguments) for c in step.tool_calls] == [("calculator", {"expression": "2+3"})]


def test_demo_brain_reads_text_from_content_parts() -> None:
    """A user message given as content parts is understood like a string."""
    content = [{"type": "text", "text": "compute "}, {"type": "text", "text": "6*7"}]
    step = respond({"messages": [{"role": "user", "content": content}], "tools": [CALCULATOR_TOOL]})
    assert [c.arguments for c in step.tool_calls] == [{"expression": "6*7"}]


def test_demo_brain_greets_an_empty_message_and_cuts_long_quotes() -> None:
    """No text gets a greeting; a long message is quoted cut to 200 characters with an ellipsis."""
    assert (respond({"messages": []}).text or "").startswith("Hello! I'm the offline scripted model.")
    text = respond({"messages": [{"role": "user", "content": "y" * 500}]}).text or ""
    assert '"' + "y" * 199 + '…"' in text


# ---------------------------------------------------------------- CLI


def _start_cli(*flags: str) -> tuple[subprocess.Popen[str], str]:
    """`python -m testbed.scripted_model` with `flags`; returns it and its announced URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "testbed.scripted_model", *flags],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, process.stdout.readline().split()[-1]


def test_cli_binds_loopback_by_default_and_exits_zero_on_sigint() -> None:
    """Without flags the CLI listens on 127.0.0.1 (never all interfaces); Ctrl-C exits cleanly."""
    process, url = _start_cli()
    try:
        assert url.startswith("http://127.0.0.1:")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=5) == 0
    finally:
        process.kill()
        process.wait()


def test_cli_help_names_the_command_that_runs_it() -> None:
    """`--help` shows `python -m testbed.scripted_model`, the command that works from the project root."""
    result = subprocess.run(
        [sys.executable, "-m", "testbed.scripted_model", "--help"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.startswith("usage: python -m testbed.scripted_model ")


# ---------------------------------------------------------------- requests OpenAI refuses


@pytest.mark.parametrize(
    ("tool", "refused"),
    [
        ({"type": "function", "function": {"name": "n" * 64}}, False),
        ({"type": "function", "function": {"name": "n" * 65}}, True),
        ({"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}, True),
        ({"type": "function"}, True),
    ],
)
def test_tools_are_refused_as_openai_refuses_them(tool: dict[str, Any], refused: bool) -> None:
    """Function names of 1-64 characters; parameters of type object; a tool needs a function."""
    assert (tools_problem([tool]) is not None) is refused


def _assistant_calling(*ids: str) -> dict[str, Any]:
    """An assistant message calling `echo` once per id."""
    calls = [{"id": i, "type": "function", "function": {"name": "echo", "arguments": "{}"}} for i in ids]
    return {"role": "assistant", "content": None, "tool_calls": calls}


@pytest.mark.parametrize(
    ("messages", "refused"),
    [
        ([], True),
        ([{"role": "user", "content": []}], True),
        ([_assistant_calling("i" * 40), {"role": "tool", "tool_call_id": "i" * 40}], False),
        ([_assistant_calling("i" * 41), {"role": "tool", "tool_call_id": "i" * 41}], True),
        # a tool message after a plain assistant message answers nothing
        (
            [
                _assistant_calling("a"),
                {"role": "tool", "tool_call_id": "a"},
                {"role": "assistant", "content": "x"},
                {"role": "tool", "tool_call_id": "a"},
            ],
            True,
        ),
        # a call left unanswered when the next assistant message comes
        (
            [
                _assistant_calling("a", "b"),
                {"role": "tool", "tool_call_id": "a"},
                _assistant_calling("c"),
                {"role": "tool", "tool_call_id": "c"},
            ],
            True,
        ),
    ],
)
def test_tool_messages_are_refused_as_openai_refuses_them(messages: list[Any], refused: bool) -> None:
    """Empty messages or content, call ids over 40 characters, tool messages that answer no open call,
    and calls left unanswered are refused (400), as OpenAI does."""
    assert (tool_message_problem(messages) is not None) is refused


@pytest.mark.asyncio
async def test_a_stall_without_seconds_outlasts_a_client_read_timeout(srv: ScriptedModelServer) -> None:
    """`{"kind": "stall"}` really stalls (30 s by default): a client with a short timeout gives up."""
    srv.script("m", [{"text": "hello", "fault": {"kind": "stall"}}])
    async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=0.5) as api:
        stream = await api.chat.completions.create(model="m", messages=USER_HI, stream=True)
        with pytest.raises(openai.APITimeoutError):
            async for _ in stream:
                pass
