"""The workflow sandbox, without its repeated per-call overheads.

temporalio 1.35's sandbox is correct but pays three costs over and over,
each measured in the benchmark (bench/README.md):

1. It runs each step of a workflow (every activation, and the serialization
   and external-storage context of every payload it encodes or decodes) as
   ``exec(source_string)``, compiling the string each time: 23% of the
   worker's event-loop CPU. Here each snippet is compiled once and the code
   object is exec'd: the same code with the same globals.
2. It asks for a payload's context four or five times per payload, each
   time entering the sandbox. Here the answers are kept from the end of one
   activation to the start of the next (they depend only on the command and
   the pending commands, which change only inside an activation).
3. Each new workflow instance re-imports its workflow module; without a
   ``.pyc`` (PYTHONDONTWRITEBYTECODE=1) that compiles the module's source
   every time. Here the compiled code is shared per (path, source).

Every restriction of the sandbox holds (tests/test_sandbox.py). The
overrides touch private parts of the SDK, so they apply only to the
temporalio version they were read against; any other version (or private
names gone) gets the stock runner (correct, just slower) and a warning.
With ``runtime/payload_walk.py`` these are the project's overrides of
private SDK code (``DataConverter._with_store_context`` is also used, by
``runtime/payloads.py`` and ``codec_server.py``).
AGENT_SANDBOX_PRECOMPILE=off (or AGENT_SDK_FALLBACKS=on, which CI runs)
turns them all off by hand.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from importlib.metadata import version
from types import CodeType
from typing import Any, ClassVar

import temporalio.workflow
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

SUPPORTED_SDK = "1.35.0"


def _private_instance_class() -> Any:
    """The SDK's private sandboxed instance class, or None when this is not
    the SDK version the overrides were read against or its names are gone."""
    if version("temporalio") != SUPPORTED_SDK:
        return None
    try:
        from temporalio.worker.workflow_sandbox import _runner  # private: see the module docstring
    except ImportError:
        return None
    instance = getattr(_runner, "_Instance", None)
    needed = ("_run_code", "activate", "get_serialization_context", "get_external_store_context")
    if instance is None or not all(hasattr(instance, name) for name in needed):
        return None
    return instance


_SdkInstance = _private_instance_class()

log = logging.getLogger(__name__)


class _CachingSourceLoader(importlib.machinery.SourceFileLoader):
    """A source loader that compiles each distinct source text once."""

    # (path, source) -> code object; one entry per module the sandbox loads.
    codes: ClassVar[dict[tuple[str, bytes], CodeType]] = {}
    compiled: ClassVar[int] = 0
    reused: ClassVar[int] = 0

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> CodeType:  # type: ignore[override]
        key = (str(path), bytes(data))
        code = self.codes.get(key)
        if code is None:
            code = self.codes[key] = super().source_to_code(data, path, _optimize=_optimize)
            type(self).compiled += 1
        else:
            type(self).reused += 1
        return code


class _SandboxCodeCache(importlib.abc.MetaPathFinder):
    """Every new workflow instance imports its workflow module afresh inside
    the sandbox. Without a ``.pyc`` (a source checkout run with
    ``PYTHONDONTWRITEBYTECODE=1``, as in many containers) that means
    compiling ``workflows/agent.py`` again for each conversation start,
    continue-as-new, replay and query of a closed conversation: ~30 ms of CPU
    each (bench/README.md). Inside the sandbox only, source modules get a
    loader that keeps the compiled code, keyed by path and source text, so
    an edited file is compiled again. The module is still executed afresh:
    only the compile is shared, as a ``.pyc`` would share it.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not temporalio.workflow.unsafe.in_sandbox() or self not in sys.meta_path:
            return None
        # Ask the finders after this one, as the import system would, and
        # swap in the caching loader where they load plain source files.
        for finder in sys.meta_path[sys.meta_path.index(self) + 1 :]:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is None:
                continue
            if type(spec.loader) is importlib.machinery.SourceFileLoader:
                spec.loader = _CachingSourceLoader(spec.loader.name, spec.loader.path)
            return spec
        return None


