"""The AWS settings that point this process's S3 clients at the ``fake_s3`` fixture."""

from __future__ import annotations

import pytest


def use_fake_s3(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    for name, value in {
        "AWS_ENDPOINT_URL": url,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }.items():
        monkeypatch.setenv(name, value)
