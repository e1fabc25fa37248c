"""The machine's fp32 matmul rate on a model's projection shapes: ``F.linear``, oneDNN's
prepacked weights and the native kernel's column panels (what the engine uses for fp32 on
the CPU, ``kernels/cpu_linear.py``), over all layers so the weights stream from memory as
they do in a real step.

    python benchmarks/matmul_rate.py [--rows 1,16,40,64,96] [--threads 2]

Shapes are SmolLM2-135M's (30 layers; qkv 960x576, o 576x576, gate/up 3072x576,
down 576x1536). Prints one JSON line per row count with ms, GFLOP/s and the rate the
weights were read at (GB/s) of each method.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from worker.engine.models.cpu_linear import OneDnnMatmul, PackedLinear, Packer, packer_for

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out_features, in_features)
LAYERS = 30


def _seconds(fn: Callable[[], None], reps: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def main() -> None:
    """Print one JSON line per row count."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16,40,64,96")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    linears = [[torch.nn.Linear(k, n, bias=False) for n, k in SHAPES] for _ in range(LAYERS)]
    native = packer_for(torch.float32)
    packers: dict[str, Packer] = {"onednn_prepacked": OneDnnMatmul}
    if native is not None and native is not OneDnnMatmul:
        packers["native_panels"] = native
    packed = {name: [[PackedLinear(lin, pack) for lin in layer] for layer in linears]
              for name, pack in packers.items()}
    weight_bytes = 4 * sum(n * k for n, k in SHAPES) * LAYERS
    for m in (int(r) for r in args.rows.split(",")):
        inputs = {k: torch.randn(m, k) for _, k in SHAPES}  # [rows, in_features]
        flops = 2 * m * sum(n * k for n, k in SHAPES) * LAYERS

        def plain(inputs: dict[int, torch.Tensor] = inputs) -> None:
            with torch.inference_mode():
                for layer in linears:
                    for lin in layer:
                        F.linear(inputs[lin.in_features], lin.weight)

        def prepacked(name: str, inputs: dict[int, torch.Tensor] = inputs) -> None:
            with torch.inference_mode():
                for layer in packed[name]:
                    for lin in layer:
                        lin(inputs[lin.in_features])

        result: dict[str, object] = {"rows": m}
        runs: list[tuple[str, Callable[[], None]]] = [("f_linear", plain)]
        runs += [(name, functools.partial(prepacked, name)) for name in packed]
        for name, fn in runs:
            seconds = _seconds(fn, args.reps)
            result[name] = {"ms": round(seconds * 1e3, 1), "gflop_s": round(flops / seconds / 1e9),
                            "weights_gb_s": round(weight_bytes / seconds / 1e9, 1)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
