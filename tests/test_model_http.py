"""The model call's direct request (activities/model_http.py) sends what
``client.post`` sends and fails as it fails: both paths side by side over
the same transport, byte for byte, and over the scripted model server."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from temporalio.client import Client

from activities.llm import LlmActivities
from activities.model_http import ChatPoster, ChunkStream, WirePart, request_body
from runtime.settings import Settings
from testbed.scripted_model import ScriptedModelServer
from tests.support.serving import serving
from tests.test_worker_settings import settings_for
from worker import build_worker

PARAMS: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "héllo \u2603"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "tools": [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}],
}
CHUNK = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}

direct_only = pytest.mark.skipif(
    not ChatPoster(openai.AsyncOpenAI(api_key="k", max_retries=0)).direct,
    reason="this openai lacks the helpers of the direct request: both paths are client.post",
)


class Blocks(httpx2.AsyncByteStream):
    """A response body sent in the given blocks; an exception in them is raised there."""

    def __init__(self, blocks: list[bytes | Exception]) -> None:
        self.blocks = blocks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for block in self.blocks:
            if isinstance(block, Exception):
                raise block
            yield block


Handler = Callable[[httpx2.Request], httpx2.Response]


def posters(handler: Handler, **client_args: Any) -> tuple[ChatPoster, ChatPoster, list[httpx2.Request]]:
    """The direct poster and the client.post one, each on its own client
    over ``handler``; the requests both sent, in order."""
    sent: list[httpx2.Request] = []

    def recording(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return handler(request)

    def poster(direct: bool) -> ChatPoster:
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(recording))
        client = openai.AsyncOpenAI(
            api_key="sk-test", base_url="http://model.test/v1", max_retries=0, http_client=http, **client_args
        )
        return ChatPoster(client, direct=direct)

    direct, through_client = poster(True), poster(False)
    assert direct.direct and not through_client.direct
    return direct, through_client, sent


def sse(*events: Any, lines: bool = False) -> bytes:
    """An event stream of ``events``; ``lines``: each event's JSON over several ``data:`` lines."""
    return (
        b"".join(
            b"".join(
                b"data: " + line.encode() + b"\n"
                for line in json.dumps(e, indent=1 if lines else None).split("\n")
            )
            + b"\n"
            for e in events
        )
        + b"data: [DONE]\n\n"
    )


async def outcome(poster: ChatPoster, params: dict[str, Any] = PARAMS) -> Any:
    """What a call gives: its chunks, or the error it raised (type, text, details)."""
    chunks: list[Any] = []
    try:
        stream = await poster.stream(params)
        async for chunk in stream:
            chunks.append(chunk)
    except openai.APIStatusError as err:
        return (type(err), str(err), err.status_code, err.body, dict(err.response.headers))
    except openai.APIError as err:
        cause = err.__cause__
        return (type(err), str(err), err.body, type(cause), str(cause), chunks)
    except ValueError as err:  # a chunk that is not JSON, as json raises it
        return (type(err), str(err), chunks)
    return chunks


@direct_only
async def test_the_direct_request_is_the_one_client_post_sends() -> None:
    cookie_sent: list[str | None] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        cookie_sent.append(request.headers.get("cookie"))
        # A load balancer's stickiness cookie: the next request carries it.
        return httpx2.Response(
            200,
            headers={"content-type": "text/event-stream", "set-cookie": "lb=node-2; Path=/"},
            content=sse(CHUNK),
        )

    direct, through_client, sent = posters(
        handler,
        organization="org-1",
        project="proj-1",
        default_headers={"X-Team": "agents"},
        default_query={"api-version": "2026-01-01"},
    )
    for _ in range(2):
        assert await outcome(direct) == [CHUNK]
        assert await outcome(through_client) == [CHUNK]
    assert len(sent) == 4
    for mine, theirs in ((sent[0], sent[1]), (sent[2], sent[3])):
        assert mine.method == theirs.method == "POST"
        assert (
            str(mine.url) == str(theirs.url) == "http://model.test/v1/chat/completions?api-version=2026-01-01"
        )
        assert mine.headers.multi_items() == theirs.headers.multi_items()
        assert mine.content == theirs.content  # the same bytes, not only the same JSON
        assert mine.extensions["timeout"] == theirs.extensions["timeout"]
    assert sent[0].headers["authorization"] == "Bearer sk-test"
    assert cookie_sent == [None, None, "lb=node-2", "lb=node-2"]


