"""What users send, checked (``workflows/inputs.py``) and the session's
public contract models (``workflows/contract.py``), without a server:
behaviours a mutation audit found no test touched."""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from runtime.converter import UNCOMPRESSED, UNCOMPRESSED_KEY, AgentPayloadConverter
from tests.support.tools import PIXEL_PNG
from workflows.contract import (
    MAX_APPROVAL_TIMEOUT_SECONDS,
    AgentSettings,
    ApprovalRequest,
    PromptResult,
    SessionInput,
    SessionSettings,
    SessionState,
    SettingsInForce,
    start_input_problem,
)
from workflows.inputs import (
    MAX_MESSAGE_BYTES,
    MAX_PROMPTS,
    MAX_REFUSAL_CHARS,
    InputError,
    check_prompts,
    clean_text,
    image_base64,
    image_problem,
    image_type,
    no_arguments,
    prompt_message,
    prompt_messages,
    refusal,
    single_argument,
    validation_text,
)
from workflows.models import CustomMessage, ImageContent, Usage, UserMessage


def now() -> int:
    return 42


def image(data: bytes | str, mime: str = "image/png") -> ImageContent:
    text = data if isinstance(data, str) else base64.b64encode(data).decode()
    return ImageContent(data=text, mime_type=mime)


def refused(payload: Any) -> str:
    with pytest.raises(InputError) as err:
        check_prompts(prompt_messages(payload, now))
    return str(err.value)


# --- refusals and handler arguments ---------------------------------------------


def test_a_refusal_of_exactly_a_thousand_characters_is_not_cut() -> None:
    """A sentence at the limit reaches the user whole; only a longer one is cut."""
    assert refusal("x" * MAX_REFUSAL_CHARS).message == "x" * MAX_REFUSAL_CHARS
    assert refusal("x" * (MAX_REFUSAL_CHARS + 1)).message.endswith(" ... (cut).")


def test_a_missing_argument_names_what_the_handler_takes() -> None:
    """`prompt`, `configure` and `approve_tool` say what their argument is; others a message."""
    with pytest.raises(InputError, match=r"needs one argument \(an object of the settings to change"):
        single_argument((), "configure")
    with pytest.raises(InputError, match=r"`steer` needs one argument \(the message text or object\)"):
        single_argument((), "steer")


def test_a_handler_that_takes_no_argument_refuses_one() -> None:
    """`continue`, `reset` and `wait_for_idle` refuse a single stray argument, not only two."""
    with pytest.raises(InputError, match=r"`reset` takes no argument; it got 1 argument\."):
        no_arguments(("x",), "reset")
    no_arguments((), "reset")
    # A lone null is "nothing" as a client passes it (the CLI's --input null).
    no_arguments((None,), "reset")
    with pytest.raises(InputError, match=r"`reset` takes no argument; it got 2 arguments\."):
        no_arguments((None, None), "reset")
    with pytest.raises(InputError, match=r"`reset` takes no argument; it got 1 argument\."):
        no_arguments((0,), "reset")


def test_an_optional_argument_given_is_taken() -> None:
    """`clear_queues "steering"` reads its one argument."""
    assert single_argument(("steering",), "clear_queues", optional=True) == "steering"
    with pytest.raises(InputError, match="takes one argument; it got 2 arguments"):
        single_argument(("a", "b"), "clear_queues", optional=True)


# --- prompts ---------------------------------------------------------------------


def test_a_prompt_of_a_hundred_messages_is_taken_and_one_more_refused() -> None:
    """The largest list a prompt takes is MAX_PROMPTS messages."""
    assert len(prompt_messages([f"m{i}" for i in range(MAX_PROMPTS)], now)) == MAX_PROMPTS
    assert refused([f"m{i}" for i in range(MAX_PROMPTS + 1)]) == (
        f"A prompt takes at most {MAX_PROMPTS} messages; it got {MAX_PROMPTS + 1}."
    )


def test_a_steer_or_follow_up_is_one_message_not_a_list() -> None:
    """A signal's payload (``prompt_message``) is one message; a list is refused, not split."""
    with pytest.raises(InputError, match="not a list"):
        prompt_message(["a", "b"], now)


def test_lone_surrogates_in_a_text_prompt_are_replaced() -> None:
    """Half an emoji in a text prompt arrives as U+FFFD, so the next activity's input encodes."""
    message = prompt_message("hi \ud83d", now)
    assert isinstance(message, UserMessage) and message.content == "hi \ufffd"
    message.model_dump_json()  # encodes


