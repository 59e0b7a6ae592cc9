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
``openai.AsyncOpenAI`` with a fixed API key (no key provider, workload
identity, provider runtime, custom auth or idempotency header) on an openai
that has the helpers used here. Anything else, or ``AGENT_DIRECT_MODEL_POST=off``
(``AGENT_SDK_FALLBACKS=on`` too), posts through ``client.post`` as before.
One difference, on purpose: an event without data (``event: ping``, an
``id:`` alone) is skipped, where openai's stream fails parsing it as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
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


class Chunks(Protocol):
    """A streamed answer: its HTTP response, its chunks as JSON, ``close``."""

    response: Any

    def __aiter__(self) -> AsyncIterator[Any]: ...

    async def close(self) -> None: ...


class ChatPoster:
    """Posts Chat Completions bodies as built, streamed (see the module)."""

    def __init__(self, client: openai.AsyncOpenAI, *, direct: bool = True) -> None:
        self.client = client
        self._template: tuple[type, Any, list[tuple[bytes, bytes]], dict[str, Any]] | None = None
        self.direct = direct and _direct_possible(client)

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
        if self._template is None:
            self._template = self._build_template()
        request_class, url, headers, extensions = self._template
        # As the client serialises a body (openapi_dumps, the same bytes for JSON values).
        body = json.dumps(params, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        # The jar's cookies as the httpx client's build_request adds them (a
        # load balancer's stickiness cookie, say).
        cookies = self.client._client.cookies or None
        return request_class(
            "POST", url, headers=headers, content=body, cookies=cookies, extensions=dict(extensions)
        )

    def _build_template(self) -> tuple[type, Any, list[tuple[bytes, bytes]], dict[str, Any]]:
        options = FinalRequestOptions.construct(  # type: ignore[union-attr]
            method="post", url=CHAT_PATH, json_data=None, security={"bearer_auth": True}
        )
        built = self.client._build_request(options)
        # Host, Content-Length and Cookie are set again for each request, in
        # the places httpx sets them (tests/test_model_http.py compares).
        headers = [
            (name, value)
            for name, value in built.headers.raw
            if name.lower() not in (b"host", b"content-length", b"cookie")
        ]
        return type(built), built.url, headers, dict(built.extensions)


def _direct_possible(client: openai.AsyncOpenAI) -> bool:
    if FinalRequestOptions is None:
        logger.warning(
            "openai %s lacks the helpers of the direct model request: posting through the client",
            openai.__version__,
        )
        return False
    if type(client) is not openai.AsyncOpenAI:
        return False
    if any(getattr(client, name, None) is not None for name in _PER_REQUEST):
        return False
    return client.custom_auth is None and not getattr(client, "_idempotency_header", None)


class ChunkStream:
    """The chunks of an event stream, decoded as openai's ``AsyncStream``
    decodes them: lines end at CR, LF or CRLF, ``:`` starts a comment, an
    event's ``data:`` lines are joined with newlines and parsed as JSON when
    a blank line ends it, ``[DONE]`` ends the stream (the rest of the body is
    drained so the connection can be reused), a chunk holding ``error``
    raises ``openai.APIError``; a timeout or a broken connection while
    reading raises ``APITimeoutError`` or ``APIConnectionError``."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self._iterator = self._chunks()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterator

    async def close(self) -> None:
        await self.response.aclose()

    async def _chunks(self) -> AsyncIterator[Any]:
        response = self.response
        blocks = response.aiter_bytes()
        data: list[bytes] = []
        rest = b""  # the start of a line not yet ended
        skip_lf = False  # the last block ended in CR: a LF starting the next ends nothing
        try:
            async for block in blocks:
                if skip_lf and block.startswith(b"\n"):
                    block = block[1:]
                skip_lf = block.endswith(b"\r")
                lines = (rest + block).splitlines()
                # splitlines drops a final line ending: the last piece is whole only after one.
                rest = b"" if block.endswith((b"\n", b"\r")) else lines.pop() if lines else b""
                for line in lines:
                    if line:
                        if line.startswith(b"data:"):
                            value = line[5:]
                            data.append(value[1:] if value.startswith(b" ") else value)
                        elif line == b"data":  # a field without a colon: its value is empty
                            data.append(b"")
                        continue  # event, id, retry, comments and other fields: not used
                    if not data:
                        continue
                    text = (b"\n".join(data) if len(data) > 1 else data[0]).decode("utf-8")
                    data = []
                    if text.startswith("[DONE]"):
                        await _drain(response, blocks)
                        return
                    chunk = json.loads(text)
                    if isinstance(chunk, dict) and chunk.get("error"):
                        raise _stream_error(chunk["error"], response)
                    yield chunk
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
                pass


def _stream_error(error: Any, response: Any) -> openai.APIError:
    """``openai.APIError`` for an ``error`` chunk, as openai's stream raises it."""
    message = error.get("message") if isinstance(error, dict) else None
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return openai.APIError(message=message, request=response.request, body=error)