@direct_only
async def test_a_configured_host_or_cookie_header_is_sent_as_configured() -> None:
    """A gateway routing by virtual host, an access cookie (OPENAI_CUSTOM_HEADERS)."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream", "set-cookie": "lb=node-2"}, content=sse(CHUNK)
        )

    direct, through_client, sent = posters(
        handler, default_headers={"Host": "llm.internal.example", "Cookie": "CF_Authorization=tok"}
    )
    await assert_host_and_cookie_sent_alike(direct, through_client, sent)


async def assert_host_and_cookie_sent_alike(
    direct: ChatPoster, through_client: ChatPoster, sent: list[httpx2.Request]
) -> None:
    """Two calls on each path: the configured Host and Cookie go out, as client.post sends them."""
    for _ in range(2):
        await outcome(direct)
        await outcome(through_client)
    for mine, theirs in ((sent[0], sent[1]), (sent[2], sent[3])):
        assert mine.headers.multi_items() == theirs.headers.multi_items()
        assert mine.headers["host"] == "llm.internal.example"
        assert mine.headers["cookie"] == "CF_Authorization=tok"


@direct_only
async def test_a_new_key_or_base_url_is_used_from_the_next_request() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse(CHUNK))

    direct, _, sent = posters(handler)
    await outcome(direct)
    direct.client.api_key = "sk-new"
    direct.client.base_url = "http://other.test/v2/"
    await outcome(direct)
    assert sent[0].headers["authorization"] == "Bearer sk-test"
    assert sent[1].headers["authorization"] == "Bearer sk-new"
    assert str(sent[1].url) == "http://other.test/v2/chat/completions"


@direct_only
async def test_a_long_event_in_many_blocks_is_read_in_linear_time() -> None:
    """A 16 MiB chunk in 4 KiB blocks: each block is kept, not copied onto
    the ones before (that took 17 s; this takes a fifth of one)."""
    text = "x" * (16 << 20)
    body = sse({**CHUNK, "choices": [{"index": 0, "delta": {"content": text}}]})
    blocks: list[bytes | Exception] = [body[i : i + 4096] for i in range(0, len(body), 4096)]

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Blocks(blocks))

    direct, _, _ = posters(handler)
    started = time.process_time()
    chunks = await outcome(direct)
    assert chunks[0]["choices"][0]["delta"]["content"] == text
    assert time.process_time() - started < 3


@direct_only
@pytest.mark.parametrize(
    ("status", "body", "headers", "error"),
    [
        (
            400,
            {"error": {"message": "stream_options is not supported", "type": "invalid_request_error"}},
            {},
            openai.BadRequestError,
        ),
        (401, {"error": {"message": "Incorrect API key provided"}}, {}, openai.AuthenticationError),
        (404, "404 page not found", {}, openai.NotFoundError),
        (429, {"error": {"message": "slow down"}}, {"retry-after": "2"}, openai.RateLimitError),
        (
            500,
            "<html><title>Bad gateway</title></html>",
            {"content-type": "text/html"},
            openai.InternalServerError,
        ),
        (503, "", {}, openai.InternalServerError),
    ],
)
async def test_an_error_answer_raises_what_client_post_raises(
    status: int, body: Any, headers: dict[str, str], error: type[Exception]
) -> None:
    content = json.dumps(body).encode() if isinstance(body, dict) else body.encode()

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers=headers, content=content)

    direct, through_client, _ = posters(handler)
    mine, theirs = await outcome(direct), await outcome(through_client)
    assert mine == theirs
    assert mine[0] is error


@direct_only
@pytest.mark.parametrize(
    "error",
    [
        httpx2.ConnectError("[Errno 111] Connection refused"),
        httpx2.ConnectTimeout("timed out connecting"),
        httpx2.ReadTimeout("timed out waiting for headers"),
    ],
)
async def test_an_unreachable_server_raises_what_client_post_raises(error: Exception) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise error

    direct, through_client, _ = posters(handler)
    mine, theirs = await outcome(direct), await outcome(through_client)
    assert mine == theirs
    assert mine[0] is (
        openai.APITimeoutError if isinstance(error, httpx2.TimeoutException) else openai.APIConnectionError
    )


BODIES: dict[str, list[bytes | Exception]] = {
    "lf": [sse(CHUNK, CHUNK)],
    "crlf": [sse(CHUNK).replace(b"\n", b"\r\n")],
    "cr": [sse(CHUNK).replace(b"\n", b"\r")],
    "comments, other fields, no space after the colon": [
        b": keep-alive\n\nevent: completion\nid: 7\nretry: 100\ndata:" + json.dumps(CHUNK).encode() + b"\n\n",
        b"data: [DONE]\n\n",
    ],
    "data over two lines": [b'data: {"a":\ndata: 1}\n\n', b"data: [DONE]\n\n"],
    "a CRLF cut between its CR and its LF": [
        b'data: {"a":\r',
        b"\ndata: 1}\r\n\r",
        b"\ndata: [DONE]\r\n\r\n",
    ],
    "an error chunk": [sse(CHUNK)[:-14], b'data: {"error": {"message": "overloaded", "code": 503}}\n\n'],
    "an error chunk without a message": [b'data: {"error": {"code": "boom"}}\n\n'],
    "a chunk that is not JSON": [b"data: {not json\n\n"],
    "cut off mid-answer": [sse(CHUNK)[:-14], httpx2.RemoteProtocolError("peer closed connection")],
    "a read timeout mid-answer": [sse(CHUNK)[:-14], httpx2.ReadTimeout("no byte for 60 s")],
    "ends without [DONE] or a last blank line": [sse(CHUNK)[:-14] + b'data: {"late": 1}'],
    "bytes after [DONE]": [sse(CHUNK) + b"data: " + json.dumps(CHUNK).encode() + b"\n\n"],
    "a chunk of another script": [sse({"x": "\u00e9\u2603\U0001f600"})],
}


@direct_only
@pytest.mark.parametrize("name", list(BODIES))
async def test_a_stream_reads_as_openais_does(name: str) -> None:
    await assert_same_stream(BODIES[name])


@direct_only
@settings(max_examples=150, deadline=None)
@given(
    ending=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    texts=st.lists(st.text(max_size=6), min_size=1, max_size=4),
    lines=st.booleans(),
    data=st.data(),
)
async def test_a_stream_cut_anywhere_reads_as_openais_does(
    ending: bytes, texts: list[str], lines: bool, data: st.DataObject
) -> None:
    body = sse(*({**CHUNK, "choices": [{"index": 0, "delta": {"content": t}}]} for t in texts), lines=lines)
    body = body.replace(b"\n", ending)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(body)), max_size=12))
    points = sorted({0, len(body), *cuts})
    await assert_same_stream([body[a:b] for a, b in itertools.pairwise(points)])


async def assert_same_stream(blocks: list[bytes | Exception]) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Blocks(blocks))

    direct, through_client, _ = posters(handler)
    mine, theirs = await outcome(direct), await outcome(through_client)
    assert mine == theirs


async def test_an_empty_read_between_a_cr_and_its_lf_ends_one_line() -> None:
    """httpx yields no empty block today; a transport that did must not
    split a CRLF into two line ends (a blank line mid-event)."""

    class Response:
        http_version = "HTTP/1.1"
        request = httpx2.Request("POST", "http://model.test/v1/chat/completions")

        async def aiter_bytes(self) -> AsyncIterator[bytes]:
            for block in (b'data: {"a":\r', b"", b"\ndata: 1}\r\n\r\n", b"data: [DONE]\r\n\r\n"):
                yield block

        async def aclose(self) -> None:
            pass

    assert [chunk async for chunk in ChunkStream(Response())] == [{"a": 1}]


@direct_only
async def test_an_event_without_data_is_skipped_where_openai_fails() -> None:
    """The one difference, on purpose: ``event: ping`` alone is no chunk."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=b"event: ping\n\n" + sse(CHUNK)
        )

    direct, through_client, _ = posters(handler)
    assert await outcome(direct) == [CHUNK]
    assert (await outcome(through_client))[0] is json.JSONDecodeError


