"""The ``stream_assistant_response`` activity: one streamed model call.

It runs the context transform and the conversion to LLM messages (both
pluggable, both may do I/O), streams the answer from an OpenAI-compatible
Chat Completions endpoint, publishes the deltas to the workflow's event
stream, and returns the assembled message.

Errors are classified here: 408/409/429/5xx, timeouts and broken streams are
retried by Temporal (Retry-After honoured); other 4xx are not. The API key
is the worker's (its settings), passed to the model server at call time; it
never enters a workflow's history: error texts are scrubbed of credentials
(``activities/redact.py``) and raised without the client's exception as
their cause, whose text would otherwise be stored beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import html
import inspect
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, timedelta
from typing import Any

import openai
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.context_store import ContextMissing, ContextStore, Manifest
from activities.events import ActivityEventPublisher, attempt_budget
from activities.heartbeat import heartbeating, retry_announced, retry_reason, will_retry
from activities.model_http import ChatPoster, Chunks, NotAnEventStream, stream_error
from activities.openai_chat import (
    ConversionMemo,
    StreamAssembler,
    StreamEndedEarly,
    completion_as_chunk,
    default_convert_to_llm,
    reasoning_effort,
    to_openai_messages,
)
from activities.redact import scrub
from activities.tools import ToolSpec, registered_tools
from workflows.contract import LlmRequest, LlmResult
from workflows.hooks import failure_text, is_user_failure
from workflows.models import (
    AgentMessage,
    AssistantMessage,
    MessageRetryEvent,
    MessageStartEvent,
)

ContextTransform = Callable[[list[AgentMessage]], "list[AgentMessage] | Awaitable[list[AgentMessage]]"]
LlmConverter = Callable[[list[AgentMessage]], "list[AgentMessage] | Awaitable[list[AgentMessage]]"]

RETRYABLE_STATUS = {408, 409, 429}
logger = logging.getLogger(__name__)


class LlmActivities:
    """Holds the worker's model configuration; register
    ``LlmActivities().stream_assistant_response`` with the worker.

    ``transform_context`` prunes or injects messages for one call (never
    written back); ``convert_to_llm`` chooses what the model sees (default:
    user, assistant and tool-result messages). ``secrets`` (besides the API
    key) are scrubbed from error texts verbatim.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        transform_context: ContextTransform | None = None,
        convert_to_llm: LlmConverter | None = None,
        read_timeout: float = 60.0,
        context_store: ContextStore | None = None,
        tools: Mapping[str, ToolSpec] | None = None,
        secrets: Sequence[str | None] = (),
        direct_post: bool = True,
    ) -> None:
        self._api_key = api_key
        self._direct_post = direct_post
        self._secrets = (api_key, *secrets)
        self._base_url = base_url
        self._transform_context = transform_context
        self._convert_to_llm = convert_to_llm or default_convert_to_llm
        # Stored context comes back as the same objects each call; without a store
        # each call's messages are new (the memo would never hit), and hooks of
        # one's own may build or change messages: converted afresh each call.
        self._memo = (
            ConversionMemo()
            if context_store is not None and transform_context is None and convert_to_llm is None
            else None
        )
        self._read_timeout = read_timeout
        self._context = context_store
        self._tools = tools
        self._poster: ChatPoster | None = None
        self._no_stream_options: set[str] = set()
        """Models the server refused ``stream_options`` for (usage in the stream)."""

    def _model_poster(self) -> ChatPoster:
        """The client for the worker's model server (made on first use)."""
        if not self._api_key:
            raise ApplicationError(
                "OPENAI_API_KEY is not set on the worker: set it (any value for a local "
                "server such as Ollama or vLLM) and point OPENAI_BASE_URL at the server.",
                type="ModelConfigError",
                non_retryable=True,
            )
        if self._poster is None:
            client = openai.AsyncOpenAI(
                base_url=self._base_url,
                api_key=self._api_key,
                max_retries=0,  # Temporal retries, with backoff and Retry-After
                timeout=openai.Timeout(self._read_timeout, connect=10.0),
            )
            self._poster = ChatPoster(client, direct=self._direct_post)
        return self._poster

    async def aclose(self) -> None:
        """Close the model client now (its connections), not whenever it is
        garbage-collected: collected later, maybe inside a workflow task,
        it would schedule its own close on whatever loop then runs. A later
        call makes a new client."""
        poster, self._poster = self._poster, None
        if poster is not None:
            await poster.client.close()

    @contextlib.asynccontextmanager
    async def in_use(self) -> AsyncIterator[None]:
        """A worker's run: the model client is closed when it ends."""
        try:
            yield
        finally:
            await self.aclose()

    def warm_up(self) -> None:
        """Make the model client now, not on the first call: building its TLS
        context takes ~30 ms, which the first answer after a worker starts
        (a deploy, a crash, an evicted conversation) would otherwise wait
        for. Without an API key it does nothing (the call then says why)."""
        if self._api_key:
            self._model_poster()

    @activity.defn(name="stream_assistant_response")
    async def stream_assistant_response(self, request: LlmRequest) -> LlmResult:
        info = activity.info()
        poster = self._model_poster()
        notice = _RetryNotice()
        # Heartbeats from the start: loading a stored context (S3) and the
        # worker's context transform may take seconds before the request
        # goes out, and the heartbeat timeout counts from the start.
        try:
            async with heartbeating():
                return await self._answer(request, info, poster, notice)
        except Exception as err:
            if not info.is_local and not (isinstance(err, ApplicationError) and err.non_retryable):
                # Its last heartbeat's details reach the next attempt, whose
                # message_retry event says why (the SDK sends it before the
                # failure), unless this attempt has delivered that event.
                activity.heartbeat(info.attempt, _failure_reason(err), notice.delivered())
            raise

    async def _answer(
        self, request: LlmRequest, info: activity.Info, poster: ChatPoster, notice: _RetryNotice
    ) -> LlmResult:
        stored, context = await self._context_of(request)
        params = await self._request_params(request, context)
        assembler = StreamAssembler(request.model)
        budget = attempt_budget(request.max_batches, info.attempt)
        publisher = notice.publisher = ActivityEventPublisher(
            request.stream_batch_ms, budget, call=request.stream_call
        )
        metrics = _ModelMetrics(request.model)
        async with publisher as events:
            if info.attempt > 1 and not retry_announced(info):
                events.publish(MessageRetryEvent(attempt=info.attempt, reason=retry_reason(info)), flush=True)
            try:
                try:
                    await _stream(poster, params, assembler, events, info.attempt)
                except openai.BadRequestError as err:
                    if not self._refuses_stream_options(err, params):
                        raise
                    await _stream(poster, params, assembler, events, info.attempt)
                message, argument_errors, closing = assembler.finish()
            except asyncio.CancelledError:
                details = activity.cancellation_details()
                if details is None or not details.cancel_requested:
                    raise  # worker shutdown or timeout: let Temporal retry elsewhere
                message, argument_errors, closing = assembler.finish(aborted=True)
            except Exception as err:
                # Not ``from err``: the cause's text (the server's raw body) would be stored too.
                failure = _classify(err, self._secrets, streaming=assembler.started)
                metrics.failed(failure.type or "Unknown")
                if will_retry(failure, info):
                    # Said now, not as the next attempt starts: that may be
                    # minutes away (a Retry-After, the backoff), and the
                    # stream was silent meanwhile (a fault audit).
                    events.publish(
                        MessageRetryEvent(attempt=info.attempt + 1, reason=_failure_reason(failure)),
                        flush=True,
                    )
                    notice.published = True
                raise failure from None
            metrics.answered(message)
            for event in closing:
                events.publish_delta(event)
        context_ref = None
        if self._context is not None:
            context_ref = self._context.save_soon(stored, [*request.messages, message])
        return LlmResult(
            message=message,
            streamed=assembler.started,
            context_ref=context_ref,
            argument_errors=argument_errors,
            events=events.tail,
        )

    def _refuses_stream_options(self, err: openai.BadRequestError, params: dict[str, Any]) -> bool:
        """The server refused the request for its ``stream_options`` (older
        vLLM, llama.cpp and proxies that check every field): it is left out
        of this request and of this worker's next ones for the model. Usage
        then comes only if the server sends it anyway."""
        if "stream_options" not in params or "stream_options" not in _error_detail(err):
            return False
        logger.warning(
            "The model server refuses stream_options for %s (%s): asking without it from now on",
            params["model"],
            _clip(scrub(_error_detail(err), self._secrets)),
        )
        self._no_stream_options.add(params["model"])
        del params["stream_options"]
        return True

    async def _context_of(self, request: LlmRequest) -> tuple[Manifest, list[AgentMessage]]:
        """The manifest of the stored part of the context, and the whole context."""
        if request.context_ref is None:
            return Manifest(), list(request.messages)
        if self._context is None:
            raise ApplicationError(
                "This worker has no context store (AGENT_STORAGE=off): it cannot read stored context.",
                type="ContextMissing",
                non_retryable=True,
            )
        try:
            manifest, stored = await self._context.load(request.context_ref)
        except ContextMissing as err:
            raise ApplicationError(str(err), type="ContextMissing", non_retryable=True) from None
        if len(stored) != request.context_length:
            raise ApplicationError(
                f"Stored context has {len(stored)} messages, expected {request.context_length}.",
                type="ContextMissing",
                non_retryable=True,
            )
        return manifest, [*stored, *request.messages]

    async def _request_params(self, request: LlmRequest, context: list[AgentMessage]) -> dict[str, Any]:
        messages: list[AgentMessage] = list(context)
        stage = "The context transform"
        try:
            if self._transform_context is not None:
                messages = await _maybe_await(self._transform_context(messages))
            stage = "The message conversion (convert_to_llm)"
            converted = await _maybe_await(self._convert_to_llm(messages))
            if self._convert_to_llm is not default_convert_to_llm:
                # Checked here, so that what it returned is worded as its
                # failure: None failed later, outside this clause, and the
                # call was retried five times for it (a robustness audit).
                messages = _only_messages(converted)
            else:
                messages = converted
        except BaseException as err:
            if isinstance(err, asyncio.CancelledError) or not is_user_failure(err):
                raise
            # User code: a failure ends the run with an error message (SPEC §8),
            # never a retry loop.
            try:
                said = f"{type(err).__name__}: {err}"
            except Exception:  # its __str__ raised: the activity was retried for it
                said = failure_text(err)
            raise ApplicationError(
                scrub(f"{stage} failed: {said}", self._secrets),
                type="ContextHookFailed",
                non_retryable=True,
            ) from None
        sent = to_openai_messages(request.system_prompt, messages, self._memo)
        if not sent:  # a model server refuses an empty list (400)
            raise ApplicationError(
                "Nothing to send to the model: the context holds no message a model reads (only "
                "application messages, or none after the context hooks) and there is no system prompt.",
                type="EmptyContext",
                non_retryable=True,
                # The run ends with this sentence; the worker's log need not
                # warn with a traceback each time (the SDK logs it at DEBUG).
                category=ApplicationErrorCategory.BENIGN,
            )
        params: dict[str, Any] = {
            "model": request.model,
            "messages": sent,
            "stream": True,
        }
        if request.model not in self._no_stream_options:
            params["stream_options"] = {"include_usage": True}
        tools = self._tools if self._tools is not None else registered_tools()
        missing = [n for n in request.tool_names if n not in tools]
        if missing:
            # The model is not told of them; a call to one gets a clear error result.
            logger.warning("Tool(s) %s are not on this worker: the model is not told of them", missing)
        described = [tools[n].openai_tool() for n in request.tool_names if n in tools]
        if described:
            params["tools"] = described
        effort = reasoning_effort(request.thinking_level)
        if effort is not None:
            params["reasoning_effort"] = effort
        return params


