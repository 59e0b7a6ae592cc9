"""Secrets stay out of what is stored and shown (issue 12): a model server's
error body that echoes the key, or a tool's exception quoting one, is
scrubbed before it reaches the history, the transcript and the UI."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from google.protobuf import text_format

from activities.redact import REDACTED, TOOL_SECRETS, scrub, scrub_before_cutting, scrub_json, scrub_known
from tests.support.stack import Stack
from tests.test_codec_server import raw_payloads

WORKER_KEY = "test-key-never-in-history"  # the shared worker's OPENAI_API_KEY (tests/conftest.py)
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


# --- scrub ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Incorrect API key provided: sk-proj-AbC123xyz789LMNopq.", "sk-proj-AbC123xyz789LMNopq"),
        ("Authorization: Bearer abc.DEF-123_ghi", "abc.DEF-123_ghi"),
        ("request had bearer tok3nVALUEhere", "tok3nVALUEhere"),
        ('{"api_key": "hunter2hunter2"}', "hunter2hunter2"),
        ("GET /v1?api-key=q8w7e6r5&x=1", "q8w7e6r5"),
        ("password=correct-horse", "correct-horse"),
        ("client_secret: 0123abcd", "0123abcd"),
        ("key AKIAIOSFODNN7EXAMPLE was refused", "AKIAIOSFODNN7EXAMPLE"),
        (f"aws said {AWS_SECRET} is wrong", AWS_SECRET),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlMTIz rejected", "eyJhbGciOiJIUzI1NiJ9"),
        ("token ghp_aBcDeFgHiJkLmNoPqRsTuV rejected", "ghp_aBcDeFgHiJkLmNoPqRsTuV"),
        ("postgres://agent:s3cr3t@db:5432/x", "s3cr3t"),
        ("hex 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 leaked", "9f86d081884c7d"),
    ],
)
def test_credential_shapes_are_redacted(text: str, secret: str) -> None:
    scrubbed = scrub(text)

    assert secret not in scrubbed
    assert REDACTED in scrubbed


def test_known_secrets_are_redacted_verbatim_whatever_their_shape() -> None:
    assert scrub(f"the server said: bad key {WORKER_KEY}!", [WORKER_KEY]) == (
        f"the server said: bad key {REDACTED}!"
    )
    # Too short to redact verbatim without mangling words (a local server's "x").
    assert scrub("a box of x", ["x"]) == "a box of x"


@pytest.mark.parametrize(
    "text",
    [
        "The model server answered 429: Rate limit reached for requests. Try again in 20s.",
        "This model's maximum context length is 128000 tokens; max_tokens: 4096.",
        "No file '/home/user/projects/durable-agent/activities/builtin_tools.py' in the workspace.",
        "6*7 = 42",
        "Tool calculator not found",
        "retry-after-milliseconds-is-not-a-header-we-expected-here",
    ],
)
def test_ordinary_error_text_is_left_alone(text: str) -> None:
    assert scrub(text) == text


# --- through a conversation ---------------------------------------------------------------


async def history_text(stack: Stack, workflow_id: str) -> str:
    """Everything the server keeps of a conversation, as text: every event,
    failures included, and every payload decoded by the project's codec."""
    history = await stack.client.get_workflow_handle(workflow_id).fetch_history()
    codec = stack.client.data_converter.payload_codec
    assert codec is not None
    decoded = await codec.decode([p for event in history.events for p in raw_payloads(event)])
    return "\n".join(
        [text_format.MessageToString(event) for event in history.events]
        + [payload.data.decode(errors="replace") for payload in decoded]
    )


async def test_a_401_that_echoes_the_key_is_stored_without_it(stack: Stack) -> None:
    echoed = f"Incorrect API key provided: {WORKER_KEY}. You sent Authorization: Bearer {WORKER_KEY}."
    stack.script({"fault": {"kind": "401", "message": echoed}})
    handle = await stack.start(prompt="hi", closeWhenIdle=True)

    answer = (await handle.result()).messages[-1]

    assert answer.stop_reason == "error"
    assert answer.error_message is not None
    assert answer.error_message.startswith("The model server answered 401: Incorrect API key provided: ")
    assert WORKER_KEY not in answer.error_message and REDACTED in answer.error_message
    stored = await history_text(stack, handle.id)
    assert WORKER_KEY not in stored
    assert "Incorrect API key provided" in stored  # the test reads what it thinks it reads


