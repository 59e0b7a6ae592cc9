"""A scripted, OpenAI-compatible Chat Completions server speaking real HTTP and SSE.

Tests, the benchmark and the offline demo point the real `openai` client at it.
Each model name has a queue of `ScriptStep`s (filled through `ScriptedModelServer.script`
or `POST /_scripts/{model}`); every completion request for that model consumes one
step, and an empty queue falls back to the deterministic `demo_brain`. Every request
body is recorded so tests can assert on exactly what the agent sent.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import re
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.client import responses as _STATUS_PHRASES
from types import TracebackType
from typing import Any, Self

from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from . import demo_brain
from .script import (
    DropFault,
    ErrorEventFault,
    MalformedFault,
    RawFault,
    ScriptStep,
    ScriptToolCall,
    ScriptUsage,
    StallFault,
    StatusFault,
)

JSON = dict[str, Any]

DEMO_MODEL = "scripted-demo"
_SHUTDOWN_GRACE_S = 0.5
_START_TIMEOUT_S = 10.0
_MALFORMED_EVENT = b"data: {not json\n\n"
_DONE_EVENT = b"data: [DONE]\n\n"
_STEPS_ADAPTER = TypeAdapter(list[ScriptStep])
_DEFAULT_ERROR_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}


class ScriptStore:
    """Thread-safe per-model step queues and request logs.

    Shared by the aiohttp handlers (server thread) and the Python API (test thread).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: defaultdict[str, deque[ScriptStep]] = defaultdict(deque)
        self._requests: defaultdict[str, list[JSON]] = defaultdict(list)
        self._first_tokens: defaultdict[str, list[float]] = defaultdict(list)

    def append(self, model: str, steps: Iterable[ScriptStep | JSON]) -> int:
        """Queue steps for `model`; returns how many are now pending."""
        parsed = [step if isinstance(step, ScriptStep) else ScriptStep.model_validate(step) for step in steps]
        with self._lock:
            self._steps[model].extend(parsed)
            return len(self._steps[model])

    def pop(self, model: str) -> ScriptStep | None:
        """Consume the next step for `model`, or None when its queue is empty."""
        with self._lock:
            queue = self._steps.get(model)
            return queue.popleft() if queue else None

    def pending(self, model: str) -> list[ScriptStep]:
        """Steps still queued for `model`."""
        with self._lock:
            return list(self._steps.get(model, ()))

    def clear_steps(self, model: str) -> int:
        """Drop the queue of `model`; returns how many steps were dropped."""
        with self._lock:
            return len(self._steps.pop(model, ()))

    def record(self, model: str, body: JSON) -> None:
        """Remember a request body received for `model`."""
        with self._lock:
            self._requests[model].append(copy.deepcopy(body))

    def record_first_token(self, model: str, at: float) -> None:
        """Remember when the first content chunk of a response for `model` was sent (unix time)."""
        with self._lock:
            self._first_tokens[model].append(at)

    def first_tokens(self, model: str) -> list[float]:
        """Unix times at which responses for `model` sent their first content chunk."""
        with self._lock:
            return list(self._first_tokens.get(model, []))

    def requests(self, model: str) -> list[JSON]:
        """Copies of the request bodies received for `model`, oldest first."""
        with self._lock:
            return copy.deepcopy(self._requests.get(model, []))

    def clear_requests(self, model: str) -> int:
        """Forget the requests of `model`; returns how many were forgotten."""
        with self._lock:
            return len(self._requests.pop(model, []))

    def reset(self) -> None:
        """Forget every queue and every recorded request."""
        with self._lock:
            self._steps.clear()
            self._requests.clear()
            self._first_tokens.clear()

    def models(self) -> list[str]:
        """The demo model plus every model that has been scripted or called."""
        with self._lock:
            return sorted({DEMO_MODEL, *self._steps, *self._requests})


STORE_KEY = web.AppKey("store", ScriptStore)
_COUNTER_KEY: web.AppKey[Iterator[int]] = web.AppKey("completion_counter")


# ---------------------------------------------------------------- wire format