async def _stream(
    poster: ChatPoster,
    params: dict[str, Any],
    assembler: StreamAssembler,
    events: ActivityEventPublisher,
    attempt: int,
) -> None:
    stream = await poster.stream(params)
    first_delta = True
    chunks: AsyncIterable[Any] = stream
    if stream.response.headers.get("content-type", "").startswith("application/json"):
        chunks = _whole_answer(stream, assembler)  # a server that does not stream (or cannot, this once)
    try:
        async for chunk in chunks:
            was_started = assembler.started
            deltas = assembler.feed(chunk)
            if not was_started and assembler.started:
                events.publish(
                    MessageStartEvent(
                        message={
                            "role": "assistant",
                            "content": [],
                            "model": params["model"],
                            "timestamp": assembler.timestamp,
                        },
                        attempt=attempt,
                    ),
                    flush=True,
                )
            for delta in deltas:
                # The first token goes out at once; the rest in batches.
                events.publish_delta(delta, flush=first_delta)
                first_delta = False
            if assembler.too_many_calls:
                await stream.close()  # the answer is refused: stop the model writing more of it
                return
    except openai.APITimeoutError:
        if not assembler.finished:
            raise
        # The server said why it stopped, then held the connection open
        # without `[DONE]`: the answer is whole.
        await stream.close()
    if getattr(stream, "done", False):
        assembler.done = True


