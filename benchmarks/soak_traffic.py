"""The mixed traffic of a soak run, as tenants would send it: jobs (some with webhooks to
a local receiver, some replayed with an Idempotency-Key, some cancelled), requests the API
must refuse, OpenAI chat completions, batches with bad lines (some cancelled), and the
clean-up a careful client does (reading each finished batch's files, then deleting the
files that would otherwise stay). Every finished batch is checked: each request line of
its input in exactly one of its two files, once."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

BATCH_ENDED = ("completed", "failed", "expired", "cancelled")


class Receiver:
    """A local webhook receiver: ``/hook/ok`` answers 204, ``/hook/flaky`` 500 on a
    delivery's first attempt and 204 after; counts the 2xx answers per job id."""

    def __init__(self) -> None:
        self.accepted: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                job_id = self.headers.get("X-Inflight-Job-Id", "?")
                attempt = self.headers.get("X-Inflight-Delivery-Attempt", "1")
                ok = not (self.path.startswith("/hook/flaky") and attempt == "1")
                with receiver._lock:
                    (receiver.accepted if ok else receiver.refused)[job_id] += 1
                self.send_response(204 if ok else 500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, kind: str) -> str:
        """A callback URL of kind ``ok`` or ``flaky``."""
        return f"http://127.0.0.1:{self.port}/hook/{kind}"

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


# Bodies the API must refuse with a 4xx: raw JSON text, so non-finite numbers and lone
# surrogates reach it as a client would send them.
BAD_BODIES = (
    '{"prompt": "x", "bogus_field": 1}',
    '{"prompt": "x", "max_tokens": 1e400}',
    '{"prompt": "\\ud800 lone surrogate"}',
    '{"prompt": "x", "max_tokens": -3}',
    '{"messages": "not a list"}',
    '{"prompt": "x", "callback_url": "http://10.0.0.1/internal"}',
    '{"prompt": "x", "n": 100000}',
    "{not json",
)

BAD_LINES = (
    "{oops",
    '{"custom_id": "c", "method": "POST", "url": "/v1/completions", '
    '"body": {"prompt": "x", "top_p": 1e400}}',
    '{"custom_id": "c", "method": "POST", "url": "/v1/completions", '
    '"body": {"prompt": "x", "unknown": true}}',
    "[1, 2]",
)


@dataclass
class Tracked:
    """A batch this client created and has not cleaned up yet."""

    batch_id: str
    tenant: int
    input_file_id: str
    lines: list[str]
    keep_outputs: bool  # created with output_expires_after: its files expire on their own


