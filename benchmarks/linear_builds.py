"""The native fp32 linear kernel built with different compile-time settings, timed against
each other in paired rounds on SmolLM2-135M's 121 projections with the weights cold.

    python benchmarks/linear_builds.py [--isa avx512] [--rows 1,4,8,16,32,64,256]
        [--variant LINEAR_PF=2048] [--variant LINEAR_MR=6+LINEAR_NV=4] [--rounds 7]
        [--threads 2] [--bf16-panels] [--json out.json]

Each ``--variant`` is a ``+``-joined list of ``NAME=VALUE`` macros of
``kernels/csrc/linear_cpu.cpp`` (``LINEAR_PF``, ``LINEAR_MR``, ``LINEAR_NV``, ``LINEAR_KC``,
``LINEAR_MC_ROWS``, ``LINEAR_AHEAD_MIN_ROWS``), built beside the default build (the
shipped one for this CPU: ``cpu_linear.chosen_build_flags``, which the variant's macros
override). Per row count and round, every build
runs all 30 layers and the head back to back (538 MB of weights) after a 1 GiB read that
pushes them out of the caches, in the same order each round; the table gives each build's
median and its ratio to the default's median. On a virtual machine whose read rate moves
from second to second, only these paired ratios mean anything.

``--bf16-panels`` rounds the weights to bf16 values first (a bf16 checkpoint run in fp32)
and adds the default build over bf16 panels of them ("bf16 panels") to the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import ModuleType

import torch

from cli.bench.machine import cpu_description
from kernels import cpu_linear, cpu_native

# (in_features, out_features) of SmolLM2-135M's projections: qkv, o, gate/up, down; the head
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]


def variant_flags(variant: str) -> tuple[str, ...]:
    """The compiler flags of a ``+``-joined list of ``NAME=VALUE`` macros."""
    macros = variant.split("+")
    if not all(macro.partition("=")[0].isidentifier() for macro in macros):
        raise ValueError(f"{variant!r}: expected NAME=VALUE macros joined by '+'")
    return tuple(f"-D{macro}" for macro in macros)


def variant_build_name(kernel: str, variant: str) -> str:
    """The name of ``kernel``'s build with ``variant``'s macros (a module name)."""
    return f"inflight_{kernel}_variant_" + "".join(c if c.isalnum() else "_" for c in variant)


def build_variant(variant: str, isa: str) -> ModuleType:
    """The kernel built for ``isa`` with the macros of ``variant`` ("default": as shipped)."""
    if variant == "default":
        return cpu_linear.load(isa)
    # the shipped build's flags for this CPU first, so the variant's macros override them
    flags = cpu_linear.chosen_build_flags() + variant_flags(variant)
    return cpu_native.build(variant_build_name("linear", variant), "linear_cpu.cpp", isa, flags)


def main() -> None:
    """Time every build at every row count; print and optionally save the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", default=None, help="avx512 or avx2 (default: the widest here)")
    parser.add_argument("--rows", default="1,4,8,16,32,64,256")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16-panels", action="store_true",
                        help="weights rounded to bf16, and the default build over bf16 panels too")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    isa = args.isa or cpu_native.default_isa()
    builds = {name: build_variant(name, isa) for name in ["default", *args.variant]}
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(out, inp, generator=generator) * 0.05 for inp, out in SHAPES]
    if args.bf16_panels:
        weights = [w.bfloat16().float() for w in weights]
    packed = {name: [cpu_linear.pack(w, ext) for w in weights] for name, ext in builds.items()}
    if args.bf16_panels:
        builds["bf16 panels"] = builds["default"]
        packed["bf16 panels"] = [cpu_linear.pack(w, builds["default"], torch.bfloat16) for w in weights]
    evict = torch.ones(2**28)  # 1 GiB, read before every pass
    results = []
    with torch.inference_mode():
        for rows in map(int, args.rows.split(",")):
            inputs = {k: torch.randn(rows, k, generator=generator) for k in (576, 1536)}
            times: dict[str, list[float]] = {name: [] for name in builds}
            for _ in range(args.rounds):
                for name, ext in builds.items():
                    evict.sum()
                    start = time.perf_counter()
                    for (inp, out), weight in zip(SHAPES, packed[name], strict=True):
                        ext.linear(inputs[inp], weight, out, None)
                    times[name].append((time.perf_counter() - start) * 1e3)
            medians = {name: statistics.median(t) for name, t in times.items()}
            row = {"rows": rows, "median_ms": {n: round(m, 2) for n, m in medians.items()},
                   "ratio_to_default": {n: round(m / medians["default"], 3) for n, m in medians.items()}}
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        report = {"isa": isa, "threads": args.threads, "rounds": args.rounds, "bf16_panels": args.bf16_panels,
                  "cpu": cpu_description(), "results": results}
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