@direct_only
async def test_calls_to_a_real_server_share_one_connection(model_server: ScriptedModelServer) -> None:
    """After ``[DONE]`` the rest of the body is read, so the next call reuses the connection."""
    http = httpx2.AsyncClient()
    poster = ChatPoster(openai.AsyncOpenAI(api_key="k", base_url=model_server.base_url, http_client=http))
    model_server.script("reuse", [{"text": "one"}, {"text": "two"}, {"text": "three"}])
    for word in ("one", "two", "three"):
        stream = await poster.stream({**PARAMS, "model": "reuse"})
        chunks = [c async for c in stream]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == word
        assert stream.response.is_closed
    pool = http._transport._pool  # the connections the three calls used
    assert len(pool.connections) == 1
    await http.aclose()


def test_a_client_whose_requests_differ_posts_through_it() -> None:
    async def key() -> str:
        return "sk-rotated"

    assert not ChatPoster(
        openai.AsyncOpenAI(api_key=key, max_retries=0)
    ).direct  # a key provider: refreshed per call
    assert not ChatPoster(
        openai.AsyncAzureOpenAI(api_key="k", api_version="v", azure_endpoint="http://x")
    ).direct
    assert not ChatPoster(openai.AsyncOpenAI(api_key="k", max_retries=0), direct=False).direct
    # client.post's retries (the worker's client has none: Temporal retries)
    assert not ChatPoster(openai.AsyncOpenAI(api_key="k", max_retries=2)).direct