async def test_a_tool_error_quoting_the_key_reaches_the_model_without_it(stack: Stack) -> None:
    stack.script({"tool_calls": [{"id": "l1", "name": "leaky", "arguments": {}}]}, {"text": "noted"})
    handle = await stack.start(prompt="connect", closeWhenIdle=True)

    result = (await handle.result()).messages[2]

    assert result.role == "toolResult" and result.is_error
    text = result.content[0].text
    assert text.startswith("cannot connect to postgres://agent:") and WORKER_KEY not in text
    sent_to_model = json.dumps(stack.requests()[1]["messages"])
    assert "cannot connect" in sent_to_model and WORKER_KEY not in sent_to_model
    assert WORKER_KEY not in await history_text(stack, handle.id)


async def test_a_tool_printing_the_key_returns_it_redacted(stack: Stack) -> None:
    """Only error texts were scrubbed: a tool that printed the environment,
    or read a `.env`, handed the worker's key to the model and the history
    (in its result, its details and its progress updates)."""
    stack.script({"tool_calls": [{"id": "p1", "name": "printenv", "arguments": {}}]}, {"text": "noted"})
    handle = await stack.start(prompt="debug", closeWhenIdle=True)

    result = (await handle.result()).messages[2]

    assert result.role == "toolResult" and not result.is_error
    assert result.content[0].text.startswith(f"OPENAI_API_KEY={REDACTED}\nHOME=")
    assert WORKER_KEY not in json.dumps(stack.requests()[1]["messages"])
    assert WORKER_KEY not in await history_text(stack, handle.id)


def test_an_encryption_key_is_scrubbed_in_every_form_it_may_be_written() -> None:
    """Keys are taken in standard or URL-safe base64, padded or not; only the
    standard padded form was scrubbed, so a URL-safe key in a file a tool
    read went to the model (a security audit)."""
    import base64

    from activities.redact import scrub_known
    from runtime.settings import Settings

    key = bytes(range(250, 256)) + bytes(range(26))  # '+' and '/' in standard base64
    urlsafe = base64.urlsafe_b64encode(key).decode().rstrip("=")
    settings = Settings.from_env({"AGENT_ENCRYPTION_KEYS": f"k1:{urlsafe}"})
    standard = base64.b64encode(key).decode()
    for form in (urlsafe, urlsafe + "=", standard, standard.rstrip("=")):
        assert scrub_known(f"AGENT_ENCRYPTION_KEYS=k1:{form}\n", settings.known_secrets()) == (
            "AGENT_ENCRYPTION_KEYS=k1:[redacted]\n"
        ), form


KEY = "test-key-never-in-history"


def test_a_known_secret_of_eight_characters_is_redacted_verbatim() -> None:
    """MIN_KNOWN_SECRET_CHARS is 8: a codec token or key of 8 characters is scrubbed."""
    assert scrub_known("the token was k9#mQ2!z here", ["k9#mQ2!z"]) == f"the token was {REDACTED} here"
    assert scrub("the token was k9#mQ2!z here", ["k9#mQ2!z"]) == f"the token was {REDACTED} here"


def test_known_secrets_are_scrubbed_from_every_string_of_a_tools_details() -> None:
    """A tool's details (kept in the transcript, shown in the UI) are JSON:
    lists and keys hold strings too."""
    details = {
        "env": [f"OPENAI_API_KEY={KEY}", {"nested": [KEY]}],
        f"key {KEY}": "value",
        "count": 3,
    }

    cleaned = scrub_json(details, [KEY])

    assert KEY not in repr(cleaned)
    assert cleaned == {
        "env": [f"OPENAI_API_KEY={REDACTED}", {"nested": [REDACTED]}],
        f"key {REDACTED}": "value",
        "count": 3,
    }


