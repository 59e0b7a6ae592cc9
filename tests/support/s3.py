"""The AWS settings that point this process's S3 clients at the ``fake_s3`` fixture."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from tests.support.serving import serving


def use_fake_s3(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    for name, value in {
        "AWS_ENDPOINT_URL": url,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }.items():
        monkeypatch.setenv(name, value)


@asynccontextmanager
async def denying_s3(reads: str = "denied") -> AsyncIterator[str]:
    """A loopback server answering S3 calls as S3 answers a key without
    rights (403 AccessDenied); yields its URL. ``reads="only"``: writes are
    taken and reads denied; ``reads="hang"``: writes are taken and reads
    never answered."""

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        if request.method == "PUT" and reads != "denied":
            return web.Response()
        if reads == "hang":
            await asyncio.sleep(3600)
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
            "<Message>Access Denied</Message></Error>"
        )
        return web.Response(status=403, body=body.encode(), content_type="application/xml")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with serving(app, shutdown_timeout=0.1) as url:  # a hung read is not waited for
        yield url
