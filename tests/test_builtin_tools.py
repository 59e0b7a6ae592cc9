"""The shipped tools (calculator, read_file, list_files) are bounded in time
and memory whatever the model asks, and leave the worker's event loop free:
the loop also sends every running activity's heartbeat (timeout 3 s), so a
tool that holds it for seconds gets every call on the worker retried."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
import time
import tracemalloc
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pydantic_core
import pytest
from pydantic import BaseModel, field_validator
from temporalio.testing import ActivityEnvironment

import activities.events as events_module
import activities.tool_runner as tool_runner_module
from activities import builtin_tools
from activities.builtin_tools import (
    MAX_EXPRESSION_CHARS,
    MAX_LINE_CHARS,
    MAX_LIST_ENTRIES,
    MAX_READ_BYTES,
    CalculatorArgs,
    ListFilesArgs,
    ReadFileArgs,
    calculator,
    list_files,
    read_file,
)
from activities.tool_runner import MAX_RESULT_BYTES, ToolActivities, output_path
from activities.tools import ToolResult, ToolSpec, registered_tools, report_progress, tool_context
from runtime.settings import Settings, SettingsError
from workflows.contract import ToolRequest
from workflows.models import ImageContent, TextContent, ToolCall, ToolOutcome

MiB = 1024 * 1024
# A heartbeat-style ticker may fall this far behind at most.
MAX_TICK_GAP = 0.1


async def longest_tick_gap(work: Awaitable[Any]) -> tuple[Any, float]:
    """Run ``work`` beside a ticker that wakes every 5 ms (as the heartbeat
    loop does, more often); its result (or exception) and the longest gap
    the ticker saw between two wake-ups."""
    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)
    try:
        result: Any = await work
    except Exception as err:
        result = err
    await asyncio.sleep(0.02)
    stop.set()
    await ticker
    return result, max(gaps)


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    before = builtin_tools.workspace_root()
    builtin_tools.set_workspace(tmp_path)
    yield tmp_path
    builtin_tools.set_workspace(before)


def text_of(result: ToolResult) -> str:
    assert isinstance(result.content, str)
    return result.content


# --- calculator -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("6*7", "6*7 = 42"),
        ("2**10-1", "2**10-1 = 1023"),
        ("(2 + 3) * 4 / 8", "(2 + 3) * 4 / 8 = 2.5"),
        # every operator its description names
        ("7 % 3", "7 % 3 = 1"),
        ("7 // 2", "7 // 2 = 3"),
        ("-7 + +2", "-7 + +2 = -5"),
    ],
)
async def test_calculator_answers(expression: str, answer: str) -> None:
    assert await calculator(CalculatorArgs(expression=expression)) == answer


async def test_calculator_accepts_ordinary_nesting() -> None:
    answer = await calculator(CalculatorArgs(expression="-(" * 40 + "2" + ")" * 40 + " - -1"))
    assert answer.endswith(" = 3")


async def test_calculator_computes_up_to_four_thousand_digits() -> None:
    answer = await calculator(CalculatorArgs(expression="10**3999*10"))
    assert answer == "10**3999*10 = 1" + "0" * 4000


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("(10**1000)**10000", "more than 4000 digits"),
        ("9**9**9**9", "more than 4000 digits"),
        ("(10**3000)*(10**3000)*(10**3000)", "more than 4000 digits"),
        ("2**13289", "more than 4000 digits"),
        ("10**4000/3", "too large for a floating-point number"),
        ("1" * 4500, "longer than 1000 characters"),
        ("-" * 990 + "1", "nested too deeply"),
        ("(" * 450 + "1" + ")" * 450, "nested too deeply"),
        ("- -" * 300 + "1", "nested too deeply"),
        ("1/0", "Division by zero"),
    ],
)
async def test_hostile_expression_is_refused_at_once_and_the_loop_keeps_ticking(
    expression: str, says: str
) -> None:
    result, gap = await longest_tick_gap(calculator(CalculatorArgs(expression=expression)))
    if gap >= MAX_TICK_GAP:
        # The same expression blocks the loop every time; a busy 2-core CI
        # machine descheduling the process once (133 ms seen) does not.
        result, gap = await longest_tick_gap(calculator(CalculatorArgs(expression=expression)))

    assert isinstance(result, ValueError) and says in str(result), result
    assert gap < MAX_TICK_GAP


# --- read_file ------------------------------------------------------------------------------


@pytest.fixture
def big_file(workspace: Path) -> Path:
    """64 MiB of 1 KiB lines."""
    path = workspace / "big.log"
    line = b"x" * 1023 + b"\n"
    with path.open("wb") as file:
        for _ in range(64):
            file.write(line * 1024)
    return path


async def test_read_file_reads_the_lines_asked_for_not_the_whole_file(big_file: Path) -> None:
    tracemalloc.start()
    try:
        result = await read_file(ReadFileArgs(path="big.log", offset=2, limit=3))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    lines = text_of(result).splitlines()
    assert [line[:8] for line in lines[:3]] == ["    2  x", "    3  x", "    4  x"]
    assert lines[3] == "[More lines follow: read again with offset=5]"
    assert peak < 2 * MiB


async def test_read_file_far_into_a_big_file_leaves_the_loop_free(big_file: Path) -> None:
    result, gap = await longest_tick_gap(read_file(ReadFileArgs(path="big.log", offset=60_000, limit=2)))

    assert text_of(result).splitlines()[0].startswith("60000  x")
    assert gap < MAX_TICK_GAP


async def test_a_very_long_line_is_cut_and_never_held_whole(workspace: Path) -> None:
    (workspace / "one-line.json").write_bytes(b"[" + b"1," * (10 * MiB) + b"1]\nsecond line\n")

    tracemalloc.start()
    try:
        result = await read_file(ReadFileArgs(path="one-line.json"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    first, second = text_of(result).splitlines()
    assert first.endswith(f"[line cut at {MAX_LINE_CHARS} characters]")
    assert len(first) < MAX_LINE_CHARS + 100
    assert second == "    2  second line"
    assert peak < 2 * MiB


async def test_read_file_stops_at_its_byte_cap_and_says_where_to_go_on(workspace: Path) -> None:
    (workspace / "wide.txt").write_text(("y" * 1500 + "\n") * 1000)

    text = text_of(await read_file(ReadFileArgs(path="wide.txt", limit=1000)))

    assert len(text.encode()) <= MAX_READ_BYTES + 200
    last = text.splitlines()[-1]
    assert last.startswith(f"[Stopped at {MAX_READ_BYTES // 1024} KiB: read again with offset=")
    next_offset = int(last.rsplit("=", 1)[1].rstrip("]"))
    assert text.splitlines()[-2].startswith(f"{next_offset - 1:>5}  y")


async def test_read_file_of_a_short_file_has_no_note(workspace: Path) -> None:
    (workspace / "short.txt").write_text("one\ntwo\r\nthree")

    assert text_of(await read_file(ReadFileArgs(path="short.txt"))) == "    1  one\n    2  two\n    3  three"
    assert text_of(await read_file(ReadFileArgs(path="short.txt", offset=9))) == (
        "(the file has fewer than 9 lines)"
    )


async def test_read_file_refuses_paths_outside_the_workspace(workspace: Path) -> None:
    with pytest.raises(PermissionError, match="outside the workspace"):
        await read_file(ReadFileArgs(path="../../etc/passwd"))


async def test_hidden_files_are_not_read_or_listed(
    workspace: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The default workspace is the worker's working directory, where its
    `.env` (the API key, the encryption keys) is kept: read_file handed it
    to the model."""
    (workspace / ".env").write_text("OPENAI_API_KEY=sk-secret\n")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[remote]\n")
    (workspace / "settings").symlink_to(workspace / ".env")
    for path in (".env", "./.env", ".git/config", "settings"):
        with pytest.raises(PermissionError, match="is hidden") as refused:
            await read_file(ReadFileArgs(path=path))
        said = str(refused.value)
        assert said.startswith(f"{path!r} is hidden" if path != "settings" else "'settings' leads")
    # Through a symlink the refusal names where it leads (it called `settings` hidden).
    assert str(refused.value).startswith("'settings' leads to '.env', which is hidden (a name starting")
    with pytest.raises(PermissionError, match="is hidden"):
        await list_files(ListFilesArgs(path=".git"))


