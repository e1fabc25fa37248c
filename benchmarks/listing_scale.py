"""The job listing as the table grows: the keyset cursor against OFFSET, the whole listing
walked page by page, and ``inflight jobs --limit 0`` streaming it.

    .venv/bin/python benchmarks/listing_scale.py [--sizes 1000,10000,100000] [--repeats 5]
        [--out listing_scale.json]

It creates a throwaway PostgreSQL database on 127.0.0.1:5432 (dropped at the end), runs the
migrations, and grows the ``jobs`` table to each size in turn: that many rows of one tenant
(queued in bursts of ``--burst`` sharing one ``queued_at``, as one enqueue call stamps them,
three in ten finished with a result text) plus ``--others`` times as many rows of four
other tenants at the same instants, bulk-inserted with SQLAlchemy core ``insert``
(executemany). After ``ANALYZE``, each figure is the median of ``--repeats`` runs:

- the first page (``--page`` rows) and the page after the job at 90 % of the tenant's list,
  through ``list_jobs`` with the keyset (``after``); the same deep page with OFFSET (a raw
  select here: the product has no OFFSET any more);
- the whole tenant listing walked with the keyset in pages of 1,000 (the CLI's page), and the
  same walk without the tenant filter (every tenant's rows);
- ``inflight jobs --tenant T --limit 0 --json`` as a subprocess (stdout counted, so every row
  is checked to arrive): wall time and its own peak RSS (``wait4`` in a small wrapper
  process, see :data:`PEAK_RSS_WRAPPER`).

Not a test: it prints a Markdown table, the least-squares slope of each walk (seconds per
1,000 rows) with its worst point's ratio to the fit, and writes the figures as JSON to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from benchmarks.service_stack import throwaway_database
from cli.bench.linear_fit import LinearFit, fit_line
from cli.bench.machine import cpu_description
from worker.store.crud.jobs import after_job, list_jobs
from worker.store.db import make_engine, make_session_factory
from worker.store.models import Job

ROOT = Path(__file__).resolve().parents[1]
TENANT = "bench"
OTHER_TENANTS = ("other-a", "other-b", "other-c", "other-d")
WALK_PAGE = 1000  # what cli.jobs_cmd reads per query
CHUNK = 5000  # rows per executemany
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
WALKS = {"walk_s": "keyset, tenant", "walk_all_tenants_s": "keyset, all tenants",
         "cli_s": "`inflight jobs --limit 0 --json`"}  # figure -> label of its fit
PROMPT = "Summarize the following paragraph in two sentences. " * 4
ANSWER = "The paragraph argues that keyset pagination keeps every page cheap. " * 5


def job_row(index: int, tenant: str, burst: int) -> dict[str, Any]:
    """One ``jobs`` row; rows of one burst share their ``queued_at`` (ids break the tie)."""
    done = index % 10 < 3
    return {
        "id": "job_" + uuid.uuid4().hex, "tenant": tenant, "batch_id": None,
        "custom_id": f"req-{index}", "queue_class": "batch",
        "status": "succeeded" if done else "queued", "priority": 0,
        "request": {"url": "/v1/chat/completions", "body": {
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64}},
        "text": ANSWER if done else None, "finish_reason": "length" if done else None,
        "prompt_tokens": 48 if done else None, "completion_tokens": 64 if done else None,
        "queued_at": T0 + timedelta(milliseconds=index // burst), "attempts": int(done),
    }  # fmt: skip


def grow(engine: Engine, start: int, stop: int, args: argparse.Namespace) -> None:
    """Add the tenant's rows ``start`` .. ``stop`` - 1 and the other tenants' share of rows
    at the same instants, ``CHUNK`` rows per executemany; then ANALYZE."""
    per_other = max(1, round(args.others / len(OTHER_TENANTS) * 100))  # per 100 of ours
    rows: list[dict[str, Any]] = []
    with engine.begin() as conn:
        for i in range(start, stop):
            rows.append(job_row(i, TENANT, args.burst))
            if i % 100 < per_other:
                rows += [job_row(i, t, args.burst) for t in OTHER_TENANTS]
            if len(rows) >= CHUNK:
                conn.execute(insert(Job), rows)
                rows = []
        if rows:
            conn.execute(insert(Job), rows)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE jobs"))


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    """The median wall time of ``repeats`` calls of ``fn``, and every time."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def offset_page(sf: sessionmaker[Session], offset: int, limit: int) -> list[Job]:
    """The tenant's page at ``offset`` the way the listing used to read it."""
    stmt = (select(Job).where(Job.tenant == TENANT).order_by(Job.queued_at, Job.id)
            .offset(offset).limit(limit))
    with sf() as s:
        return list(s.scalars(stmt))


def keyset_page(sf: sessionmaker[Session], after: str | None, limit: int,
                tenant: str | None = TENANT) -> list[Job]:
    """One page of the product's listing (``list_jobs`` with the cursor)."""
    with sf() as s:
        return list_jobs(session=s, tenant=tenant, after=after, limit=limit)