def test_the_first_four_characters_of_a_secret_at_the_cut_are_redacted() -> None:
    """A secret cut so that only its first 4 characters would show is
    still taken out (shorter starts are too common to tell)."""
    secret = "Zq7vW2pXk9"
    token = TOOL_SECRETS.set((secret,))
    try:
        # the text itself already cut (a line read to a byte limit) inside the secret
        assert scrub_before_cutting("x" * 6 + secret[:4], 10) == "x" * 6 + REDACTED
        assert scrub_before_cutting("x" * 7 + secret[:3], 10) == "x" * 7 + "Zq7"
    finally:
        TOOL_SECRETS.reset(token)


def test_an_authorization_header_without_a_scheme_is_redacted() -> None:
    """Some APIs take the key as the whole header (``Authorization: KEY``)."""
    scrubbed = scrub("the server echoed Authorization: abc123def456 back")

    assert "abc123def456" not in scrubbed and REDACTED in scrubbed


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("temporary key ASIAY34FZKBOKMUTVV7A was refused", "ASIAY34FZKBOKMUTVV7A"),  # STS, not only AKIA
        ("gitlab said glpat-aB3dE5fG7hI9jK1lMn2o", "aB3dE5fG7hI9jK1lMn2o"),
        ("slack said xoxb-4821-aB3dE5fG7hI9", "4821-aB3dE5fG7hI9"),
        ("the proxy sent Bearer abc.DEF-123_ghi upstream", "abc.DEF-123_ghi"),  # capitalised, no header name
        ("login pwd=s3cr3tpass failed", "s3cr3tpass"),
        ("login passwd: s3cr3tpass failed", "s3cr3tpass"),
        ("key 5f4dcc3b5aa765d61d8327deb882cf99 refused", "5f4dcc3b5aa765d61d8327deb882cf99"),  # 32 hex
        ("key Zx8Qw2Er5Ty7Ui9Op1As3Df4Gh6Jk0Lm refused", "Zx8Qw2Er5Ty7Ui9Op1As3Df4Gh6Jk0Lm"),  # 32 mixed
    ],
)
def test_each_credential_shape_the_module_names_is_redacted(text: str, secret: str) -> None:
    """README: error texts are scrubbed of `sk-` keys, Bearer tokens, AWS
    keys, `api_key=`-like pairs and long hex or base64 runs."""
    scrubbed = scrub(text)

    assert secret not in scrubbed and REDACTED in scrubbed


@pytest.mark.parametrize(
    "text",
    [
        "AbstractSingletonProxyFactoryBeanImplementation failed",  # no digit
        "no such dir /srv/app/releases/20240101/build/output/bundle.js",  # no capital
        "ERR_CONNECTION_REFUSED_AT_PORT_5432_ON_THE_HOST",  # no small letter
        "a 31 character run Zx8Qw2Er5Ty7Ui9Op1As3Df4Gh6Jk0L is no key",
    ],
)
def test_a_long_run_without_digits_capitals_and_small_letters_mixed_is_left_alone(text: str) -> None:
    """A long identifier, path or constant is no key: the scrubber leaves it
    as written (it redacts a run of 32 or more with all three mixed)."""
    assert scrub(text) == text


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("api_key=hunter2hunter2, model=gpt-4", f"api_key={REDACTED}, model=gpt-4"),
        ("GET /v1?api-key=q8w7e6r5&x=1", f"GET /v1?api-key={REDACTED}&x=1"),
        ('{"token": "abc123def", "user": "bob"}', f'{{"token": "{REDACTED}", "user": "bob"}}'),
    ],
)
def test_a_named_credential_is_redacted_whole_and_only_up_to_its_end(text: str, scrubbed: str) -> None:
    """The value of `api_key=...` goes whole (not only its first character),
    and what follows it (the next parameter of a query, a list) stays."""
    assert scrub(text) == scrubbed


