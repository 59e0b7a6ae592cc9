"""The codec endpoint: how the Temporal UI and CLI read this project's payloads.

    python codec_server.py [--host 127.0.0.1] [--port 8081] [--cors-origin URL ...]

Workers compress large payloads (zlib) and move the largest out of the
history (external storage), so the UI and the CLI see base64 and
references where a conversation should be. This server speaks Temporal's
remote codec protocol: POST ``.../decode`` and ``.../encode`` with
``{"payloads": [...]}`` in protobuf JSON (only the last part of the path
counts, so it can be mounted under any prefix). ``/decode`` undoes the
compression and resolves external-storage references to the stored
payload, so even a payload kept outside the history reads as its JSON.

It runs the worker's own data converter (``runtime.payloads.data_converter``
with the worker's settings: the same compression, encryption keys and
storage, AGENT_STORAGE and friends), on raw payloads, through the SDK's
public path (``RawValue``): no second implementation of any of them.

The payloads are conversation contents, so it listens on 127.0.0.1 unless
told otherwise, answers browsers only from the origins given
(``--cors-origin``, repeatable, or AGENT_CODEC_CORS_ORIGINS, comma-separated;
default the dev server's UI and compose's UI), and, when AGENT_CODEC_TOKEN
is set, wants ``Authorization: Bearer <token>`` on every request.
A request it cannot serve gets a 4xx and one sentence in plain text.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import functools
import hmac
import json
import logging
import os
import signal
import sys
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.common import RawValue
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
)

from runtime.converter import DECODE_BUDGET, REFUSED, DecodeBudget
from runtime.payloads import data_converter, for_namespace
from runtime.settings import DEFAULT_MAX_DECOMPRESSED_BYTES, Settings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8081
# The dev server's UI (temporal server start-dev) and compose's UI.
DEFAULT_CORS_ORIGINS = (
    "http://localhost:8233",
    "http://127.0.0.1:8233",
    "http://localhost:8080",
    "http://127.0.0.1:8080",
)
# A batch of payloads, each up to Temporal's 2 MB limit, as base64 in JSON.
MAX_BODY_BYTES = 64 * 1024 * 1024
# One request of 600,000 tiny payloads took 25 s of the server's one thread,
# holding every other request (the UI's next page) up; the UI and the CLI
# send a page of history at a time.
MAX_PAYLOADS = 20_000
# Payloads decoded at once in one request (stored ones are fetched meanwhile).
DECODE_AT_ONCE = 16
# Requests decoding compressed or stored payloads at once, server-wide (the
# others wait their turn): each may decode to AGENT_MAX_DECOMPRESSED_BYTES
# and holds that until its answer is sent. Bounded per request only, 16
# requests of 80 KB, each a zlib payload of 60 MiB, took the server to 3.1
# GB (an audit). A turn ends when the answer has been written, or after
# HEAVY_TURN_SECONDS, when the connection is closed (a client that does not
# read its answer).
HEAVY_AT_ONCE = 2
HEAVY_TURN_SECONDS = 60.0

log = logging.getLogger("codec_server")


@dataclass(frozen=True)
class CodecSettings:
    """Where the server listens and whom it answers; read once at start."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    cors_origins: tuple[str, ...] = DEFAULT_CORS_ORIGINS
    token: str | None = None
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    """What one request's payloads may decode to together (the worker's bound)."""


