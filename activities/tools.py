"""The public API for tool authors.

    from pydantic import BaseModel
    from activities.tools import tool, ToolResult, report_progress

    class Args(BaseModel):
        path: str

    @tool(description="Read a file")
    async def read_file(args: Args) -> str: ...

A tool is registered by importing its module in the worker (``--tools
pkg.module``). When a conversation starts, the worker's tool declarations
(name, description, JSON schema, execution mode, timeout, approval, local)
are recorded in its history; the workflow validates each call against the
recorded schema before any activity is scheduled, and each call then runs
as one ``execute_tool`` activity, validated again by the tool's model.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, Field, ValidationError

from activities.model_http import WirePart
from activities.openai_chat import TOOL_NAME
from workflows.models import ToolDeclaration, UserContent

logger = logging.getLogger(__name__)

ExecutionMode = Literal["sequential", "parallel"]
ToolFunction = Callable[[Any], Awaitable["str | ToolResult"]]


class ToolResult(BaseModel):
    """What a tool returns when a plain string is not enough.

    ``content`` goes to the model; ``details`` is for clients and logs only;
    ``terminate`` asks the loop to stop after this batch (honoured only when
    every result of the batch asks for it).
    """

    content: str | list[UserContent]
    details: Any = None
    terminate: bool = False
    is_error: bool = False


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: its schema, its function and how it runs."""

    name: str
    description: str
    args_model: type[BaseModel]
    function: ToolFunction
    execution_mode: ExecutionMode | None = None
    label: str | None = None
    timeout: timedelta = timedelta(minutes=5)
    prepare_arguments: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    requires_approval: bool = False
    local: bool = False

    def declaration(self, *, local: bool | None = None) -> ToolDeclaration:
        """What the workflow records of this tool (``local`` overrides the
        tool's own flag, from the worker's ``AGENT_LOCAL_TOOLS``)."""
        return ToolDeclaration(
            name=self.name,
            description=self.description,
            parameters=self.parameters_schema(),
            execution_mode=self.execution_mode,
            timeout_seconds=self.timeout.total_seconds(),
            requires_approval=self.requires_approval,
            local=self.local if local is None else local,
            label=self.label,
        )

    def parameters_schema(self) -> dict[str, Any]:
        return _schema(self.args_model)

    def openai_tool(self) -> dict[str, Any]:
        """The Chat Completions ``tools`` entry for this tool, built once and
        shared by every request (``WirePart``: not to be changed)."""
        return self._openai_tool

    @functools.cached_property
    def _openai_tool(self) -> WirePart:
        return WirePart(
            type="function",
            function={
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters_schema(),
            },
        )


