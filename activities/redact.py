"""Credentials out of error texts before they are stored.

An error text an activity produces ends up in the workflow's history, the
transcript (``errorMessage``, a tool's error result), the Temporal UI and
the model's next prompt. A model server's error body may echo the key it
was sent ("Incorrect API key provided: sk-..."), a tool's exception may
quote a connection string. ``scrub`` replaces what looks like a credential
with ``[redacted]``: the worker's own secrets verbatim, then common shapes
(``sk-`` keys, ``Bearer`` tokens, ``api_key=...``, AWS access key ids,
JWTs, passwords in URLs, long hex or base64 runs).

It is a heuristic: it may redact a long identifier that is no secret (a
64-hex digest), and cannot know every secret's shape; it is a last line,
not a reason to put secrets into errors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

REDACTED = "[redacted]"
# A known secret shorter than this ("x" for a local model server) would
# redact ordinary words: only longer ones are replaced verbatim.
MIN_KNOWN_SECRET_CHARS = 8

_NAMED = re.compile(
    r"""(?ix)
    (?<![A-Za-z0-9])(  # not \b: DB_PASSWORD=... names one too
        (?:api[_-]?key|apikey|x-api-key|access[_-]?token|auth[_-]?token|refresh[_-]?token|id[_-]?token
          |token|secret|client[_-]?secret|secret[_-]?access[_-]?key|aws[_-]?secret[_-]?access[_-]?key
          |password|passwd|pwd|authorization|credentials?)
        ["']?\s*[:=]\s*["']?
    )
    (?:(?:bearer|basic|token)\s+)?
    (?!(?:true|false|null|none)\b)  # is_secret=false, use_auth_token=True: no value to hide
    [^\s"'&,;}\]]+
    """
)
_SCHEME = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_SHAPES = re.compile(
    r"""(?x)
      \bsk-[A-Za-z0-9_-]{6,}                                       # OpenAI, Anthropic, ...
    | \b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b  # AWS access key ids
    | \beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}  # JWTs
    | \b(?:ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abprs])[-_][A-Za-z0-9_-]{10,}
    | \b[0-9a-fA-F]{32,}\b                                         # long hex
    """
)
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+):[^/\s@]+@")
# After "=" too (?key=AIza...); a long mixed-case path or model name there
# is redacted as it already was after a space.
_LONG_RUN = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{32,}={0,2}")


def scrub_known(text: str, known_secrets: Iterable[str | None]) -> str:
    """``text`` with the given secrets (of ``MIN_KNOWN_SECRET_CHARS`` or
    more) replaced by ``[redacted]``: for any text a tool returns, which may
    quote a file or the environment holding them."""
    for secret in sorted((s for s in known_secrets if s), key=len, reverse=True):
        if len(secret) >= MIN_KNOWN_SECRET_CHARS and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def scrub_json(value: Any, known_secrets: Iterable[str | None]) -> Any:
    """``value`` (JSON) with ``scrub_known`` applied to every string in it."""
    secrets = [s for s in known_secrets if s and len(s) >= MIN_KNOWN_SECRET_CHARS]
    if not secrets:
        return value

    def clean(item: Any) -> Any:
        if isinstance(item, str):
            return scrub_known(item, secrets)
        if isinstance(item, dict):
            return {clean(k) if isinstance(k, str) else k: clean(v) for k, v in item.items()}
        if isinstance(item, list):
            return [clean(v) for v in item]
        return item

    return clean(value)


def scrub(text: str, known_secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every credential-looking part replaced by ``[redacted]``."""
    text = scrub_known(text, known_secrets)
    text = _NAMED.sub(lambda m: m.group(1) + REDACTED, text)
    text = _SCHEME.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _SHAPES.sub(REDACTED, text)
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)
    return _LONG_RUN.sub(_random_looking, text)


def _random_looking(match: re.Match[str]) -> str:
    """A long base64-like run with digits, capitals and small letters mixed
    (a key, not a word or a path) is redacted."""
    run = match.group(0)
    mixed = any(c.isdigit() for c in run) and any(c.isupper() for c in run) and any(c.islower() for c in run)
    return REDACTED if mixed else run


TOOL_SECRETS: ContextVar[tuple[str, ...]] = ContextVar("agent_tool_secrets", default=())
"""The worker's secrets while one of its tools runs (set by the tool
runner), for a tool that cuts text before the runner scrubs its result: a
secret cut in two no longer matches, and its first part was shown."""


def scrub_before_cutting(text: str, keep: int) -> str:
    """The first ``keep`` characters of ``text``, with the worker's secrets
    taken out, and the start of one that runs past them (or past the end
    of ``text``, itself cut before: 8,000 bytes of a line of emoji are
    2,000 characters) too: cut in two, the runner's scrub would not match."""
    secrets = [s for s in TOOL_SECRETS.get() if len(s) >= MIN_KNOWN_SECRET_CHARS]
    shown = scrub_known(text, secrets)[:keep]
    for secret in secrets:
        for length in range(len(secret) - 1, MIN_KNOWN_SECRET_CHARS // 2 - 1, -1):
            if shown.endswith(secret[:length]):
                return shown[: len(shown) - length] + REDACTED
    return shown
