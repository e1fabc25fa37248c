"""Real service processes for the fault tests: start, wait until serving, kill -9."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s; no-op when it already exited."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class ApiProcess:
    """``inflight api`` in a child process, configured through the environment."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "ab")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "api", "--port", str(self.port),
             "--log-level", "warning"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_serving(timeout=60)

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the API exited with {self.proc.returncode}"
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("the API did not start serving")

    def kill9(self) -> None:
        """SIGKILL: no shutdown hook runs."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """Terminate (if still running) and close the log."""
        terminate(self.proc)
        self._log.close()


class CeleryWorker:
    """A Celery control-plane worker (prefork, one child) in a child process."""

    def __init__(self, env: dict[str, str], queue: str, log: Path) -> None:
        self._log = open(log, "ab")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "api.control.celery_main", "worker",
             "-P", "prefork", "-c", "1", "-Q", queue, "--without-heartbeat",
             "--without-mingle", "--without-gossip", "-l", "warning"],
            cwd=ROOT,
            env={**os.environ, **env, "INFLIGHT_CELERY_EAGER": "0"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def children(self) -> list[int]:
        """Pids of the pool's child processes."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(x) for x in path.read_text().split()] if path.exists() else []

    def stop(self) -> None:
        """Terminate (if still running) and close the log."""
        terminate(self.proc)
        self._log.close()


class PrivateRedis:
    """A redis-server of the test's own on a free port (no persistence), so a test can
    pause, restart or shut it down without touching the shared one."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        """Start (again, after a shutdown) on the same port, with no data."""
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self._workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        """Kill it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class StallingProxy:
    """Forward 127.0.0.1:<port> to a target port; ``stall()`` stops every byte (connections
    stay open, new ones are accepted but go nowhere), as a network partition does: a client
    hangs in its query instead of failing fast. ``resume()`` lets everything through again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.flowing = threading.Event()
        self.flowing.set()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self.flowing.wait()
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            client.close()
            return
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self.flowing.wait()  # stalled: hold the bytes until resumed
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stall(self) -> None:
        """Stop forwarding."""
        self.flowing.clear()

    def resume(self) -> None:
        """Forward again (held bytes go through)."""
        self.flowing.set()

    def close(self) -> None:
        """Stop accepting."""
        self.flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
