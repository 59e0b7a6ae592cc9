"""The model call's HTTP request and its event stream, without the openai
client's per-request machinery.

``client.post(..., stream=True)`` rebuilds the same request for every call
(authentication, the platform headers, the httpx client's defaults merged
one header at a time, the options copied and checked), then decodes the
stream through three nested generators: 1.56 ms of CPU per call against the
scripted server (a tool-call answer of 17 chunks, a 32-message context),
more than the rest of the model activity's own work. ``ChatPoster`` asks
the client to build the request once (``_build_request``: its URL, query,
headers and timeout, as ``client.post`` would send them) and for each call
sends a copy with the new body through the client's own httpx client (its
connection pool, proxies, TLS, cookies and event hooks); ``ChunkStream``
reads the event stream as openai's decoder does: 1.0-1.1 ms per call,
same bench. Failures are the openai exceptions ``client.post`` raises, built by
the client's own helpers (tests/test_model_http.py compares both paths).

Used only where no request differs from the last but for its body: a plain
``openai.AsyncOpenAI`` with a fixed API key and no retries of its own
(``max_retries=0``, as the worker's: Temporal retries), without a key
provider, workload identity, provider runtime, custom auth or idempotency
header, on an openai that has the helpers used here; a new API key or base
URL set on the client is read from the next request on. Anything else, or
``AGENT_DIRECT_MODEL_POST=off`` (``AGENT_SDK_FALLBACKS=on`` too), posts
through ``client.post`` as before.

Differences, each where openai's stream fails or reads another API: an
event without data (``event: ping``, an ``id:`` alone) is skipped where
openai's stream fails parsing it as JSON; a line that is not ``data:`` is
not decoded (openai fails on one that is not UTF-8), nor is an unfinished
event when the body ends; Assistants ``thread.*`` events are read as any
other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import openai

logger = logging.getLogger(__name__)

CHAT_PATH = "/chat/completions"
DRAIN_SECONDS = 0.1  # openai's

try:  # openai >= 2 (httpx2): the helpers client.post itself uses
    from openai._httpx2 import request_exceptions, status_exceptions, timeout_exceptions
    from openai._models import FinalRequestOptions
except ImportError:  # pragma: no cover - another openai: posts through client.post
    FinalRequestOptions = None  # type: ignore[assignment,misc]

_PER_REQUEST = ("_api_key_provider", "_provider_runtime", "_workload_identity_auth")
"""Client attributes that, set, make a request differ from the last (a key
refreshed, a token fetched, a provider's transform)."""


class WirePart(dict[str, Any]):
    """A piece of a request body (a converted message, a tool's entry) that
    is shared between requests and never changed once built: its JSON is
    made once, the first time a body holds it, and reused by every later
    body (``request_body``). A model call's body used to be serialised whole
    each call: ~2 ms of CPU for a 540 KB context, ~0.2 ms with the parts'
    JSON kept (``bench.context``). Anything that would change one after its
    first body must copy it."""

    __slots__ = ("_json",)
    _json: bytes

    def json(self) -> bytes:
        try:
            return self._json
        except AttributeError:
            self._json = _dumps(self)
            return self._json


# As the client serialises a body (openapi_dumps, the same bytes for JSON
# values); one encoder (json.dumps would make one per call).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


def request_body(params: dict[str, Any]) -> bytes:
    """``params`` as JSON, byte for byte what ``json.dumps`` makes of it
    (and so what the client sends), with each ``WirePart`` in a list of
    ``params`` taken as already encoded."""
    if not all(type(key) is str for key in params):
        return _dumps(params)  # json.dumps's own key coercion
    # One join: a context of megabytes is copied once, not once per level.
    pieces = [b"{"]
    for key, value in params.items():
        if len(pieces) > 1:
            pieces.append(b",")
        pieces += (_dumps(key), b":")
        if type(value) is list and any(type(item) is WirePart for item in value):
            pieces.append(b"[")
            for n, item in enumerate(value):
                if n:
                    pieces.append(b",")
                pieces.append(item.json() if type(item) is WirePart else _dumps(item))
            pieces.append(b"]")
        else:
            pieces.append(_dumps(value))
    pieces.append(b"}")
    return b"".join(pieces)


class Chunks(Protocol):
    """A streamed answer: its HTTP response, its chunks as JSON, ``close``."""

    response: Any

    def __aiter__(self) -> AsyncIterator[Any]: ...

    async def close(self) -> None: ...


class ChatPoster:
    """Posts Chat Completions bodies as built, streamed (see the module)."""

    def __init__(self, client: openai.AsyncOpenAI, *, direct: bool = True) -> None:
        self.client = client
        self._template: _Template | None = None
        self.direct = direct and _direct_possible(client)
        if self.direct:
            # Now, not in the first call: the client's platform headers read
            # the platform once (~2 ms), which client.post does in a thread.
            self._template = _Template.of(client)

    async def stream(self, params: dict[str, Any]) -> Chunks:
        """The answer to ``params`` (``stream: true``), its chunks as the JSON the server sent."""
        if not self.direct:
            return await self.client.post(
                CHAT_PATH,
                cast_to=object,
                body=params,
                options={"security": {"bearer_auth": True}},
                stream=True,
                stream_cls=openai.AsyncStream[object],
            )
        http = self.client._client
        request = self._request(params)
        try:
            response = await http.send(request, stream=True)
        except timeout_exceptions() as err:
            raise openai.APITimeoutError(request=request) from err
        except openai.OpenAIError:
            raise
        except request_exceptions() as err:
            raise openai.APIConnectionError(request=request) from err
        try:
            response.raise_for_status()
        except status_exceptions() as err:
            if not err.response.is_closed:
                await err.response.aread()
            raise self.client._make_status_error_from_response(err.response) from None
        return ChunkStream(response)

    def _request(self, params: dict[str, Any]) -> Any:
        client = self.client
        template = self._template
        if template is None or template.key != (client.api_key, client.base_url):
            template = self._template = _Template.of(client)
        body = request_body(params)
        # The jar's cookies as the httpx client's build_request adds them (a
        # load balancer's stickiness cookie, say); none over a Cookie header
        # the client was configured with.
        return template.request_class(
            "POST",
            template.url,
            headers=template.headers,
            content=body,
            cookies=client._client.cookies or None,
            extensions=dict(template.extensions),
        )


@dataclass(frozen=True)
class _Template:
    """What every request of a client has in common, as its own
    ``_build_request`` makes it: URL (base URL, default query), headers
    (authentication, platform, defaults, configured ones, the httpx
    client's), the timeout."""

    key: tuple[Any, Any]  # the API key and base URL it was built with
    request_class: type
    url: Any
    headers: list[tuple[bytes, bytes]]
    extensions: dict[str, Any]

    @classmethod
    def of(cls, client: openai.AsyncOpenAI) -> _Template:
        options = FinalRequestOptions.construct(  # type: ignore[union-attr]
            method="post", url=CHAT_PATH, json_data=None, security={"bearer_auth": True}
        )
        built = client._build_request(options)
        # Host, Content-Length and a Cookie from the jar are each request's
        # own: httpx sets them again, where it set these (the test compares).
        # A Host or Cookie header the client was configured with stays.
        configured = {name.lower() for name in (*client._build_headers(options), *client._client.headers)}
        own = {b"content-length"} | {b"host", b"cookie"} - {n.encode() for n in configured}
        headers = [(name, value) for name, value in built.headers.raw if name.lower() not in own]
        return cls((client.api_key, client.base_url), type(built), built.url, headers, dict(built.extensions))


def _direct_possible(client: openai.AsyncOpenAI) -> bool:
    if FinalRequestOptions is None:
        logger.warning(
            "openai %s lacks the helpers of the direct model request: posting through the client",
            openai.__version__,
        )
        return False
    if type(client) is not openai.AsyncOpenAI or client.max_retries != 0:
        return False  # the direct request has no retry loop (the worker's client: Temporal retries)
    if any(getattr(client, name, None) is not None for name in _PER_REQUEST):
        return False
    return client.custom_auth is None and not getattr(client, "_idempotency_header", None)


class NotAnEventStream(openai.APIError):
    """The server answered 200 with a body that holds no event of a stream
    (an error as plain JSON or text, a wrong endpoint's page): its text is
    the message."""


class ChunkStream:
    """The chunks of an event stream, decoded as openai's ``AsyncStream``
    decodes them: lines end at CR, LF or CRLF, ``:`` starts a comment, an
    event's ``data:`` lines are joined with newlines and parsed as JSON when
    a blank line ends it, ``[DONE]`` ends the stream (the rest of the body is
    drained so the connection can be reused; ``done`` says it came), a
    chunk holding ``error`` raises ``openai.APIError``; a timeout or a
    broken connection while reading raises ``APITimeoutError`` or
    ``APIConnectionError``.

    Errors servers send otherwise raise ``openai.APIError`` too: an event
    named ``error`` (``event: error``), an ``error:`` field (llama.cpp's
    ``error: {...}``), and a body that is no event stream at all (a JSON
    error without ``data:``), whose first line is the error's text."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self.done = False
        self._iterator = self._chunks()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterator

    async def close(self) -> None:
        await self.response.aclose()

    async def _chunks(self) -> AsyncIterator[Any]:
        response = self.response
        blocks = response.aiter_bytes()
        data: list[bytes] = []
        # The start of a line not yet ended, in pieces: a long line is not copied per block.
        rest: list[bytes] = []
        skip_lf = False  # the last block ended in CR: a LF starting the next ends nothing
        event = b""  # the event's name (``event:``)
        errors: list[bytes] = []  # its ``error:`` fields
        stray = b""  # lines that are no field of an event stream (the first 2,000 bytes)
        yielded = False
        try:
            async for block in blocks:
                if not block:
                    continue  # nothing read (a CR before it may still pair with a LF after)
                if skip_lf and block.startswith(b"\n"):
                    block = block[1:]
                if b"\n" not in block and b"\r" not in block:
                    skip_lf = False
                    if block:
                        rest.append(block)
                    continue
                skip_lf = block.endswith(b"\r")
                if rest:
                    rest.append(block)
                    block = b"".join(rest)
                    rest.clear()
                lines = block.splitlines()
                # splitlines drops a final line ending: the last piece is whole only after one.
                if not block.endswith((b"\n", b"\r")):
                    rest.append(lines.pop())
                for line in lines:
                    if line:
                        if line.startswith(b"data:"):
                            value = line[5:]
                            data.append(value[1:] if value.startswith(b" ") else value)
                        elif line == b"data":  # a field without a colon: its value is empty
                            data.append(b"")
                        elif line.startswith(b"event:"):
                            event = line[6:].strip()
                        elif line.startswith(b"error:"):
                            errors.append(line[6:].strip())
                        elif len(stray) < 2000 and not line.startswith((b":", b"id:", b"retry:")):
                            stray = (stray + b"\n" + line if stray else line)[:2000]
                        continue  # id, retry, comments and other fields: not used
                    if errors:
                        raise stream_error(_error_value(b"\n".join(errors)), response)
                    if not data:
                        event = b""
                        continue
                    text = (b"\n".join(data) if len(data) > 1 else data[0]).decode("utf-8")
                    data = []
                    if text.startswith("[DONE]"):
                        self.done = True
                        await _drain(response, blocks)
                        return
                    if event == b"error":
                        value = _error_value(text.encode())
                        if isinstance(value, dict) and value.get("error"):
                            value = value["error"]
                        raise stream_error(value, response)
                    event = b""
                    chunk = json.loads(text)
                    if isinstance(chunk, dict) and chunk.get("error"):
                        raise stream_error(chunk["error"], response)
                    yielded = True
                    yield chunk
            if errors:  # the body ended right after them
                raise stream_error(_error_value(b"\n".join(errors)), response)
            if rest and not yielded and len(stray) < 2000:  # a last line without its line end
                stray = (stray + b"\n" + b"".join(rest) if stray else b"".join(rest))[:2000]
            if stray and not yielded:
                value = _error_value(stray)
                if isinstance(value, dict) and value.get("error"):
                    raise stream_error(value["error"], response)
                said = " ".join(stray.decode("utf-8", "replace").split())
                raise NotAnEventStream(said, response.request, body=None)
        except timeout_exceptions() as err:
            raise openai.APITimeoutError(request=response.request) from err
        except request_exceptions() as err:
            raise openai.APIConnectionError(request=response.request) from err
        finally:
            await response.aclose()


async def _drain(response: Any, blocks: AsyncIterator[bytes]) -> None:
    """The rest of an HTTP/1.1 body read (for a moment at most), so the
    connection can be reused, as openai's stream does after ``[DONE]``."""
    if response.http_version != "HTTP/1.1":
        return
    with contextlib.suppress(TimeoutError, *request_exceptions()):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in blocks:
                await asyncio.sleep(0)  # the deadline holds for a transport with the data at hand


def _error_value(raw: bytes) -> Any:
    """An error field's value: its JSON, else its text."""
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def stream_error(error: Any, response: Any) -> openai.APIError:
    """``openai.APIError`` for an ``error`` chunk (or a whole answer's
    ``error``), as openai's stream raises it; an error given as text
    (``{"error": "..."}``) keeps its text."""
    message = error.get("message") if isinstance(error, dict) else error
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return openai.APIError(message=message, request=response.request, body=error)