@dataclass(frozen=True)
class _Completion:
    """Identity shared by every chunk of one response."""

    id: str
    created: int
    model: str

    def envelope(self, obj: str) -> JSON:
        """The fields OpenAI puts on every completion and chunk."""
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
        }

    def chunk(self, delta: JSON, finish_reason: str | None = None) -> JSON:
        """A `chat.completion.chunk` with one choice."""
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        return {**self.envelope("chat.completion.chunk"), "choices": [choice]}

    def usage_chunk(self, usage: JSON) -> JSON:
        """The trailing chunk sent when `stream_options.include_usage` is set."""
        return {**self.envelope("chat.completion.chunk"), "choices": [], "usage": usage}

    def call_id(self, call: ScriptToolCall, index: int) -> str:
        """The scripted tool call id, or one derived from this completion."""
        return call.id or f"call_{self.id.removeprefix('chatcmpl-')}_{index}"


def _estimate_tokens(text: str) -> int:
    """Rough token count: one token per four characters."""
    return (len(text) + 3) // 4


def _usage(step: ScriptStep, body: JSON) -> JSON:
    """Usage block: scripted counts where given, otherwise chars/4 estimates."""
    scripted = step.usage or ScriptUsage()
    reasoning = step.reasoning or ""
    calls = "".join(call.name + call.arguments_json() for call in step.tool_calls)
    prompt = json.dumps(body.get("messages", []), ensure_ascii=False)
    prompt_tokens = _first_set(scripted.prompt_tokens, _estimate_tokens(prompt))
    completion_tokens = _first_set(
        scripted.completion_tokens,
        _estimate_tokens((step.text or "") + reasoning + calls),
    )
    reasoning_tokens = _first_set(scripted.reasoning_tokens, _estimate_tokens(reasoning))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


def _first_set(value: int | None, default: int) -> int:
    """`value` unless it is None."""
    return default if value is None else value


def _deltas(step: ScriptStep, completion: _Completion) -> list[JSON]:
    """Content deltas in OpenAI order: reasoning, then text, then tool calls."""
    deltas: list[JSON] = [{"reasoning_content": piece} for piece in step.pieces(step.reasoning or "")]
    deltas += [{"content": piece} for piece in step.pieces(step.text or "")]
    for index, call in enumerate(step.tool_calls):
        opening = {
            "index": index,
            "id": completion.call_id(call, index),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        deltas.append({"tool_calls": [opening]})
        pieces = step.pieces(call.arguments_json())
        deltas += [{"tool_calls": [{"index": index, "function": {"arguments": piece}}]} for piece in pieces]
    return deltas


def _timed_chunks(step: ScriptStep, completion: _Completion, body: JSON) -> list[tuple[float, JSON]]:
    """Every stream chunk paired with the seconds to wait before sending it."""
    content_delay = step.delay_ms / 1000
    timed = [
        (
            step.first_delay_ms / 1000,
            completion.chunk({"role": "assistant", "content": ""}),
        )
    ]
    timed += [(content_delay, completion.chunk(delta)) for delta in _deltas(step, completion)]
    timed.append((0.0, completion.chunk({}, step.resolved_finish_reason())))
    if (body.get("stream_options") or {}).get("include_usage"):
        timed.append((0.0, completion.usage_chunk(_usage(step, body))))
    return timed


def _message(step: ScriptStep, completion: _Completion) -> JSON:
    """The assistant message of a non-streaming completion."""
    message: JSON = {"role": "assistant", "content": step.text, "refusal": None}
    if step.reasoning:
        message["reasoning_content"] = step.reasoning
    if step.tool_calls:
        message["tool_calls"] = [
            {
                "id": completion.call_id(call, index),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json()},
            }
            for index, call in enumerate(step.tool_calls)
        ]
    return message


def _completion_body(step: ScriptStep, completion: _Completion, body: JSON) -> JSON:
    """A whole `chat.completion` object."""
    choice = {
        "index": 0,
        "message": _message(step, completion),
        "logprobs": None,
        "finish_reason": step.resolved_finish_reason(),
    }
    return {
        **completion.envelope("chat.completion"),
        "choices": [choice],
        "usage": _usage(step, body),
    }


def _sse(data: JSON) -> bytes:
    """One SSE `data:` event."""
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def error_response(
    status: int,
    message: str | None = None,
    *,
    error_type: str | None = None,
    code: str | None = None,
    retry_after: float | None = None,
) -> web.Response:
    """An HTTP error in OpenAI's `{"error": {...}}` shape."""
    default_type = (
        "requests" if status == 429 else "invalid_request_error" if status < 500 else "server_error"
    )
    error = {
        "message": message or f"scripted {status} {_STATUS_PHRASES.get(status, 'error')}",
        "type": error_type or default_type,
        "param": None,
        "code": code or _DEFAULT_ERROR_CODES.get(status),
    }
    headers = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
    return web.json_response({"error": error}, status=status, headers=headers)