def test_a_surrogate_pair_sent_as_two_code_points_is_joined() -> None:
    """A pair split by a UTF-16 client is joined into its character, not replaced."""
    assert clean_text("a\ud83d\ude00b") == "a\U0001f600b"
    assert clean_text("plain") == "plain"


def test_a_message_of_exactly_two_megabytes_is_taken_as_an_object() -> None:
    """The size limit takes a message object at the limit, counted as compact JSON."""
    overhead = len('{"role":"user","content":""}')
    at_limit = {"role": "user", "content": "x" * (MAX_MESSAGE_BYTES - overhead)}
    assert isinstance(prompt_message(at_limit, now), UserMessage)
    over = {"role": "user", "content": "x" * (MAX_MESSAGE_BYTES - overhead + 1)}
    assert "the limit is 2.1 MB" in refused(over)


def test_the_size_limit_counts_utf8_bytes_not_characters() -> None:
    """A text of multi-byte characters is measured as it travels (UTF-8 bytes)."""
    text = "é" * (MAX_MESSAGE_BYTES // 2 + 1)  # 2 bytes each: just over the limit
    assert "the limit is 2.1 MB" in refused(text)
    assert "the limit is 2.1 MB" in refused({"role": "user", "content": text})


def test_a_message_object_of_non_ascii_text_under_the_limit_is_taken() -> None:
    """Non-ASCII text is counted as UTF-8, not as the longer \\u escapes of ASCII JSON."""
    overhead = len('{"role":"user","content":""}')
    text = "é" * ((MAX_MESSAGE_BYTES - overhead) // 2)
    assert isinstance(prompt_message({"role": "user", "content": text}, now), UserMessage)


def test_a_message_object_the_python_client_built_is_taken() -> None:
    """`prompt(UserMessage(...))` from Python code is read like its JSON."""
    message = prompt_message(UserMessage(content="hi", timestamp=0), now)
    assert isinstance(message, UserMessage) and message.content == "hi" and message.timestamp == 42


def test_lone_surrogates_in_a_message_object_are_replaced() -> None:
    """A message object's strings are cleaned as a text prompt is."""
    message = prompt_message({"role": "user", "content": [{"type": "text", "text": "x\ud83d"}]}, now)
    assert isinstance(message, UserMessage) and message.content[0].text == "x\ufffd"  # type: ignore[union-attr]


def test_an_assistant_or_tool_result_message_cannot_be_prompted() -> None:
    """Only user and application messages may be sent; the refusal names the role."""
    assert refused({"role": "assistant", "content": []}).startswith(
        "A message with role `assistant` cannot be sent"
    )
    assert "role `toolResult`" in refused(
        {"role": "toolResult", "toolCallId": "a", "toolName": "t", "content": [], "isError": False}
    )


def test_a_message_with_only_an_image_is_taken() -> None:
    """An image alone is content: the blank-text check looks at text parts only."""
    [message] = prompt_messages(
        {"role": "user", "content": [{"type": "image", "data": PIXEL_PNG, "mimeType": "image/png"}]}, now
    )
    check_prompts([message])


def test_a_list_of_blank_text_and_real_text_is_taken() -> None:
    """Text parts are refused only when ALL are blank."""
    messages = prompt_messages(
        {"role": "user", "content": [{"type": "text", "text": " "}, {"type": "text", "text": "hi"}]}, now
    )
    check_prompts(messages)


def test_an_invalid_message_names_up_to_five_problems() -> None:
    """The refusal lists each field that is wrong (at most five), where it is."""
    with pytest.raises(InputError) as err:
        prompt_message({"role": "user", "content": 5, "timestamp": "soon"}, now)
    text = str(err.value)
    assert text.startswith('Expected a string or a message like {"role": "user", "content": "..."} (')
    assert "timestamp" in text and "content" in text


# --- images ----------------------------------------------------------------------

PNG = base64.b64decode(PIXEL_PNG)


@pytest.mark.parametrize(
    ("data", "mime"),
    [
        (PNG, "image/png"),
        (b"\xff\xd8\xff\xe0" + bytes(20), "image/jpeg"),
        (b"\xff\xd8\xff\xe0" + bytes(20), "image/jpg"),
        (b"GIF87a" + bytes(20), "image/gif"),
        (b"GIF89a" + bytes(20), "image/gif"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(20), "image/webp"),
        (PNG, "IMAGE/PNG; charset=binary"),
    ],
)
def test_png_jpeg_gif_and_webp_images_are_taken(data: bytes, mime: str) -> None:
    """Every format the vision APIs read passes, whatever the case or parameters of its type."""
    assert image_problem(image(data, mime)) is None


def test_a_riff_file_that_is_not_webp_is_refused() -> None:
    """A WAV (RIFF....WAVE) labelled image/webp is not an image a model reads."""
    wav = b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(20)
    assert image_problem(image(wav, "image/webp")) == "its data is not a PNG, JPEG, GIF or WebP image"


@pytest.mark.parametrize("mime", ["image/png extra", "image/", "image/png/x", "x-image/png"])
def test_a_mime_type_with_more_than_an_image_type_is_refused(mime: str) -> None:
    """The whole mimeType must be an image type, not merely start like one."""
    assert image_problem(image(PNG, mime)) == f"its mimeType {mime!r} is not an image type (e.g. image/png)"


def test_an_svg_image_is_refused_as_a_vector_image() -> None:
    """SVG gets its own sentence (send it as PNG or JPEG)."""
    assert "SVG (vector) image" in (image_problem(image(b"<svg/>", "image/svg+xml")) or "")


def test_data_in_a_data_url_of_any_kind_is_refused() -> None:
    """A `data:` URL is refused whatever follows it (the base64 alone is wanted)."""
    assert image_problem(image("data:;base64," + PIXEL_PNG)) == (
        "its data is a data: URL; send the base64 after the comma alone"
    )


def test_base64_with_stray_characters_is_refused() -> None:
    """Only whitespace is taken inside the base64; other characters make it invalid."""
    assert image_problem(image(PIXEL_PNG[:8] + "!" + PIXEL_PNG[8:])) == "its data is not valid base64"


def test_an_image_type_is_read_without_parameters_and_in_lowercase() -> None:
    """`IMAGE/PNG; charset=binary` is sent to the model as image/png."""
    assert image_type(image(PNG, " IMAGE/PNG; charset=binary")) == "image/png"


def test_base64_is_sent_without_line_breaks_and_padded() -> None:
    """Wrapped or unpadded base64 goes to the model clean."""
    wrapped = base64.encodebytes(PNG + bytes(100)).decode()
    assert image_base64(image(wrapped)) == base64.b64encode(PNG + bytes(100)).decode()
    assert image_base64(image(PIXEL_PNG.rstrip("="))) == PIXEL_PNG


def test_an_application_message_with_a_role_of_spaces_is_refused() -> None:
    """A role of blanks names nothing: refused by `prompt`."""
    assert "role is empty" in refused({"role": "   ", "content": "x"})


# --- the contract ----------------------------------------------------------------


def test_validation_text_says_input_for_a_problem_of_the_whole_value() -> None:
    """A refusal of the whole payload names it `input`, not an empty place."""
    with pytest.raises(ValidationError) as err:
        AgentSettings.model_validate("not an object")
    assert validation_text("The settings are invalid", err.value).startswith(
        "The settings are invalid (input: "
    )


def test_settings_at_their_bounds_are_taken() -> None:
    """The largest approval timeout, one turn and the longest batch are valid settings."""
    AgentSettings.model_validate({"approvalTimeoutSeconds": MAX_APPROVAL_TIMEOUT_SECONDS, "maxTurns": 1})
    SessionSettings.model_validate({"streamBatchMs": 10_000, "continueAsNewAfterTurns": 1})
    assert start_input_problem({"streamBatchMs": 10_000, "maxCost": 0.01}) is None


def test_the_longest_approval_timeout_taken_is_one_a_timer_can_wait() -> None:
    """The largest approvalTimeoutSeconds is within Python's timedelta (a timer's wait)."""
    assert timedelta(seconds=MAX_APPROVAL_TIMEOUT_SECONDS) <= timedelta.max


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"model": ""}, "model"),
        ({"maxTurns": 0}, "maxTurns"),
        ({"maxCost": 0}, "maxCost"),
        ({"streamBatchMs": 10_001}, "streamBatchMs"),
        ({"continueAsNewAfterTurns": 0}, "continueAsNewAfterTurns"),
        ({"approvalTimeoutSeconds": MAX_APPROVAL_TIMEOUT_SECONDS + 1}, "approvalTimeoutSeconds"),
        ({"maxTurns": True}, "maxTurns"),
        ({"maxTurns": "10"}, "maxTurns"),
        ({"closeWhenIdle": 1}, "closeWhenIdle"),
    ],
)
def test_a_start_input_setting_out_of_range_or_of_the_wrong_type_is_named(
    raw: dict[str, Any], said: str
) -> None:
    """The client hears which start setting is wrong before anything starts."""
    problem = start_input_problem(raw)
    assert problem is not None and problem.startswith("The start input is invalid (") and said in problem


