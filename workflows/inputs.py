"""What users send, checked: prompt, steer and follow-up payloads, and the
arguments of every handler.

Handlers take ``*args`` so that a signal sent with no argument, or with
two, reaches our code instead of failing the workflow task in the SDK;
here each is refused with one sentence (updates) or logged and dropped
(signals). Text is cleaned of lone surrogates, which would otherwise fail
the encoding of the next activity's input.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from workflows.arguments import MAX_NESTING, clean_json, clean_text, nesting_depth
from workflows.models import (
    AgentMessage,
    CustomMessage,
    ImageContent,
    MessageAdapter,
    TextContent,
    UserMessage,
    WireModel,
)

MAX_MESSAGE_BYTES = 2 * 1024 * 1024
"""The largest message a prompt, steer or follow-up may carry (Temporal's
own payload limit; larger content belongs in a file a tool reads)."""
MAX_PROMPTS = 100


class InputError(ValueError):
    """A payload a user sent that cannot be used; the text says why and what to do."""


MAX_REFUSAL_CHARS = 1000


def refusal(text: str) -> ApplicationError:
    """A refusal (type ``InvalidInput``, final), its sentence cut to
    MAX_REFUSAL_CHARS: one that quoted all of a megabyte-sized argument made
    the workflow's answer too large for the server, which failed the
    conversation's workflow tasks until it dropped the request. Lone
    surrogates a sender put in a key it quotes go on as U+FFFD: the SDK
    could not write them, and the sender read only "Failure error"."""
    text = clean_text(text)
    if len(text) > MAX_REFUSAL_CHARS:
        text = text[: MAX_REFUSAL_CHARS - 12] + " ... (cut)."
    return ApplicationError(text, type="InvalidInput", non_retryable=True)


_ARGUMENT_OF = {
    "prompt": "the message text or object, or a list of them",
    "configure": 'an object of the settings to change, e.g. {"model": "gpt-4o"}',
    "approve_tool": '{"toolCallId": "...", "approved": true or false}',
}
"""What a handler's one argument is, for the sentence that says it is missing
(a message's text or object where not named)."""


def single_argument(args: tuple[Any, ...], what: str, *, optional: bool = False) -> Any:
    """The one argument of a handler that takes one."""
    if len(args) == 1:
        return args[0]
    if not args and optional:
        return None
    if not args:
        expected = _ARGUMENT_OF.get(what, "the message text or object")
        raise InputError(f"`{what}` needs one argument ({expected}); it got none.")
    raise InputError(f"`{what}` takes one argument; it got {_arguments(len(args))}.")


def no_arguments(args: tuple[Any, ...], what: str) -> None:
    """Refuses any argument but a lone ``null``, which is what a client sends
    when it passes "nothing" as the one argument (the CLI's ``--input null``,
    the Python SDK's ``execute_update("reset", None)``)."""
    if args and args != (None,):
        raise InputError(f"`{what}` takes no argument; it got {_arguments(len(args))}.")


def _arguments(count: int) -> str:
    """The count with its noun ("1 argument", "2 arguments"): "it got 1"
    read as if the value sent were 1 (a new user's audit)."""
    return f"{count} argument" if count == 1 else f"{count} arguments"


def prompt_messages(
    payload: Any, now_ms: Callable[[], int], *, allow_list: bool = True
) -> list[AgentMessage]:
    """A prompt payload as messages: a non-empty string, a user (or
    application) message, or a non-empty list of those."""
    if isinstance(payload, list) and allow_list:
        if not payload:
            raise InputError("The list of messages is empty: send at least one.")
        if len(payload) > MAX_PROMPTS:
            raise InputError(f"A prompt takes at most {MAX_PROMPTS} messages; it got {len(payload)}.")
        return [prompt_message(item, now_ms) for item in payload]
    return [prompt_message(payload, now_ms)]


MAX_SAFE_INTEGER = 2**53 - 1  # JavaScript's: a JSON reader in the UI or a pi client reads past it inexactly


def prompt_message(payload: Any, now_ms: Callable[[], int]) -> AgentMessage:
    """One prompt, steer or follow-up payload as a message."""
    if isinstance(payload, str):
        text = clean_text(payload)
        if not text.strip():
            raise InputError("The message text is empty: send some text.")
        _check_size(text)
        return UserMessage(content=text, timestamp=now_ms())
    if isinstance(payload, WireModel):
        payload = payload.model_dump(mode="json")
    if not isinstance(payload, dict):
        raise InputError(
            'Expected a string or a message like {"role": "user", "content": "..."}, '
            f"not {json_type(payload)}."
        )
    if nesting_depth(payload) > MAX_NESTING:
        raise InputError(f"The message is nested deeper than {MAX_NESTING} levels.")
    _check_size(payload)
    try:
        message = MessageAdapter.validate_python(clean_json(payload))
    except ValidationError as err:
        raise InputError(
            validation_text('Expected a string or a message like {"role": "user", "content": "..."}', err)
        ) from None
    if isinstance(message, UserMessage):
        if _is_empty(message.content):
            raise InputError("The message has no content: send some text or an image.")
        if not message.timestamp or abs(message.timestamp) > MAX_SAFE_INTEGER:
            # None given, or one no JavaScript reader takes exactly (a security
            # audit sent -10**22): the time it arrived. Data only, no command.
            message = message.model_copy(update={"timestamp": now_ms()})
        return message
    if isinstance(message, CustomMessage):
        return message
    raise InputError(
        f"A message with role `{getattr(message, 'role', '?')}` cannot be sent: "
        'send text or a user message ({"role": "user", ...}).'
    )


_IMAGE_TYPE = re.compile(r"image/[a-z0-9][a-z0-9.+-]*")


def image_problem(image: ImageContent) -> str | None:
    """Why a model would refuse ``image`` (and every later call with it in
    the context), or None: its ``mimeType`` must be an image type and its
    ``data`` the image's bytes in base64 (line breaks and missing padding
    are taken: ``image_base64`` sends it without them)."""
    if not _IMAGE_TYPE.fullmatch(image_type(image)):
        return f"its mimeType {image.mime_type[:80]!r} is not an image type (e.g. image/png)"
    if image_type(image) == "image/svg+xml":
        return "it is an SVG (vector) image, which models do not take; send it as PNG or JPEG"
    if image_type(image) not in _IMAGE_FORMATS:
        return f"models take PNG, JPEG, GIF or WebP images, not {image_type(image)[:80]}"
    if image.data.startswith("data:"):
        return "its data is a data: URL; send the base64 after the comma alone"
    try:
        decoded = base64.b64decode(image_base64(image), validate=True)
    except (binascii.Error, ValueError):
        return "its data is not valid base64"
    if not decoded:
        return "its data is empty"
    if not any(decoded.startswith(magic) for magic in _IMAGE_MAGIC) and not _is_webp(decoded):
        return "its data is not a PNG, JPEG, GIF or WebP image"
    return None


# The image types OpenAI (and the other vision APIs) take, and how their bytes begin.
_IMAGE_FORMATS = frozenset({"image/png", "image/jpeg", "image/jpg", "image/gif", "image/webp"})
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")


def _is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def image_type(image: ImageContent) -> str:
    """The image's media type as a model reads it: lowercase (MIME types are
    not case-sensitive), without parameters (``image/jpeg; charset=binary``)."""
    return image.mime_type.partition(";")[0].strip().lower()


def image_base64(image: ImageContent) -> str:
    """The image's base64 without whitespace, padded (as a model reads it)."""
    data = "".join(image.data.split())
    return data + "=" * (-len(data) % 4)


def check_prompts(messages: list[AgentMessage]) -> None:
    """Refuse (``InputError``) messages with an image a model would refuse,
    text parts that are all blank (``""`` was refused, ``[{"type": "text",
    "text": ""}]`` taken) or an empty role. For a validator: it does not run
    on replay, so a prompt accepted before these checks replays as it ran."""
    for message in messages:
        if isinstance(message, CustomMessage) and not message.role.strip():
            raise InputError(
                'The message\'s role is empty: send {"role": "user", ...} or name your own role.'
            )
        if isinstance(message, UserMessage) and not isinstance(message.content, str):
            if all(isinstance(part, TextContent) and not part.text.strip() for part in message.content):
                raise InputError("The message has no content: send some text or an image.")
            for block in message.content:
                if isinstance(block, ImageContent):
                    problem = image_problem(block)
                    if problem is not None:
                        raise InputError(f"An image of the message cannot be sent to a model: {problem}.")


def validation_text(prefix: str, err: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in err.errors()[:5]
    )
    return f"{prefix} ({problems})."


def _check_size(value: Any) -> None:
    size = len(value.encode("utf-8", "replace")) if isinstance(value, str) else _json_size(value)
    if size > MAX_MESSAGE_BYTES:
        raise InputError(
            f"The message is {size / 1e6:.1f} MB; the limit is {MAX_MESSAGE_BYTES / 1e6:.1f} MB. "
            "Put large content in a file the agent's tools can read."
        )


def _json_size(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace"))
    except (TypeError, ValueError):
        return 0


def json_type(value: Any) -> str:
    """What a JSON client sent, in JSON's words ("a string", not "str")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_empty(content: Any) -> bool:
    if isinstance(content, str):
        return not content.strip()
    return not content