def _fault_response(fault: StatusFault) -> web.Response:
    """The error response a status fault asks for."""
    if fault.body is not None:
        kind = "text/html" if fault.body.lstrip().startswith("<") else "text/plain"
        headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
        return web.Response(status=fault.status, text=fault.body, content_type=kind, headers=headers)
    return error_response(
        fault.status,
        fault.message,
        error_type=fault.type,
        code=fault.code,
        retry_after=fault.retry_after,
    )


# ---------------------------------------------------------------- serving a step


def _cut_connection(request: web.Request) -> None:
    """Close the socket mid-response so the client sees an incomplete body, not a clean end."""
    request.protocol.force_close()


async def _write_chunks(response: web.StreamResponse, timed: list[tuple[float, JSON]]) -> None:
    """Send chunks, sleeping before each as scripted."""
    for delay, chunk in timed:
        if delay:
            await asyncio.sleep(delay)
        await response.write(_sse(chunk))


async def _stream(
    request: web.Request, step: ScriptStep, completion: _Completion, body: JSON
) -> web.StreamResponse:
    """Serve `step` as an SSE stream, applying a stall/drop/malformed fault at its chunk."""
    response = web.StreamResponse(headers={"Content-Type": step.content_type, "Cache-Control": "no-cache"})
    await response.prepare(request)
    if isinstance(step.fault, RawFault):
        return await _write_raw(request, response, step.fault)
    timed = _timed_chunks(step, completion, body)
    fault = step.fault
    split = (
        fault.after_chunks
        if isinstance(fault, StallFault | DropFault | MalformedFault | ErrorEventFault)
        else len(timed)
    )
    try:
        if fault is None and len(timed) > 2:
            # Note when the first token leaves (benchmarks measure time to screen).
            await _write_chunks(response, timed[:2])
            request.app[STORE_KEY].record_first_token(body["model"], time.time())
            timed, split = timed[2:], split - 2
        await _write_chunks(response, timed[:split])
        if isinstance(fault, MalformedFault):
            await response.write(_MALFORMED_EVENT)
        if isinstance(fault, DropFault | MalformedFault):
            _cut_connection(request)
            return response
        if isinstance(fault, ErrorEventFault):
            error = {"message": fault.message, "type": fault.type, "code": fault.code}
            await response.write(_sse({"error": error}) + _DONE_EVENT)
            return response
        if isinstance(fault, StallFault):
            await asyncio.sleep(fault.seconds)
        await _write_chunks(response, timed[split:])
        await response.write(_DONE_EVENT)
    except ConnectionResetError:
        pass  # the client went away; nothing left to serve
    return response


async def _write_raw(
    request: web.Request, response: web.StreamResponse, fault: RawFault
) -> web.StreamResponse:
    """The raw fault's body, then its hold with the connection open."""
    try:
        await response.write(fault.body.encode())
        if fault.hold_seconds:
            await asyncio.sleep(fault.hold_seconds)
            _cut_connection(request)  # a held stream ends without a clean end of its body
    except ConnectionResetError:
        pass
    return response


async def _complete(
    request: web.Request, step: ScriptStep, completion: _Completion, body: JSON
) -> web.StreamResponse:
    """Serve `step` as one JSON completion, after the time its stream would have taken."""
    fault = step.fault
    if isinstance(fault, RawFault):
        response = web.StreamResponse(headers={"Content-Type": step.content_type})
        await response.prepare(request)
        return await _write_raw(request, response, fault)
    await asyncio.sleep((step.first_delay_ms + step.delay_ms * len(_deltas(step, completion))) / 1000)
    if isinstance(fault, StallFault):
        await asyncio.sleep(fault.seconds)
    if isinstance(fault, DropFault):
        _cut_connection(request)
    if isinstance(fault, MalformedFault):
        return web.Response(body=_MALFORMED_EVENT[len(b"data: ") :], content_type="application/json")
    if isinstance(fault, ErrorEventFault):  # some servers answer 200 with an error object
        return web.json_response(
            {"error": {"message": fault.message, "type": fault.type, "code": fault.code}}
        )
    return web.json_response(_completion_body(step, completion, body))