def test_start_input_keys_are_taken_in_camel_and_snake_case() -> None:
    """`systemPrompt` (JSON) and `system_prompt` (Python) are both start input keys."""
    assert start_input_problem({"systemPrompt": "Be brief.", "close_when_idle": True, "prompt": "hi"}) is None


def test_an_unknown_start_key_is_named_with_the_keys_the_input_takes() -> None:
    """The refusal lists the camelCase keys, without the internal `carry`."""
    problem = start_input_problem({"sytemPrompt": "x"})
    assert problem is not None and problem.startswith(
        "Unknown start input key(s) sytemPrompt: the start input takes "
    )
    assert "systemPrompt" in problem and "carry" not in problem and "system_prompt" not in problem


def test_a_start_setting_with_a_lone_surrogate_is_not_refused() -> None:
    """Half an emoji in a start setting is replaced, as the workflow does, not refused."""
    assert start_input_problem({"systemPrompt": "hi \ud83d", "model": "m\ud83d"}) is None


def test_the_defaults_a_start_input_leaves_out() -> None:
    """A start input of `{}` runs with the documented defaults."""
    settings = SessionSettings()
    assert (settings.close_when_idle, settings.thinking_level, settings.stream_batch_ms) == (
        False,
        "off",
        100,
    )
    assert (settings.steering_mode, settings.follow_up_mode, settings.tool_execution) == (
        "one-at-a-time",
        "one-at-a-time",
        "parallel",
    )