def walk(sf: sessionmaker[Session], tenant: str | None,
         page_times: list[float] | None = None) -> int:
    """The whole listing, ``WALK_PAGE`` rows per query, as the CLI walks it; rows seen.
    Each page's seconds are appended to ``page_times`` when given."""
    after, seen = None, 0
    while True:
        t0 = time.perf_counter()
        page = keyset_page(sf, after, WALK_PAGE, tenant)
        if page_times is not None:
            page_times.append(time.perf_counter() - t0)
        seen += len(page)
        if len(page) < WALK_PAGE:
            return seen
        after = page[-1].id


def page_cost_by_depth(sf: sessionmaker[Session]) -> dict[str, float]:
    """Median seconds of a full page in the first and in the last tenth of the tenant's
    walk: equal when a page's cost does not depend on how deep it is."""
    times: list[float] = []
    walk(sf, TENANT, times)
    full = times[:-1] or times  # the last page may be short
    tenth = max(1, len(full) // 10)
    return {"first_tenth_page_s": statistics.median(full[:tenth]),
            "last_tenth_page_s": statistics.median(full[-tenth:])}


def deep_page_indexes(engine: Engine, after: str, limit: int) -> list[str]:
    """The indexes PostgreSQL's plan for the deep keyset page reads (what serves it)."""
    with sessionmaker(bind=engine)() as s:
        query = (select(Job).where(Job.tenant == TENANT, after_job(after))
                 .order_by(Job.queued_at, Job.id).limit(limit))
        sql = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
        plan = s.execute(text("EXPLAIN (FORMAT JSON) " + sql)).scalar_one()
    found: list[str] = []

    def visit(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            found.append(node["Index Name"])
        for child in node.get("Plans", []):
            visit(child)

    visit(plan[0]["Plan"])
    return found


# Spawns the command and writes its own peak RSS (kB) to fd argv[1]. A child of this
# process would not do: Linux carries the parent's peak RSS into a child's ru_maxrss when it
# execs, so the CLI is started by this small interpreter instead (its peak is far below).
PEAK_RSS_WRAPPER = """
import os, sys
fd, cmd = int(sys.argv[1]), sys.argv[2:]
pid = os.posix_spawn(cmd[0], cmd, os.environ)
_, status, usage = os.wait4(pid, 0)
os.write(fd, str(usage.ru_maxrss).encode())
sys.exit(os.waitstatus_to_exitcode(status))
"""


def cli_run(url: str, expected: int, limit: str = "0") -> dict[str, float]:
    """``inflight jobs --tenant T --limit LIMIT --json``: wall seconds and its peak RSS
    (``wait4`` on it, through :data:`PEAK_RSS_WRAPPER`); fails unless it exits 0 after
    printing ``expected`` lines."""
    cmd = [sys.executable, "-m", "cli.main", "jobs", "--tenant", TENANT,
           "--limit", limit, "--json", "--database-url", url]
    read_end, write_end = os.pipe()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", PEAK_RSS_WRAPPER, str(write_end), *cmd],
                            cwd=ROOT, stdout=subprocess.PIPE, pass_fds=(write_end,))
    os.close(write_end)
    assert proc.stdout is not None
    lines = sum(1 for _ in proc.stdout)
    proc.wait()
    wall = time.perf_counter() - t0
    with os.fdopen(read_end, "rb") as peak:
        peak_kb = int(peak.read() or 0)
    if proc.returncode != 0 or lines != expected:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}, {lines} lines, "
                           f"expected {expected}")
    return {"wall_s": wall, "peak_rss_bytes": peak_kb * 1024}  # Linux counts kilobytes