def test_the_setting_turns_the_direct_request_off() -> None:
    assert Settings.from_env({}).direct_model_post
    assert not Settings.from_env({"AGENT_DIRECT_MODEL_POST": "off"}).direct_model_post
    llm = LlmActivities(api_key="k", direct_post=False)
    assert not llm._model_poster().direct
    assert (
        LlmActivities(api_key="k")._model_poster().direct
        == ChatPoster(openai.AsyncOpenAI(api_key="k", max_retries=0)).direct
    )


@direct_only
async def test_a_data_field_without_a_colon_reads_as_openais_does() -> None:
    """Mutant: the ``line == b"data"`` branch dropped (the field's empty
    value not kept): an event of only ``data`` was skipped where openai's
    stream fails on it, and ``data`` lines joined differently."""
    await assert_same_stream([b"data\n\n", sse(CHUNK)])


@direct_only
async def test_a_body_that_goes_on_after_done_is_read_so_the_connection_is_reused() -> None:
    """Mutant: the rest of the body not drained after ``[DONE]``. A server
    whose body ends a moment after ``[DONE]`` (a proxy that flushes the
    chunked terminator late, a trailing comment): the connection was closed
    after every call, and each call paid a new connection (and TLS
    handshake)."""
    peers: list[object] = []

    async def late_end(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(CHUNK))
        await asyncio.sleep(0.02)
        await response.write(b": end\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", late_end)
    async with serving(app) as url:
        http = httpx2.AsyncClient()
        poster = ChatPoster(
            openai.AsyncOpenAI(api_key="k", base_url=f"{url}/v1", max_retries=0, http_client=http)
        )
        assert poster.direct
        for _ in range(3):
            stream = await poster.stream(PARAMS)
            assert [c async for c in stream] == [CHUNK]
        await http.aclose()
    assert len(peers) == 3 and len(set(peers)) == 1


def streaming(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse(CHUNK))


@direct_only
async def test_a_new_api_key_alone_is_used_from_the_next_request() -> None:
    """A rotated OPENAI_API_KEY set on the client, the base URL unchanged, authenticates the next call."""
    direct, _, sent = posters(streaming)
    await outcome(direct)
    direct.client.api_key = "sk-new"
    await outcome(direct)
    assert [r.headers["authorization"] for r in sent] == ["Bearer sk-test", "Bearer sk-new"]


