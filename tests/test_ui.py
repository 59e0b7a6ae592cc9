"""The Temporal UI tells the story: a headless Chromium opens the
conversation's page on the dev server UI and finds the readable activity
summaries, and tool outputs that the worker compressed or stored outside
the history read as their content, decoded by the codec server (the
screenshots are kept in tests/artifacts/)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from tests.support.stack import Stack

CHROMIUM = shutil.which("chromium")


def chromium(
    url: str, *args: str, size: tuple[int, int] = (1400, 1000), wait_ms: int = 3000
) -> subprocess.CompletedProcess[str]:
    """Headless Chromium as this machine allows it: no sandbox (root), no
    background networking (the network is closed), a fresh profile.
    ``wait_ms`` of virtual time let the page load and render (virtual time
    stands still while a request, to the codec server say, is pending)."""
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        return subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={wait_ms}",  # without it the page is still blank
                f"--window-size={size[0]},{size[1]}",
                *args,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)


needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test.sh installs it as root)"
)


@needs_chromium
async def test_history_page_shows_readable_activity_summaries(stack: Stack, artifacts: Path) -> None:
    stack.script(
        {"tool_calls": [{"id": "u1", "name": "read_file", "arguments": {"path": "README.md", "limit": 3}}]},
        {"text": "It is a README."},
    )
    handle = await stack.start(prompt="What is in the README?", closeWhenIdle=True)
    await handle.result()
    url = f"{stack.dev_server.ui_url}/namespaces/default/workflows/{handle.id}"

    dom = chromium(url, "--dump-dom").stdout
    assert f"llm: {stack.model} turn 1" in dom
    assert f"llm: {stack.model} turn 2" in dom
    assert "tool: read_file path=README.md" in dom
    assert "test-key-never-in-history" not in dom

    screenshot = artifacts / "ui-history.png"
    chromium(url, f"--screenshot={screenshot}")
    assert screenshot.stat().st_size > 10_000


@needs_chromium
async def test_big_tool_outputs_read_decoded_on_the_workflow_page(stack: Stack, artifacts: Path) -> None:
    # One output compressed in the history (3 KiB), one stored outside it (400 KiB).
    handle, [compressed, stored] = await stack.run_bulky_tools(3, 400)
    history = await handle.fetch_history()
    run_id = (await handle.describe()).run_id
    page = f"{stack.dev_server.ui_url}/namespaces/default/workflows/{handle.id}/{run_id}/history"

    dom = chromium(page, "--dump-dom", wait_ms=8000).stdout
    # Each event's row previews its payload decoded; the Result panel shows the transcript.
    assert compressed in dom
    assert stored in dom
    assert '"messages"' in dom and '"role"' in dom
    assert "YmluYXJ5L3psaWI=" not in dom  # base64 of binary/zlib: a payload the UI could not decode
    assert "claimData" not in dom  # an external-storage reference the UI could not resolve
    screenshot = artifacts / "ui-codec-history.png"
    chromium(page, f"--screenshot={screenshot}", size=(1600, 2000), wait_ms=8000)
    assert screenshot.stat().st_size > 10_000

    # The stored output's own event, expanded: the whole result, as JSON.
    [stored_event] = [
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and e.activity_task_completed_event_attributes.result.payloads[0].external_payloads
    ]
    event_page = f"{page}/events/{stored_event}"
    event_dom = chromium(event_page, "--dump-dom", wait_ms=8000).stdout
    (artifacts / "ui-codec-stored-event.html").write_text(event_dom)
    assert f'"{stored}"</span>' in event_dom  # a string in the expanded JSON, not the row preview
    screenshot = artifacts / "ui-codec-stored-event.png"
    chromium(event_page, f"--screenshot={screenshot}", size=(1600, 1400), wait_ms=8000)
    assert screenshot.stat().st_size > 10_000
