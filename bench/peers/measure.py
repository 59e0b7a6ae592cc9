"""What each conversation is measured by: CPU per process, its history
(bytes, events, billable actions), fetched across continue-as-new, and the
requests the server answered (by operation, from the server's metrics)."""

from __future__ import annotations

import os
import re
import resource
import statistics
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")

# Events that Temporal Cloud bills as an action, one each. Queries, activity
# heartbeats and rejected updates are billed too but leave no event: the
# first two are counted from the server's requests (``SERVER_ACTIONS``).
_ACTIONS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "workflow_starts",
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activities",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signals",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "updates",
    EventType.EVENT_TYPE_TIMER_STARTED: "timers",
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: "search_attributes",
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: "child_workflows",
    EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED: "external_signals",
}
# Billed actions that leave no event, by the frontend operations that make them.
SERVER_ACTIONS = {
    "queries": ("QueryWorkflow",),
    "heartbeats": ("RecordActivityTaskHeartbeat", "RecordActivityTaskHeartbeatById"),
}
ACTION_KINDS = (*_ACTIONS.values(), "local_activities")
_LOCAL_ACTIVITY_MARKER = "core_local_activity"


_REQUESTS = re.compile(r"^service_requests\{([^}]*)\} ([0-9.e+]+)$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def server_requests(metrics_url: str, namespace: str = "default") -> Counter[str]:
    """Requests the server's frontend has answered so far in ``namespace``,
    by operation (its ``service_requests`` counter): what workers and
    clients asked of it, not the server's own system workers (namespace
    ``temporal_system``, whose polls come in bursts). Reading them costs
    the server some CPU, so read them outside a CPU window."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        return parse_server_requests(response.read().decode(), namespace)


def parse_server_requests(text: str, namespace: str = "default") -> Counter[str]:
    counts: Counter[str] = Counter()
    for labels, value in _REQUESTS.findall(text):
        fields = dict(_LABEL.findall(labels))
        if fields.get("service_name") == "frontend" and fields.get("namespace") == namespace:
            if "operation" in fields:
                counts[fields["operation"]] += int(float(value))
    return counts


def server_actions(requests: Counter[str]) -> Counter[str]:
    """The billed actions that leave no event (``SERVER_ACTIONS``), from a
    conversation's server requests (``server_requests``)."""
    return Counter({kind: sum(requests[op] for op in ops) for kind, ops in SERVER_ACTIONS.items()})


def tree_bytes(root: Path) -> int:
    """The bytes of the files under ``root`` (0 if it does not exist)."""
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file()) if root.exists() else 0


def process_cpu_ms(pid: int) -> float:
    """User + system CPU of a process (all its threads, ended ones too) so far,
    in ms; the kernel counts in clock ticks (10 ms)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) * 1000 / _TICKS_PER_SECOND


def _stat_fields(path: str) -> list[str]:
    # The command name (field 2) may hold spaces; the fields after it start past its ")".
    text = open(path).read()
    return text[text.rindex(")") + 2 :].split()


def own_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def median_and_middle_half(values: list[float]) -> tuple[float | None, list[float] | None]:
    """The median of ``values`` and their first and third quartiles (None
    where there are too few), rounded to 0.01: a run's ratios to the floor."""
    median = round(statistics.median(values), 2) if values else None
    if len(values) < 2:
        return median, None
    first, _, third = statistics.quantiles(values, n=4, method="inclusive")
    return median, [round(first, 2), round(third, 2)]


CPU_HEADER = f"{'CPU ms/turn: server':>19} {'worker':>6} {'client':>6} {'model':>5}"
"""The CPU columns of both ``bench.peers`` tables (``cpu_cells``)."""


def cpu_cells(cpu: dict[str, float]) -> str:
    """A row's CPU ms per turn by process, under ``CPU_HEADER`` ("-": not measured)."""
    return (
        f"{cpu.get('dev server', '-'):>19} {cpu.get('worker', '-'):>6} {cpu.get('client', '-'):>6} "
        f"{cpu.get('model server', '-'):>5}"
    )


@dataclass
class CpuMeter:
    """CPU of the benchmark's processes, read before and after a conversation:
    ``children`` by role (dev server, scripted model, each row's worker), and
    the benchmark process itself, the client."""

    children: dict[str, int]

    def read(self) -> dict[str, float]:
        sample = {role: process_cpu_ms(pid) for role, pid in self.children.items()}
        sample["client"] = own_cpu_ms()
        return sample

    @staticmethod
    def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {role: after[role] - before[role] for role in before}

    @staticmethod
    def by_row(spent: dict[str, float], key: str, workers: int) -> dict[str, float]:
        """``spent`` as one row's figures: its own ``workers`` (roles
        ``key#0``...) together, the other rows' workers as idle ones."""
        own = {f"{key}#{i}" for i in range(workers)}
        return {
            "dev server": spent["dev server"],
            "worker": sum(spent[role] for role in own),
            "client": spent["client"],
            "model server": spent["model server"],
            "idle workers": sum(v for role, v in spent.items() if "#" in role and role not in own),
        }


@dataclass
class History:
    """A conversation's history over all its runs."""

    events: int = 0
    bytes: int = 0
    runs: int = 0
    actions: Counter[str] = field(default_factory=Counter)

    @property
    def total_actions(self) -> int:
        return sum(self.actions.values())


async def fetch_history(client: Client, workflow_id: str, first_run_id: str | None) -> History:
    """Every run's events, from the first run along its continue-as-new chain."""
    history = History()
    run_id = first_run_id
    while True:
        fetched = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        history.runs += 1
        history.events += len(fetched.events)
        history.bytes += sum(event.ByteSize() for event in fetched.events)
        next_run = None
        for event in fetched.events:
            kind = _action(event)
            if kind:
                history.actions[kind] += 1
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                next_run = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        if not next_run:
            return history
        run_id = next_run


def _action(event: HistoryEvent) -> str | None:
    if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
        marker = event.marker_recorded_event_attributes.marker_name
        return "local_activities" if marker == _LOCAL_ACTIVITY_MARKER else None
    return _ACTIONS.get(event.event_type)