@direct_only
async def test_a_new_base_url_alone_is_used_from_the_next_request() -> None:
    """A base URL moved to another server, the key unchanged, is where the next call goes."""
    direct, _, sent = posters(streaming)
    await outcome(direct)
    direct.client.base_url = "http://other.test/v2/"
    await outcome(direct)
    assert str(sent[1].url) == "http://other.test/v2/chat/completions"


@direct_only
async def test_a_streamed_error_answer_raises_what_client_post_raises() -> None:
    """A 429 whose body arrives in pieces (a real server's) is read whole: RateLimitError with its message
    and Retry-After."""
    body = b'{"error": {"message": "slow down", "type": "rate_limit"}}'

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            429,
            headers={"content-type": "application/json", "retry-after": "3"},
            stream=Blocks([body[:10], body[10:]]),
        )

    direct, through_client, _ = posters(handler)
    mine, theirs = await outcome(direct), await outcome(through_client)
    assert mine == theirs
    assert mine[0] is openai.RateLimitError and mine[4]["retry-after"] == "3"


@direct_only
async def test_a_status_error_carries_no_http_error_as_its_cause() -> None:
    """As client.post's (``from None``): the activity failure shows the API error, not httpx's under it."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(500, json={"error": {"message": "boom"}})

    direct, through_client, _ = posters(handler)
    errors = []
    for poster in (direct, through_client):
        with pytest.raises(openai.InternalServerError) as info:
            await poster.stream(PARAMS)
        errors.append((info.value.__cause__, info.value.__suppress_context__))
    assert errors[0] == errors[1] == (None, True)


@direct_only
async def test_a_body_holding_nan_is_refused_as_client_post_refuses_it() -> None:
    """NaN is no JSON: the call fails before sending, as client.post's, not with ``NaN`` on the wire."""
    direct, through_client, sent = posters(streaming)
    params = {**PARAMS, "temperature": math.nan}
    for poster in (direct, through_client):
        with pytest.raises(ValueError, match="not JSON compliant"):
            await poster.stream(params)
    assert sent == []


@direct_only
async def test_headers_configured_on_the_http_client_are_sent_as_configured() -> None:
    """A Host or Cookie header set on the httpx client passed as http_client is sent, as client.post sends
    it."""
    sent: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream", "set-cookie": "lb=node-2"}, content=sse(CHUNK)
        )

    def poster(direct: bool) -> ChatPoster:
        http = httpx2.AsyncClient(
            transport=httpx2.MockTransport(handler),
            headers={"Host": "llm.internal.example", "Cookie": "CF_Authorization=tok"},
        )
        client = openai.AsyncOpenAI(
            api_key="k", base_url="http://model.test/v1", max_retries=0, http_client=http
        )
        return ChatPoster(client, direct=direct)

    direct, through_client = poster(True), poster(False)
    await assert_host_and_cookie_sent_alike(direct, through_client, sent)


@direct_only
async def test_a_changed_stickiness_cookie_is_sent_after_a_new_key() -> None:
    """The jar's latest cookie goes out, even after a key rotation rebuilt the request template."""
    values = iter(["node-2", "node-3", "node-4"])
    cookies_sent: list[str | None] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        cookies_sent.append(request.headers.get("cookie"))
        return httpx2.Response(
            200,
            headers={"content-type": "text/event-stream", "set-cookie": f"lb={next(values)}"},
            content=sse(CHUNK),
        )

    direct, _, _ = posters(handler)
    await outcome(direct)
    direct.client.api_key = "sk-new"
    await outcome(direct)
    await outcome(direct)
    assert cookies_sent == [None, "lb=node-2", "lb=node-3"]


def _json_values(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=8,
    )


_LEAVES = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)