class Refused(Exception):
    """A request this server will not serve: an HTTP status and one sentence."""

    def __init__(self, status: int, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status
        self.sentence = sentence


_CONVERTER = web.AppKey("converter", DataConverter)
_SETTINGS = web.AppKey("settings", CodecSettings)
_HEAVY = web.AppKey("heavy", asyncio.Semaphore)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(converter: DataConverter, settings: CodecSettings) -> web.Application:
    """The codec endpoint as an aiohttp application (``converter`` does the work)."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_cors, _refusals, _bearer_token])
    app[_CONVERTER] = converter
    app[_SETTINGS] = settings
    app[_HEAVY] = asyncio.Semaphore(HEAVY_AT_ONCE)
    app.router.add_route("*", "/{path:.*}", _codec)
    return app


# --- the protocol ---------------------------------------------------------------


async def _codec(request: web.Request) -> web.Response:
    """POST .../encode, .../decode (or .../download): Payloads in, Payloads out (protobuf JSON)."""
    action = request.path.rstrip("/").rsplit("/", 1)[-1]
    if action not in ("encode", "decode", "download"):
        raise Refused(404, f"No such endpoint {request.raw_path}: POST to /encode or /decode.")
    if request.method != "POST":
        raise Refused(405, f"Use POST for /{action}, not {request.method}.")
    payloads = await _read_payloads(request)
    converter = request.app[_CONVERTER]
    namespace = _namespace(request)
    # The UI asks /download for a stored payload that /decode left as a
    # reference; this /decode never does, but the answer would be the same.
    if action == "encode":  # plain payloads in, none larger out
        return _answer(await _encode(converter, namespace, payloads))
    budget = request.app[_SETTINGS].max_decompressed_bytes
    if all(p.metadata.get("encoding") == b"json/plain" for p in payloads):  # as sent: nothing grows
        return _answer(await _decode_all(converter, payloads, budget))
    turn = await _Turn.take(request.app[_HEAVY], request)
    try:
        answer = _answer(await _decode_all(converter, payloads, budget), turn)
    except BaseException:
        turn.end()
        raise
    return answer


def _answer(payloads: Sequence[Payload], turn: _Turn | None = None) -> web.Response:
    body = json_format.MessageToDict(Payloads(payloads=payloads))
    body.setdefault("payloads", [])  # proto3 JSON leaves an empty list out; the UI reads it
    text = json.dumps(body)
    if turn is None:
        return web.Response(text=text, content_type="application/json")
    return _TurnResponse(turn, text=text, content_type="application/json")


class _Turn:
    """A heavy request's turn (``HEAVY_AT_ONCE``): ended once, when its
    answer is written or after ``HEAVY_TURN_SECONDS``, whichever is first;
    at that deadline the connection is closed, so an answer a client does
    not read is dropped with it rather than held while the next turn
    decodes another (a review)."""

    def __init__(self, gate: asyncio.Semaphore, request: web.Request) -> None:
        self._gate: asyncio.Semaphore | None = gate
        self._request = request
        self._timer = asyncio.get_running_loop().call_later(HEAVY_TURN_SECONDS, self._expire)

    @classmethod
    async def take(cls, gate: asyncio.Semaphore, request: web.Request) -> _Turn:
        await gate.acquire()
        return cls(gate, request)

    def _expire(self) -> None:
        if self._gate is not None:
            log.warning(
                "%s %s: its turn ran out; the connection is closed",
                self._request.method,
                self._request.raw_path,
            )
            if self._request.transport is not None:
                self._request.transport.close()
            self.end()

    def end(self) -> None:
        if self._gate is not None:
            self._gate.release()
            self._gate = None
            self._timer.cancel()


class _TurnResponse(web.Response):
    """An answer that ends its request's turn once written (a client gone
    before that: the turn's timer ends it)."""

    def __init__(self, turn: _Turn, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._turn = turn

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            await super().write_eof(data)
        finally:
            self._turn.end()


def _namespace(request: web.Request) -> str:
    """The request's X-Namespace (``default`` without one), or a 400 for bytes no name has."""
    namespace = request.headers.get("X-Namespace") or "default"
    try:
        namespace.encode()
    except UnicodeEncodeError:  # aiohttp keeps a header's undecodable bytes as surrogates
        raise Refused(400, "The X-Namespace header is not UTF-8 text: send the namespace's name.") from None
    return namespace


async def _read_payloads(request: web.Request) -> list[Payload]:
    """The request's ``{"payloads": [...]}``, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(await request.read())
    except ValueError as err:  # also bytes that are not UTF-8
        raise Refused(400, f'The body is not JSON ({_reason(err)}): send {{"payloads": [...]}}.') from None
    except RecursionError:
        raise Refused(400, 'The body is JSON nested too deep to read: send {"payloads": [...]}.') from None
    if not isinstance(body, dict):
        raise Refused(400, 'The body is JSON but not an object: send {"payloads": [...]}.')
    items = body.get("payloads")
    if isinstance(items, list) and len(items) > MAX_PAYLOADS:
        raise Refused(
            413,
            f"At most {MAX_PAYLOADS:,} payloads in one request (this one has {len(items):,}): "
            "send them in parts.",
        )
    try:
        payloads = list(json_format.ParseDict(body, Payloads()).payloads)
    except RecursionError:
        raise Refused(400, 'The body is JSON nested too deep to read: send {"payloads": [...]}.') from None
    except json_format.ParseError as err:
        raise Refused(
            400,
            f"The body is not a Payloads object in protobuf JSON ({_reason(err)}): "
            'send {"payloads": [...]}.',
        ) from None
    for index, item in enumerate(body.get("payloads") or []):
        # protobuf's parser reads a few invalid characters as no bytes at all
        fields = [item.get("data"), *(item.get("metadata") or {}).values()] if isinstance(item, dict) else []
        if any(isinstance(value, str) and not _is_base64(value) for value in fields):
            raise Refused(400, f"Payload {index} has data or metadata that is not base64.")
    return payloads


def _is_base64(text: str) -> bool:
    """Standard or URL-safe base64, padded or not, as protobuf JSON writes bytes."""
    alphabet = b"-_" if "-" in text or "_" in text else None
    try:
        base64.b64decode(text + "=" * (-len(text) % 4), altchars=alphabet, validate=True)
    except (ValueError, binascii.Error):
        return False
    return True


async def _decode_all(converter: DataConverter, payloads: Sequence[Payload], budget: int) -> list[Payload]:
    """Every payload decoded, ``DECODE_AT_ONCE`` at a time (stored ones
    fetched in the same turns), the request's together within ``budget``
    bytes: 8 compressed payloads of 48 MiB each (0.5 MB sent) took the
    codec server to 2 GB (a security audit). A payload that decompresses past
    what is left is refused (422), and once the decoded payloads pass it
    the request is (413)."""
    gate = asyncio.Semaphore(DECODE_AT_ONCE)
    used = 0

    def refuse_past_budget() -> None:
        if used > budget:
            raise Refused(
                413,
                f"The payloads of this request decode to more than {budget:,} bytes "
                "(AGENT_MAX_DECOMPRESSED_BYTES): ask for fewer at once.",
            )

    async def one(index: int, payload: Payload) -> Payload:
        nonlocal used
        if payload.metadata.get("encoding") == b"json/plain":  # as sent: no larger than the body
            return await _decode(converter, index, payload)
        # Anything else may grow: a compressed payload, and a reference
        # (json/protobuf), whose stored payload may be any size, compressed
        # or not (a control payload never is; nor one sent to /encode with
        # the uncompressed mark): 200 references of 16 KB took 66 MB.
        async with gate:
            refuse_past_budget()
            decoded = await _decode(converter, index, payload)
            used += decoded.ByteSize()
            refuse_past_budget()
            return decoded

    token = DECODE_BUDGET.set(DecodeBudget(budget))
    try:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(payloads))))
    finally:
        DECODE_BUDGET.reset(token)


async def _decode(converter: DataConverter, index: int, payload: Payload) -> Payload:
    """One payload as a plain client would have written it: a stored payload
    fetched back (storage reference -> stored payload), then decompressed.
    The SDK's own order, through its public path (``RawValue`` skips only the
    final conversion to a Python value)."""
    try:
        [raw] = await converter.decode([payload], [RawValue])
    except Exception as err:
        raise _decode_refusal(index, payload, err) from None
    if raw.payload.metadata.get("encoding") == REFUSED:  # a bomb, a payload that does not decrypt
        reason = raw.payload.data.decode(errors="replace")[:500].rstrip(".")
        raise Refused(422, f"Payload {index} {reason}.")
    if raw.payload.metadata.get("encoding") == b"binary/null":
        # A handler's None: JSON's null, which every SDK reads as None too,
        # and the UI shows as null instead of the metadata in base64.
        return Payload(metadata={"encoding": b"json/plain"}, data=b"null")
    # Any other encoding this project does not write (another client's own
    # codec, a signal sent with `--input-meta encoding=...`) goes back as it
    # came, as Temporal's remote codecs do with what they do not handle:
    # refused, it blanked the whole page it came in (the CLI's `workflow
    # show` printed no event at all; a contract audit).
    return raw.payload


async def _encode(converter: DataConverter, namespace: str, payloads: Sequence[Payload]) -> list[Payload]:
    """Payloads as the worker would write them: compressed when large, stored
    outside the history when larger still (under ``namespace``)."""
    for index, payload in enumerate(payloads):
        _check_encoding(converter, index, payload)
    try:
        return await for_namespace(converter, namespace).encode([RawValue(p) for p in payloads])
    except Exception as err:
        raise Refused(502, f"The payload store did not take the payloads: {_reason(err)}.") from None


def _check_encoding(converter: DataConverter, index: int, payload: Payload) -> None:
    """Refuse a payload that is not a plain client's payload (before ``encode``)."""
    known = _known_encodings(converter.payload_converter_class)
    encoding = payload.metadata.get("encoding")
    if known and encoding not in known:
        name = encoding.decode(errors="replace") if encoding else "none"
        plain = ", ".join(e.decode() for e in sorted(known))
        raise Refused(
            422,
            f"Payload {index} has encoding {name!r}, which this codec server cannot encode "
            f"(it encodes payloads of {plain}).",
        )


@functools.cache
def _known_encodings(payload_converter_class: type) -> frozenset[bytes]:
    """The encodings a payload converter reads (empty: it does not say)."""
    inner = payload_converter_class()
    if isinstance(inner, CompositePayloadConverter):
        return frozenset(inner.converters) - {REFUSED}
    return frozenset()


def _decode_refusal(index: int, payload: Payload, err: Exception) -> Refused:
    """Why payload ``index`` could not be decoded, as one sentence."""
    encoding = payload.metadata.get("encoding", b"").decode(errors="replace")
    if isinstance(err, zlib.error):
        return Refused(422, f"Payload {index} is marked {encoding} but its data does not decompress.")
    if isinstance(err, DecodeError):
        return Refused(422, f"Payload {index} is marked {encoding} but its data is not a serialized payload.")
    if isinstance(err, RuntimeError) and "TMPRL1105" in str(err):
        return Refused(
            422,
            f"Payload {index} is stored outside the history, but this codec server has no storage: "
            "start it with the worker's AGENT_STORAGE settings.",
        )
    if isinstance(err, json_format.ParseError) or isinstance(err.__cause__, json_format.ParseError):
        # A reference cut short or mangled (the SDK wraps the parse error): the store is not asked.
        return Refused(422, f"Payload {index} is marked {encoding} but is not a readable storage reference.")
    if isinstance(err, ValueError):  # no such driver, a bad or corrupt claim
        return Refused(
            422,
            f"Payload {index} cannot be read with this codec server's storage settings ({_reason(err)}): "
            "start it with the worker's AGENT_STORAGE settings.",
        )
    return Refused(502, f"Payload {index} could not be fetched from the payload store: {_reason(err)}.")


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.rstrip(".")


# --- middlewares: CORS, refusals as sentences, the token ---------------------------


@web.middleware
async def _cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer browsers from the allowed origins only; the UI sends a preflight
    (OPTIONS) before each POST, and may ask to include credentials."""
    origin = request.headers.get("Origin")
    if origin is None:  # not a browser: the CLI, an SDK client
        return await handler(request)
    if origin not in request.app[_SETTINGS].cors_origins:
        return _refusal(
            request,
            Refused(
                403,
                f"Origin {origin} may not read payloads here: add it with --cors-origin "
                "or AGENT_CODEC_CORS_ORIGINS.",
            ),
        )
    if request.method == "OPTIONS":
        response: web.StreamResponse = web.Response(status=204)
        response.headers["Access-Control-Allow-Methods"] = "POST, OPTIONS"
        response.headers["Access-Control-Allow-Headers"] = "Content-Type, X-Namespace, Authorization"
        response.headers["Access-Control-Max-Age"] = "600"
        if request.headers.get("Access-Control-Request-Private-Network") == "true":
            response.headers["Access-Control-Allow-Private-Network"] = "true"
    else:
        response = await handler(request)
    response.headers["Access-Control-Allow-Origin"] = origin
    response.headers["Access-Control-Allow-Credentials"] = "true"
    response.headers["Vary"] = "Origin"
    return response


@web.middleware
async def _refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes a status and one sentence, and one log line; never a traceback."""
    try:
        return await handler(request)
    except Refused as refused:
        return _refusal(request, refused)
    except web.HTTPException as err:  # aiohttp's own: a body too large, ...
        reason = _reason(Exception(err.text or "the request was refused"))
        return _refusal(request, Refused(err.status, f"{err.reason}: {reason}."))
    except Exception as err:
        return _refusal(
            request, Refused(500, f"The codec server failed ({type(err).__name__}: {_reason(err)}).")
        )


@web.middleware
async def _bearer_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With AGENT_CODEC_TOKEN set, every request carries ``Authorization: Bearer <token>``."""
    token = request.app[_SETTINGS].token
    if token:
        sent = request.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(errors="surrogateescape"), f"Bearer {token}".encode()):
            raise Refused(401, "This codec server wants Authorization: Bearer <AGENT_CODEC_TOKEN>.")
    return await handler(request)


def _refusal(request: web.Request, refused: Refused) -> web.Response:
    log.warning("%s %s -> %d: %s", request.method, request.raw_path, refused.status, refused.sentence)
    headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else None
    body = (refused.sentence + "\n").encode(errors="backslashreplace")  # a header's undecodable bytes
    return web.Response(
        status=refused.status, body=body, content_type="text/plain", charset="utf-8", headers=headers
    )


# --- the process --------------------------------------------------------------------


def settings_from(argv: Sequence[str] | None = None, settings: Settings | None = None) -> CodecSettings:
    """Where to listen and whom to answer: the command line, then ``settings``
    (AGENT_CODEC_CORS_ORIGINS, AGENT_CODEC_TOKEN), then the defaults."""
    settings = settings or Settings.from_env()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port (default 8081)")
    parser.add_argument(
        "--cors-origin",
        action="append",
        metavar="URL",
        help="a UI origin allowed to call this server (repeatable; default AGENT_CODEC_CORS_ORIGINS, "
        "else the dev server's and compose's UI)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port < 65536:
        parser.error(f"--port must be a port number (0-65535), not {args.port}")
    origins = args.cors_origin or settings.codec_cors_origins or DEFAULT_CORS_ORIGINS
    return CodecSettings(
        host=args.host,
        port=args.port,
        cors_origins=tuple(o.rstrip("/") for o in origins),
        token=settings.codec_token,
        max_decompressed_bytes=settings.max_decompressed_bytes,
    )


async def serve(codec: CodecSettings, settings: Settings) -> None:
    """Serve until SIGINT or SIGTERM with the worker's converter (as ``settings``
    say); prints ``codec server listening on URL`` when ready."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before saying "listening": a stop may follow at once
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(build_app(data_converter(settings), codec), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, codec.host, codec.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        print(f"codec server listening on http://{_url_host(host)}:{port}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def main(argv: Sequence[str] | None = None) -> None:
    code = 0
    codec = CodecSettings()
    try:
        settings = Settings.from_env()
        codec = settings_from(argv, settings)
        logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(message)s")
        settings.check_key_file()
        asyncio.run(serve(codec, settings))
    except (ValueError, ImportError) as err:  # settings (AGENT_STORAGE, AGENT_ENCRYPTION_KEYS...)
        print(f"error: {err}", file=sys.stderr)
        code = 2
    except OSError as err:
        print(
            f"error: cannot listen on {codec.host}:{codec.port} ({err.strerror or err}).",
            file=sys.stderr,
        )
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the SDK can crash at interpreter exit (sdk-python #300)


if __name__ == "__main__":
    main()
