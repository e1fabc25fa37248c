"""Sections, their checks and figures, and the JSON and Markdown reports.

A section runs as ``fn(recorder)``; the recorder collects named checks (passed, failed,
or skipped with a reason), figures for the JSON and tables for the Markdown. An
exception ends only its own section, which is then recorded as failed with the
traceback; the run goes on with the next section.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
JSON_NAME, MARKDOWN_NAME = "gpu_check.json", "gpu_check.md"


@dataclass
class Check:
    """One verdict inside a section."""

    name: str
    status: str
    reason: str | None = None  # why it failed or was skipped
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Table:
    """A Markdown table: a title, column names and rows of cells."""

    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Recorder:
    """What a running section reports."""

    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, reason: str | None = None, **detail: Any) -> bool:
        """Record a verdict; ``reason`` is kept when it failed. Returns ``ok``."""
        self.checks.append(Check(name, PASSED if ok else FAILED, None if ok else reason, detail))
        return ok

    def attempt(self, name: str, fn: Callable[[], T]) -> T | None:
        """``fn()``, or None with a failed check ``name`` saying what it raised (the
        section goes on with its next part)."""
        try:
            return fn()
        except Exception as exc:  # recorded as this part's failure
            self.check(name, False, f"{type(exc).__name__}: {exc}",
                       traceback=traceback.format_exc(limit=6))
            return None

    def skip(self, name: str, reason: str) -> None:
        """Record a check that could not run here, and why."""
        self.checks.append(Check(name, SKIPPED, reason))

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Add a table to the Markdown report."""
        self.tables.append(Table(title, list(columns), [list(r) for r in rows]))

    def note(self, text: str) -> None:
        """A sentence printed under the section in the Markdown report."""
        self.notes.append(text)


def section_status(checks: Sequence[Check], error: str | None) -> str:
    """failed if anything failed (or raised), skipped if nothing ran, else passed."""
    if error is not None or any(c.status == FAILED for c in checks):
        return FAILED
    if not any(c.status == PASSED for c in checks):
        return SKIPPED
    return PASSED


def run_section(name: str, title: str, fn: Callable[[Recorder], None], *,
                skip_reason: str | None = None) -> dict[str, Any]:
    """Run one section, timed; an exception fails this section only."""
    recorder = Recorder()
    error = None
    start = time.perf_counter()
    if skip_reason is not None:
        recorder.skip(name, skip_reason)
    else:
        try:
            fn(recorder)
        except Exception:  # recorded in the report; the next section still runs
            error = traceback.format_exc(limit=8)
    return {
        "name": name,
        "title": title,
        "status": section_status(recorder.checks, error),
        "seconds": round(time.perf_counter() - start, 3),
        "error": error,
        "checks": [asdict(c) for c in recorder.checks],
        "figures": recorder.figures,
        "tables": [asdict(t) for t in recorder.tables],
        "notes": recorder.notes,
    }


def overall_status(sections: Sequence[dict[str, Any]]) -> str:
    """failed when any section failed, else passed (skipped sections say why)."""
    return FAILED if any(s["status"] == FAILED for s in sections) else PASSED


def write_reports(out_dir: Path, result: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``gpu_check.json`` and ``gpu_check.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / JSON_NAME, out_dir / MARKDOWN_NAME
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(result), encoding="utf-8")
    return json_path, md_path


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table_lines(table: dict[str, Any]) -> list[str]:
    lines = [f"**{table['title']}**", "", "| " + " | ".join(table["columns"]) + " |",
             "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table["rows"]]
    return [*lines, ""]


def render_markdown(result: dict[str, Any]) -> str:
    """The human-readable report: a summary table, then each section's checks and tables."""
    device = result["device"]
    lines = [f"# GPU check: {result['status'].upper()}", "",
             f"Device: {device['description']}. Run: `{result['command']}`, "
             f"{result['started']}, {result['seconds']:.0f} s (budget {result['budget_s']} s).", ""]
    if not result["gpu_figures"]:
        lines += ["**This run was not on a GPU: none of its figures are GPU figures.**", ""]
    lines += ["| section | status | seconds |", "|---|---|---|"]
    lines += [f"| {s['title']} | {s['status']} | {s['seconds']:.1f} |" for s in result["sections"]]
    lines.append("")
    if result.get("goals"):
        lines += ["| goal | target | value | met |", "|---|---|---|---|"]
        lines += [f"| {g['goal']} | {g['target']} | {_cell(g['value'])} | "
                  f"{'n/a' if g['met'] is None else ('yes' if g['met'] else 'NO')} |"
                  for g in result["goals"]]
        lines.append("")
    for s in result["sections"]:
        lines += [f"## {s['title']}: {s['status']}", ""]
        lines += [f"{n}" for n in s["notes"]] + ([""] if s["notes"] else [])
        lines += ["| check | status | reason |", "|---|---|---|"]
        lines += [f"| {_cell(c['name'])} | {c['status']} | {_cell(c['reason'])} |"
                  for c in s["checks"]]
        lines.append("")
        for table in s["tables"]:
            lines += _table_lines(table)
        if s["error"]:
            lines += ["```", s["error"].rstrip(), "```", ""]
    return "\n".join(lines)
