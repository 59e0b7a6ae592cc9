#!/usr/bin/env bash
# Install the project (in .venv) and run the demo: embedded Temporal dev
# server, worker, and the scripted model when OPENAI_API_KEY is unset.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
exec .venv/bin/python demo.py "$@"
