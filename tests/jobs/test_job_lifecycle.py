"""The job status transition table and its moves, and who writes ``jobs.status``: every
function in ``worker/`` and ``api/`` that writes it is found by reading the code, and each
must be in the store's status-write module, which only the lifecycle (``worker/jobs``)
imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from worker.store.job_lifecycle import (
    CANCEL,
    FINISH,
    HAND_BACK,
    HELD,
    MOVES,
    OPEN,
    RECORD_CANCEL,
    START,
    TERMINAL,
    TRANSITIONS,
    is_allowed,
    sources,
)

ROOT = Path(__file__).resolve().parents[2]
STATUS_WRITES = "worker/store/crud/job_status.py"
LIFECYCLE = "worker/jobs/"


def test_terminal_statuses_are_final_and_open_ones_can_end_every_way() -> None:
    assert set(TERMINAL) == {"succeeded", "failed", "cancelled"} and set(OPEN) == {"queued", "running"}
    for ended in TERMINAL:
        assert not any(is_allowed(ended, other) for other in TRANSITIONS)  # not even to itself
    for status in OPEN:
        assert all(is_allowed(status, ended) for ended in TERMINAL)


def test_the_writes_start_only_from_what_the_table_allows() -> None:
    assert sources("running") == ("queued", "running")  # a redelivery re-starts a running job
    assert sources("queued") == ("running",)  # only a started job is handed back
    assert set(sources("succeeded")) == set(sources("failed")) == set(sources("cancelled")) == set(OPEN)
    assert not is_allowed("queued", "queued")


def test_every_move_is_in_the_table_and_every_edge_has_a_move() -> None:
    made = set()
    for move in MOVES:
        assert move.sources and move.targets, move
        for old in move.sources:
            for new in move.targets:
                assert is_allowed(old, new), (move.name, old, new)
                made.add((old, new))
    edges = {(old, new) for old, nxt in TRANSITIONS.items() for new in nxt}
    assert made == edges, f"edges no move makes: {edges - made}"


def test_the_moves_say_what_the_lifecycle_does() -> None:
    assert HELD == ("running",)
    assert START.sources == ("queued", "running") and HAND_BACK.sources == ("running",)
    assert FINISH.sources == OPEN and set(FINISH.targets) == set(TERMINAL)
    # a cancel ends at once only what no worker holds; a held job's cancel is recorded
    assert CANCEL.sources == ("queued",) and RECORD_CANCEL.sources == RECORD_CANCEL.targets == HELD


# ------------------------------------------------------------- who writes jobs.status

_WRITE_CALLS = {"update", "insert", "pg_insert", "sqlite_insert"}
_RAW_WRITE = ("update jobs", "insert into jobs")


def _mentions_job_table(node: ast.AST, aliases: set[str]) -> bool:
    """``Job``, ``Job.__table__``, or a name bound to one of them."""
    if isinstance(node, ast.Name):
        return node.id == "Job" or node.id in aliases
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "__table__"
        and isinstance(node.value, ast.Name)
        and node.value.id == "Job"
    )


def _is_new_row(node: ast.AST, rows: set[str]) -> bool:
    """``Job(...)``, or a name bound to one (a row only once added to a session)."""
    if isinstance(node, ast.Name):
        return node.id in rows
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Job"


def _imports_job_model(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.ImportFrom)
        and (n.module or "").startswith("worker.store.models")
        and any(a.name == "Job" for a in n.names)
        for n in ast.walk(tree)
    )


def _updates_without_status(fn: ast.AST) -> set[int]:
    """ids of the ``update(...)`` calls whose statement sets its columns only by name, none
    of them ``status`` (``update(Job).where(...).values(text=None)``: retention clearing
    results), which therefore write no status. One ``.values`` that may set it (a
    ``status=``, a dict, a ``**`` splat, or none at all) anywhere on the chain counts."""
    clean: set[int] = set()
    dirty: set[int] = set()
    for n in ast.walk(fn):
        if not (isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "values"):
            continue
        names = [k.arg for k in n.keywords]
        ok = not n.args and bool(names) and None not in names and "status" not in names
        (clean if ok else dirty).update(
            id(c) for c in ast.walk(n.func)
            if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "update"
        )
    return clean - dirty


def _writes_status(fn: ast.AST, orm_module: bool) -> bool:
    """Whether this function writes ``jobs.status``: an UPDATE or INSERT on the jobs table
    (SQLAlchemy core or raw SQL), a ``Job(...)`` added to a session, or, in a module that
    imports the ``Job`` model, an assignment to some ``.status``."""
    aliases = {
        t.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None
        and _mentions_job_table(n.value, set())
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Name)
    }
    rows = {
        t.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and _is_new_row(n.value, set())
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    spared = _updates_without_status(fn)
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and id(n) not in spared:
            name = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            if name in _WRITE_CALLS and n.args and _mentions_job_table(n.args[0], aliases):
                return True
            if name in ("add", "add_all", "merge") and any(
                _is_new_row(a, rows) for arg in n.args for a in ast.walk(arg)
            ):
                return True
            if name == "setattr" and len(n.args) > 1 and getattr(n.args[1], "value", None) == "status":
                return orm_module
        if isinstance(n, ast.Call | ast.Assign) and any(  # raw SQL (not a docstring)
            isinstance(c, ast.Constant) and isinstance(c.value, str)
            and any(w in " ".join(c.value.lower().split()) for w in _RAW_WRITE)
            for c in ast.walk(n)
        ):
            return True
        targets = (n.targets if isinstance(n, ast.Assign)
                   else [n.target] if isinstance(n, ast.AugAssign | ast.AnnAssign) else [])
        if orm_module and any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
            return True
    return False


def status_writers_in(source: str, path: str) -> list[str]:
    """``path:function`` of each function (innermost) of ``source`` that writes
    ``jobs.status``; ``path:<module>`` for a write outside any function."""
    tree = ast.parse(source)
    orm_module = _imports_job_model(tree)
    found: list[str] = []

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if _writes_status(child, orm_module) and not any(
                    isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef)
                    and _writes_status(inner, orm_module)
                    for inner in ast.walk(child) if inner is not child
                ):
                    found.append(f"{path}:{child.name}")
                visit(child, child.name)
            elif isinstance(child, ast.ClassDef):
                visit(child, owner)
            elif owner == "<module>" and _writes_status(child, orm_module):
                found.append(f"{path}:<module>")

    visit(tree, "<module>")
    return found


def status_writers() -> list[str]:
    """Every function under ``worker/`` and ``api/`` that writes ``jobs.status``."""
    found: list[str] = []
    for top in ("worker", "api"):
        for file in sorted((ROOT / top).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            found += status_writers_in(file.read_text(), rel)
    return found


def test_every_status_write_is_in_the_status_write_module() -> None:
    writers = status_writers()
    home = {w.split(":")[1] for w in writers if w.startswith(STATUS_WRITES + ":")}
    assert home >= {"create_jobs", "start_jobs", "finish_jobs", "fail_job", "requeue_jobs",
                    "_cancel", "cancel_queued_batch_jobs"}, f"the scan missed writes: {home}"
    outside = [w for w in writers if not w.startswith(STATUS_WRITES + ":")]
    assert not outside, f"jobs.status written outside {STATUS_WRITES}: {outside}"


def test_only_the_lifecycle_imports_the_status_writes() -> None:
    importers = []
    for top in ("worker", "api", "benchmarks", "migrations"):
        for file in sorted((ROOT / top).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            for n in ast.walk(ast.parse(file.read_text())):
                names = (
                    [a.name for a in n.names] if isinstance(n, ast.Import)
                    else [f"{n.module}.{a.name}" for a in n.names] if isinstance(n, ast.ImportFrom)
                    else []
                )
                if any(name.startswith("worker.store.crud.job_status") for name in names):
                    importers.append(rel)
    assert importers, "nothing imports the status writes: the scan is broken"
    assert all(rel.startswith(LIFECYCLE) for rel in importers), importers
    contracts = (ROOT / "pyproject.toml").read_text()
    assert 'protected_modules = ["worker.store.crud.job_status"]' in contracts
    assert 'allowed_importers = ["worker.jobs"]' in contracts


@pytest.mark.parametrize(
    "snippet",
    [
        "from worker.store.models import Job\ndef f(s):\n    s.execute(update(Job).values(status='x'))\n",
        "def f(s):\n    t = Job.__table__\n    s.execute(update(t).values(status='x'))\n",
        "from worker.store.models import Job\ndef f(s, i):\n    s.get(Job, i).status = 'failed'\n",
        "def f(s):\n    s.execute(text('UPDATE  jobs SET status = :s'))\n",
        "def f(s):\n    s.add(Job(id='j', request={}))\n",
        "def f(s):\n    row = Job(id='j')\n    s.add_all([row])\n",
        "class C:\n    def f(self, s):\n        s.execute(insert(Job), [])\n",
        "def f(s):\n    s.execute(update(Job).values(text=None).values(status='x'))\n",
        "def f(s, v):\n    s.execute(update(Job).where(Job.id == 1).values(text=None, **v))\n",
        "def f(s):\n    s.execute(update(Job).values({'status': 'x'}))\n",
        "def f(s):\n    s.execute(update(Job), [{'id': 1, 'status': 'x'}])\n",
    ],
)
def test_the_scan_finds_each_way_of_writing_a_status(snippet: str) -> None:
    assert status_writers_in(snippet, "x.py") in (["x.py:f"],)


def test_the_scan_leaves_other_tables_and_reads_alone() -> None:
    other = (
        "from worker.store.models import Batch, Job\n"
        "def f(s, b):\n    s.execute(update(Batch).values(status='x'))\n"
        "    s.execute(select(Job.status).where(Job.status == 'queued'))\n"
        "def g(row):\n    return row.status\n"
    )
    assert status_writers_in(other, "x.py") == []
    assert status_writers_in("def h(w):\n    w.status = 'running'\n", "x.py") == []
    # clearing other columns by name (retention) writes no status
    clear = "def c(s):\n    s.execute(update(Job).where(Job.id == 1).values(text=None))\n"
    assert status_writers_in(clear, "x.py") == []
    # a row made to render an answer, never added to a session, writes nothing
    assert status_writers_in("def r(j):\n    return [Job(id=j, status='queued')]\n", "x.py") == []
