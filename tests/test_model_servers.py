"""OpenAI-compatible servers that answer unlike OpenAI (found by a provider
audit): error pages instead of JSON errors, a completion sent whole when a
stream was asked for, an error sent as an event of the stream. On a real
dev server with the real worker and the scripted model over HTTP."""

from __future__ import annotations

import json

from tests.support.stack import Stack

NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


async def test_a_plain_text_404_says_what_the_server_said_and_which_setting_to_check(stack: Stack) -> None:
    """Ollama at a base URL without /v1 answers `404 page not found`: the
    error said only "Error code: 404"."""
    stack.script(
        {"fault": {"kind": "status", "status": 404, "body": "404 page not found"}}, {"text": "unused"}
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert last.stop_reason == "error" and last.error_message is not None
    assert last.error_message.startswith("The model server answered 404: 404 page not found")
    assert "OPENAI_BASE_URL" in last.error_message
    assert len(stack.requests()) == 1  # not retried


async def test_an_error_page_and_a_text_error_are_read_for_the_message(stack: Stack) -> None:
    """A proxy's HTML 502 (retried: the failure names the page's title), then
    a TGI-style 400 whose `error` is a string (not retried)."""
    stack.script(
        {"fault": {"kind": "status", "status": 502, "body": NGINX_502, "retry_after": 0.1}},
        {
            "fault": {
                "kind": "status",
                "status": 400,
                "body": '{"error": "Input validation error: inputs tokens + max_new_tokens must be <= 4096",'
                ' "error_type": "validation"}',
            }
        },
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert last.error_message == (
        "The model server answered 400: Input validation error: "
        "inputs tokens + max_new_tokens must be <= 4096"
    )
    history = await handle.fetch_history()
    failures = [
        e.activity_task_started_event_attributes.last_failure.message
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
        and e.activity_task_started_event_attributes.attempt > 1
    ]
    assert failures == ["The model server answered 502: 502 Bad Gateway"]
    assert len(stack.requests()) == 2


async def test_a_server_that_answers_whole_instead_of_streaming_is_understood(stack: Stack) -> None:
    """A 200 `application/json` completion to a streamed request was taken
    for a stream that ended early: retried five times, the answer lost."""
    stack.script(
        {
            "tool_calls": [{"id": "c1", "name": "calculator", "arguments": {"expression": "6*7"}}],
            "whole": True,
        },
        {"text": "It is 42.", "whole": True},
    )
    handle = await stack.start(prompt="6*7?", closeWhenIdle=True)
    messages = (await handle.result()).messages
    assert [m.role for m in messages] == ["user", "assistant", "toolResult", "assistant"]
    assert messages[2].content[0].text == "6*7 = 42" and not messages[2].is_error
    assert messages[-1].text == "It is 42." and messages[-1].stop_reason == "stop"
    assert messages[-1].usage.output > 0
    assert len(stack.requests()) == 2
    kinds = [e["type"] for e in await stack.events(handle.id)]
    assert kinds.count("message_start") == 4 and "message_retry" not in kinds


async def test_an_error_sent_mid_stream_is_retried_only_when_it_may_pass(stack: Stack) -> None:
    """vLLM and OpenRouter send `data: {"error": ...}` in the stream. One
    without a client-error code is retried; a context-length error (code
    400) was retried five times too, though the same request cannot pass."""
    stack.script(
        {
            "text": "partial ",
            "fault": {"kind": "error_event", "after_chunks": 2, "message": "engine overloaded"},
        },
        {"text": "recovered"},
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    assert (await handle.result()).messages[-1].text == "recovered"
    assert len(stack.requests()) == 2

    stack.script(
        {
            "text": "partial ",
            "fault": {
                "kind": "error_event",
                "after_chunks": 2,
                "message": "This model's maximum context length is 4096 tokens. "
                "However, you requested 5000 tokens.",
                "type": "BadRequestError",
                "code": 400,
            },
        },
        {"text": "never used"},
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert last.stop_reason == "error" and last.error_message is not None
    assert last.error_message.startswith(
        "The model server sent an error mid-answer: This model's maximum context"
    )
    assert len(stack.requests()) == 3  # the two above, and this one once


async def test_a_server_that_refuses_stream_options_is_asked_without_them(stack: Stack) -> None:
    """Older servers and strict proxies refuse the field that asks for usage
    (400): every model call failed; now the worker asks again without it, and
    no longer sends it."""
    stack.script(
        {
            "fault": {
                "kind": "400",
                "message": "Unrecognized request argument supplied: stream_options",
            }
        },
        {"text": "without usage"},
        {"text": "and again"},
    )
    conversation = await stack.conversation()
    await conversation.prompt("hi")
    await conversation.wait_for_idle()
    await conversation.prompt("next")
    await conversation.wait_for_idle()
    messages = await conversation.messages()
    assert [m.text for m in messages if m.role == "assistant"] == ["without usage", "and again"]
    assert ["stream_options" in r for r in stack.requests()] == [True, False, False]


async def test_an_event_stream_labelled_json_is_read_as_a_stream(stack: Stack) -> None:
    """Some proxies label an event stream `application/json`: the first
    version of the whole-answer path read it as one JSON body (found by review)."""
    stack.script({"text": "labelled json", "content_type": "application/json"})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert (last.text, last.stop_reason) == ("labelled json", "stop")
    assert len(stack.requests()) == 1


async def test_an_error_page_echoing_the_key_is_scrubbed_before_it_is_cut(stack: Stack) -> None:
    """The page's text was cut to length before the key was scrubbed: a key
    cut in two was no longer recognised, and its first half was kept."""
    page = (
        "<html><body><p>"
        + "Access denied. " * 18
        + "Rejected credential test-key-never-in-history</p></body></html>"
    )
    stack.script({"fault": {"kind": "status", "status": 401, "body": page}})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert last.error_message is not None and last.error_message.startswith(
        "The model server answered 401: Access"
    )
    assert "test-key" not in last.error_message


def _sse(*chunks: dict[str, object], done: bool = True) -> str:
    events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return events + ("data: [DONE]\n\n" if done else "")


def _delta(delta: dict[str, object], finish_reason: str | None = None) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


async def test_llama_cpps_error_line_ends_the_run_with_its_text_not_retries(stack: Stack) -> None:
    """llama.cpp sends `error: {...}` (no `data:`): it was passed over, the
    stream taken for broken, retried five times and its text lost."""
    error = {
        "code": 400,
        "message": "the request exceeds the available context size",
        "type": "exceed_context_size_error",
    }
    stack.script(
        {"fault": {"kind": "raw", "body": f"error: {json.dumps(error)}\n\n"}}, {"text": "never used"}
    )
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert last.stop_reason == "error"
    assert last.error_message == (
        "The model server answered with an error: the request exceeds the available context size"
    )
    assert len(stack.requests()) == 1


async def test_lm_studios_wrong_endpoint_answer_names_the_setting_and_is_not_retried(stack: Stack) -> None:
    """LM Studio answers a path it does not serve with 200 and a JSON error:
    it was retried five times, and nothing said to check OPENAI_BASE_URL."""
    body = json.dumps({"error": "Unexpected endpoint or method. (POST /chat/completions)"})
    stack.script({"fault": {"kind": "raw", "body": body}}, {"text": "never used"})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert last.stop_reason == "error"
    assert last.error_message == (
        "The model server answered with an error: Unexpected endpoint or method. (POST /chat/completions)"
        " (is OPENAI_BASE_URL the API's root? It usually ends in /v1)"
    )
    assert len(stack.requests()) == 1


async def test_an_answer_ended_by_done_without_a_finish_reason_is_whole(stack: Stack) -> None:
    """A server that never sends `finish_reason` but ends with `[DONE]`:
    the whole answer was streamed five times, then ended as an error."""
    body = _sse(_delta({"role": "assistant", "content": "hello"}), _delta({"content": " world"}))
    stack.script({"fault": {"kind": "raw", "body": body}})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert (last.text, last.stop_reason) == ("hello world", "stop")
    assert len(stack.requests()) == 1


async def test_an_answer_whose_stream_is_held_open_after_its_finish_reason_is_kept(stack: Stack) -> None:
    """A server that says why it stopped, then neither sends `[DONE]` nor
    closes: each attempt ran into the read timeout (3 s here) and the
    answer was lost after five."""
    body = _sse(_delta({"role": "assistant", "content": "all here"}, "stop"), done=False)
    stack.script({"fault": {"kind": "raw", "body": body, "hold_seconds": 6}})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)
    last = (await handle.result()).messages[-1]
    assert (last.text, last.stop_reason) == ("all here", "stop")
    assert len(stack.requests()) == 1
