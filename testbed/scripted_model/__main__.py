"""`python -m testbed.scripted_model --host 127.0.0.1 --port 0`: serve until SIGTERM/SIGINT.

Prints exactly one line, `scripted model listening on http://HOST:PORT/v1`, so a
parent process can read the URL (port 0 picks a free port).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from .server import serve


def _parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m testbed.scripted_model", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="port to bind; 0 picks a free one (default 0)",
    )
    return parser.parse_args()


async def _main(host: str, port: int) -> None:
    """Serve, announce the URL, and shut down cleanly on SIGTERM or SIGINT."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    runner, base_url = await serve(host, port)
    print(f"scripted model listening on {base_url}", flush=True)
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    args = _parse_args()
    asyncio.run(_main(args.host, args.port))