# ---------------------------------------------------------------- handlers


async def _read_json(request: web.Request) -> Any:
    """The request body parsed as JSON, or None when it is not valid JSON."""
    try:
        return await request.json()
    except ValueError:
        return None


_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def tools_problem(tools: Any) -> str | None:
    """Why OpenAI would refuse these ``tools`` (400), or None: a function
    name of letters, digits, `_` and `-`, parameters that are an object."""
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            return "Invalid 'tools[]': each tool needs a 'function'."
        name = function.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            return f"Invalid 'tools[].function.name': string does not match pattern: {name!r}"
        parameters = function.get("parameters")
        if parameters is not None and (
            not isinstance(parameters, dict) or parameters.get("type") != "object"
        ):
            return (
                f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"'."
            )
    return None


def tool_message_problem(messages: Any) -> str | None:
    """Why OpenAI would refuse these ``messages`` for their tool calls and
    results (as it does, with status 400), or None: an assistant message's
    ``tool_calls`` (ids of at most 40 characters, names of letters, digits,
    `_` and `-`) must be answered, each, by the ``tool`` messages right
    after it, and a ``tool`` message must answer one."""
    if not isinstance(messages, list):
        return None
    if not messages:
        return "Invalid 'messages': empty array. Expected an array with minimum length 1."
    open_calls: list[Any] = []  # calls of the last assistant message not answered yet
    answering = False  # the messages since that assistant message are all tool messages
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user" and message.get("content") == []:
            return "Invalid 'messages[].content': empty array. Expected an array with minimum length 1."
        if role == "tool":
            if not answering or message.get("tool_call_id") not in open_calls:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceding message with 'tool_calls'."
                )
            open_calls.remove(message["tool_call_id"])
            continue
        if open_calls:
            break
        calls = message.get("tool_calls") if role == "assistant" else None
        open_calls = [c.get("id") for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        answering = bool(open_calls)
        for call in calls if isinstance(calls, list) else []:
            name = (call.get("function") or {}).get("name") if isinstance(call, dict) else None
            if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
                return f"Invalid 'tool_calls[].function.name': string does not match pattern: {name!r}"
        for call_id in open_calls:
            if not isinstance(call_id, str) or len(call_id) > 40:
                return "Invalid 'tool_calls[].id': string too long. Expected a string with maximum length 40."
    if open_calls:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
            f"{', '.join(map(str, open_calls))}"
        )
    return None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """`POST /v1/chat/completions`: consume the model's next step (or ask the demo brain).
    A request OpenAI would refuse for the order of its tool messages is
    refused the same way (400), its step left queued."""
    body = await _read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return error_response(400, "body must be a JSON object with a string 'model'")
    store = request.app[STORE_KEY]
    store.record(body["model"], body)
    problem = tool_message_problem(body.get("messages")) or tools_problem(body.get("tools"))
    if problem is not None:
        return error_response(400, problem)
    step = store.pop(body["model"]) or demo_brain.respond(body)
    if isinstance(step.fault, StatusFault):
        return _fault_response(step.fault)
    numbers = request.app[_COUNTER_KEY]
    number = next(numbers)
    completion = _Completion(id=f"chatcmpl-{number}", created=int(time.time()), model=body["model"])
    if body.get("stream") and not step.whole:
        return await _stream(request, step, completion, body)
    return await _complete(request, step, completion, body)


async def list_models(request: web.Request) -> web.Response:
    """`GET /v1/models`: the demo model and every model seen so far."""
    models = request.app[STORE_KEY].models()
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "scripted-model"} for name in models]
    return web.json_response({"object": "list", "data": data})


async def add_steps(request: web.Request) -> web.Response:
    """`POST /_scripts/{model}` with `{"steps": [...]}`: append steps to the model's queue."""
    body = await _read_json(request)
    raw_steps = body.get("steps") if isinstance(body, dict) else None
    try:
        steps = _STEPS_ADAPTER.validate_python(raw_steps)
    except ValidationError as exc:
        return error_response(400, f"invalid steps: {exc}")
    model = request.match_info["model"]
    return web.json_response({"model": model, "pending": request.app[STORE_KEY].append(model, steps)})