@given(
    st.lists(
        st.tuples(st.booleans(), st.dictionaries(st.text(max_size=6), _json_values(_LEAVES), max_size=4))
    ),
    st.dictionaries(st.text(max_size=6), _json_values(_LEAVES), max_size=3),
)
@settings(max_examples=200, deadline=None)
def test_a_body_of_shared_parts_is_what_json_dumps_makes(
    parts: list[tuple[bool, dict[str, Any]]], rest: dict[str, Any]
) -> None:
    """Byte for byte, whatever the body holds: messages and tools kept
    encoded (``WirePart``) or not, any text, any other fields."""
    items = [WirePart(part) if shared else part for shared, part in parts]
    params = {"model": "m", **rest, "messages": items, "tools": list(reversed(items))}
    expected = json.dumps(params, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    assert request_body(params) == expected
    assert request_body(params) == expected  # and again, from the parts' kept JSON


def test_a_body_json_dumps_would_refuse_is_refused_with_shared_parts() -> None:
    for bad in (math.nan, math.inf, object()):
        params = {"model": "m", "messages": [WirePart(role="user", content=bad)]}
        with pytest.raises((ValueError, TypeError)) as raised:
            json.dumps(params, allow_nan=False)
        with pytest.raises(type(raised.value)):
            request_body(params)
    assert request_body({1: "a", "messages": [WirePart(a=1)]}) == b'{"1":"a","messages":[{"a":1}]}'


def test_a_context_is_encoded_once_across_model_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each stored message is serialised for the first call that sends it;
    later calls with it in their context reuse that JSON."""
    from activities import model_http
    from activities.openai_chat import ConversionMemo, to_openai_messages
    from workflows.models import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage

    encoded: list[Any] = []
    dumps = model_http._dumps

    def counting(value: Any) -> bytes:
        encoded.append(value)
        return dumps(value)

    monkeypatch.setattr(model_http, "_dumps", counting)
    context: list[Any] = [UserMessage(content="add 1 and 2")]
    memo = ConversionMemo()
    for turn in range(3):
        call = ToolCall(id=f"c{turn}", name="add", arguments={"a": 1, "b": 2})
        context += [
            AssistantMessage(content=[call], stop_reason="toolUse"),
            ToolResultMessage(tool_call_id=f"c{turn}", tool_name="add", content=[TextContent(text="3")]),
        ]
        encoded.clear()
        sent = to_openai_messages("be brief", context, memo)
        body = request_body({"model": "m", "messages": sent, "stream": True})
        assert json.loads(body)["messages"] == sent
        messages_encoded = [v for v in encoded if isinstance(v, dict) and "role" in v]
        # The system prompt (made each call), and the messages new to this call.
        new = ["assistant", "tool"] if turn else ["user", "assistant", "tool"]
        assert [m["role"] for m in messages_encoded] == ["system", *new]


@direct_only
async def test_a_body_of_shared_parts_is_the_one_client_post_sends() -> None:
    direct, through_client, sent = posters(streaming)
    shared = {
        **PARAMS,
        "messages": [WirePart(m) for m in PARAMS["messages"]],
        "tools": [WirePart(t) for t in PARAMS["tools"]],
    }
    for params in (shared, shared, PARAMS):
        assert await outcome(direct, params) == [CHUNK]
        assert await outcome(through_client, params) == [CHUNK]
    assert len(sent) == 6
    assert all(sent[i].content == sent[i + 1].content for i in range(0, 6, 2))
    assert sent[0].content == sent[4].content  # the same bytes as plain dicts make


def test_an_azure_client_without_retries_posts_through_it() -> None:
    """Azure routes each call by its deployment: its requests differ, so client.post sends them."""
    assert not ChatPoster(
        openai.AsyncAzureOpenAI(api_key="k", api_version="v", azure_endpoint="http://x", max_retries=0)
    ).direct


def test_a_client_with_one_retry_posts_through_it() -> None:
    """Any retries of the client's own (even one) are client.post's to make."""
    assert not ChatPoster(openai.AsyncOpenAI(api_key="k", max_retries=1)).direct


def test_a_workload_identity_client_posts_through_it() -> None:
    """A workload identity fetches and refreshes its token per request: client.post sends them."""
    identity: Any = {
        "identity_provider_id": "idp",
        "service_account_id": "sa",
        "provider": {"token_type": "jwt", "get_token": lambda: "jwt"},
    }
    client = openai.AsyncOpenAI(workload_identity=identity, max_retries=0)
    assert client._workload_identity_auth is not None
    assert not ChatPoster(client).direct


def test_a_client_with_a_provider_runtime_posts_through_it() -> None:
    """A provider's runtime transforms each request: client.post sends them."""
    client = openai.AsyncOpenAI(api_key="k", max_retries=0)
    client._provider_runtime = object()  # type: ignore[assignment]
    assert not ChatPoster(client).direct


@direct_only
async def test_closing_a_stream_closes_its_response() -> None:
    """``close`` (a refused answer) stops the model writing: the connection is released at once."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Blocks([sse(CHUNK)])
        )

    direct, _, _ = posters(handler)
    stream = await direct.stream(PARAMS)
    assert not stream.response.is_closed
    await stream.close()
    assert stream.response.is_closed


@direct_only
@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(
            [b"data: 1\r", b": c", b"\n\ndata: [DONE]\n\n"], id="a CR, a block without line end, a LF"
        ),
        pytest.param([b"data:  [DONE]\n\n"], id="[DONE] after two spaces is no [DONE]"),
        pytest.param([b"data: [DONE] bye\n\n", b"data: 1\n\n"], id="[DONE] followed by more on its line"),
        pytest.param([b"data: {\ndata: nope\n\n"], id="bad JSON over two data lines"),
        pytest.param([b'data: {"error": null, "x": 1}\n\n', b"data: [DONE]\n\n"], id="a null error"),
        pytest.param([b"data: [1, 2]\n\n", b"data: [DONE]\n\n"], id="a chunk that is a JSON array"),
        pytest.param([b'data: {"error": {"message": 5}}\n\n'], id="an error whose message is no string"),
        pytest.param([b"data: [DONE]\n\n", httpx2.RemoteProtocolError("x")], id="dropped after [DONE]"),
        pytest.param([b"data: 1\n \ndata: 2\n\n"], id="a line of a space is no blank line"),
        pytest.param([b"datax: 1\n\ndata: 2\n\n", b"data: [DONE]\n\n"], id="a field named datax is not data"),
    ],
)
async def test_more_streams_read_as_openais_do(blocks: list[bytes | Exception]) -> None:
    await assert_same_stream(blocks)


async def direct_outcome(blocks: list[bytes | Exception]) -> tuple[Any, bool]:
    """What the direct poster makes of a 200 event stream of ``blocks``, and its ``done``."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Blocks(blocks))

    direct, _, _ = posters(handler)
    stream = await direct.stream(PARAMS)
    chunks: list[Any] = []
    try:
        async for chunk in stream:
            chunks.append(chunk)
    except openai.APIError as err:
        return (type(err).__name__, err.message, err.body), getattr(stream, "done", False)
    return chunks, getattr(stream, "done", False)


@direct_only
@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        pytest.param(
            [b'data: {"error": "This model\'s maximum context length is 4096 tokens"}\n\n'],
            (
                "APIError",
                "This model's maximum context length is 4096 tokens",
                "This model's maximum context length is 4096 tokens",
            ),
            id="an error that is a string keeps its text (openai: 'An error occurred during streaming')",
        ),
        pytest.param(
            [
                sse(CHUNK)[:-14],
                b'error: {"code":400,"message":"the request exceeds the available context size"}\n\n',
            ],
            (
                "APIError",
                "the request exceeds the available context size",
                {"code": 400, "message": "the request exceeds the available context size"},
            ),
            id="llama.cpp's error field",
        ),
        pytest.param(
            [b'event: error\ndata: {"message": "upstream overloaded"}\n\n'],
            ("APIError", "upstream overloaded", {"message": "upstream overloaded"}),
            id="an event named error",
        ),
        pytest.param(
            [b'{"error": {"message": "Unexpected endpoint or method. (POST /chat/completions)"}}'],
            (
                "APIError",
                "Unexpected endpoint or method. (POST /chat/completions)",
                {"message": "Unexpected endpoint or method. (POST /chat/completions)"},
            ),
            id="a JSON error without data:",
        ),
        pytest.param(
            [b"<html><title>Not here</title></html>\n"],
            ("NotAnEventStream", "<html><title>Not here</title></html>", None),
            id="a page that is no event stream",
        ),
    ],
)
async def test_errors_a_server_sends_its_own_way_raise_with_its_text(
    blocks: list[bytes | Exception], expected: Any
) -> None:
    """openai's stream reads none of these as an error: llama.cpp's context
    error was retried five times and its text lost (a provider audit)."""
    assert (await direct_outcome(blocks))[0] == expected