async def test_a_hard_link_in_the_workspace_is_read_as_the_file_it_links(
    workspace: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A hard link is the file itself (the README: link in only what the
    agent may read); unlike a symbolic link it names no place outside."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "shared.txt").write_text("linked in on purpose\n")
    os.link(outside / "shared.txt", workspace / "shared.txt")
    assert "linked in on purpose" in text_of(await read_file(ReadFileArgs(path="shared.txt")))


async def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(
    workspace: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The path was checked, then opened: a directory replaced by a link to
    another place in between was read through (a race won 1 time in 40)."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "f").write_text("OUTSIDE-SECRET")
    (workspace / "d").mkdir()
    (workspace / "d" / "f").write_text("inside")
    checked = builtin_tools._inside_workspace("d/f")
    (workspace / "d" / "f").unlink()
    (workspace / "d").rmdir()
    (workspace / "d").symlink_to(outside, target_is_directory=True)  # the swap
    with pytest.raises(PermissionError, match="outside the workspace"):
        builtin_tools._read_file(checked, ReadFileArgs(path="d/f"))
    with pytest.raises((PermissionError, FileNotFoundError)):  # a link it does not follow
        builtin_tools._list_files(builtin_tools._inside_workspace(".") / "d", "d")


async def test_a_directory_swapped_for_a_link_to_a_hidden_one_after_the_check_is_refused(
    workspace: Path,
) -> None:
    """The hidden-name check ran before opening and the one after only asked
    "inside the workspace": a directory swapped for a link to `.secrets` in
    between was read (a security audit: 3,830 reads in 20,000)."""
    (workspace / ".secrets").mkdir()
    (workspace / ".secrets" / "f").write_text("HIDDEN-TOKEN")
    (workspace / "d").mkdir()
    (workspace / "d" / "f").write_text("public")
    checked = builtin_tools._inside_workspace("d/f")
    (workspace / "d" / "f").unlink()
    (workspace / "d").rmdir()
    (workspace / "d").symlink_to(workspace / ".secrets", target_is_directory=True)  # the swap
    with pytest.raises(PermissionError, match=r"^'d/f' leads to '.secrets/f', which is hidden"):
        builtin_tools._read_file(checked, ReadFileArgs(path="d/f"))


async def read_holding(path: str, secret: str) -> str:
    """What read_file shows of ``path`` while the worker holds ``secret``."""
    from activities.redact import TOOL_SECRETS

    token = TOOL_SECRETS.set((secret,))
    try:
        result = await read_file(ReadFileArgs(path=path))
    finally:
        TOOL_SECRETS.reset(token)
    return result.content if isinstance(result.content, str) else str(result.content)


async def test_a_secret_across_a_lines_cut_is_scrubbed_before_the_cut(workspace: Path) -> None:
    """A line is cut at 2,000 characters before the runner scrubs the result:
    a key across the cut no longer matched, and its first half was shown."""
    secret = "sk-proj-" + "S3cr3t" * 6
    (workspace / "config.json").write_text("x" * 1990 + secret + "y" * 100 + "\n")
    text = await read_holding("config.json", secret)
    assert "sk-proj-S3" not in text and "[redacted]" in text

    # A line read only to 8,000 bytes: of 4-byte characters, that is the
    # 2,000 shown, and a key after 1,990 of them was cut before the scrub
    # (a review: its first 10 characters showed).
    key = "ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXo0NTY3ODkwMTIz"
    (workspace / "emoji.txt").write_text("\U0001f600" * 1990 + key + "\n")
    text = await read_holding("emoji.txt", key)
    assert "ZGVmZ2" not in text and "[redacted] [line cut at 2000 characters]" in text


async def test_a_fifo_is_refused_at_once(workspace: Path) -> None:
    """Opening a FIFO blocks until a writer comes: a thread of the worker's
    pool was held for good (a file swapped for one after the check)."""
    os.mkfifo(workspace / "pipe")
    checked = builtin_tools._inside_workspace("pipe")
    started = time.monotonic()
    with pytest.raises(FileNotFoundError, match="No file 'pipe'"):
        await asyncio.wait_for(
            asyncio.to_thread(builtin_tools._read_file, checked, ReadFileArgs(path="pipe")), 5
        )
    assert time.monotonic() - started < 1


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("a\0b", "has a NUL character in it"),
        ("loop", "is a loop of symbolic links"),
        ("d/" * 3000 + "f", "No file 'd/d/d/"),
    ],
)
async def test_a_path_that_cannot_be_read_gets_one_short_sentence(
    workspace: Path, path: str, says: str
) -> None:
    (workspace / "loop").symlink_to(workspace / "loop")
    with pytest.raises((ValueError, FileNotFoundError)) as refused:
        await read_file(ReadFileArgs(path=path))
    assert says in str(refused.value) and len(str(refused.value)) < 400
    assert str(workspace) not in str(refused.value)


