"""The project's source as every Python it supports (3.11 and later) reads it.

Python 3.13 strips a docstring's indentation when it compiles the module,
and re-encodes the text as UTF-8 to do so: a docstring holding a lone
surrogate (``"\\ud800"`` written unescaped) then fails the import with
``UnicodeEncodeError``, while 3.11 and 3.12 import it. `runtime.converter`
did, so no worker started on 3.13. The suite runs on one interpreter; this
reads every docstring as 3.13 does."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {".venv", "node_modules", "__pycache__", "build", "dist"}


def _sources() -> list[Path]:
    found = []
    for folder, folders, files in os.walk(ROOT):
        folders[:] = [name for name in folders if name not in SKIPPED and not name.startswith(".")]
        found += [Path(folder) / name for name in files if name.endswith(".py")]
    return sorted(found)


def _undecodable_docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is None:
                continue
            try:
                doc.encode("utf-8")
            except UnicodeEncodeError as error:
                line = getattr(node, "lineno", 1)
                found.append(
                    f"{path.relative_to(ROOT)}:{line}: {error.reason} ({doc[error.start : error.end]!r})"
                )
    return found


def test_the_sources_are_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in _sources()}
    assert {"worker.py", "runtime/converter.py", "workflows/agent.py", "tests/test_source.py"} <= names


def test_no_docstring_holds_text_that_python_3_13_cannot_compile() -> None:
    found = [problem for path in _sources() for problem in _undecodable_docstrings(path)]
    assert not found, (
        "escape these (\\\\ud800 in the source), or Python 3.13 cannot import them:\n" + "\n".join(found)
    )
