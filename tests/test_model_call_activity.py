"""The model call activity against stand-in servers: which failures are
retried, how errors read, timeouts, the first token's flush, abort and
shutdown, the tools field and the token metric (behaviours a mutation
audit of activities/llm.py found no test of; each docstring names what
the untested code could have done instead). Stand-in servers as in
tests/test_llm_activity.py (``serving``)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import httpx2
import openai
import pytest
from aiohttp import web
from temporalio.activity import ActivityCancellationDetails
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.events as events_module
from activities import llm as llm_module
from activities.llm import LlmActivities, _classify
from activities.model_http import NotAnEventStream
from activities.openai_chat import MAX_TOOL_CALLS_PER_ANSWER, StreamEndedEarly, usage_from_openai
from tests.support.serving import serving
from workflows.contract import LlmRequest
from workflows.models import AssistantMessage, UserMessage

REQUEST = LlmRequest(model="m", messages=[UserMessage(content="hi", timestamp=0)], turn=1)
MODEL_REQUEST = httpx2.Request("POST", "http://model/v1/chat/completions")


class NoStream:  # no workflow to signal: the batches the activity publishes go nowhere
    def topic(self, _name: str) -> Any:
        return self

    def publish(self, _event: Any) -> None:
        pass

    async def flush(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "run_stream_client", NoStream)


def _status_error(status: int, body: Any = None) -> openai.APIStatusError:
    response = httpx2.Response(status, request=MODEL_REQUEST)
    return openai.APIStatusError(f"Error code: {status}", response=response, body=body)


# --- classification ------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retried"),
    [
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (529, True),  # Anthropic-style "overloaded" behind a proxy
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (422, False),
    ],
)
def test_which_status_is_retried(status: int, retried: bool) -> None:
    """Mutants: RETRYABLE_STATUS without 408 / without 409, and
    ``status >= 500`` -> ``> 500``. A user relies on a transient 408, 409
    (a busy model slot) or 500 being retried, and a 4xx never."""
    failure = _classify(_status_error(status, {"error": {"message": "x"}}))
    assert failure.type == f"ModelHttp{status}"
    assert failure.non_retryable is (not retried)


def test_openais_out_of_quota_429_is_not_retried() -> None:
    """ "You exceeded your current quota" cannot pass on a retry: it was tried five times."""
    quota = {
        "message": "You exceeded your current quota",
        "type": "insufficient_quota",
        "code": "insufficient_quota",
    }
    failure = _classify(_status_error(429, quota))
    assert failure.type == "ModelHttp429" and failure.non_retryable
    assert "current quota" in failure.message
    assert not _classify(
        _status_error(429, {"message": "Rate limit reached", "type": "requests"})
    ).non_retryable


def test_a_stream_error_says_whether_it_came_mid_answer_without_class_names() -> None:
    ended = _classify(StreamEndedEarly("The model's stream ended before it finished its answer."))
    assert (
        ended.message == "The model's stream broke: The model's stream ended before it finished its answer."
    )
    assert not ended.non_retryable
    page = _classify(NotAnEventStream("<html>Not here</html>", MODEL_REQUEST, body=None))
    assert page.message == (
        "The model server's answer is no event stream: <html>Not here</html>"
        " (is OPENAI_BASE_URL the API's root? It usually ends in /v1)"
    )
    long_page = _classify(NotAnEventStream("x" * 2000, MODEL_REQUEST, body=None))
    assert long_page.message.endswith("\u2026 (is OPENAI_BASE_URL the API's root? It usually ends in /v1)")
    assert len(long_page.message) <= 400
    said = openai.APIError("This model's maximum context length is 4096 tokens", MODEL_REQUEST, body="x")
    assert _classify(said, streaming=True).message.startswith("The model server sent an error mid-answer: ")
    whole = _classify(said, streaming=False)
    assert whole.message == "The model server answered with an error: x"


def test_a_timeout_is_retried() -> None:
    """Mutant: ModelTimeout made non-retryable."""
    failure = _classify(openai.APITimeoutError(request=MODEL_REQUEST))
    assert failure.type == "ModelTimeout" and not failure.non_retryable


def test_a_connection_error_names_its_cause() -> None:
    """Mutant: _reason_of returns ``str(err)`` only ("Connection error.")."""
    err = openai.APIConnectionError(request=MODEL_REQUEST)
    err.__cause__ = httpx2.ConnectError("[Errno 111] Connection refused")
    failure = _classify(err)
    assert failure.message == (
        "Could not reach the model server: Connection error. (ConnectError: [Errno 111] Connection refused)"
    )


@pytest.mark.parametrize(
    ("error", "permanent"),
    [
        ({"message": "rate limited", "code": 429}, False),
        ({"message": "timed out in the queue", "code": "408"}, False),
        ({"message": "conflict", "code": 409}, False),
        ({"message": "overloaded", "code": 503}, False),
        ({"message": "bad field", "code": 400}, True),
        ({"message": "The prompt is longer than the model's context length (8192)."}, True),
    ],
)
def test_an_error_event_mid_stream_is_permanent_only_when_it_cannot_pass(
    error: dict[str, Any], permanent: bool
) -> None:
    """Mutants: ``status not in RETRYABLE_STATUS`` dropped (a 429 sent in the
    stream, as OpenRouter does, ended the run), and "context length"
    dropped from the permanent words (the same too-long request retried)."""
    failure = _classify(openai.APIError(error["message"], MODEL_REQUEST, body=error))
    assert failure.type == "ModelStreamError"
    assert failure.non_retryable is permanent


def test_an_error_body_with_a_flag_and_a_message_says_the_message() -> None:
    """Mutant: ``message`` looked for after ``error``. Many servers answer
    ``{"error": true, "message": "..."}``: the user must read the message,
    not ``true``."""
    failure = _classify(_status_error(400, {"error": True, "message": "model 'x' not found"}))
    assert failure.message == "The model server answered 400: model 'x' not found"


def test_a_long_error_is_cut_to_400_characters() -> None:
    """Mutant: _clip returns the text whole. The text goes into the
    history and to every subscriber."""
    failure = _classify(_status_error(400, {"error": {"message": "x" * 5000}}))
    assert len(failure.message) == 400 and failure.message.endswith("\u2026")


# --- the activity against a stand-in server ------------------------------


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


TEXT_CHUNKS = (
    {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "ok"}}]},
    {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
)


def _app(handler: Any) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def _run(
    url: str, request: LlmRequest = REQUEST, env: ActivityEnvironment | None = None, **kwargs: Any
) -> Any:
    llm = LlmActivities(api_key="k", base_url=f"{url}/v1", **kwargs)
    return await (env or ActivityEnvironment()).run(llm.stream_assistant_response, request)


async def test_an_event_stream_labelled_json_without_a_space_after_data_is_read() -> None:
    """Mutant: only ``data: `` (with its space) read in a stream labelled JSON."""

    async def labelled(request: web.Request) -> web.Response:
        body = b"".join(b"data:" + json.dumps(c).encode() + b"\n\n" for c in TEXT_CHUNKS) + b"data:[DONE]\n\n"
        return web.Response(body=body, content_type="application/json")

    async with serving(_app(labelled)) as url:
        result = await _run(url)
    assert (result.message.text, result.message.stop_reason) == ("ok", "stop")


async def test_a_whole_answer_holding_a_client_error_is_not_retried() -> None:
    """Mutant: the ``error`` of a whole (200, JSON) answer not read: it was a
    retried "no chat completion" instead of the server's own message."""

    async def refusing(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "model 'm' does not exist", "code": 404}})

    async with serving(_app(refusing)) as url:
        with pytest.raises(ApplicationError) as raised:
            await _run(url)
    assert raised.value.type == "ModelStreamError" and raised.value.non_retryable
    assert raised.value.message == "The model server answered with an error: model 'm' does not exist"


