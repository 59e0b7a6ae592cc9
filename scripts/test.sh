#!/usr/bin/env bash
# Install everything the tests need (in .venv) and run lint, type checks and the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"

# The UI test drives Debian's chromium; compose files are checked by docker-compose.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing=()
    command -v chromium >/dev/null || missing+=(chromium)
    command -v docker-compose >/dev/null || missing+=(docker-compose)
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
fi

echo "== ruff"
.venv/bin/ruff format --check .
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy workflows activities runtime console testbed worker.py starter.py client.py demo.py codec_server.py
echo "== docker-compose config"
bash .ci/check-compose
echo "== pytest"
.venv/bin/pytest -q -rs "$@"
echo "== pytest: the conformance tests again, with the SDK fallbacks forced on"
# The stock workflow sandbox (no private SDK names) and the stream without
# subscriber tracking: what a temporalio upgrade would fall back to.
AGENT_SDK_FALLBACKS=on .venv/bin/pytest -q tests/test_loop.py