@dataclass
class Traffic:
    """One client per tenant; ``step()`` does one randomly chosen action."""

    base_url: str
    keys: list[str]
    receiver: Receiver
    dead_port: int
    seed: int = 0
    batch_lines: tuple[int, int] = (3, 16)
    counts: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    open_batches: list[Tracked] = field(default_factory=list)
    recent_jobs: list[tuple[int, str]] = field(default_factory=list)
    model: str | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.clients = [httpx.Client(base_url=self.base_url, timeout=60.0,
                                     headers={"Authorization": f"Bearer {k}"})
                        for k in self.keys]

    def wait_for_model(self, timeout: float) -> None:
        """Wait until a worker serves a model (the API lists it); RuntimeError after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            models = self.clients[0].get("/v1/models")
            data = models.json().get("data", []) if models.status_code == 200 else []
            if data:
                self.model = data[0]["id"]
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker served a model within {timeout:.0f} s")
            time.sleep(0.5)
        # the engine's first steps build and load its kernels: wait for one completion
        r = self.clients[0].post("/v1/chat/completions", timeout=timeout, json={
            "model": self.model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "warm up"}]})
        if r.status_code != 200:
            raise RuntimeError(f"the warm-up completion answered {r.status_code}: {r.text}")

    def close(self) -> None:
        """Close the clients."""
        for c in self.clients:
            c.close()

    def _call(self, tenant: int, method: str, url: str, **kw: Any) -> httpx.Response:
        r = self.clients[tenant].request(method, url, **kw)
        self.statuses[r.status_code] += 1
        if r.status_code >= 500:
            self.errors.append(f"{method} {url} -> {r.status_code}: {r.text[:300]}")
        return r

    def step(self) -> None:
        """One action, chosen by weight."""
        actions = ((self.job, 40), (self.bad_job, 10), (self.cancel_job, 8),
                   (self.replay_job, 5), (self.chat, 4), (self.batch, 8),
                   (self.cancel_batch, 2), (self.list_jobs, 3))
        action = self.rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
        action()

    def _body(self, n: int) -> dict[str, Any]:
        if self.rng.random() < 0.5:
            return {"prompt": f"soak {n}: the quick brown fox", "temperature": 0,
                    "max_tokens": self.rng.randint(2, 8)}
        return {"messages": [{"role": "user", "content": f"soak {n}: say hi"}],
                "max_tokens": self.rng.randint(2, 8)}

    def job(self) -> None:
        """A job; a third with a webhook (ok, flaky, or to a dead port)."""
        tenant = self.rng.randrange(len(self.clients))
        body = self._body(self.counts["jobs"])
        if self.rng.random() < 0.1:  # a grammar: compiled by the API's and the worker's helpers
            body["guided_choice"] = ["yes", "no", f"maybe {self.rng.randrange(50)}"]
        hook = self.rng.random()
        if hook < 0.2:
            body["callback_url"] = self.receiver.url("ok")
        elif hook < 0.28:
            body["callback_url"] = self.receiver.url("flaky")
        elif hook < 0.32:
            body["callback_url"] = f"http://127.0.0.1:{self.dead_port}/hook/dead"
        r = self._call(tenant, "POST", "/v1/jobs", json=body)
        self.counts["jobs"] += 1
        if r.status_code == 201:
            self.counts["webhook_jobs"] += "callback_url" in body
            self.recent_jobs.append((tenant, r.json()["id"]))
            del self.recent_jobs[:-50]
        elif r.status_code != 429:
            self.errors.append(f"POST /v1/jobs -> {r.status_code}: {r.text[:300]}")

    def bad_job(self) -> None:
        """A request the API must refuse with a 4xx (never a 5xx, nothing stored)."""
        body = self.rng.choice(BAD_BODIES)
        r = self._call(self.rng.randrange(len(self.clients)), "POST", "/v1/jobs",
                       content=body.encode(), headers={"Content-Type": "application/json"})
        self.counts["bad_jobs"] += 1
        if not 400 <= r.status_code < 500:
            self.errors.append(f"bad body {body!r} -> {r.status_code}")

    def cancel_job(self) -> None:
        """Cancel one of the recent jobs (queued, running or already ended)."""
        if not self.recent_jobs:
            return
        tenant, job_id = self.recent_jobs.pop(self.rng.randrange(len(self.recent_jobs)))
        r = self._call(tenant, "DELETE", f"/v1/jobs/{job_id}")
        self.counts["job_cancels"] += 1
        if r.status_code not in (200, 404):  # 404: retention deleted it meanwhile
            self.errors.append(f"DELETE /v1/jobs/{job_id} -> {r.status_code}: {r.text[:300]}")

    def replay_job(self) -> None:
        """A job sent twice with one Idempotency-Key: the second answers the first."""
        tenant = self.rng.randrange(len(self.clients))
        key = uuid.uuid4().hex
        body = self._body(self.counts["jobs"])
        first = self._call(tenant, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        again = self._call(tenant, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        self.counts["replays"] += 1
        if first.status_code == 201 and (again.status_code != 200
                                         or again.json()["id"] != first.json()["id"]):
            self.errors.append(f"replay answered {again.status_code}: {again.text[:200]}")

    def chat(self) -> None:
        """An OpenAI chat completion, waited for."""
        if self.model is None:
            return
        r = self._call(self.rng.randrange(len(self.clients)), "POST", "/v1/chat/completions",
                       json={"model": self.model, "max_tokens": 4,
                             "messages": [{"role": "user", "content": "hello"}]})
        self.counts["chats"] += 1
        if r.status_code not in (200, 429):
            self.errors.append(f"chat -> {r.status_code}: {r.text[:300]}")

    def list_jobs(self) -> None:
        """A page of the tenant's jobs."""
        self._call(self.rng.randrange(len(self.clients)), "GET", "/v1/jobs?limit=20")

    def batch(self) -> None:
        """A batch of good lines with bad ones and a blank line among them; half with
        ``output_expires_after`` (its files expire), half without (this client deletes
        them once read)."""
        tenant = self.rng.randrange(len(self.clients))
        k = self.counts["batches"]
        lines = [json.dumps({"custom_id": f"b{k}-{i}", "method": "POST",
                             "url": "/v1/completions",
                             "body": {"prompt": f"batch {k} line {i}", "temperature": 0,
                                      "max_tokens": self.rng.randint(2, 6)}})
                 for i in range(self.rng.randint(*self.batch_lines))]
        for _ in range(self.rng.randint(0, 2)):
            lines.insert(self.rng.randrange(len(lines) + 1), self.rng.choice(BAD_LINES))
        lines.insert(self.rng.randrange(len(lines) + 1), "")
        data = ("\n".join(lines) + "\n").encode()
        f = self._call(tenant, "POST", "/v1/files", data={"purpose": "batch"},
                       files={"file": ("soak.jsonl", data, "application/jsonl")})
        if f.status_code != 200:
            self.errors.append(f"upload -> {f.status_code}: {f.text[:300]}")
            return
        keep = self.rng.random() < 0.5
        body: dict[str, Any] = {"input_file_id": f.json()["id"], "endpoint": "/v1/completions",
                                "completion_window": "24h", "metadata": {"soak": str(k)}}
        if keep:
            body["output_expires_after"] = {"anchor": "created_at", "seconds": 3600}
        r = self._call(tenant, "POST", "/v1/batches", json=body)
        self.counts["batches"] += 1
        if r.status_code != 200:
            self.errors.append(f"POST /v1/batches -> {r.status_code}: {r.text[:300]}")
            self._call(tenant, "DELETE", f"/v1/files/{f.json()['id']}")
            return
        self.open_batches.append(Tracked(r.json()["id"], tenant, f.json()["id"], lines, keep))

    def cancel_batch(self) -> None:
        """Cancel one open batch (it may have ended meanwhile: then a 400)."""
        if not self.open_batches:
            return
        b = self.rng.choice(self.open_batches)
        r = self._call(b.tenant, "POST", f"/v1/batches/{b.batch_id}/cancel")
        self.counts["batch_cancels"] += 1
        if r.status_code not in (200, 400):
            self.errors.append(f"batch cancel -> {r.status_code}: {r.text[:300]}")

    def check_batches(self) -> int:
        """Look at every open batch; check and clean up those that ended. Returns how
        many are still open."""
        still: list[Tracked] = []
        for b in self.open_batches:
            r = self._call(b.tenant, "GET", f"/v1/batches/{b.batch_id}")
            if r.status_code != 200:
                self.errors.append(f"GET batch {b.batch_id} -> {r.status_code}")
                continue
            batch = r.json()
            if batch["status"] not in BATCH_ENDED:
                still.append(b)
                continue
            self.counts[f"batches_{batch['status']}"] += 1
            self._check_files(b, batch)
            self._call(b.tenant, "DELETE", f"/v1/files/{b.input_file_id}")
            if not b.keep_outputs:
                for fid in (batch["output_file_id"], batch["error_file_id"]):
                    if fid:
                        self._call(b.tenant, "DELETE", f"/v1/files/{fid}")
        self.open_batches = still
        return len(still)

    def _check_files(self, b: Tracked, batch: dict[str, Any]) -> None:
        """Each request line of the input in exactly one file, once (a failed batch
        writes no file: nothing to check)."""
        if batch["status"] == "failed":
            return
        seen: list[int] = []
        for fid in (batch["output_file_id"], batch["error_file_id"]):
            if not fid:
                continue
            r = self._call(b.tenant, "GET", f"/v1/files/{fid}/content")
            seen += [int(json.loads(x)["response"]["request_id"][-12:], 16)
                     for x in r.text.split("\n") if x.strip()]  # JSONL: \n only
        want = [i for i, x in enumerate(b.lines, start=1) if x.strip()]
        if sorted(seen) != want:
            self.errors.append(f"batch {b.batch_id} ({batch['status']}): lines {sorted(seen)} "
                               f"in its files, {want} in its input")