async def test_the_read_timeout_setting_bounds_a_silent_server() -> None:
    """Mutant: the client's read timeout fixed at 60 s
    (AGENT_LLM_READ_TIMEOUT ignored)."""

    async def silent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(30)
        return response

    async with serving(_app(silent), shutdown_timeout=0.1) as url:
        started = time.monotonic()
        with pytest.raises(ApplicationError) as raised:
            await asyncio.wait_for(_run(url, read_timeout=0.5), 10)
    assert raised.value.type == "ModelTimeout" and not raised.value.non_retryable
    assert time.monotonic() - started < 5


async def _stalled_call(details: ActivityCancellationDetails, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The activity cancelled with ``details`` once the model's first token
    was read (published as a ``text_delta``), while the model stalls."""
    started = asyncio.Event()
    token_read = asyncio.Event()

    class Watching(NoStream):
        def publish(self, event: Any) -> None:
            if isinstance(event, dict) and event.get("type") == "message_update":
                token_read.set()

    monkeypatch.setattr(events_module, "run_stream_client", Watching)

    async def stalling(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(TEXT_CHUNKS[0])}\n\n".encode())
        started.set()
        await asyncio.sleep(30)
        return response

    env = ActivityEnvironment()
    async with serving(_app(stalling), shutdown_timeout=0.1) as url:
        task = asyncio.create_task(_run(url, env=env))
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.wait_for(token_read.wait(), 5)
        env.cancel(cancellation_details=details)
        return await asyncio.wait_for(task, 5)


async def test_an_abort_ends_the_call_with_what_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the abort branch re-raising. An abort (the workflow's
    cancellation) answers at once, ``aborted``, the text so far kept."""
    result = await _stalled_call(ActivityCancellationDetails(cancel_requested=True), monkeypatch)
    assert result.message.stop_reason == "aborted" and result.message.text == "ok"
    assert result.message.error_message == "Request was aborted"


async def test_a_worker_shutdown_is_no_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: ``details is None or not details.cancel_requested`` ->
    ``details is None``. A worker shutting down (a deploy) or a timeout must
    leave the call to Temporal's retry on another worker, not end the
    user's run as aborted."""
    with pytest.raises(asyncio.CancelledError):
        await _stalled_call(ActivityCancellationDetails(worker_shutdown=True), monkeypatch)


async def test_an_answer_with_too_many_calls_stops_reading_the_stream() -> None:
    """Mutant: the stream not closed when the answer asks for too many
    calls: the activity waited for the model to finish writing a refused
    answer (here: until the read timeout)."""

    async def flooding(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        calls = [
            {"index": i, "id": f"c{i}", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
            for i in range(MAX_TOOL_CALLS_PER_ANSWER + 1)
        ]
        chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": calls}}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await asyncio.sleep(30)  # a model that would go on writing
        return response

    async with serving(_app(flooding), shutdown_timeout=0.1) as url:
        started = time.monotonic()
        result = await asyncio.wait_for(_run(url, read_timeout=20), 15)
    assert result.message.stop_reason == "error" and result.message.tool_calls == []
    assert time.monotonic() - started < 10


async def _recorded_request(request: LlmRequest) -> dict[str, Any]:
    asked: list[Any] = []

    async def recording(http: web.Request) -> web.StreamResponse:
        asked.append(await http.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(http)
        await response.write(_sse(*TEXT_CHUNKS))
        return response

    async with serving(_app(recording)) as url:
        await _run(url, request=request)
    (body,) = asked
    return body


async def test_reasoning_effort_is_sent_only_when_thinking_is_on() -> None:
    """Mutant: reasoning_effort sent whatever the level (``"off"``, which
    OpenAI refuses: 400 on every call of a conversation without thinking)."""
    assert "reasoning_effort" not in await _recorded_request(REQUEST)
    high = REQUEST.model_copy(update={"thinking_level": "high"})
    assert (await _recorded_request(high))["reasoning_effort"] == "high"


@pytest.mark.parametrize(
    "body",
    [
        b"data: [DONE]\n\n",  # not a single chunk (with chunks, [DONE] ends an answer whole)
        b"",  # the body ends at once
    ],
)
async def test_a_stream_that_ends_before_the_answer_finishes_is_retried(body: bytes) -> None:
    """Mutant: StreamEndedEarly not raised. A stream that ends before a
    finish_reason is a broken answer, retried; it must not become the run's
    last message (``stopReason: "error"``, "finish_reason=None")."""

    async def ending(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(body)
        return response

    async with serving(_app(ending)) as url:
        with pytest.raises(ApplicationError) as raised:
            await _run(url)
    assert raised.value.type == "ModelStreamBroken" and not raised.value.non_retryable
    assert "The model" in raised.value.message and "stream ended" in raised.value.message


async def test_no_tools_means_no_tools_field() -> None:
    """Mutant: ``tools`` sent whatever (``"tools": []`` for a conversation
    without tools), which OpenAI and DashScope refuse: 400 ``[] is too
    short - 'tools'`` on every call."""
    assert "tools" not in await _recorded_request(REQUEST)


async def test_the_first_token_goes_out_at_once_not_with_the_next_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutant: ``publish_delta(delta, flush=first_delta)`` -> ``flush=False``.
    OpenAI's first chunk carries only the role: ``message_start`` goes out
    then, and the first token, a moment later, must not wait for the batch
    interval (here 10 s; 100 ms by default, on every answer)."""
    sent: list[dict[str, Any]] = []

    class Recording(NoStream):
        def publish(self, event: Any) -> None:
            sent.append(event)

    monkeypatch.setattr(events_module, "run_stream_client", Recording)

    async def streaming(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        role = {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
        await response.write(f"data: {json.dumps(role)}\n\n".encode())
        await asyncio.sleep(0.3)
        await response.write(f"data: {json.dumps(TEXT_CHUNKS[0])}\n\n".encode())
        await asyncio.sleep(0.5)
        await response.write(_sse(TEXT_CHUNKS[1]))
        return response

    request = REQUEST.model_copy(update={"stream_batch_ms": 10_000})
    async with serving(_app(streaming)) as url:
        result = await _run(url, request=request)
    assert result.message.text == "ok"
    deltas = [e for e in sent if isinstance(e, dict) and e.get("type") == "message_update"]
    assert [d["assistantMessageEvent"]["type"] for d in deltas][:2] == ["text_start", "text_delta"]


def test_the_input_token_metric_counts_cached_prompt_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: ``usage.input + usage.cache_read`` -> ``usage.input`` in the
    ``agent_model_tokens_input`` counter ("Prompt tokens (cached ones
    included)"): a dashboard of a cache-heavy agent showed a fraction of
    its prompt tokens."""
    counted: dict[str, int] = {}

    class Meter:
        def with_additional_attributes(self, _attributes: Any) -> Meter:
            return self

        def create_counter(self, name: str, *_args: Any) -> Any:
            class Counter:
                def add(self, value: int, *_args: Any) -> None:
                    counted[name] = counted.get(name, 0) + value

            return Counter()

        def create_histogram_timedelta(self, *_args: Any) -> Any:
            class Histogram:
                def record(self, *_args: Any) -> None:
                    pass

            return Histogram()

    monkeypatch.setattr(llm_module.activity, "metric_meter", lambda: Meter())
    usage = usage_from_openai(
        "m", {"prompt_tokens": 100, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 40}}
    )
    message = AssistantMessage(content=[], usage=usage, stop_reason="stop", timestamp=0)
    llm_module._ModelMetrics("m").answered(message)
    assert counted["agent_model_tokens_input"] == 100
    assert counted["agent_model_tokens_output"] == 10


async def test_an_abort_before_the_first_chunk_says_nothing_streamed() -> None:
    """Mutant: ``streamed=assembler.started`` -> ``streamed=True``. Without
    ``streamed`` the workflow (its path without instant abort) announces the
    message itself: an aborted call that streamed nothing would have no
    ``message_start``."""

    async def silent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(30)
        return response

    env = ActivityEnvironment()
    async with serving(_app(silent), shutdown_timeout=0.1) as url:
        task = asyncio.create_task(_run(url, env=env))
        await asyncio.sleep(0.5)
        env.cancel()  # cancel_requested: an abort
        result = await asyncio.wait_for(task, 5)
    assert result.message.stop_reason == "aborted" and result.streamed is False


async def test_a_retried_call_publishes_within_a_smaller_batch_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutant: ``max_batches >> (attempt - 1)`` -> ``max_batches``. Each
    attempt of a call halves its budget of event batches (signals), so a
    call retried five times stays under the workflow's signal limit; with
    the whole budget on every attempt it would not."""
    batches = 0
    pending = False

    class Counting(NoStream):
        def publish(self, _event: Any) -> None:
            nonlocal pending
            pending = True

        async def flush(self) -> None:
            nonlocal batches, pending
            batches += pending
            pending = False

    monkeypatch.setattr(events_module, "run_stream_client", Counting)

    async def trickling(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(30):
            await response.write(f"data: {json.dumps(TEXT_CHUNKS[0])}\n\n".encode())
            await asyncio.sleep(0.03)
        await response.write(_sse(TEXT_CHUNKS[1]))
        return response

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=3)
    request = REQUEST.model_copy(update={"stream_batch_ms": 10, "max_batches": 8})
    async with serving(_app(trickling)) as url:
        result = await _run(url, request=request, env=env)
    assert result.message.text == "ok" * 30
    assert 1 <= batches <= 2  # 8 >> 2