async def get_steps(request: web.Request) -> web.Response:
    """`GET /_scripts/{model}`: the steps still queued, to check a script was fully consumed."""
    pending = request.app[STORE_KEY].pending(request.match_info["model"])
    return web.json_response(
        {"steps": [step.model_dump(mode="json", exclude_unset=True) for step in pending]}
    )


async def clear_steps(request: web.Request) -> web.Response:
    """`DELETE /_scripts/{model}`: drop the model's queue."""
    model = request.match_info["model"]
    return web.json_response({"model": model, "cleared": request.app[STORE_KEY].clear_steps(model)})


async def get_requests(request: web.Request) -> web.Response:
    """`GET /_requests/{model}`: the request bodies received for the model, oldest first."""
    return web.json_response(request.app[STORE_KEY].requests(request.match_info["model"]))


async def clear_requests(request: web.Request) -> web.Response:
    """`DELETE /_requests/{model}`: forget the model's recorded requests."""
    model = request.match_info["model"]
    return web.json_response({"model": model, "cleared": request.app[STORE_KEY].clear_requests(model)})


async def reset(request: web.Request) -> web.Response:
    """`POST /_reset`: forget all queues and recorded requests."""
    request.app[STORE_KEY].reset()
    return web.json_response({"reset": True})


def create_app(store: ScriptStore | None = None) -> web.Application:
    """The aiohttp application; pass a store to share it with in-process callers."""
    app = web.Application(client_max_size=256 * 1024 * 1024)  # long contexts, as real servers take
    app[STORE_KEY] = store or ScriptStore()
    app[_COUNTER_KEY] = itertools.count(1)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/_scripts/{model:.+}", add_steps)
    app.router.add_get("/_scripts/{model:.+}", get_steps)
    app.router.add_delete("/_scripts/{model:.+}", clear_steps)
    app.router.add_get("/_requests/{model:.+}", get_requests)
    app.router.add_delete("/_requests/{model:.+}", clear_requests)
    app.router.add_post("/_reset", reset)
    return app


async def serve(
    host: str = "127.0.0.1", port: int = 0, store: ScriptStore | None = None
) -> tuple[web.AppRunner, str]:
    """Start listening on the running loop; returns the runner (to clean up) and the `/v1` base URL."""
    runner = web.AppRunner(create_app(store), handler_cancellation=True, shutdown_timeout=_SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"http://{url_host}:{bound_port}/v1"


# ---------------------------------------------------------------- in-process API


class ScriptedModelServer:
    """The server running on a background thread with its own event loop, for tests.

    Usage: `with ScriptedModelServer() as srv: srv.script("m", [{"text": "hi"}])`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.base_url = ""
        self.store = ScriptStore()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def start(self) -> Self:
        """Start serving; returns once the socket is listening."""
        if self._loop is not None:
            raise RuntimeError("ScriptedModelServer is already running")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=_run_loop_forever, args=(loop,), name="scripted-model", daemon=True)
        thread.start()
        started = asyncio.run_coroutine_threadsafe(serve(self.host, self.port, self.store), loop)
        try:
            self._runner, self.base_url = started.result(timeout=_START_TIMEOUT_S)
        except BaseException:
            _stop_loop(loop, thread)
            raise
        self._loop, self._thread = loop, thread
        return self

    def stop(self) -> None:
        """Stop serving and join the background thread; safe to call twice."""
        if self._loop is None or self._thread is None or self._runner is None:
            return
        cleanup = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        cleanup.result(timeout=_START_TIMEOUT_S)
        _stop_loop(self._loop, self._thread)
        self._loop = self._thread = self._runner = None

    def script(self, model: str, steps: Iterable[ScriptStep | JSON]) -> None:
        """Append steps to the queue of `model`."""
        self.store.append(model, steps)

    def pending(self, model: str) -> list[ScriptStep]:
        """Steps of `model` not yet consumed."""
        return self.store.pending(model)

    def requests(self, model: str) -> list[JSON]:
        """Request bodies received for `model`, oldest first."""
        return self.store.requests(model)

    def reset(self) -> None:
        """Forget all queues and recorded requests."""
        self.store.reset()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _run_loop_forever(loop: asyncio.AbstractEventLoop) -> None:
    """Thread body: run `loop` until stopped, then close it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop a loop running on another thread and wait for that thread."""
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=_START_TIMEOUT_S)
