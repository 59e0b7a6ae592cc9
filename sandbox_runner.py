"""The workflow sandbox, without recompiling its glue code on every call.

temporalio 1.35's sandbox runs each step of a workflow (every activation,
and the serialization and external-storage context of every payload it
encodes or decodes) as ``exec(source_string)``; ``exec`` compiles the string
each time. With a dozen payloads per workflow task that compiling was 23% of
the worker's event-loop CPU in the benchmark (bench/README.md): 70 ms per LLM
turn sandboxed against 54 ms unsandboxed. Compiling each snippet once, then
``exec``-ing the code object, gives the unsandboxed speed (53 ms) and keeps
every restriction of the sandbox: the same code runs with the same globals.

The override touches a private method of the SDK, so it is applied only to
the temporalio version it was read against; any other version gets the stock
runner (correct, just slower) and a warning. AGENT_SANDBOX_PRECOMPILE=off
turns it off by hand.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from importlib.metadata import version
from typing import Any

import temporalio.workflow
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import (
    SandboxedWorkflowRunner,
    SandboxRestrictions,
    _runner,  # private: see the module docstring
)

SUPPORTED_SDK = "1.35.0"

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> Any:
    # The SDK passes a handful of fixed snippets (one per workflow class for
    # the import); 64 is far more than a worker ever sees.
    return compile(source, "<temporal sandbox>", "exec")


class _PrecompiledInstance(_runner._Instance):
    def _run_code(self, code: str, **extra_globals: Any) -> None:
        # Same as the SDK's _run_code, with exec(code object) for exec(str).
        for key, value in extra_globals.items():
            self.globals_and_locals[key] = value
        try:
            temporalio.workflow.unsafe._set_in_sandbox(True)
            self._current_thread_id = threading.get_ident()
            exec(_compiled(code), self.globals_and_locals, self.globals_and_locals)
        finally:
            temporalio.workflow.unsafe._set_in_sandbox(False)
            self._current_thread_id = None
            for key in extra_globals:
                self.globals_and_locals.pop(key, None)


class PrecompiledSandboxedWorkflowRunner(SandboxedWorkflowRunner):
    """``SandboxedWorkflowRunner`` whose glue snippets are compiled once."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _PrecompiledInstance(det, self.runner_class, self.restrictions)


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox the worker runs workflows in: the SDK's default
    restrictions (the workflow modules pass their pure data-model imports
    through themselves). Passing every module through would not be faster per
    turn (measured) and would let a module-level ``from datetime import
    datetime`` escape the wall-clock restriction.
    """
    restrictions = SandboxRestrictions.default
    if os.environ.get("AGENT_SANDBOX_PRECOMPILE", "").strip().lower() == "off":
        return SandboxedWorkflowRunner(restrictions=restrictions)
    if version("temporalio") == SUPPORTED_SDK and hasattr(_runner._Instance, "_run_code"):
        return PrecompiledSandboxedWorkflowRunner(restrictions=restrictions)
    log.warning(
        "temporalio %s is not %s: using the stock workflow sandbox (slower per workflow task)",
        version("temporalio"),
        SUPPORTED_SDK,
    )
    return SandboxedWorkflowRunner(restrictions=restrictions)
