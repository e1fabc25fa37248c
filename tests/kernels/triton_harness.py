"""Where the Triton kernel tests run their checks: in a worker process under the Triton
interpreter (the default, on the CPU), or compiled on CUDA in the pytest process with
``INFLIGHT_TRITON_TEST_DEVICE=cuda`` (benchmarks/gpu_check.py does this).

Triton reads TRITON_INTERPRET when ``triton.language`` is imported (its own helpers such
as ``tl.max`` are ``@triton.jit`` functions) and when a kernel is decorated, so it must be
set before anything in the process imports triton. Other test files may import triton (or
torch may) before a kernel test module, so every kernel runs in a worker process started
once per module with the ``spawn`` method, whose initializer sets TRITON_INTERPRET=1 before
its first import of triton: each test sends a module-level ``check_*`` function there and
gets its assertion back. The pytest process never runs a kernel and its environment is
untouched. No GPU is needed; grids are small because the interpreter runs every program in
Python. A test takes the ``run`` fixture (``conftest.py``), one runner per module.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest
import torch

CALL_TIMEOUT_S = 120  # one check in the worker; a hung kernel fails instead of blocking
DEVICE_ENV = "INFLIGHT_TRITON_TEST_DEVICE"  # unset or "interpreter": interpreter; "cuda": GPU

Run = Callable[..., Any]


def _worker_ready() -> bool:
    """In the worker: the kernels (and triton's own jit helpers) are interpreted."""
    import triton
    from triton.runtime.interpreter import InterpretedFunction

    from kernels import (
        triton_decode_attention,
        triton_fused,
        triton_prefill_attention,
        triton_write_kv,
    )

    kernels = [
        triton.language.standard.zeros,
        triton_write_kv._write_kv_kernel,
        triton_fused._add_rms_norm_kernel,
        triton_fused._rope_qk_kernel,
        triton_fused._silu_mul_kernel,
        triton_decode_attention._decode_kernel,
        triton_decode_attention._decode_reduce_kernel,
        triton_prefill_attention._prefill_kernel,
    ]
    return all(isinstance(k, InterpretedFunction) for k in kernels)


def _serve(conn: Connection) -> None:
    """Worker loop: run each ``(fn, args, kwargs)`` received, send back result or traceback."""
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        fn, args, kwargs = job
        try:
            conn.send((True, fn(*args, **kwargs)))
        except BaseException as exc:  # reported to the test, which fails with it
            conn.send((False, "".join(traceback.format_exception(exc))))


class InterpreterWorker:
    """One spawned process, started with TRITON_INTERPRET=1, that runs the checks."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"  # the child inherits the environment at start
        try:
            self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
            self.proc.start()
        finally:
            if saved is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = saved
        child.close()
        assert self(_worker_ready), "the worker did not run triton in interpreter mode"

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the worker; a failure there fails the calling test."""
        self.conn.send((fn, args, kwargs))
        if not self.conn.poll(CALL_TIMEOUT_S):
            self.close()
            self._start()  # a hung kernel must not block the tests after it
            pytest.fail(f"{fn.__name__} ran over {CALL_TIMEOUT_S}s in the interpreter worker")
        try:
            ok, value = self.conn.recv()
        except EOFError:
            self.close()
            self._start()
            pytest.fail(f"the interpreter worker died in {fn.__name__} (a wild write?)")
        if not ok:
            pytest.fail(f"in the interpreter worker:\n{value}", pytrace=False)
        return value

    def close(self) -> None:
        """Stop the worker process."""
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def _compiled_for_cuda() -> bool:
    """In this process: the kernels are compiled (not interpreted) and CUDA is usable."""
    from triton.runtime.interpreter import InterpretedFunction

    from kernels import triton_decode_attention

    return torch.cuda.is_available() and not isinstance(
        triton_decode_attention._decode_kernel, InterpretedFunction
    )


class CudaRunner:
    """Runs the checks in this process with CUDA as the default device."""

    def __init__(self) -> None:
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            pytest.fail(f"{DEVICE_ENV}=cuda with TRITON_INTERPRET set: unset TRITON_INTERPRET")
        if not _compiled_for_cuda():
            pytest.fail(f"{DEVICE_ENV}=cuda but CUDA is not available to torch and triton")

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with tensors created on CUDA; waits for the device."""
        with torch.device("cuda"):
            result = fn(*args, **kwargs)
        torch.cuda.synchronize()
        return result


def runner() -> Iterator[Run]:
    """The ``run`` fixture's body (``tests/kernels/conftest.py``): ``run(fn, *args)`` calls a
    module-level ``fn`` in the interpreter worker, or on CUDA when
    ``INFLIGHT_TRITON_TEST_DEVICE=cuda``."""
    if os.environ.get(DEVICE_ENV) == "cuda":
        yield CudaRunner()
        return
    worker = InterpreterWorker()
    yield worker
    worker.close()
