"""The Temporal UI tells the story: a headless Chromium opens the
conversation's page on the dev server UI and finds the readable activity
summaries (the screenshot is kept in tests/artifacts/)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.stack import Stack

CHROMIUM = shutil.which("chromium")


def chromium(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium as this machine allows it: no sandbox (root), no
    background networking (the network is closed), a fresh profile."""
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
                "--virtual-time-budget=3000",  # without it the page is still blank
                "--window-size=1400,1000",
                *args,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/test.sh installs it as root)"
)
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