_code_cache = _SandboxCodeCache()


def _install_code_cache() -> None:
    # Just before PathFinder, so builtin, frozen and hook-based finders
    # (pytest's assertion rewriting, for one) keep their precedence.
    if _code_cache in sys.meta_path:
        return
    at = next(
        (i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path)
    )
    sys.meta_path.insert(at, _code_cache)


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> Any:
    # The SDK passes a handful of fixed snippets (one per workflow class for
    # the import); 64 is far more than a worker ever sees.
    return compile(source, "<temporal sandbox>", "exec")


class _PrecompiledInstance(_SdkInstance or object):  # type: ignore[misc]
    """The SDK's sandboxed instance, with its glue compiled once and the
    payload contexts of one workflow task looked up once.

    Encoding a completion asks for the serialization context of each payload
    up to four times (encode, external store, reference, codec), and each ask
    runs glue in the sandbox. The answer depends only on the command (its
    type and sequence number) and on the instance's pending commands, which
    change only inside ``activate``: so answers are kept from the end of one
    activation to the start of the next.
    """

    # Attributes of the SDK's instance that the overrides use.
    globals_and_locals: dict[str, Any]
    _current_thread_id: int | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._contexts: dict[tuple[str, Any], Any] = {}
        super().__init__(*args, **kwargs)

    def activate(self, act: Any) -> Any:
        self._contexts.clear()
        try:
            return super().activate(act)
        finally:
            self._contexts.clear()

    def get_serialization_context(self, command_info: Any) -> Any:
        key = ("serialization", command_info)
        if key not in self._contexts:
            inside = self._inside()
            self._contexts[key] = (
                inside.get_serialization_context(command_info)
                if inside is not None
                else super().get_serialization_context(command_info)
            )
        return self._contexts[key]

    def get_external_store_context(self, command_info: Any) -> Any:
        key = ("external_store", command_info)
        if key not in self._contexts:
            inside = self._inside()
            self._contexts[key] = (
                inside.get_external_store_context(command_info)
                if inside is not None
                else super().get_external_store_context(command_info)
            )
        return self._contexts[key]

    def _inside(self) -> Any:
        """The SDK's object inside the sandbox that answers these two asks.

        Its answers are the SDK's own code reading the instance's info and
        pending commands (no workflow code runs, nothing is imported), so
        they are asked for directly instead of through the sandbox's glue,
        which swaps the import machinery in and out around each ask (it was
        ~7% of the worker's event loop). None when the glue is not the
        one this was written against; then the glue is used."""
        inside = self.globals_and_locals.get("__temporal_in_sandbox")
        if inside is None or not hasattr(inside, "instance"):
            return None
        return inside

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


def workflow_runner(precompile: bool = True) -> SandboxedWorkflowRunner:
    """The sandbox the worker runs workflows in: the SDK's default
    restrictions (the workflow modules pass their pure data-model imports
    through themselves). Passing every module through would not be faster per
    turn (measured) and would let a module-level ``from datetime import
    datetime`` escape the wall-clock restriction. ``precompile=False`` (or
    another temporalio version) gives the SDK's stock sandbox.
    """
    restrictions = SandboxRestrictions.default
    if not precompile:
        return SandboxedWorkflowRunner(restrictions=restrictions)
    if _SdkInstance is not None:
        _install_code_cache()
        return PrecompiledSandboxedWorkflowRunner(restrictions=restrictions)
    log.warning(
        "temporalio %s is not %s (or its sandbox internals moved): using the stock workflow "
        "sandbox (slower per workflow task)",
        version("temporalio"),
        SUPPORTED_SDK,
    )
    return SandboxedWorkflowRunner(restrictions=restrictions)
