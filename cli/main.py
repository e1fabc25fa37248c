"""``inflight``: the command line entry point.

Only the chosen subcommand's module is imported, and subcommand modules import torch only
inside ``run()``, so ``inflight --help`` and the torch-free commands start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from cli.allocator import restart_with_tcmalloc

# name -> (module exposing add_parser(subparsers) and run(args) -> int, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("cli.generate_cmd",
                 "generate completions for a JSONL file of requests on this machine"),
    "bench": ("cli.bench_cmd", "benchmark the engine against its static policy and HF"),
    "worker": ("cli.worker_cmd", "run a long-lived worker pulling jobs from Redis"),
    "enqueue": ("cli.enqueue_cmd", "enqueue a JSONL file of requests as jobs"),
    "jobs": ("cli.jobs_cmd", "list jobs"),
    "job": ("cli.jobs_cmd", "show one job: state, timeline and result"),
    "trace": ("cli.trace_cmd", "one job's timeline and what else was in its batch"),
    "top": ("cli.top_cmd", "live view of the workers and the queues"),
    "models": ("cli.models_cmd", "the models the live workers serve"),
    "migrate": ("cli.migrate_cmd", "apply the database migrations"),
    "api": ("cli.api_cmd", "serve the REST API"),
    "keys": ("cli.keys_cmd", "create, list and revoke API keys"),
}
# Commands that run the engine in this process: started again on tcmalloc where it is
# installed (cli/allocator.py).
ENGINE_COMMANDS = frozenset({"generate", "bench", "worker"})


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The ``inflight`` parser; only ``selected``'s module is imported to add its options."""
    parser = argparse.ArgumentParser(
        prog="inflight",
        description="A queue-fed LLM generation service: continuous batching over paged KV.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name == selected:
            importlib.import_module(module_name).add_parser(subparsers)
        elif name not in subparsers.choices:  # a module may register several commands
            subparsers.add_parser(name, help=help_text, description=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inflight`` with ``argv`` (default: sys.argv[1:]); returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in args_list if not a.startswith("-")), None)
    if selected not in SUBCOMMANDS:
        selected = None
    try:
        parser = build_parser(selected)
    except ModuleNotFoundError as exc:
        module_name = SUBCOMMANDS[selected][0] if selected else ""
        if exc.name != module_name:
            raise
        print(f"inflight: the {selected!r} command is not available in this install "
              f"({module_name} is missing)", file=sys.stderr)
        return 2
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    if argv is None and selected in ENGINE_COMMANDS:  # this process's own command line
        restart_with_tcmalloc()
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