# --- list_files -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of 40,000 files, two subdirectories and a hidden file."""
    root = tmp_path_factory.mktemp("crowded")
    for index in range(40_000):
        (root / f"f{index:05d}.txt").touch()
    (root / "zz-dir").mkdir()
    (root / "aa-dir").mkdir()
    (root / ".hidden").touch()
    return root


async def test_a_name_that_could_read_as_other_lines_is_quoted(tmp_path: Path) -> None:
    """A file named `new\nline.txt` was listed as two files, `new` and
    `line.txt` (a security audit): such names are JSON strings, one line each."""
    for name in (
        "new\nline.txt",
        "[9 more entries not shown]",
        '"quoted"',
        "plain.txt",
        "sep\u2028arated",
        "nel\x85here",
        "(empty directory)",
    ):
        (tmp_path / name).touch()
    (tmp_path / "tab\tdir").mkdir()
    builtin_tools.set_workspace(tmp_path)
    try:
        listing = (await list_files(ListFilesArgs())).splitlines()
    finally:
        builtin_tools.set_workspace(Path.cwd())

    assert listing == [
        '"tab\\tdir"/',
        '"\\"quoted\\""',
        '"(empty directory)"',
        '"[9 more entries not shown]"',
        '"nel\\u0085here"',
        '"new\\nline.txt"',
        "plain.txt",
        '"sep\\u2028arated"',
    ]


async def test_list_files_shows_directories_first_and_says_how_many_were_left_out(crowded: Path) -> None:
    builtin_tools.set_workspace(crowded)
    try:
        listing = (await list_files(ListFilesArgs())).splitlines()
    finally:
        builtin_tools.set_workspace(Path.cwd())

    assert listing[:3] == ["aa-dir/", "zz-dir/", "f00000.txt"]
    assert len(listing) == MAX_LIST_ENTRIES + 1
    assert (
        listing[-1] == f"[{40_002 - MAX_LIST_ENTRIES:,} more entries not shown: list a subdirectory instead.]"
    )
    assert ".hidden" not in listing


async def test_listing_a_crowded_directory_leaves_the_loop_free(crowded: Path) -> None:
    builtin_tools.set_workspace(crowded)
    try:
        listing, gap = await longest_tick_gap(list_files(ListFilesArgs()))
    finally:
        builtin_tools.set_workspace(Path.cwd())

    assert isinstance(listing, str) and listing.startswith("aa-dir/")
    assert gap < MAX_TICK_GAP


@pytest.mark.parametrize("storage", ["file", "off"])
def test_a_worker_refuses_a_workspace_holding_its_data(tmp_path: Path, storage: str) -> None:
    """The full outputs of every conversation's tools are kept under
    AGENT_DATA_DIR: inside the workspace, one conversation's read_file
    could read another's. The worker refuses to start, whatever the storage."""
    inside = {"AGENT_WORKSPACE": str(tmp_path), "AGENT_DATA_DIR": str(tmp_path / ".agent-data")}
    outside = {
        "AGENT_STORAGE": storage,
        "AGENT_STORAGE_DIR": str(tmp_path.parent / f"{tmp_path.name}-payloads"),
    }
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({**inside, **outside}).check_workspace()
    assert str(refused.value).startswith(
        f"The tool output directory {tmp_path / '.agent-data' / 'tool-output'}"
    )
    assert "Point AGENT_TOOL_OUTPUT_DIR (or AGENT_DATA_DIR) outside AGENT_WORKSPACE" in str(refused.value)
    elsewhere = {"AGENT_TOOL_OUTPUT_DIR": str(tmp_path.parent / f"{tmp_path.name}-output")}
    Settings.from_env({**inside, **outside, **elsewhere}).check_workspace()  # no refusal


def test_full_outputs_of_different_calls_never_share_a_file(tmp_path: Path) -> None:
    """The file was the flattened `{workflowId}/tool-{callId}` cut at 200
    characters: `team/alice` and `team_alice` shared files, long ids shared
    one, and a model could name a call to overwrite another conversation's."""
    pairs = [
        ("team/alice-1", "call_0"),
        ("team_alice-1", "call_0"),
        ("c" * 300 + "1", "call_0"),
        ("c" * 300 + "2", "call_0"),
        ("c" * 300 + "1", "call_1"),
        ("p", "q_tool-r"),
        ("p/tool-q", "r"),
        ("x", "y/tool-z"),
        ("x/tool-y", "z"),
    ]
    paths = [output_path(tmp_path, w, f"{w}/tool-{c}") for w, c in pairs]
    assert len(set(paths)) == len(pairs)
    assert all(p.parent.parent == tmp_path and len(p.name) < 150 for p in paths)
    assert (
        output_path(tmp_path, "team/alice-1", "team/alice-1/tool-call_0") == paths[0]
    )  # a retry: the same file


