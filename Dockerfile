# The agent worker: `python worker.py` as a non-root user. The same image runs
# the codec server (`python codec_server.py`, compose's `codec` service).
# Configured entirely by environment variables (see the README); the defaults
# below keep its files in /data (payload store, full tool output) and let the
# agent's tools work in /workspace.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, so editing the code does not reinstall them. The
# aioboto3 extra is the SDK's S3 driver, used when AGENT_STORAGE=s3://...
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "temporalio[aioboto3]" \
    && rm /tmp/requirements.txt

COPY . .
RUN pip install --no-deps . \
    && rm -rf build *.egg-info \
    && useradd --create-home --uid 10001 agent \
    && mkdir -p /data /workspace \
    && chown agent:agent /data /workspace

ENV AGENT_STORAGE_DIR=/data/payloads \
    AGENT_TOOL_OUTPUT_DIR=/data/tool-output \
    AGENT_WORKSPACE=/workspace

USER agent
CMD ["python", "worker.py"]