@pytest.mark.parametrize(
    "text", ["flags: is_secret=false", '{"use_auth_token": true}', "api_key: None", "token=null"]
)
def test_a_flag_named_like_a_credential_keeps_its_value(text: str) -> None:
    """true, false, null and none hide nothing: an error text saying which
    flag was set stays readable."""
    assert scrub(text) == text


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("cannot connect: DB_PASSWORD=hunter2hunter2 rejected", "hunter2hunter2"),
        ("env has OPENAI_API_KEY=hunter2hunter2", "hunter2hunter2"),
        ("push refused for GITHUB_TOKEN=abcdef12", "abcdef12"),
    ],
)
def test_a_credential_named_as_an_environment_variable_is_redacted(text: str, secret: str) -> None:
    """README: `api_key=...` is scrubbed; so must `OPENAI_API_KEY=...` or
    `DB_PASSWORD=...` be, the way a tool's exception quotes a setting."""
    scrubbed = scrub(text)

    assert secret not in scrubbed and REDACTED in scrubbed


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (
            "POST https://generativelanguage.googleapis.com/v1beta/models/g:generateContent"
            "?key=AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe failed",
            "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe",
        ),
        (
            "STRIPE_SECRET_KEY=sk_live_51HqLyjWDarjtT1zdp7dcXAMPLEKEYabcd",
            "sk_live_51HqLyjWDarjtT1zdp7dcXAMPLEKEYabcd",
        ),
    ],
)
def test_a_random_key_after_an_equals_sign_is_redacted(text: str, secret: str) -> None:
    """A long base64-like key is redacted wherever it stands: after `?key=`
    in a URL or `NAME=` in an environment line too, not only after a space."""
    scrubbed = scrub(text)

    assert secret not in scrubbed and REDACTED in scrubbed


# --- scrub_known -------------------------------------------------------------------------------


def test_a_secret_that_contains_another_is_redacted_whole() -> None:
    """Known secrets are replaced longest first: an encryption key's padded
    and unpadded forms, or a key and its prefix, leave no tail behind."""
    short, long = "Zq7vW2pXk9", "Zq7vW2pXk9Lm4Rt8"

    assert scrub_known(f"KEY={long}\n", [short, long]) == f"KEY={REDACTED}\n"


# --- scrub_before_cutting ------------------------------------------------------------------------

SECRET = "Zq7vW2pXk9"


@pytest.fixture
def holding_secret() -> Iterator[str]:
    """The worker's secrets as a running tool sees them (set by the tool runner)."""
    token = TOOL_SECRETS.set((SECRET, "dummy"))
    try:
        yield SECRET
    finally:
        TOOL_SECRETS.reset(token)


def test_a_secret_inside_the_kept_part_is_taken_out(holding_secret: str) -> None:
    """The tool's own cut: a secret wholly before the cut is replaced too."""
    assert scrub_before_cutting(f"a {holding_secret} b", 100) == f"a {REDACTED} b"


def test_a_whole_secret_across_the_cut_shows_not_even_its_first_three_characters(holding_secret: str) -> None:
    """The secret is taken out before the cut: of a secret the text holds
    whole, no start shows (three characters would, once cut in two)."""
    shown = scrub_before_cutting("x" * 7 + holding_secret + " tail", 10)

    assert shown == "x" * 7 + REDACTED[:3]


def test_the_longest_start_of_a_secret_at_the_cut_is_redacted(holding_secret: str) -> None:
    """A text already cut inside a secret: all that shows of it goes, up to
    all but its last character."""
    assert scrub_before_cutting("x" * 6 + holding_secret[:-1], 100) == "x" * 6 + REDACTED


def test_a_secret_whose_start_repeats_is_redacted_from_its_first_character() -> None:
    """Of a secret like `abababab12`, the whole start shown goes, not only
    its last repeat."""
    token = TOOL_SECRETS.set(("abababab12",))
    try:
        assert scrub_before_cutting("xxxx" + "abababab", 100) == "xxxx" + REDACTED
    finally:
        TOOL_SECRETS.reset(token)


def test_a_short_worker_secret_is_not_taken_out_of_a_cut_line(holding_secret: str) -> None:
    """A secret under MIN_KNOWN_SECRET_CHARS ("dummy" for a local model
    server) is never redacted: its start would redact ordinary words."""
    assert scrub_before_cutting("xxxxdumm", 8) == "xxxxdumm"