async def test_a_model_reusing_a_call_id_gets_a_file_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some models number their calls `call_0` in every answer: the second
    call's output replaced the first's, which its result still named. Each
    call has its own idempotency key (unique in the conversation): its file."""
    import tests.support.tools  # noqa: F401  (registers echo)

    class NoStream:  # the tool publishes nothing: no workflow to signal
        def topic(self, _name: str) -> Any:
            return self

    monkeypatch.setattr(events_module, "run_stream_client", NoStream)

    runner = ToolActivities(output_cap=10, output_dir=tmp_path)
    paths = []
    for key, text in (("wf/tool-call_0", "first " * 10), ("wf/tool-call_0-2", "second " * 10)):
        request = ToolRequest(
            tool_call=ToolCall(id="call_0", name="echo", arguments={"text": text}), idempotency_key=key
        )
        outcome = await ActivityEnvironment().run(runner.execute_tool, request)
        paths.append(Path(outcome.details["fullOutputPath"]))
    assert paths[0] != paths[1]
    assert paths[0].read_text().startswith("echo: first")
    assert paths[1].read_text().startswith("echo: second")


async def test_an_output_over_the_cap_is_cut_even_where_its_full_text_cannot_be_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read-only AGENT_TOOL_OUTPUT_DIR (a read-only root file system) made
    every long output an error; it is cut for the model all the same."""
    import tests.support.tools  # noqa: F401  (registers echo)

    class NoStream:
        def topic(self, _name: str) -> Any:
            return self

    monkeypatch.setattr(events_module, "run_stream_client", NoStream)
    runner = ToolActivities(output_cap=10, output_dir=Path("/proc/no-outputs"))
    request = ToolRequest(
        tool_call=ToolCall(id="call_0", name="echo", arguments={"text": "long " * 10}),
        idempotency_key="wf/tool-call_0",
    )
    outcome = await ActivityEnvironment().run(runner.execute_tool, request)
    assert not outcome.is_error
    assert outcome.content[0].text.startswith("echo: long")  # type: ignore[union-attr]
    assert "[Output truncated: " in outcome.content[0].text  # type: ignore[union-attr]
    assert "fullOutputPath" not in (outcome.details or {})


def test_a_workspace_inside_the_worker_data_or_holding_its_key_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for workspace in (data / "payloads" / "default", data / "tool-output"):
        with pytest.raises(SettingsError, match="is inside"):
            Settings.from_env(
                {"AGENT_DATA_DIR": str(data), "AGENT_WORKSPACE": str(workspace)}
            ).check_workspace()
    keys = tmp_path / "ws" / "keys.txt"
    keys.parent.mkdir()
    keys.write_text("k1:" + "A" * 43 + "=\n")
    with pytest.raises(SettingsError, match=r"AGENT_ENCRYPTION_KEY_FILE .* is inside the tools' workspace"):
        Settings.from_env(
            {
                "AGENT_DATA_DIR": str(data),
                "AGENT_WORKSPACE": str(keys.parent),
                "AGENT_ENCRYPTION_KEY_FILE": str(keys),
            }
        ).check_workspace()


def test_a_tls_private_key_inside_the_workspace_is_refused(tmp_path: Path) -> None:
    """read_file would hand the worker's mTLS key to the model (and the history)."""
    workspace = tmp_path / "ws"
    (workspace / "certs").mkdir(parents=True)
    for name in ("client.pem", "client.key"):
        (workspace / "certs" / name).write_text("-----BEGIN-----\n")
    settings = Settings.from_env(
        {
            "AGENT_DATA_DIR": str(tmp_path / "data"),
            "AGENT_WORKSPACE": str(workspace),
            "TEMPORAL_TLS_CERT": str(workspace / "certs" / "client.pem"),
            "TEMPORAL_TLS_KEY": str(workspace / "certs" / "client.key"),
        }
    )

    with pytest.raises(SettingsError, match=r"TEMPORAL_TLS_KEY .* is inside the tools' workspace"):
        settings.check_workspace()


