"""What a soak run samples every interval: Redis memory and keys, SQL rows and bytes per
table, RSS and open file descriptors of each service process (with its children), and the
files in the API's storage. Plus the figure and table of a run's samples."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

TABLES = ("jobs", "api_jobs", "batches", "batch_progress", "files", "iterations", "workers")

_ID = re.compile(r"(job|batch|file)_[0-9a-f]{8,}|[0-9a-f]{16,}")


def key_kind(key: str, prefix: str) -> str:
    """A Redis key with its ids replaced by ``*`` (``<prefix>:job:deltas:*``)."""
    return _ID.sub("*", key.removeprefix(prefix + ":"))


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants alive now."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out.append(p)
        todo.extend(int(c) for c in children)
    return out


def rss_kib(pid: int) -> int:
    """Resident set size of one process, KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def open_fds(pid: int) -> int:
    """Open file descriptors of one process (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class Sampler:
    """Takes one sample of a running stack: ``sample()`` returns a flat dict."""

    def __init__(self, *, redis_url: str, database_url: str, prefix: str,
                 processes: dict[str, int], storage: Path | None) -> None:
        import psycopg
        import redis

        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.sql = psycopg.connect(database_url, autocommit=True)
        self.prefix = prefix
        self.processes = processes
        self.storage = storage
        self.started = time.monotonic()

    def sample(self) -> dict[str, Any]:
        """One sample (seconds since the sampler started under ``t``)."""
        row: dict[str, Any] = {"t": round(time.monotonic() - self.started, 1),
                               "wall": time.time()}
        row.update(self._redis())
        row.update(self._sql())
        row.update(self._procs())
        row.update(self._files())
        return row

    def _redis(self) -> dict[str, Any]:
        info = self.redis.info("memory")
        kinds: dict[str, int] = {}
        entries: dict[str, int] = {}  # stream entries by kind of stream
        for key in self.redis.scan_iter(match=f"{self.prefix}:*", count=1000):
            kind = key_kind(key, self.prefix)
            kinds[kind] = kinds.get(kind, 0) + 1
            if self.redis.type(key) == "stream":
                entries[kind] = entries.get(kind, 0) + int(self.redis.xlen(key))
        queued = sum(n for k, n in entries.items() if k.startswith("jobs:") and k != "jobs:dead")
        return {"redis_used_memory": int(info["used_memory"]),
                "redis_keys": sum(kinds.values()), "redis_stream_entries": queued,
                "redis_key_kinds": kinds, "redis_stream_kinds": entries}

    def _sql(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with self.sql.cursor() as cur:
            for table in TABLES:
                cur.execute(f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}")
                rows, size = cur.fetchone()  # type: ignore[misc]
                out[f"rows_{table}"] = int(rows)
                out[f"bytes_{table}"] = int(size)
            cur.execute("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")
            out["open_jobs"] = int(cur.fetchone()[0])  # type: ignore[index]
            cur.execute("SELECT count(*) FROM api_jobs WHERE webhook_state = 'pending'")
            out["pending_webhooks"] = int(cur.fetchone()[0])  # type: ignore[index]
        return out

    def _procs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, pid in self.processes.items():
            tree = process_tree(pid)
            out[f"rss_kib_{name}"] = rss_kib(pid)
            out[f"fds_{name}"] = open_fds(pid)
            out[f"rss_kib_{name}_tree"] = sum(rss_kib(p) for p in tree)
            out[f"fds_{name}_tree"] = sum(open_fds(p) for p in tree)
            out[f"procs_{name}_tree"] = len(tree)
        return out

    def _files(self) -> dict[str, Any]:
        count = size = staging = 0
        if self.storage is not None and self.storage.exists():
            for path in self.storage.rglob("*"):
                if path.is_file():
                    count += 1
                    size += path.stat().st_size
                    staging += path.parent.name == "staging"
        return {"storage_files": count, "storage_bytes": size, "staging_files": staging}

    def close(self) -> None:
        """Close the connections."""
        self.sql.close()
        self.redis.close()


def table(samples: list[dict[str, Any]], at: list[float]) -> str:
    """A markdown table of the samples nearest each of the times ``at`` (seconds)."""
    names = sorted({k for s in samples for k in s if k.startswith("rss_kib_")
                    and not k.endswith("_tree")})
    head = ["t (min)", "Redis used_memory (KiB)", "Redis keys", "stream entries",
            *(f"rows {t}" for t in ("jobs", "api_jobs", "batches", "files", "iterations")),
            "jobs + api_jobs (KiB on disk)", "storage files",
            *(f"RSS {n.removeprefix('rss_kib_')} (MiB)" for n in names),
            *(f"fds {n.removeprefix('rss_kib_')}" for n in names)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for want in at:
        s = min(samples, key=lambda x: abs(x["t"] - want))
        cells = [f"{s['t'] / 60:.0f}", f"{s['redis_used_memory'] // 1024:,}",
                 str(s["redis_keys"]), str(s["redis_stream_entries"]),
                 *(f"{s[f'rows_{t}']:,}" for t in ("jobs", "api_jobs", "batches", "files",
                                                   "iterations")),
                 f"{(s['bytes_jobs'] + s['bytes_api_jobs']) // 1024:,}",
                 str(s["storage_files"]),
                 *(f"{s[n] / 1024:.0f}" for n in names),
                 *(str(s[n.replace('rss_kib_', 'fds_')]) for n in names)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(samples: list[dict[str, Any]], path: Path, title: str) -> None:
    """Four panels over time: Redis memory, SQL rows per table, RSS per process, open
    file descriptors per process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    ax = axes[0][0]
    ax.plot(t, [s["redis_used_memory"] / 2**20 for s in samples], label="used_memory")
    ax.set_ylabel("Redis MiB")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(t, [s["redis_keys"] for s in samples], color="tab:orange", label="keys")
    ax2.set_ylabel("keys (orange)")
    ax2.set_ylim(bottom=0)
    ax = axes[0][1]
    for name in ("jobs", "api_jobs", "batches", "files", "iterations"):
        ax.plot(t, [s[f"rows_{name}"] for s in samples], label=name)
    ax.set_ylabel("SQL rows")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    procs = sorted({k.removeprefix("rss_kib_") for s in samples for k in s
                    if k.startswith("rss_kib_") and not k.endswith("_tree")})
    ax = axes[1][0]
    for name in procs:
        ax.plot(t, [s[f"rss_kib_{name}"] / 1024 for s in samples], label=name)
    ax.set_ylabel("RSS MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax = axes[1][1]
    for name in procs:
        ax.plot(t, [s[f"fds_{name}"] for s in samples], label=name)
    ax.set_ylabel("open file descriptors")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