async def _whole_answer(stream: Chunks, assembler: StreamAssembler) -> AsyncIterator[dict[str, Any]]:
    """A completion the server sent whole (``application/json``, not a
    stream) as the one chunk it amounts to (``assembler.done``: whole, with
    or without a finish reason); an ``error`` it holds raised as the
    stream's would be."""
    response = stream.response
    raw = await response.aread()
    try:
        body = json.loads(raw)
    except ValueError:
        # An event stream labelled as JSON (some proxies and servers): read as one.
        for line in raw.decode("utf-8", "replace").splitlines():
            data = line[5:].strip() if line.startswith("data:") else ""
            if data.startswith("[DONE]"):
                assembler.done = True
                return
            if data:
                chunk = json.loads(data)
                if isinstance(chunk, dict) and chunk.get("error"):
                    raise stream_error(chunk["error"], response) from None
                yield chunk
        return
    if isinstance(body, dict) and body.get("error"):
        raise stream_error(body["error"], response)
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        keys = ", ".join(map(str, body)) if isinstance(body, dict) else type(body).__name__
        raise ValueError(f"the server answered JSON that is no chat completion ({keys[:200]})")
    assembler.done = True
    yield completion_as_chunk(body)


class _ModelMetrics:
    """The worker's model metrics for one call (Prometheus, by model)."""

    def __init__(self, model: str) -> None:
        self._meter = activity.metric_meter().with_additional_attributes({"model": model})
        self._started = time.monotonic()

    def answered(self, message: AssistantMessage) -> None:
        meter, usage = self._meter, message.usage
        meter.create_histogram_timedelta(
            "agent_model_call_latency", "Model call, request to last token"
        ).record(timedelta(seconds=time.monotonic() - self._started))
        meter.create_counter("agent_model_tokens_input", "Prompt tokens (cached ones included)").add(
            usage.input + usage.cache_read
        )
        meter.create_counter("agent_model_tokens_output", "Completion tokens").add(usage.output)
        meter.create_counter("agent_model_cost_microdollars", "Model cost in millionths of a dollar").add(
            round(usage.cost.total * 1_000_000)
        )

    def failed(self, error_class: str) -> None:
        self._meter.create_counter("agent_model_errors", "Failed model calls, by error class").add(
            1, {"error_class": error_class}
        )


