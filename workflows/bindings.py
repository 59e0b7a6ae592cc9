"""Code the worker binds into every conversation it runs: the hooks, the
tools' argument shims, and the tool declarations of conversations started
before declarations were recorded.

These are code, not data: they are fixed when the worker is built (like
the workflow's own code) and handed to each workflow instance by a worker
interceptor, before its ``run`` starts. Workflow code never looks anything
up in the worker process at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from workflows.hooks import AgentHooks
from workflows.models import ToolDeclaration

ArgumentShim = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class WorkflowBindings:
    hooks: AgentHooks = field(default_factory=AgentHooks)
    argument_shims: Mapping[str, ArgumentShim] = field(default_factory=dict)
    """Tool name -> its ``prepare_arguments`` (run before validation)."""
    legacy_tools: Mapping[str, ToolDeclaration] = field(default_factory=dict)
    """For conversations started before tool declarations were recorded
    (their histories hold none): the worker's tools, as before."""
    default_model: str | None = None
    """The worker's default model: what the first task records for a
    conversation started without one (a `state` query asked before that
    answers with it)."""
    track_subscribers: bool = True
    """The worker's own choice (False with AGENT_SDK_FALLBACKS): what a new
    conversation records, and how one that recorded no choice (started
    before it was recorded) replays, as it did."""


class BindingsInterceptor(Interceptor):
    """Hands ``bindings`` to each workflow instance that has a ``bind`` method."""

    def __init__(self, bindings: WorkflowBindings) -> None:
        self._bindings = bindings

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        bindings = self._bindings

        class _Bind(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                bind = getattr(workflow.instance(), "bind", None)
                if callable(bind):
                    bind(bindings)
                return await super().execute_workflow(input)

        return _Bind
