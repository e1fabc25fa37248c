"""The engine benchmark: continuous vs static batching vs Hugging Face ``generate``.

``workload`` reads and writes the fixed request files, ``metrics`` turns per-step records
into the reported figures (no torch), ``engine_run`` and ``hf_run`` time one configuration
each, ``plot`` draws batch occupancy per step and ``runner`` ties them into one run.
"""