def _classify(
    err: Exception, secrets: Sequence[str | None] = (), *, streaming: bool = False
) -> ApplicationError:
    """Retryable or not, with the server's Retry-After as the next delay, and
    the text scrubbed of credentials (the server's body may echo the key).
    ``streaming``: the server had answered and sent chunks."""
    if isinstance(err, ApplicationError):
        return err
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        text = _clip(scrub(f"The model server answered {status}: {_error_detail(err)}", secrets))
        if status == 429 and "insufficient_quota" in (err.code, err.type):
            # OpenAI's "You exceeded your current quota": no retry pays it.
            return ApplicationError(text, type=f"ModelHttp{status}", non_retryable=True)
        if status in RETRYABLE_STATUS or status >= 500:
            return ApplicationError(
                text,
                type=f"ModelHttp{status}",
                next_retry_delay=_retry_after(err.response),
            )
        return ApplicationError(text, type=f"ModelHttp{status}", non_retryable=True)
    if isinstance(err, openai.APITimeoutError):
        return ApplicationError("The model server timed out.", type="ModelTimeout")
    if isinstance(err, openai.APIConnectionError) and streaming:
        # The server was reached and answering: the connection broke mid-answer.
        return ApplicationError(
            scrub(f"The model's stream broke off mid-answer: {_reason_of(err)}", secrets),
            type="ModelStreamBroken",
        )
    if isinstance(err, openai.APIConnectionError):
        return ApplicationError(
            scrub(f"Could not reach the model server: {_reason_of(err)}", secrets), type="ModelUnreachable"
        )
    if isinstance(err, NotAnEventStream):
        text = _clip(scrub(f"The model server's answer is no event stream: {err.message}", secrets), 340)
        return ApplicationError(f"{text}{_ROOT_HINT}", type="ModelStreamError")
    if isinstance(err, openai.APIError):
        return _stream_error(err, secrets, streaming=streaming)
    if isinstance(err, StreamEndedEarly):
        return ApplicationError(f"The model's stream broke: {err}", type="ModelStreamBroken")
    # Anything else broke the stream mid-way (a dropped connection, a chunk
    # that is not JSON): the next attempt starts over.
    return ApplicationError(
        scrub(f"The model's stream broke: {type(err).__name__}: {err}", secrets), type="ModelStreamBroken"
    )


