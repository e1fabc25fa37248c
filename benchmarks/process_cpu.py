"""CPU seconds used so far by the processes around a benchmark, from ``/proc`` (Linux only):
a process with its descendants (the API and its server workers), this process, and every
process of a given name (``redis-server``, ``postgres``). Take two samples and subtract."""

from __future__ import annotations

import os
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def read_stat(path: Path) -> tuple[str, int, int] | None:
    """A ``/proc/.../stat`` file's command name, parent pid and user + system CPU ticks;
    None when the process or thread just ended."""
    try:
        raw = path.read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1: raw.rindex(")")]
    fields = raw.rsplit(")", 1)[1].split()  # fields[0] is the state, [1] the parent
    return name, int(fields[1]), int(fields[11]) + int(fields[12])  # utime, stime


def _stats() -> dict[int, tuple[str, int, float]]:
    """pid -> (command name, parent pid, user + system CPU seconds) of every process."""
    out: dict[int, tuple[str, int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := read_stat(entry / "stat")) is not None:
            name, parent, ticks = stat
            out[int(entry.name)] = (name, parent, ticks / TICKS_PER_S)
    return out


def cpu_sample(tree_roots: dict[str, int], names: tuple[str, ...]) -> dict[str, float]:
    """CPU seconds so far of each ``tree_roots`` process with its descendants (by label),
    of this process (``self``) and of all processes called each of ``names``."""
    stats = _stats()
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    out: dict[str, float] = {}
    for label, root in tree_roots.items():
        total, todo = 0.0, [root]
        while todo:
            pid = todo.pop()
            if pid in stats:
                total += stats[pid][2]
                todo += children.get(pid, [])
        out[label] = total
    own = os.getpid()
    out["self"] = stats[own][2] if own in stats else 0.0
    for name in names:
        out[name] = sum(s[2] for s in stats.values() if s[0] == name)
    return out


def cores_used(first: dict[str, float], last: dict[str, float], seconds: float) -> dict[str, float]:
    """Each label's CPU seconds between two samples over ``seconds``: cores it kept busy."""
    return {k: (last[k] - first[k]) / seconds for k in first if k in last}
