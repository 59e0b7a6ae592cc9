"""The worker's workflow sandbox: faster glue, same restrictions."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import logging
import sys
import threading
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import temporalio.workflow
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import CommandType
from temporalio.api.failure.v1 import Failure
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.client import Client, WorkflowFailureError
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    ExternalStorage,
    PayloadCodec,
    SerializationContext,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.worker import Worker, WorkflowInstanceDetails
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox import _runner as sdk_runner

import runtime.sandbox as sandbox_runner
from runtime.sandbox import PrecompiledSandboxedWorkflowRunner, workflow_runner

# A sandbox that fails every workflow task fails the test at this, instead of hanging it.
HANG = timedelta(seconds=60)


@workflow.defn(sandboxed=True)
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return text.upper()


@workflow.defn(sandboxed=True)
class WallClockWorkflow:
    @workflow.run
    async def run(self) -> str:
        return datetime.now().isoformat()  # not allowed in workflow code


def test_worker_runs_workflows_in_the_precompiled_sandbox() -> None:
    assert isinstance(workflow_runner(), PrecompiledSandboxedWorkflowRunner)


async def test_sandbox_compiles_each_glue_snippet_once(client: Client) -> None:
    sandbox_runner._compiled.cache_clear()
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[EchoWorkflow], workflow_runner=workflow_runner()):
        for i in range(3):
            result = await client.execute_workflow(
                EchoWorkflow.run,
                f"run {i}",
                id=f"echo-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
                execution_timeout=HANG,
            )
            assert result == f"RUN {i}"
    info = sandbox_runner._compiled.cache_info()
    assert info.hits > info.misses > 0
    assert info.currsize <= 8  # a fixed set of snippets, not one per call


@pytest.mark.expect_task_failures("the sandbox refusing a wall-clock read fails the workflow task")
async def test_sandbox_still_rejects_a_wall_clock_read(client: Client) -> None:
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=queue, workflows=[WallClockWorkflow], workflow_runner=workflow_runner()
    ):
        handle = await client.start_workflow(
            WallClockWorkflow.run,
            id=f"clock-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            execution_timeout=timedelta(seconds=30),
        )
        # A restricted call fails the workflow task (retried, never completes):
        # poll the history for the failure instead of waiting for a result.
        for _ in range(100):
            history = await handle.fetch_history()
            failed = [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
            if failed:
                message = failed[0].workflow_task_failed_event_attributes.failure.message
                assert "Cannot access datetime.datetime.now" in message
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the sandbox let datetime.now() run in workflow code")
        await handle.terminate()
        with pytest.raises(WorkflowFailureError):
            await handle.result()


# --- payload contexts: looked up once per command and workflow task, never mixed up ---

SEEN_CONTEXTS: list[tuple[str, str]] = []


class RecordingCodec(PayloadCodec, WithSerializationContext):
    """Records which activity's context each activity payload is encoded with."""

    def __init__(self, context: SerializationContext | None = None) -> None:
        self.context = context

    def with_context(self, context: SerializationContext) -> RecordingCodec:
        return RecordingCodec(context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if isinstance(self.context, ActivitySerializationContext) and not self.context.is_local:
            SEEN_CONTEXTS.extend((self.context.activity_id or "", p.data.decode()) for p in payloads)
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


@activity.defn(name="shout")
async def shout(text: str) -> str:
    return text.upper()


@workflow.defn(sandboxed=True)
class FanOutWorkflow:
    @workflow.run
    async def run(self, words: list[str]) -> list[str]:
        # All scheduled in one workflow task: one completion, several commands.
        handles = [
            workflow.start_activity(
                shout, word, activity_id=f"id-{word}", start_to_close_timeout=timedelta(seconds=10)
            )
            for word in words
        ]
        return list(await asyncio.gather(*handles))


async def test_each_payload_is_encoded_with_its_own_commands_context(client: Client) -> None:
    SEEN_CONTEXTS.clear()
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    storing = dataclasses.replace(client.data_converter, payload_codec=RecordingCodec())
    codec_client = Client(**{**client.config(), "data_converter": storing})
    words = ["alpha", "beta", "gamma", "delta"]
    async with Worker(
        codec_client,
        task_queue=queue,
        workflows=[FanOutWorkflow],
        activities=[shout],
        workflow_runner=workflow_runner(),
    ):
        for _ in range(2):
            result = await codec_client.execute_workflow(
                FanOutWorkflow.run,
                words,
                id=f"fan-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
                execution_timeout=HANG,
            )
            assert result == [w.upper() for w in words]
    # Each activity's input (encoded by the workflow) and result (by the
    # activity worker) carried that activity's own context.
    expected = {(f"id-{w}", f'"{w}"') for w in words} | {(f"id-{w}", f'"{w.upper()}"') for w in words}
    assert set(SEEN_CONTEXTS) == expected


# --- workflow modules: compiled once, executed afresh for each workflow ---

FRESH_MODULE = """
from temporalio import workflow

COUNTER = []


@workflow.defn(sandboxed=True)
class FreshModuleWorkflow:
    @workflow.run
    async def run(self) -> int:
        COUNTER.append(1)  # a fresh module each time: always 1 long
        return len(COUNTER)
"""


async def test_sandbox_compiles_a_workflow_module_once_and_runs_it_afresh(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No .pyc (as under PYTHONDONTWRITEBYTECODE=1): without the cache each
    # workflow instance would compile the module's source again.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    name = f"fresh_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(FRESH_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    compiled = sandbox_runner._CachingSourceLoader.compiled
    reused = sandbox_runner._CachingSourceLoader.reused
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[module.FreshModuleWorkflow],
        workflow_runner=workflow_runner(),
        max_cached_workflows=0,  # every task builds a new instance
    ):
        for _ in range(3):
            result = await client.execute_workflow(
                module.FreshModuleWorkflow.run,
                id=f"fresh-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
                execution_timeout=HANG,
            )
            assert result == 1
    assert sandbox_runner._CachingSourceLoader.compiled - compiled == 1
    assert sandbox_runner._CachingSourceLoader.reused - reused >= 2
    assert not (tmp_path / "__pycache__").exists()


def test_precompile_off_gives_the_sdks_stock_sandbox() -> None:
    """AGENT_SANDBOX_PRECOMPILE=off (and AGENT_SDK_FALLBACKS=on, which CI
    runs) must leave none of the overrides of private SDK code in use."""
    assert type(workflow_runner(precompile=False)) is SandboxedWorkflowRunner


def test_an_edited_workflow_module_is_compiled_again(tmp_path: Path) -> None:
    """The compiled code is shared per path and source text: a module
    edited under a running worker gets its new code, not the old."""
    path = tmp_path / "edited_module.py"
    loader = sandbox_runner._CachingSourceLoader("edited_module", str(path))
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    exec(loader.source_to_code(b"VALUE = 1\n", str(path)), before)
    exec(loader.source_to_code(b"VALUE = 2\n", str(path)), after)
    assert (before["VALUE"], after["VALUE"]) == (1, 2)


def test_another_sdk_version_gets_no_private_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overrides were read against one temporalio version; any other gets the stock runner."""
    monkeypatch.setattr(sandbox_runner, "version", lambda name: "1.36.0")
    assert sandbox_runner._private_instance_class() is None


def test_an_sdk_without_the_private_runner_module_gets_no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """A same-numbered SDK whose sandbox runner module moved falls back instead of failing at import."""
    package = sys.modules["temporalio.worker.workflow_sandbox"]
    monkeypatch.delattr(package, "_runner")
    monkeypatch.setitem(sys.modules, "temporalio.worker.workflow_sandbox._runner", None)
    assert sandbox_runner._private_instance_class() is None


def test_an_sdk_whose_instance_lacks_run_code_gets_no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The private glue runner the overrides replace must exist, or the stock runner is used."""
    monkeypatch.delattr(sdk_runner._Instance, "_run_code")
    assert sandbox_runner._private_instance_class() is None


def test_the_fallback_runs_the_stock_sandbox_and_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On another SDK the worker runs the stock (correct, slower) sandbox and says so in its log."""
    monkeypatch.setattr(sandbox_runner, "_SdkInstance", None)
    monkeypatch.setattr(sandbox_runner, "version", lambda name: "9.9.9")
    with caplog.at_level(logging.WARNING, logger="runtime.sandbox"):
        runner = workflow_runner()
    assert type(runner) is SandboxedWorkflowRunner
    assert runner.restrictions is SandboxRestrictions.default
    assert any(
        r.levelno == logging.WARNING
        and "temporalio 9.9.9 is not" in r.getMessage()
        and "using the stock workflow sandbox" in r.getMessage()
        for r in caplog.records
    )


# --- the code cache: shared compiles, never the wrong file or a lost loader ---


def test_modules_with_the_same_source_keep_their_own_file_names(tmp_path: Path) -> None:
    """Two files with equal text (empty __init__.py files, say) each get code naming their own path."""
    loader = sandbox_runner._CachingSourceLoader("same", str(tmp_path / "a.py"))
    source = f"# {uuid.uuid4().hex}\nVALUE = 1\n".encode()
    first = loader.source_to_code(source, str(tmp_path / "a.py"))
    second = loader.source_to_code(source, str(tmp_path / "b.py"))
    assert (first.co_filename, second.co_filename) == (str(tmp_path / "a.py"), str(tmp_path / "b.py"))


def _module_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"cached_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(temporalio.workflow.unsafe, "in_sandbox", lambda: True)
    return name


def test_the_code_cache_keeps_a_source_loader_subclass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import hook whose loader subclasses SourceFileLoader (beartype.claw's does) keeps its loader."""
    name = _module_file(tmp_path, monkeypatch)

    class HookLoader(importlib.machinery.SourceFileLoader):
        pass

    class HookFinder:
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is not None and spec.origin:
                spec.loader = HookLoader(fullname, spec.origin)
            return spec

    cache = sandbox_runner._code_cache
    monkeypatch.setattr(sys, "meta_path", [cache, HookFinder(), importlib.machinery.PathFinder])
    spec = cache.find_spec(name)
    assert type(spec.loader) is HookLoader


def test_the_code_cache_passes_over_finders_without_find_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finder on sys.meta_path without find_spec does not break imports inside the sandbox."""
    name = _module_file(tmp_path, monkeypatch)
    cache = sandbox_runner._code_cache
    monkeypatch.setattr(sys, "meta_path", [cache, object(), importlib.machinery.PathFinder])
    spec = cache.find_spec(name)
    assert type(spec.loader) is sandbox_runner._CachingSourceLoader


# --- the glue: the SDK's bookkeeping around each snippet, kept ---


def _details(cls: type) -> WorkflowInstanceDetails:
    """What the SDK's prepare_workflow builds: a definition and placeholder info."""
    return WorkflowInstanceDetails(
        payload_converter_factory=DataConverter.default._new_payload_converter,
        failure_converter_class=DataConverter.default.failure_converter_class,
        interceptor_classes=[],
        defn=workflow._Definition.must_from_class(cls),
        info=sdk_runner._fake_info,
        randomness_seed=-1,
        extern_functions={},
        disable_eager_activity_execution=False,
        worker_level_failure_exception_types=[],
        patch_activation_callback=None,
        last_completion_result=Payloads(),
        last_failure=Failure(),
    )


async def test_a_running_snippet_reports_its_thread_for_deadlock_interruption() -> None:
    """The SDK interrupts a deadlocked workflow through the thread the instance reports while it runs."""
    instance = workflow_runner().create_instance(_details(EchoWorkflow))
    seen: list[tuple[bool, int | None]] = []
    probe = lambda: seen.append((temporalio.workflow.unsafe.in_sandbox(), instance.get_thread_id()))  # noqa: E731
    instance._run_code("__probe()", __probe=probe)  # type: ignore[attr-defined]
    assert seen == [(True, threading.get_ident())]


async def test_a_finished_snippet_leaves_no_thread_no_sandbox_flag_and_no_extra_globals() -> None:
    """After each step nothing claims to run in the sandbox, and the step's inputs are not kept alive."""
    instance = workflow_runner().create_instance(_details(EchoWorkflow))
    instance._run_code("__result = __probe", __probe=object())  # type: ignore[attr-defined]
    assert instance.get_thread_id() is None
    assert not temporalio.workflow.unsafe.in_sandbox()
    assert "__probe" not in instance.globals_and_locals  # type: ignore[attr-defined]


async def test_a_precompiled_runner_keeps_the_restrictions_it_was_given() -> None:
    """PrecompiledSandboxedWorkflowRunner(restrictions=...) sandboxes with those, not the defaults."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules("json")
    runner = PrecompiledSandboxedWorkflowRunner(restrictions=restrictions)
    instance = runner.create_instance(_details(EchoWorkflow))
    assert instance.importer.restrictions is restrictions  # type: ignore[attr-defined]


# --- payload contexts: never an answer from before an activation ---


def _start(cls: type, *args: Any) -> WorkflowActivation:
    act = WorkflowActivation(run_id=f"run-{uuid.uuid4().hex[:8]}")
    init = act.jobs.add().initialize_workflow
    init.workflow_type = workflow._Definition.must_from_class(cls).name or cls.__name__
    init.workflow_id = sdk_runner._fake_info.workflow_id
    init.randomness_seed = 1
    init.arguments.extend(DataConverter.default.payload_converter.to_payloads(list(args)))
    return act


async def test_a_commands_context_asked_before_an_activation_is_not_served_after_it() -> None:
    """The activation that schedules activity 1 changes its payloads' context: the old answer must go."""
    instance = workflow_runner().create_instance(_details(FanOutWorkflow))
    first = CommandInfo(command_type=CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK, command_seq=1)
    assert isinstance(instance.get_serialization_context(first), WorkflowSerializationContext)
    completion = instance.activate(_start(FanOutWorkflow, ["alpha"]))
    assert completion.successful.commands[0].HasField("schedule_activity")
    context = instance.get_serialization_context(first)
    assert isinstance(context, ActivitySerializationContext) and context.activity_id == "id-alpha"


# --- external storage: each command's payloads go to that command's target ---


@dataclasses.dataclass
class RecordingDriver(StorageDriver):
    """An in-memory store recording the target workflow id of each stored payload."""

    blobs: dict[str, Payload] = dataclasses.field(default_factory=dict)
    targets: list[tuple[str | None, str]] = dataclasses.field(default_factory=list)

    def name(self) -> str:
        return "recording"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        claims = []
        for payload in payloads:
            key = str(len(self.blobs))
            self.blobs[key] = payload
            self.targets.append((getattr(context.target, "id", None), payload.data.decode(errors="replace")))
            claims.append(StorageDriverClaim(claim_data={"key": key}))
        return claims

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return [self.blobs[claim.claim_data["key"]] for claim in claims]


@workflow.defn(sandboxed=True)
class ChildEchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return "ok"


@workflow.defn(sandboxed=True)
class ParentWorkflow:
    @workflow.run
    async def run(self, child_id: str) -> list[str]:
        # Both commands in one workflow task: one completion, two targets.
        activity = workflow.start_activity(
            shout,
            "activity-input-" + "a" * 64,
            activity_id="act",
            start_to_close_timeout=timedelta(seconds=10),
        )
        child = workflow.execute_child_workflow(ChildEchoWorkflow.run, "child-input-" + "c" * 64, id=child_id)
        await asyncio.gather(activity, child)
        return ["done"]


async def test_each_commands_payloads_are_stored_for_that_commands_target(client: Client) -> None:
    """A child workflow's large input is stored under the child, an activity's under its workflow."""
    driver = RecordingDriver()
    storing = dataclasses.replace(
        client.data_converter, external_storage=ExternalStorage(drivers=[driver], payload_size_threshold=40)
    )
    storage_client = Client(**{**client.config(), "data_converter": storing})
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    parent_id, child_id = f"parent-{uuid.uuid4().hex[:8]}", f"child-{uuid.uuid4().hex[:8]}"
    async with Worker(
        storage_client,
        task_queue=queue,
        workflows=[ParentWorkflow, ChildEchoWorkflow],
        activities=[shout],
        workflow_runner=workflow_runner(),
    ):
        result = await storage_client.execute_workflow(
            ParentWorkflow.run, child_id, id=parent_id, task_queue=queue, execution_timeout=HANG
        )
    assert result == ["done"]
    targets = {target for target, data in driver.targets if "child-input-" in data}
    assert targets == {child_id}
    targets = {target for target, data in driver.targets if "activity-input-" in data}
    assert targets == {parent_id}
