"""Run an app under uvicorn in a background thread (tests, the load benchmark)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThreadedServer:
    """``with ThreadedServer(app) as url:`` serves ``app`` on 127.0.0.1 until the block ends."""

    def __init__(
        self, app: Any, *, port: int | None = None, log_level: str = "warning", **config: Any
    ) -> None:
        import uvicorn

        self.port = port or free_port()
        cfg = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level=log_level, lifespan="on", **config
        )
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        """The base URL."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