@direct_only
async def test_a_stream_says_whether_it_ended_with_done() -> None:
    assert await direct_outcome([sse(CHUNK)]) == ([CHUNK], True)
    assert await direct_outcome([sse(CHUNK)[: -len(b"data: [DONE]\n\n")]]) == ([CHUNK], False)
    # Lines that are no event do not matter once the stream has given chunks.
    assert await direct_outcome([b"hello\n", sse(CHUNK)]) == ([CHUNK], True)


@direct_only
@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param([b'data: {"error": {"message": "overloaded"}}\n\n', b": more\n\n"], id="an error chunk"),
        pytest.param([b"data: {not json\n\n", b": more\n\n"], id="a chunk that is not JSON"),
    ],
)
async def test_a_stream_that_fails_releases_its_connection(blocks: list[bytes | Exception]) -> None:
    """A failing answer does not hold its connection (and the server's worker) until garbage collection."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Blocks(blocks))

    direct, _, _ = posters(handler)
    stream = await direct.stream(PARAMS)
    with pytest.raises((openai.APIError, ValueError)):
        async for _ in stream:
            pass
    assert stream.response.is_closed


class Endless(httpx2.AsyncByteStream):
    """[DONE], then comments that are always at hand and end only after millions."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield sse(CHUNK)
        for _ in range(3_000_000):
            yield b": keep-alive\n\n"


