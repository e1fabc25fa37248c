"""The sections of ``benchmarks/gpu_check.py``: one module per job.

``report`` records and writes the results, ``device`` times and measures on CPU or CUDA,
``arch_models`` builds random-weight checkpoints of real architectures' shapes,
``pytest_runs`` runs test files in a subprocess, and ``graphs``, ``parity``,
``throughput``, ``bandwidth`` are the sections themselves. ``plan`` sizes them (GPU or
``--quick``) and ``main`` ties them together.
"""
