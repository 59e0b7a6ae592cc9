"""Tool-call arguments checked against the tool's recorded JSON schema.

The workflow validates a call before any activity runs (pi's
``validateToolArguments``), and it must decide the same way on every worker
that ever replays the conversation: so it validates against the schema
recorded in the conversation's history, never against a Python class that
happens to be registered on this worker. As pi's validator converts
(TypeBox ``Value.Convert``), scalar strings are coerced where the schema
asks for a number or a boolean ("3" -> 3). Unlike it, ``null`` and 1/0
are not made 0 and true/false (they are refused, with the schema's words),
and top-level defaults are filled in, so a tool and its hooks see every
argument its schema describes. A change here changes which calls run in a
replayed history: it needs a workflow patch (``workflows/versions.py``).

Pure and deterministic: no Temporal import, no I/O.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.exceptions import SchemaError
from pydantic_core import to_json

from workflows.models import ToolDeclaration

MAX_NESTING = 64
"""Deepest nesting of arguments (and of any JSON the loop accepts): deeper
JSON cannot be decoded by the workflow's payload converter."""

_COERCION_ROUNDS = 3
_INTEGER = re.compile(r"[+-]?\d+")


class ToolArgumentsError(ValueError):
    """Arguments that failed validation; the message is what the model sees."""


def validate_tool_arguments(tool: ToolDeclaration, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments as the tool will receive them, or ``ToolArgumentsError``
    with pi's message format (what failed, then the arguments received)."""
    if nesting_depth(arguments) > MAX_NESTING:
        raise ToolArgumentsError(
            f'Validation failed for tool "{tool.name}": the arguments are nested deeper '
            f"than {MAX_NESTING} levels."
        )
    validator = _validator(_schema_key(tool.parameters))
    checked = copy.deepcopy(arguments)
    errors = _errors(validator, checked)
    for _ in range(_COERCION_ROUNDS):
        if not errors or not _coerce(checked, errors):
            break
        errors = _errors(validator, checked)
    if errors:
        problems = "\n".join(f"  - {_location(e)}: {_message(e)}" for e in errors)
        raise ToolArgumentsError(
            f'Validation failed for tool "{tool.name}":\n{problems}\n\n'
            f"Received arguments:\n{json.dumps(arguments, indent=2, ensure_ascii=False, default=str)}"
        )
    for name, spec in (tool.parameters.get("properties") or {}).items():
        if name not in checked and isinstance(spec, dict) and "default" in spec:
            checked[name] = copy.deepcopy(spec["default"])
    return checked


def nesting_depth(value: Any, limit: int = MAX_NESTING, _depth: int = 0) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar is 0). Stops
    counting past ``limit + 1`` so a hostile value costs little."""
    if _depth > limit:
        return _depth
    if isinstance(value, dict):
        return max((nesting_depth(v, limit, _depth + 1) for v in value.values()), default=_depth + 1)
    if isinstance(value, list):
        return max((nesting_depth(v, limit, _depth + 1) for v in value), default=_depth + 1)
    return _depth


def require_sendable(value: Any, what: str) -> None:
    """``TypeError`` unless ``value`` (what user code handed the loop:
    arguments a shim returned, details an ``after_tool_call`` set) can go
    where the conversation sends it: JSON through the payload converter
    (``pydantic_core.to_json``, which writes a ``datetime`` as text but
    refuses an object it does not know), nested at most ``MAX_NESTING``
    deep. Caught where user code is contained, it becomes the call's error
    result; let through, every workflow task failed on it (the event
    carrying it could not be written)."""
    if nesting_depth(value) > MAX_NESTING:
        raise TypeError(f"{what} nested deeper than {MAX_NESTING} levels.")
    try:
        to_json(value)
    except (ValueError, TypeError, RecursionError) as err:
        raise TypeError(f"{what} that cannot be sent as JSON: {err}") from None


def clean_text(text: str) -> str:
    """``text`` with lone surrogates replaced (they cannot be encoded as UTF-8)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clean_json(value: Any) -> Any:
    """Every string of a JSON value cleaned with ``clean_text``."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value


def _schema_key(schema: dict[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


@lru_cache(maxsize=256)
def _validator(schema_key: str) -> Draft202012Validator:
    schema = json.loads(schema_key)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError:
        # A schema the validator cannot read accepts any object: the tool's
        # own model validates again in the activity.
        schema = {"type": "object"}
    return Draft202012Validator(schema)


def _errors(validator: Draft202012Validator, value: Any) -> list[ValidationError]:
    return sorted(validator.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])


def _location(error: ValidationError) -> str:
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        # One error per missing property, each holding the whole `required`
        # list: its message names which ("'b' is a required property").
        named = [name for name in missing if error.message == f"{name!r} is a required property"]
        path += (named or missing)[:1]
    return ".".join(path) or "root"


def _message(error: ValidationError) -> str:
    return "required property missing" if error.validator == "required" else error.message


def _coerce(value: Any, errors: Iterable[ValidationError]) -> bool:
    """Coerce scalars at the places a ``type`` error points to; True if any changed."""
    changed = False
    for error in errors:
        if error.validator != "type" or not error.absolute_path:
            continue
        *parents, last = list(error.absolute_path)
        container = value
        try:
            for key in parents:
                container = container[key]
            current = container[last]
        except (KeyError, IndexError, TypeError):
            continue
        wanted = error.validator_value
        for kind in [wanted] if isinstance(wanted, str) else list(wanted):
            coerced = _coerce_scalar(current, kind)
            if coerced is not _NOT_COERCED:
                container[last] = coerced
                changed = True
                break
    return changed


_NOT_COERCED = object()


def _coerce_scalar(value: Any, kind: str) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if kind == "integer" and _INTEGER.fullmatch(text):
            return int(text)
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                return _NOT_COERCED
            if number != number or number in (float("inf"), float("-inf")):
                return _NOT_COERCED
            return int(number) if _INTEGER.fullmatch(text) else number
        if kind == "boolean" and text in ("true", "false"):
            return text == "true"
        return _NOT_COERCED
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return _NOT_COERCED