class _RetryNotice:
    """Whether a failing attempt delivered the next one's ``message_retry``
    itself: published, and not left over when its publisher closed (no
    signal budget, the run took no more signals, or the signal failed)."""

    def __init__(self) -> None:
        self.publisher: ActivityEventPublisher | None = None
        self.published = False

    def delivered(self) -> bool:
        left = [*self.publisher.tail, *self.publisher.undelivered] if self.publisher is not None else []
        return self.published and not any(event.get("type") == "message_retry" for event in left)


def _failure_reason(err: Exception) -> str:
    """Why an attempt failed, as the next attempt's ``message_retry`` says:
    the classified failure's sentence (scrubbed of secrets) and the wait the
    server asked for, else only the exception's type (its text was not
    scrubbed)."""
    if not isinstance(err, ApplicationError):
        return type(err).__name__
    wait = err.next_retry_delay  # the server's Retry-After
    return err.message if wait is None else f"{err.message} (Retry-After: {wait.total_seconds():g} s)"


def _reason_of(err: openai.APIConnectionError) -> str:
    """The connection error and what caused it ("Connection error." alone says little)."""
    cause = err.__cause__
    return f"{err} ({type(cause).__name__}: {cause})" if cause is not None and str(cause) else str(err)


def _error_detail(err: openai.APIStatusError) -> str:
    """What the server said, in one line: its ``error.message`` (OpenAI,
    vLLM, llama.cpp), its ``error`` text (TGI), ``detail`` (FastAPI) or
    ``message``, else its body as text (an HTML page's title); a 404 that
    says nothing more names the setting to check."""
    said = _said(err.body)
    if err.status_code == 404 and not (isinstance(err.body, dict) and err.body.get("message")):
        said = f"{said or 'Not Found'}{_ROOT_HINT}"
    return said or err.message


