"""Determinism guard: every recorded history in tests/histories/ replays
against the current workflow code. A change that would break running
conversations fails here (see the README on ``workflow.patched``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

import activities.builtin_tools  # noqa: F401  (the registry the legacy recordings saw)
import tests.support.tools  # noqa: F401
from activities.tools import declarations, registered_tools
from runtime.payloads import data_converter_from_env
from runtime.sandbox import workflow_runner
from workflows.agent import AgentWorkflow
from workflows.bindings import BindingsInterceptor, WorkflowBindings

HISTORIES = sorted((Path(__file__).resolve().parent / "histories").glob("*.json"))


def test_there_are_recorded_histories() -> None:
    names = {path.stem.rsplit("_", 1)[0] if path.stem[-1].isdigit() else path.stem for path in HISTORIES}
    assert {
        "tools",
        "steering_and_follow_up",
        "abort_and_prompt",
        "errors",
        "continue_as_new",
        "subscriber_at_close",
    } <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    # Histories recorded before tool declarations were recorded replay with
    # the registry they saw; newer ones need nothing from the worker.
    legacy = {d.name: d for d in declarations(registered_tools())}
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=data_converter_from_env(),
        workflow_runner=workflow_runner(),  # the worker's sandbox
        interceptors=[BindingsInterceptor(WorkflowBindings(legacy_tools=legacy))],
    )
    await replayer.replay_workflow(history)
