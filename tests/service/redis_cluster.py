"""A real Redis Cluster on loopback for the tests: three ``redis-server --cluster-enabled
yes`` nodes on ports the OS gave as free (each with its cluster bus port, +10000, free
too), each in its own temporary directory, joined by ``redis-cli --cluster create``."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

NODES = 3


def missing_binaries() -> str | None:
    """Why no cluster can be made here (None when redis-server and redis-cli exist)."""
    for binary in ("redis-server", "redis-cli"):
        if shutil.which(binary) is None:
            return f"{binary} is not installed (apt-get install redis-server), so no local cluster"
    return None


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(n: int) -> list[int]:
    """``n`` ports free now whose cluster bus ports (+10000) are free too."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 55_000 and port not in ports and _free(port + 10_000):
            ports.append(port)
    return ports


@dataclass
class LocalCluster:
    """A running cluster: its nodes' ports and the URL that names it."""

    ports: list[int]

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node (worker.queue.connection)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)


def _ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")
    return False


def _wait(what: str, cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise RuntimeError(f"the local Redis cluster did not come up: {what}")


@contextlib.contextmanager
def local_cluster(root: Path) -> Iterator[LocalCluster]:
    """Start the nodes under ``root``, create the cluster, yield it; stop the nodes."""
    ports = _free_ports(NODES)
    procs: list[subprocess.Popen] = []
    try:
        for port in ports:
            d = root / str(port)
            d.mkdir(parents=True)
            procs.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "5000", "--save", "", "--appendonly", "no",
                 "--dir", str(d)],
                stdout=open(d / "log.txt", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
            ))
        _wait("nodes answering", lambda: all(_ping(p) for p in ports))
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )

        def ready(port: int) -> bool:
            out = subprocess.run(["redis-cli", "-p", str(port), "cluster", "info"],
                                 capture_output=True, text=True, timeout=5).stdout
            return "cluster_state:ok" in out

        for port in ports:
            _wait(f"node {port} sees the cluster ok", lambda port=port: ready(port))
        yield LocalCluster(ports)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