@direct_only
async def test_a_body_that_goes_on_after_done_is_given_up_on_at_once() -> None:
    """After [DONE] the rest of the body is read for a moment only, even when it keeps coming: the answer
    ends."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Endless())

    direct, _, _ = posters(handler)
    started = time.monotonic()
    assert await outcome(direct) == [CHUNK]
    assert time.monotonic() - started < 5  # 0.1 s of draining; unbounded, it took ~20 s


@direct_only
async def test_a_data_line_that_is_not_utf8_fails_as_openais_stream_does() -> None:
    """Not decoded with replacement characters: the call fails (UnicodeDecodeError) on both paths."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = [b'data: {"a":"\xff"}\n\n', b"data: [DONE]\n\n"]
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Blocks(body))

    direct, through_client, _ = posters(handler)
    for poster in (direct, through_client):
        stream = await poster.stream(PARAMS)
        with pytest.raises(UnicodeDecodeError):
            async for _ in stream:
                pass


@pytest.mark.parametrize(("env", "direct"), [({"AGENT_SDK_FALLBACKS": "on"}, False), ({}, True)])
async def test_sdk_fallbacks_post_model_calls_through_the_openai_client(
    client: Client, tmp_path: Path, env: dict[str, str], direct: bool
) -> None:
    """README: AGENT_SDK_FALLBACKS=on sends model calls through the openai client's post,
    AGENT_DIRECT_MODEL_POST aside."""
    worker = build_worker(client, settings_for(tmp_path, OPENAI_API_KEY="k", **env))
    llms = {
        getattr(a, "__self__", None)
        for a in worker.config()["activities"]
        if isinstance(getattr(a, "__self__", None), LlmActivities)
    }
    expected = direct and ChatPoster(openai.AsyncOpenAI(api_key="k", max_retries=0)).direct
    assert [llm._model_poster().direct for llm in llms] == [expected]


async def test_a_workers_model_client_closes_when_its_run_ends(client: Client, tmp_path: Path) -> None:
    """Not left to the garbage collector, which may run inside a later
    workflow task (an "Exception ignored" in AsyncHttpxClientWrapper.__del__)."""
    worker = build_worker(client, settings_for(tmp_path, OPENAI_API_KEY="k"))
    [llm] = {
        getattr(a, "__self__", None)
        for a in worker.config()["activities"]
        if isinstance(getattr(a, "__self__", None), LlmActivities)
    }
    assert isinstance(llm, LlmActivities)
    model_client = llm._model_poster().client
    async with worker:
        assert not model_client.is_closed()
    assert model_client.is_closed()
    assert llm._model_poster().client is not model_client  # a later call makes a new one