def measure(engine: Engine, url: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure at the current table size (``size`` rows of the tenant)."""
    sf = make_session_factory(engine=engine)
    with sf() as s:
        ids = list(s.scalars(select(Job.id).where(Job.tenant == TENANT)
                             .order_by(Job.queued_at, Job.id)))
        total = s.scalar(select(func.count()).select_from(Job)) or 0
    assert len(ids) == size, (len(ids), size)
    deep = int(size * 0.9)
    if keyset_page(sf, ids[deep - 1], args.page)[0].id != ids[deep] or \
            offset_page(sf, deep, args.page)[0].id != ids[deep]:
        raise RuntimeError("the keyset and the OFFSET deep pages disagree")
    if (walk(sf, TENANT), walk(sf, None)) != (size, total):
        raise RuntimeError("a keyset walk missed or repeated rows")
    figures: dict[str, Any] = {"rows": size, "table_rows": int(total), "samples": {}}
    timed = {
        "first_page_s": lambda: keyset_page(sf, None, args.page),
        "deep_keyset_s": lambda: keyset_page(sf, ids[deep - 1], args.page),
        "deep_offset_s": lambda: offset_page(sf, deep, args.page),
        "walk_s": lambda: walk(sf, TENANT),
        "walk_all_tenants_s": lambda: walk(sf, None),
    }
    for name, fn in timed.items():
        figures[name], figures["samples"][name] = median_time(fn, args.repeats)
    cli = [cli_run(url, size) for _ in range(args.repeats)]
    figures["cli_s"] = statistics.median(r["wall_s"] for r in cli)
    figures["cli_peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in cli)
    figures["samples"]["cli"] = cli
    figures["deep_keyset_indexes"] = deep_page_indexes(engine, ids[deep - 1], args.page)
    figures.update(page_cost_by_depth(sf))
    return figures


def walk_fit(rows: list[dict[str, Any]], key: str) -> LinearFit:
    """Least-squares line of figure ``key`` against the rows that walk reads (the whole
    table for the walk without the tenant filter, the tenant's rows otherwise)."""
    sizes = [r["table_rows"] if key == "walk_all_tenants_s" else r["rows"] for r in rows]
    return fit_line(sizes, [r[key] for r in rows])


def report(rows: list[dict[str, Any]], baseline: dict[str, float], context: str) -> str:
    """The Markdown table, the fit of each walk, and the machine line."""
    ms, mb = 1000.0, 1 / 2**20
    out = ["| tenant rows (table) | first page ms | deep page, keyset ms | deep page, OFFSET ms "
           "| walk s (tenant) | µs/row | walk page ms, first / last tenth | walk s (all tenants) "
           "| µs/row | `jobs --limit 0 --json` s | CLI peak RSS MB |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['rows']:,} ({r['table_rows']:,}) | {r['first_page_s'] * ms:.2f} | "
                   f"{r['deep_keyset_s'] * ms:.2f} | {r['deep_offset_s'] * ms:.2f} | "
                   f"{r['walk_s']:.3f} | {r['walk_s'] / r['rows'] * 1e6:.1f} | "
                   f"{r['first_tenth_page_s'] * ms:.1f} / {r['last_tenth_page_s'] * ms:.1f} | "
                   f"{r['walk_all_tenants_s']:.3f} | "
                   f"{r['walk_all_tenants_s'] / r['table_rows'] * 1e6:.1f} | {r['cli_s']:.2f} | "
                   f"{r['cli_peak_rss_bytes'] * mb:.0f} |")
    out += ["", "| walk | slope, s per 1,000 rows | intercept s | worst point / fit | "
            "marginal cost, last interval / first |", "|---|---|---|---|---|"]
    for key, label in WALKS.items():
        fit = walk_fit(rows, key)
        out.append(f"| {label} | {fit.slope * 1000:.4f} | {fit.intercept:.3f} | "
                   f"{fit.worst_ratio:.3f} | {fit.marginal_growth:.3f} |")
    out += ["", f"`inflight jobs --limit 1 --json` (start-up alone): {baseline['wall_s']:.2f} s, "
            f"peak RSS {baseline['peak_rss_bytes'] * mb:.0f} MB. {context}"]
    return "\n".join(out)


def fits(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The linear fit of each walk, JSON-ready."""
    out = {}
    for key in WALKS:
        fit = walk_fit(rows, key)
        out[key] = {"slope_s_per_1k_rows": fit.slope * 1000, "intercept_s": fit.intercept,
                    "ratios": list(fit.ratios), "worst_ratio": fit.worst_ratio,
                    "marginal_growth": fit.marginal_growth}
    return out


def main(argv: list[str] | None = None) -> int:
    """Grow the table through every size, print the table and write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="the tenant's rows, ascending")
    p.add_argument("--repeats", type=int, default=5, help="runs per figure (the median counts)")
    p.add_argument("--page", type=int, default=100, help="rows of the first and the deep page")
    p.add_argument("--burst", type=int, default=50, help="rows sharing one queued_at")
    p.add_argument("--others", type=float, default=0.2,
                   help="other tenants' rows per row of the tenant")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    sizes = sorted(int(x) for x in args.sizes.split(","))
    rows: list[dict[str, Any]] = []
    with throwaway_database(prefix="inflight_listing") as url:
        engine = make_engine(url=url)
        try:
            with engine.connect() as conn:
                server = conn.execute(text("SHOW server_version")).scalar_one()
            grown = 0
            for size in sizes:
                t0 = time.perf_counter()
                grow(engine, grown, size, args)
                grown = size
                print(f"{size:,} rows inserted in {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr)
                rows.append(measure(engine, url, size, args))
                print(f"{size:,}: " + ", ".join(f"{k} {v:.4f}" for k, v in rows[-1].items()
                                               if k.endswith("_s")), file=sys.stderr)
            baseline = cli_run(url, 1, limit="1")
        finally:
            engine.dispose()
    cpu = cpu_description()
    context = (f"PostgreSQL {server}, Python {platform.python_version()}, {os.cpu_count()} cores. "
               f"CPU: {cpu['model']} ({', '.join(cpu['vector_extensions'])}). Median of "
               f"{args.repeats}; pages of {args.page} (first/deep) and {WALK_PAGE} (walks).")
    print(report(rows, baseline, context))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"cpu": cpu, "postgresql": server, "cores": os.cpu_count(), "args": vars(args),
             "cli_baseline": baseline, "rows": rows, "fits": fits(rows)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
