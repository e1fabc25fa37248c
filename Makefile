# The two set-up commands of the README: `make demo` and `make test`.
.PHONY: setup demo test lint faults

setup:
	bash scripts/setup.sh

# Generate the example prompts on SmolLM2-135M with the embedded defaults (no servers).
demo: setup
	mkdir -p out
	.venv/bin/inflight generate examples/prompts.jsonl -o out/results.jsonl --model smollm2-135m
	head -c 2000 out/results.jsonl; echo

# Lint, types, import contracts, then every test (Redis and PostgreSQL started if needed).
test: setup
	bash scripts/services.sh
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/lint-imports
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/lint-imports

# The fault suite alone, with each scenario's wall time (the figures of docs/reliability.md);
# PostgreSQL stays unreachable 90 s here (12 s in CI), the thrice-killed worker runs
# 500 jobs (120 in CI), the soak runs an hour of traffic (45 s in CI; samples, report and
# plot in out/soak) and the property test 60 examples (6 in CI).
faults: setup
	bash scripts/services.sh
	INFLIGHT_FAULT_PG_OUTAGE_S=90 INFLIGHT_FAULT_KILL_JOBS=500 INFLIGHT_FAULT_SOAK_S=3600 \
	INFLIGHT_FAULT_SOAK_OUT=out/soak HYPOTHESIS_PROFILE=faults \
	.venv/bin/python -m pytest tests/faults -q -p no:cacheprovider --durations=0