def _said(body: object) -> str:
    """The text an error body holds, on one line (whole: it is scrubbed of
    secrets before it is cut to length, ``_clip``)."""
    if isinstance(body, dict):
        said = next(
            (body[key] for key in ("message", "error", "detail", "msg") if body.get(key)),
            None,
        )
        if isinstance(said, dict):
            return _said(said)
        return _one_line(said if isinstance(said, str) else json.dumps(said)) if said else ""
    if isinstance(body, str):
        if "</" not in body:
            return _one_line(body)
        title = re.search(r"<title[^>]*>(.*?)</title>", body, re.IGNORECASE | re.DOTALL)
        return _one_line(html.unescape(title.group(1) if title else re.sub(r"<[^>]+>", " ", body)))
    return ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int = 400) -> str:
    """``text`` cut to ``limit`` characters (after scrubbing: a secret cut
    in two would no longer be recognised)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _stream_error(
    err: openai.APIError, secrets: Sequence[str | None], *, streaming: bool = True
) -> ApplicationError:
    """An error the server sent as an event of the stream (vLLM, OpenRouter:
    ``data: {"error": {...}}``), or as its whole answer: permanent when its
    code is a client error (not 408, 409 or 429) or it says the context is
    too long, as the same answer from the HTTP status would be."""
    body = err.body if isinstance(err.body, dict) else {}
    code = body.get("code", body.get("status"))
    status = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
    said = _said(body) or _said(err.body) or err.message
    lowered = f"{code} {body.get('type')} {said}".lower()
    permanent = (status is not None and 400 <= status < 500 and status not in RETRYABLE_STATUS) or any(
        words in lowered for words in _PERMANENT_WORDS
    )
    text = scrub(
        f"The model server sent an error mid-answer: {said}"
        if streaming
        else f"The model server answered with an error: {said}",
        secrets,
    )
    if not streaming and any(words in lowered for words in _WRONG_ENDPOINT_WORDS):
        # A whole answer that says the path is wrong (LM Studio answers 200
        # "Unexpected endpoint or method."): no attempt will find another.
        return ApplicationError(
            f"{_clip(text, 340)}{_ROOT_HINT}", type="ModelStreamError", non_retryable=True
        )
    return ApplicationError(_clip(text), type="ModelStreamError", non_retryable=permanent)


_PERMANENT_WORDS = ("context_length_exceeded", "context length", "invalid_request_error", "badrequesterror")
_WRONG_ENDPOINT_WORDS = (
    "unexpected endpoint",
    "unknown endpoint",
    "invalid endpoint",
    "no route",
    "unknown url",
)
_ROOT_HINT = " (is OPENAI_BASE_URL the API's root? It usually ends in /v1)"


def _retry_after(response: Any) -> timedelta | None:
    """Retry-After (seconds or HTTP date) or retry-after-ms, capped at 5 min;
    None when absent or unreadable (a proxy's "soon", "NaN" or a bad date:
    the attempt is still retried, by the activity's own backoff)."""
    headers = response.headers
    seconds: float | None = None
    if "retry-after-ms" in headers:
        milliseconds = _finite(headers["retry-after-ms"])
        seconds = None if milliseconds is None else milliseconds / 1000
    elif "retry-after" in headers:
        value = headers["retry-after"]
        seconds = _finite(value)
        if seconds is None:
            seconds = _seconds_until(value)
    if seconds is None:
        return None
    return timedelta(seconds=min(max(seconds, 0.0), 300.0))


def _finite(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _seconds_until(http_date: str) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, by RFC 5322
        when = when.replace(tzinfo=UTC)
    return when.timestamp() - time.time()


def _only_messages(returned: Any) -> list[AgentMessage]:
    """What a ``convert_to_llm`` hook returned as a list of messages, or a
    ``TypeError`` saying what it was instead."""
    if isinstance(returned, str | bytes | dict) or not isinstance(returned, Iterable):
        raise TypeError(f"it returned {type(returned).__name__}, not a list of messages")
    messages = list(returned)
    stray = next((m for m in messages if not hasattr(m, "role")), None)
    if stray is not None:
        raise TypeError(f"it returned a list holding a {type(stray).__name__}, not only messages")
    return messages


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
