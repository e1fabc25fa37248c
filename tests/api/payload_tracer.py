"""Follow one object graph (``payload``) through the code, with ``sys.settrace``.

A frame is *on the path* when a call hands it ``payload`` or something derived from it (a
value returned by a frame on the path, or an object holding one). :meth:`Follow.entries`
lists the project files in the order calls on the path enter them (a call within one file
is not an entry) and counts the entries into a file already entered. ``max_depth`` limits
the frames counted to that many file crossings below the route (None: all)."""
from __future__ import annotations

import datetime
import sys

ROOT_MARKERS = ("/api/", "/worker/")
_SKIP = (str, bytes, int, float, bool, type(None), datetime.datetime)


def _project(path: str) -> str | None:
    if "/.venv/" in path or "site-packages" in path:
        return None
    for m in ROOT_MARKERS:
        i = path.find(m)
        if i >= 0:
            return path[i + 1 :]
    return None


class Follow:
    def __init__(self, seed: object, max_depth: int | None = None) -> None:
        self.tainted: dict[int, object] = {}
        self.events: list[tuple[str, str, str]] = []  # (file, function, kind)
        self.depth_of: dict[int, int] = {}
        self.max_depth = max_depth
        self._taint(seed)
        self.root = None
        self.generators: set[int] = set()

    def _members(self, obj):
        if isinstance(obj, dict):
            return list(obj.values())
        if isinstance(obj, (list, tuple, set, frozenset)):
            return list(obj)
        out = []
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            out += list(d.values())
        extra = getattr(obj, "__pydantic_extra__", None)
        if isinstance(extra, dict):
            out += list(extra.values())
        return out

    @staticmethod
    def _data(obj):
        """Plain data, or an object of the project's own (a request, a job, a row)."""
        if isinstance(obj, (dict, list, tuple, set, frozenset)):
            return True
        mod = type(obj).__module__ or ""
        return mod.startswith(("api.", "worker."))

    def _taint(self, obj, deep=1):
        if isinstance(obj, _SKIP):
            return
        self.tainted[id(obj)] = obj
        if deep:
            for m in self._members(obj):
                if self._data(m):
                    self._taint(m, deep - 1)

    def _is(self, obj):
        if isinstance(obj, _SKIP):
            return False
        if id(obj) in self.tainted:
            return True
        try:
            for m in self._members(obj):
                if isinstance(m, _SKIP):
                    continue
                if id(m) in self.tainted:
                    return True
                if isinstance(m, (list, tuple)) and any(id(x) in self.tainted for x in m):
                    return True
            return False
        except Exception:
            return False

    def entries(self):
        """Cross-file calls only (a caller's resumption, a generator resumed and a call
        within one file are not entries): the files in the order the request enters them."""
        out = []
        for f, fn, kind in self.events:
            if kind != "enter":
                continue
            if not out or out[-1][0] != f:
                out.append([f, [fn]])
            elif fn not in out[-1][1]:
                out[-1][1].append(fn)
        seen, again, lines = set(), 0, []
        for f, fns in out:
            mark = ""
            if f in seen:
                again += 1
                mark = "   <- again"
            seen.add(f)
            lines.append(f"  {f}: {', '.join(fns)}{mark}")
        return out, seen, again, "\n".join(lines)

    def _record(self, frame, kind):
        d = self.depth_of.get(id(frame))
        if d is None or (self.max_depth is not None and d > self.max_depth):
            return
        f = _project(frame.f_code.co_filename)
        if f is not None:
            self.events.append((f, frame.f_code.co_qualname, kind))

    def __call__(self, frame, event, arg):
        if event != "call":
            return self.local
        code = frame.f_code
        if self.root is None:
            self.root = frame
            self.depth_of[id(frame)] = 0
            self._record(frame, "call")
            return self.local
        parent = frame.f_back
        while parent is not None and id(parent) not in self.depth_of:
            parent = parent.f_back
        if parent is None:
            return self.local
        n = code.co_argcount + code.co_kwonlyargcount
        args = [frame.f_locals.get(v) for v in code.co_varnames[:n]]
        if any(self._is(a) for a in args):
            # depth counts project frames on the path between it and the route
            pd = self.depth_of[id(parent)]
            mine, theirs = _project(code.co_filename), _project(parent.f_code.co_filename)
            self.depth_of[id(frame)] = pd + (1 if mine is not None and mine != theirs else 0)
            self._record(frame, "call")
            resumed = False
            if code.co_flags & 0x20:  # a generator: entered once, then only resumed
                resumed = id(frame) in self.generators
                self.generators.add(id(frame))
            if mine is not None and mine != theirs and not resumed:
                self._record(frame, "enter")
        return self.local

    def local(self, frame, event, arg):
        if id(frame) not in self.depth_of:
            return self.local
        if event == "line":
            self._record(frame, "line")
        elif event == "return":
            # only the project's code (and dataclass-made __init__) derives values: what it
            # returns, and the objects it made that hold the request
            path = frame.f_code.co_filename
            if _project(path) is not None or path.startswith("<"):
                code = frame.f_code
                args = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
                self._taint(arg)
                for name, v in list(frame.f_locals.items()):
                    if (name not in args or (name == "self" and path.startswith("<"))) and self._is(v):
                        self._taint(v)
            self.depth_of.pop(id(frame), None)
            # the caller resumes: its next line is a new event
        return self.local

    def run(self, fn, *a, **kw):
        sys.settrace(self)
        try:
            return fn(*a, **kw)
        finally:
            sys.settrace(None)