@functools.cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema, built once (pydantic takes about a millisecond).
    A model that refers to itself (a tree) is a ``$ref`` at the root, which
    OpenAI refuses (the parameters must be ``"type": "object"``): the root
    is the referred definition, written out."""
    schema = model.model_json_schema()
    ref = schema.get("$ref")
    definitions = schema.get("$defs")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and isinstance(definitions, dict):
        root = definitions.get(ref.removeprefix("#/$defs/"))
        if isinstance(root, dict):
            schema = {**root, "$defs": definitions}
    return schema


# A longer description than this was refused by OpenAI until 2025 (a warning now).
MAX_TOOL_DESCRIPTION = 1024


def _declaration_problem(name: str, args_model: type[BaseModel]) -> str | None:
    """Why a model server would refuse this tool in every request (so every
    conversation on the worker), or None."""
    if not TOOL_NAME.fullmatch(name):
        return (
            f"Tool name {name!r} is not one models take: use 1 to 64 letters, digits, `_` "
            "or `-` (name=... in @tool)."
        )
    if _schema(args_model).get("type") != "object":
        return (
            f"Tool {name!r} takes {args_model.__name__}, whose JSON schema is not an object: "
            "its arguments must be a pydantic model with fields (not a RootModel)."
        )
    return None


_registry: dict[str, ToolSpec] = {}


def tool(
    description: str,
    *,
    name: str | None = None,
    execution_mode: ExecutionMode | None = None,
    label: str | None = None,
    timeout: timedelta = timedelta(minutes=5),
    prepare_arguments: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    requires_approval: bool = False,
    local: bool = False,
) -> Callable[[ToolFunction], ToolFunction]:
    """Register ``async def name(args: SomeModel) -> str | ToolResult`` as a tool.

    ``prepare_arguments`` is a compatibility shim run (in the workflow, so it
    must be deterministic) on the raw arguments before validation.
    ``requires_approval`` makes every call wait for a person's decision
    (update ``approve_tool``). ``local`` runs calls as local activities.
    """
    if execution_mode not in (None, "sequential", "parallel"):
        raise ValueError(f"execution_mode must be None, 'sequential' or 'parallel', not {execution_mode!r}.")

    def register(function: ToolFunction) -> ToolFunction:
        tool_name = name or function.__name__
        if inspect.isasyncgenfunction(function):  # an `async def` too: "must be async def" puzzled
            raise TypeError(
                f"Tool {tool_name!r} must be an `async def` function that returns its result, not an "
                "async generator (`yield`): report progress with report_progress() and return the result."
            )
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"Tool {tool_name!r} must be an `async def` function.")
        params = list(inspect.signature(function).parameters.values())
        hints = get_type_hints(function)
        args_model = hints.get(params[0].name) if len(params) == 1 else None
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise TypeError(
                f"Tool {tool_name!r} must take exactly one argument annotated with a "
                "pydantic model, e.g. `async def f(args: MyArgs) -> str`."
            )
        problem = _declaration_problem(tool_name, args_model)
        if problem is not None:
            raise ValueError(problem)
        if len(description) > MAX_TOOL_DESCRIPTION:
            logger.warning(
                "Tool %r has a description of %d characters: some model servers take at most %d.",
                tool_name,
                len(description),
                MAX_TOOL_DESCRIPTION,
            )
        existing = _registry.get(tool_name)
        if existing is not None and existing.function is not function:
            raise ValueError(f"A tool named {tool_name!r} is already registered.")
        _registry[tool_name] = ToolSpec(
            name=tool_name,
            description=description,
            args_model=args_model,
            function=function,
            execution_mode=execution_mode,
            label=label,
            timeout=timeout,
            prepare_arguments=prepare_arguments,
            requires_approval=requires_approval,
            local=local,
        )
        return function

    return register


def registered_tools() -> dict[str, ToolSpec]:
    """All registered tools by name (a copy)."""
    return dict(_registry)


def declarations(tools: dict[str, ToolSpec], local: set[str] | None = None) -> list[ToolDeclaration]:
    """The declarations a conversation records; ``local`` names tools made
    local by the worker's setting (``{"*"}``: all)."""
    local = local or set()
    return [
        spec.declaration(local=True if ("*" in local or name in local) else None)
        for name, spec in sorted(tools.items())
    ]


def unregister(name: str) -> None:
    """Remove a tool (tests and hot reloading)."""
    _registry.pop(name, None)


@dataclass(frozen=True)
class ToolContext:
    """Where the running tool call comes from.

    ``idempotency_key`` is stable across retries of the same call (it derives
    from the workflow id and the tool call id): use it to make side effects
    happen once.
    """

    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    workflow_id: str
    activity_id: str
    attempt: int
    idempotency_key: str
    publish_progress: Callable[[Any], None] = lambda partial: None


_current: contextvars.ContextVar[ToolContext] = contextvars.ContextVar("tool_context")


def tool_context() -> ToolContext:
    """The context of the tool call being executed (only inside a tool)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("tool_context() is only available while a tool runs.") from None


def report_progress(partial: str | ToolResult | Any) -> None:
    """Publish a partial result as a ``tool_execution_update`` event."""
    tool_context().publish_progress(partial)


class ToolArgumentsError(ValueError):
    """Arguments that failed validation; the message is shown to the model."""


def parse_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> BaseModel:
    """The tool's argument model from arguments the workflow already
    validated against the recorded schema (and shimmed); a mismatch between
    that schema and this worker's model raises ``ToolArgumentsError`` with
    pi's message format."""
    try:
        return spec.args_model.model_validate(arguments)
    except ValidationError as err:
        problems = "\n".join(
            f"  - {'.'.join(str(p) for p in e['loc']) or 'root'}: {e['msg']}" for e in err.errors()
        )
        raise ToolArgumentsError(
            f'Validation failed for tool "{spec.name}":\n{problems}\n\n'
            f"Received arguments:\n{json.dumps(arguments, indent=2)}"
        ) from None


__all__ = [
    "ExecutionMode",
    "Field",
    "ToolArgumentsError",
    "ToolContext",
    "ToolResult",
    "ToolSpec",
    "declarations",
    "parse_arguments",
    "registered_tools",
    "report_progress",
    "tool",
    "tool_context",
    "unregister",
]