def test_the_settings_in_force_list_every_key_with_null_where_unset() -> None:
    """`configure` answers with every setting (SPEC 8), unset ones as null, camelCase."""
    dumped = SettingsInForce().model_dump(mode="json")
    assert dumped["systemPrompt"] is None and dumped["maxTurns"] is None and dumped["tools"] is None
    assert set(dumped) == {f.alias for f in AgentSettings.model_fields.values()}


def test_control_payloads_are_marked_never_to_be_compressed() -> None:
    """The settings in force and a prompt's receipt stay plain JSON without the codec (SPEC 10)."""
    for value in (SettingsInForce(), PromptResult(run=1, event_offset=0)):
        [payload] = AgentPayloadConverter().to_payloads([value])
        assert payload.metadata.get(UNCOMPRESSED_KEY) == UNCOMPRESSED, type(value).__name__


def test_the_state_statuses_are_the_documented_ones() -> None:
    """`state.status` is idle, running, awaiting-approval or closed."""
    base = {
        "isStreaming": False,
        "pendingToolCalls": [],
        "messageCount": 0,
        "steeringQueue": 0,
        "followUpQueue": 0,
        "turns": 0,
        "runs": 0,
        "usage": Usage().model_dump(mode="json"),
        "eventOffset": 0,
    }
    for status in ("idle", "running", "awaiting-approval", "closed"):
        assert SessionState.model_validate({**base, "status": status}).status == status
    with pytest.raises(ValidationError):
        SessionState.model_validate({**base, "status": "awaiting_approval"})


def test_an_application_message_is_kept_as_sent() -> None:
    """A message of one's own role is taken without a timestamp being added."""
    message = prompt_message({"role": "note", "content": "x"}, now)
    assert isinstance(message, CustomMessage)
    assert message.model_dump(mode="json") == {"role": "note", "content": "x"}


def test_a_start_input_takes_a_list_of_prompts() -> None:
    """`{"prompt": [...]}` at the start is pi's prompt(AgentMessage[]) too (SPEC 8)."""
    start = SessionInput.model_validate({"prompt": ["a", {"role": "user", "content": "b"}]})
    assert len(prompt_messages(start.prompt, now)) == 2


def test_an_approval_without_a_reason_is_taken() -> None:
    """`approve_tool {"toolCallId": ..., "approved": true}`: the reason is optional (SPEC 9)."""
    decision = ApprovalRequest.model_validate({"toolCallId": "a", "approved": True})
    assert decision.reason is None and decision.model_dump(mode="json") == {
        "toolCallId": "a",
        "approved": True,
    }


def test_every_unknown_start_key_is_named() -> None:
    """Two misspelt keys are both named, so one fix does not uncover the next."""
    problem = start_input_problem({"sytemPrompt": "x", "maxTurn": 3})
    assert problem is not None and problem.startswith("Unknown start input key(s) sytemPrompt, maxTurn: ")
