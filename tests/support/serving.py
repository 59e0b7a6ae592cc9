"""An aiohttp app on a free loopback port, for the tests' stand-in servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serving(app: web.Application, shutdown_timeout: float = 60.0) -> AsyncIterator[str]:
    """``app`` on a free loopback port; yields its URL. ``shutdown_timeout``:
    how long the end waits for requests still being answered."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