async def test_a_huge_line_is_not_read_to_its_end(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 GiB file with no line break took 15 s to show its first line cut
    (the rest of the line was read to skip it), holding a thread meanwhile."""
    monkeypatch.setattr(builtin_tools, "MAX_SCAN_BYTES", 1024 * 1024)
    (workspace / "one-line").write_bytes(b"x" * (3 * 1024 * 1024) + b"\nsecond\n")
    shown = text_of(await read_file(ReadFileArgs(path="one-line", limit=2)))
    assert shown.startswith("    1  " + "x" * 100)
    assert shown.endswith("[Stopped in line 1, 1 MiB into the file: read_file reads no further in one call]")
    with pytest.raises(ValueError, match="Line 3 is more than 1 MiB into the file"):
        await read_file(ReadFileArgs(path="one-line", offset=3))


async def test_details_are_measured_in_utf8_bytes_not_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    """400,000 characters of three bytes each are 1.2 MB of JSON, past the
    1 MB a result's details may take (they were counted as 400,000)."""
    import tests.support.tools  # noqa: F401  (registers wide_details)

    class NoStream:
        def topic(self, _name: str) -> Any:
            return self

    monkeypatch.setattr(events_module, "run_stream_client", NoStream)
    runner = ToolActivities()
    request = ToolRequest(
        tool_call=ToolCall(id="w1", name="wide_details", arguments={"megabytes": 0.4}),
        idempotency_key="wf/w1",
    )
    outcome = await ActivityEnvironment().run(runner.execute_tool, request)
    assert "blob" not in outcome.details
    assert "details were dropped: more than 1,000,000 bytes" in outcome.details["notes"]["details"]
    request.tool_call.arguments = {"megabytes": 0.3}  # 900,000 bytes: kept
    outcome = await ActivityEnvironment().run(runner.execute_tool, request)
    assert len(outcome.details["blob"]) == 300_000


async def test_a_tool_runner_made_without_an_output_directory_writes_nothing_where_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`ToolActivities()` wrote full outputs under `./.agent-data`, in the
    directory it ran in: for a program that embeds it, a tool's workspace
    (a design audit). Without `output_dir` the output is cut, not kept."""
    import tests.support.tools  # noqa: F401  (registers echo)

    class NoStream:
        def topic(self, _name: str) -> Any:
            return self

    monkeypatch.setattr(events_module, "run_stream_client", NoStream)
    monkeypatch.chdir(tmp_path)
    runner = ToolActivities(output_cap=10)
    request = ToolRequest(
        tool_call=ToolCall(id="e1", name="echo", arguments={"text": "long " * 20}), idempotency_key="wf/e1"
    )
    outcome = await ActivityEnvironment().run(runner.execute_tool, request)
    assert "[Output truncated" in outcome.content[0].text and "fullOutputPath" not in (outcome.details or {})
    assert list(tmp_path.iterdir()) == []


async def test_a_whole_quotient_is_shown_as_an_integer() -> None:
    assert await calculator(CalculatorArgs(expression="4/2")) == "4/2 = 2"


async def test_calculator_takes_an_expression_of_exactly_the_character_limit() -> None:
    expression = "1+" * 499 + "10"
    assert len(expression) == MAX_EXPRESSION_CHARS
    assert await calculator(CalculatorArgs(expression=expression)) == f"{expression} = {499 + 10}"


async def test_booleans_are_not_numbers_to_the_calculator() -> None:
    with pytest.raises(ValueError, match=r"^Unsupported element in expression: 'True'$"):
        await calculator(CalculatorArgs(expression="True + 1"))


async def test_an_operator_the_calculator_lacks_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^Unsupported element in expression: '1 << 2'$"):
        await calculator(CalculatorArgs(expression="1 << 2"))


# --- read_file and list_files -----------------------------------------------------------


async def test_a_refused_open_leaves_no_descriptor_open(workspace: Path) -> None:
    """What is opened and then refused (here a FIFO, not a regular file) is
    closed: a model asking again and again must not exhaust the worker's
    descriptors."""
    os.mkfifo(workspace / "pipe")
    checked = builtin_tools._inside_workspace("pipe")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(FileNotFoundError, match="No file 'pipe'"):
            builtin_tools._read_file(checked, ReadFileArgs(path="pipe"))
    assert len(os.listdir("/proc/self/fd")) == before


async def test_a_file_of_exactly_the_lines_asked_for_says_no_more_follow(workspace: Path) -> None:
    (workspace / "three.txt").write_text("a\nb\nc\n")

    assert text_of(await read_file(ReadFileArgs(path="three.txt", limit=3))) == "    1  a\n    2  b\n    3  c"


async def test_read_file_details_say_which_lines_were_shown(workspace: Path) -> None:
    (workspace / "five.txt").write_text("1\n2\n3\n4\n5\n")

    result = await read_file(ReadFileArgs(path="five.txt", offset=4, limit=10))

    assert result.details == {
        "path": str(workspace / "five.txt"),
        "bytes": 10,
        "firstLine": 4,
        "linesShown": 2,
    }


async def test_a_line_cut_by_its_bytes_says_so_even_under_the_character_limit(workspace: Path) -> None:
    """A line is read to 8,000 bytes: of 4-byte characters that is exactly
    the 2,000 shown, and the rest of the line was dropped all the same."""
    (workspace / "emoji.txt").write_text("\U0001f600" * 3000 + "\nnext\n")

    first, second = text_of(await read_file(ReadFileArgs(path="emoji.txt"))).splitlines()

    assert first == "    1  " + "\U0001f600" * MAX_LINE_CHARS + f" [line cut at {MAX_LINE_CHARS} characters]"
    assert second == "    2  next"


async def test_a_line_of_exactly_the_bytes_read_is_not_called_cut(workspace: Path) -> None:
    (workspace / "full.txt").write_text("\U0001f600" * MAX_LINE_CHARS + "\nnext\n")

    first, second = text_of(await read_file(ReadFileArgs(path="full.txt"))).splitlines()

    assert first == "    1  " + "\U0001f600" * MAX_LINE_CHARS
    assert second == "    2  next"


async def test_an_empty_file_says_so(workspace: Path) -> None:
    (workspace / "empty.txt").write_bytes(b"")

    assert text_of(await read_file(ReadFileArgs(path="empty.txt"))) == "(empty file)"


async def test_list_files_says_when_it_stopped_looking_in_a_huge_directory(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builtin_tools, "MAX_SCAN_ENTRIES", 5)
    for index in range(8):
        (workspace / f"f{index}").touch()

    listing = (await list_files(ListFilesArgs())).splitlines()

    assert len(listing) == 6
    assert listing[-1] == (
        "[The directory has more than 5 entries: these are the first 5 of the first 5 looked at. "
        "List a subdirectory instead.]"
    )


async def test_listing_an_empty_directory_says_so(workspace: Path) -> None:
    (workspace / "nothing").mkdir()

    assert await list_files(ListFilesArgs(path="nothing")) == "(empty directory)"


# --- the tool runner --------------------------------------------------------------------


class _NoArgs(BaseModel):
    pass


class _TextArgs(BaseModel):
    text: str


class _NoStream:  # the tool publishes nothing: no workflow to signal
    def topic(self, _name: str) -> Any:
        return self


@pytest.fixture
def no_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "run_stream_client", _NoStream)


def runner_of(function: Any, *, args_model: type[BaseModel] = _NoArgs, **options: Any) -> ToolActivities:
    """A runner with one tool, ``t``, that runs ``function``."""
    spec = ToolSpec(name="t", description="a test tool", args_model=args_model, function=function)
    return ToolActivities({"t": spec}, **options)


async def run_t(
    runner: ToolActivities,
    arguments: dict[str, Any] | None = None,
    *,
    attempt: int = 1,
    max_batches: int | None = None,
    local: bool = False,
) -> ToolOutcome:
    request = ToolRequest(
        tool_call=ToolCall(id="c1", name="t", arguments=arguments or {}),
        idempotency_key="wf/tool-c1",
        max_batches=max_batches,
    )
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, attempt=attempt, is_local=local)
    return await environment.run(runner.execute_tool, request)


async def test_details_nested_deeper_than_the_workflow_decodes_are_dropped_with_a_note(
    no_stream: None,
) -> None:
    async def deep(args: _NoArgs) -> ToolResult:
        details: Any = "leaf"
        for _ in range(70):
            details = {"d": details}
        return ToolResult(content="deep", details=details)

    outcome = await run_t(runner_of(deep))

    assert not outcome.is_error and outcome.content[0].text == "deep"  # type: ignore[union-attr]
    assert set(outcome.details) == {"notes"}
    assert "nested deeper than 64 levels" in outcome.details["notes"]["details"]


async def test_details_that_are_no_json_are_dropped_with_a_note_that_says_so(no_stream: None) -> None:
    """A dict keyed by a tuple was dropped as "more than 1,000,000 bytes of
    JSON or nested deeper than 64 levels": the wrong thing to go and fix."""

    async def keyed(args: _NoArgs) -> ToolResult:
        return ToolResult(content="done", details={(1, 2): "cell"})

    outcome = await run_t(runner_of(keyed))

    assert not outcome.is_error and outcome.content[0].text == "done"  # type: ignore[union-attr]
    note = outcome.details["notes"]["details"]
    assert note.startswith("The tool's details were dropped: they are not JSON (keys must be str")
    assert "bytes" not in note and "nested" not in note


async def test_images_over_the_result_limit_are_dropped_with_a_note(no_stream: None) -> None:
    async def photos(args: _NoArgs) -> ToolResult:
        image = ImageContent(data="A" * (MAX_RESULT_BYTES // 2 + 4), mime_type="image/png")
        return ToolResult(content=[TextContent(text="two photos"), image, image])

    outcome = await run_t(runner_of(photos))

    assert [c.type for c in outcome.content] == ["text", "text"]
    assert outcome.content[1].text == "[2 image(s) dropped: more than 1,000,000 bytes.]"  # type: ignore[union-attr]


async def test_a_result_that_is_no_json_becomes_an_error_result(no_stream: None) -> None:
    """Reported done, a result that cannot be encoded fails the activity,
    and Temporal runs the tool's side effect again."""

    async def opaque(args: _NoArgs) -> ToolResult:
        return ToolResult(content="made", details={"handle": object()})

    outcome = await run_t(runner_of(opaque))

    assert outcome.is_error and outcome.details == {}
    assert outcome.content[0].text.startswith("The tool's result could not be encoded as JSON")  # type: ignore[union-attr]


async def test_an_output_of_exactly_the_cap_is_not_cut(no_stream: None, tmp_path: Path) -> None:
    async def ten(args: _NoArgs) -> str:
        return "0123456789"

    outcome = await run_t(runner_of(ten, output_cap=10, output_dir=tmp_path))

    assert outcome.content[0].text == "0123456789"  # type: ignore[union-attr]
    assert list(tmp_path.iterdir()) == []


async def test_a_full_output_is_kept_without_the_workers_secrets_and_for_the_worker_only(
    no_stream: None, tmp_path: Path
) -> None:
    secret = "sk-test-" + "Q7w" * 10

    async def dump(args: _NoArgs) -> str:
        return f"OPENAI_API_KEY={secret}\n" + "x" * 100

    old_umask = os.umask(0o022)
    try:
        outcome = await run_t(runner_of(dump, output_cap=10, output_dir=tmp_path / "out", secrets=[secret]))
    finally:
        os.umask(old_umask)

    path = Path(outcome.details["fullOutputPath"])
    assert secret not in path.read_text() and "[redacted]" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # The conversation's directory and the output directory made for it.
    assert path.parent.parent == tmp_path / "out"
    assert [stat.S_IMODE(d.stat().st_mode) for d in (path.parent, path.parent.parent)] == [0o700, 0o700]


async def test_a_tool_result_marked_as_an_error_stays_an_error(no_stream: None) -> None:
    async def refuses(args: _NoArgs) -> ToolResult:
        return ToolResult(content="no such record", is_error=True)

    outcome = await run_t(runner_of(refuses))

    assert outcome.is_error and outcome.content[0].text == "no such record"  # type: ignore[union-attr]


async def test_a_tool_returning_neither_text_nor_a_tool_result_gets_an_error_result(no_stream: None) -> None:
    async def forgets(args: _NoArgs) -> Any:
        return None

    outcome = await run_t(runner_of(forgets))

    assert outcome.is_error
    assert outcome.content[0].text == "A tool must return str or ToolResult, not NoneType."  # type: ignore[union-attr]


async def test_arguments_this_workers_model_refuses_become_an_error_result(no_stream: None) -> None:
    """The workflow validated them against the schema recorded at the start;
    a worker deployed since with another model for the tool refuses them."""

    async def needs_text(args: _TextArgs) -> str:
        return args.text

    outcome = await run_t(runner_of(needs_text, args_model=_TextArgs), {"query": "x"})

    assert outcome.is_error and outcome.details == {}
    assert outcome.content[0].text.startswith('Validation failed for tool "t":\n  - text: Field required')  # type: ignore[union-attr]


async def test_a_retried_call_gets_half_the_event_batches_of_the_attempt_before(
    no_stream: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets: list[int | None] = []
    real = tool_runner_module.ActivityEventPublisher

    def recording(batch_ms: int, max_batches: int | None = None) -> Any:
        budgets.append(max_batches)
        return real(batch_ms, max_batches)

    monkeypatch.setattr(tool_runner_module, "ActivityEventPublisher", recording)

    async def quiet(args: _NoArgs) -> str:
        return "ok"

    for attempt in (1, 2, 3):
        await run_t(runner_of(quiet), attempt=attempt, max_batches=100)
    await run_t(runner_of(quiet), attempt=9, max_batches=100)

    assert budgets == [100, 50, 25, 1]


class _Recording:
    """A stream client that keeps the events of each flush in ``flushed``."""

    flushed: ClassVar[list[list[Any]]] = []

    def __init__(self) -> None:
        self.pending: list[Any] = []

    def topic(self, _name: str) -> Any:
        return self

    def publish(self, event: Any) -> None:
        self.pending.append(event)

    async def flush(self) -> None:
        if self.pending:
            _Recording.flushed.append(list(self.pending))
            self.pending.clear()


def recording(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Tools publish to a ``_Recording``; returns its ``flushed``."""
    flushed: list[list[Any]] = []
    monkeypatch.setattr(_Recording, "flushed", flushed)
    monkeypatch.setattr(events_module, "run_stream_client", _Recording)
    return flushed


async def test_a_tool_run_again_says_so_before_it_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool whose attempt did not report (its worker died) runs again from
    the start: its progress restarts and what it did may be done twice. A
    subscriber saw the same progress twice with nothing between (a
    robustness audit); now ``tool_execution_retry`` comes first, at once,
    with the attempt and why, as a model call's ``message_retry`` does."""
    flushed = recording(monkeypatch)

    async def slow(args: _NoArgs) -> str:
        started = time.monotonic()  # a retry's mark is sent while the tool runs
        while tool_context().attempt > 1 and not flushed and time.monotonic() - started < 1:
            await asyncio.sleep(0.001)
        report_progress("half way")
        return "done"

    first = await run_t(runner_of(slow))
    first_sent = [e for batch in flushed for e in batch] + first.events
    flushed.clear()
    again = await run_t(runner_of(slow), attempt=2)

    assert [e["type"] for e in first_sent] == ["tool_execution_update"]
    retried = [e for batch in flushed for e in batch] + again.events
    marks = [e for e in retried if e["type"] == "tool_execution_retry"]
    assert marks == [
        {
            "type": "tool_execution_retry",
            "toolCallId": "c1",
            "toolName": "t",
            "attempt": 2,
            "reason": "its worker stopped, or it ran out of time",
        }
    ]
    assert [e["type"] for e in retried] == ["tool_execution_retry", "tool_execution_update"]
    assert flushed[0] == marks  # sent at once, before the tool went on


async def test_a_local_tool_sends_no_signal_and_its_latest_progress_goes_with_its_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The workflow takes a signal only after the workflow task that runs a
    local tool ends: progress a local tool sent reached subscribers after
    its result, stale. It sends none now; the latest goes with the result."""
    flushed = recording(monkeypatch)

    async def stepping(args: _NoArgs) -> str:
        for step in range(1, 6):
            report_progress(f"step {step}")
            await asyncio.sleep(0.03)
        return "done"

    outcome = await run_t(runner_of(stepping), local=True)

    assert flushed == []
    assert [(e["type"], e["partialResult"]["content"][0]["text"]) for e in outcome.events] == [
        ("tool_execution_update", "step 5")
    ]


async def test_a_tool_reporting_progress_often_sends_its_first_report_at_once_and_the_rest_in_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every ``report_progress`` used to flush at once: a tool reporting every
    few milliseconds sent a signal (and cost the conversation a workflow
    task) each time, 50-100 a second (a Temporal review). Now the first
    report goes out at once and the rest every ``stream_batch_ms``."""
    flushed = recording(monkeypatch)
    first_sent_after: list[float] = []

    async def chatty(args: _NoArgs) -> str:
        started = time.monotonic()
        report_progress("0")
        while not flushed and time.monotonic() - started < 1:
            await asyncio.sleep(0.001)
        first_sent_after.append(time.monotonic() - started)
        for step in range(1, 40):
            report_progress(str(step))
            await asyncio.sleep(0.005)
        return "done"

    outcome = await run_t(runner_of(chatty))  # stream_batch_ms: 100 by default

    assert first_sent_after[0] < 0.09  # not held for the batch interval
    assert 2 <= len(flushed) <= 5  # ~0.25 s of reports: not one signal each
    sent = [e for batch in flushed for e in batch] + outcome.events
    assert [e["partialResult"]["content"][0]["text"] for e in sent] == [str(i) for i in range(40)]


async def test_read_file_skips_no_further_than_its_scan_limit_through_short_lines(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builtin_tools, "MAX_SCAN_BYTES", 1024 * 1024)
    (workspace / "log.txt").write_bytes((b"z" * 1023 + b"\n") * 3000)

    with pytest.raises(ValueError, match=r"^Line 2900 is more than 1 MiB into the file"):
        await read_file(ReadFileArgs(path="log.txt", offset=2900))


async def test_an_error_result_has_credential_shaped_text_redacted_and_an_ordinary_result_does_not(
    no_stream: None,
) -> None:
    """An exception's message may quote a credential the worker does not
    know (a database's, a user's token): error results are scrubbed of
    whatever looks like one. A successful result is scrubbed only of the
    worker's own secrets: a tool's output is not mangled by guesses."""
    token = "ghp_" + "a1B2c3D4e5" * 3

    async def fails(args: _NoArgs) -> str:
        raise RuntimeError(f"login refused for {token}")

    async def prints(args: _NoArgs) -> str:
        return f"the test fixture's token is {token}"

    failed = await run_t(runner_of(fails))
    printed = await run_t(runner_of(prints))

    assert failed.is_error and failed.content[0].text == "login refused for [redacted]"  # type: ignore[union-attr]
    assert printed.content[0].text == f"the test fixture's token is {token}"  # type: ignore[union-attr]


async def test_the_runner_lets_a_tool_scrub_the_workers_secrets_before_it_cuts(
    no_stream: None, workspace: Path
) -> None:
    """read_file cuts a line at 2,000 characters: only the tool itself can
    take out a secret that straddles the cut, and only if the runner hands
    it the worker's secrets."""
    secret = "sk-proj-" + "S3cr3t" * 6
    (workspace / "config.json").write_text("x" * 1990 + secret + "y" * 100 + "\n")
    runner = ToolActivities({"read_file": registered_tools()["read_file"]}, secrets=[secret])
    request = ToolRequest(
        tool_call=ToolCall(id="c1", name="read_file", arguments={"path": "config.json"}),
        idempotency_key="wf/tool-c1",
    )

    outcome = await ActivityEnvironment().run(runner.execute_tool, request)

    assert "sk-proj-S3" not in outcome.content[0].text  # type: ignore[union-attr]
    assert "[redacted]" in outcome.content[0].text  # type: ignore[union-attr]


async def test_progress_a_tool_reports_is_sent_without_the_workers_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Progress travels as its own signal (into the history), not with the
    result the runner scrubs at the end."""
    published: list[Any] = []

    class CapturingStream:
        def topic(self, _name: str) -> Any:
            return self

        def publish(self, event: Any) -> None:
            published.append(event)

        async def flush(self) -> None:
            return None

    monkeypatch.setattr(events_module, "run_stream_client", CapturingStream)
    secret = "worker-secret-" + "k9" * 10

    async def debug(args: _NoArgs) -> str:
        report_progress(f"environment: KEY={secret}")
        return "done"

    outcome = await run_t(runner_of(debug, secrets=[secret]))

    sent = published + list(outcome.events)  # sent at once, or left for the result to carry
    assert [e["type"] for e in sent] == ["tool_execution_update"]
    assert secret not in repr(sent) and "[redacted]" in repr(sent)


# --- what a user's tool can hand back (a robustness audit) ----------------------------


class _Unreadable(Exception):
    """An exception whose message cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("str exploded")


async def test_a_tool_raising_an_exception_whose_message_cannot_be_read_runs_once(no_stream: None) -> None:
    """Wording it raised again: the activity failed, and the tool ran three times."""
    runs: list[int] = []

    async def unreadable(args: _NoArgs) -> str:
        runs.append(1)
        raise _Unreadable()

    outcome = await run_t(runner_of(unreadable))

    assert outcome.is_error and runs == [1]
    assert outcome.content[0].text == "_Unreadable (its message could not be read: RuntimeError)"  # type: ignore[union-attr]


class _CheckedArgs(BaseModel):
    path: str

    @field_validator("path")
    @classmethod
    def _exists(cls, value: str) -> str:
        raise RuntimeError(f"cannot check {value}")  # not a ValueError: pydantic does not wrap it


async def test_an_argument_validator_raising_is_the_calls_error_and_the_tool_does_not_run(
    no_stream: None,
) -> None:
    """It failed the activity, tried three times, the tool never running."""
    runs: list[int] = []

    async def checked(args: _CheckedArgs) -> str:
        runs.append(1)
        return "ran"

    outcome = await run_t(runner_of(checked, args_model=_CheckedArgs), {"path": "/etc"})

    assert outcome.is_error and runs == []
    assert outcome.content[0].text == 'Validation failed for tool "t": cannot check /etc'  # type: ignore[union-attr]


async def test_a_result_with_a_lone_surrogate_is_kept_with_a_replacement(no_stream: None) -> None:
    """A file name read with surrogateescape: the whole result was replaced
    by "could not be encoded as JSON", though the tool had acted."""

    async def deletes(args: _NoArgs) -> ToolResult:
        return ToolResult(content="deleted caf\udce9.txt", details={"removed": ["caf\udce9.txt"]})

    outcome = await run_t(runner_of(deletes))

    assert not outcome.is_error
    assert outcome.content[0].text == "deleted caf\ufffd.txt"  # type: ignore[union-attr]
    assert outcome.details == {"removed": ["caf\ufffd.txt"]}


async def test_an_error_message_is_capped_as_a_result_is(no_stream: None, tmp_path: Path) -> None:
    """A tool raising with a 10 MB message sent it whole to the model."""

    async def loud(args: _NoArgs) -> str:
        raise RuntimeError("x" * 10_000)

    outcome = await run_t(runner_of(loud, output_cap=100, output_dir=tmp_path))

    assert outcome.is_error
    text = outcome.content[0].text  # type: ignore[union-attr]
    assert text.startswith("x" * 100 + "\n[Output truncated: 10000 characters") and len(text) < 300
    assert Path(outcome.details["fullOutputPath"]).read_text() == "x" * 10_000


class _EncodingStream(_Recording):
    """A stream that writes each batch as the SDK's converter would (UTF-8
    JSON), so what it cannot write fails the flush, as the real one does."""

    sent: ClassVar[list[Any]] = []  # what every such stream sent, in order

    async def flush(self) -> None:
        for event in self.pending:
            pydantic_core.to_json(event)
        _EncodingStream.sent.extend(self.pending)
        self.pending.clear()


@pytest.fixture
def encoding_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_EncodingStream, "sent", [])
    monkeypatch.setattr(events_module, "run_stream_client", _EncodingStream)


async def test_progress_with_a_lone_surrogate_is_sent_with_a_replacement(encoding_stream: None) -> None:
    """Its batch could not be written: the activity failed after the tool
    had run, and the tool ran three times."""

    async def reports(args: _NoArgs) -> str:
        report_progress("reading caf\udce9")
        await asyncio.sleep(0.2)  # the first report is sent at once
        return "done"

    outcome = await run_t(runner_of(reports))

    assert not outcome.is_error and outcome.content[0].text == "done"  # type: ignore[union-attr]
    [sent] = _EncodingStream.sent
    assert sent["partialResult"]["content"][0]["text"] == "reading caf\ufffd"


async def test_progress_reported_from_a_thread_reaches_the_stream(encoding_stream: None) -> None:
    """The README advises `asyncio.to_thread` for blocking work; a report
    from there raised "no running event loop" and failed the tool."""

    def blocking_work() -> str:
        for step in range(3):
            report_progress(f"step {step}")
        return "done"

    async def threaded(args: _NoArgs) -> str:
        return await asyncio.to_thread(blocking_work)

    outcome = await run_t(runner_of(threaded))

    assert not outcome.is_error and outcome.content[0].text == "done"  # type: ignore[union-attr]
    sent = _EncodingStream.sent + outcome.events
    assert [e["partialResult"]["content"][0]["text"] for e in sent] == ["step 0", "step 1", "step 2"]
