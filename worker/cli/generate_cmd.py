"""``inflight generate INPUT.jsonl -o OUTPUT.jsonl``: offline batch generation, resumable.

Input lines are OpenAI Batch input lines or plain ``{"prompt": ...}`` / ``{"messages": [...]}``
lines; output lines are in the OpenAI Batch output format, written as each request
finishes. A bad line gets an error line and the run goes on. Rerunning the same command
skips every custom_id already in the output file (lines without one are ``line-<n>``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from worker.cli.engine_flags import add_engine_flags, engine_args_from
from worker.cli.generate_loop import Progress, WorkItem, run_requests, write_parse_errors
from worker.cli.jsonl_io import OutputWriter, prepare_output, read_input_lines
from worker.protocol.openai_batch import RequestParseError, parse_request_line
from worker.protocol.sampling_params import InvalidRequestError

_DESCRIPTION = """\
Generate completions for every line of INPUT.jsonl on this machine.

Input lines: OpenAI Batch input lines {"custom_id", "method": "POST", "url":
"/v1/chat/completions" | "/v1/completions", "body": {...}}, or plain lines
{"prompt": ...} / {"messages": [...]} with the body's fields at the top level.
Output lines are in the OpenAI Batch output format, written as each request
finishes. A bad line gets an error line and the run goes on. Rerunning the
same command skips every custom_id already in OUTPUT (a line without a
custom_id is known as line-<n>)."""


def add_parser(subparsers: Any) -> None:
    """Register ``generate`` on the ``inflight`` subparsers."""
    parser = subparsers.add_parser(
        "generate",
        help="generate completions for a JSONL file of requests on this machine",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", metavar="INPUT.jsonl", help="request lines ('-': stdin)")
    parser.add_argument("-o", "--output", required=True, metavar="OUTPUT.jsonl",
                        help="OpenAI Batch output lines; appended to when it exists (resume)")
    parser.add_argument("--no-resume", action="store_true",
                        help="overwrite OUTPUT instead of skipping the custom_ids it holds")
    parser.add_argument("--window", type=int, metavar="N",
                        help="most requests handed to the engine at once "
                             "(default: 2 x --max-num-seqs)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar and no summary")
    add_engine_flags(parser)
    parser.set_defaults(func=run)


def plan_lines(lines: list[tuple[int, bytes]], done: set[str]) -> tuple[list[WorkItem], int]:
    """Parse every line into a WorkItem, leaving out custom_ids in ``done``.

    Returns the items and how many lines were skipped. A line whose custom_id repeats an
    earlier line's is refused and keyed ``line-<n>``, so resuming never confuses the two.
    """
    items: list[WorkItem] = []
    first_line: dict[str, int] = {}
    skipped = 0
    for number, raw in lines:
        item = _parse(number, raw)
        if item.custom_id in first_line:
            item = WorkItem(number, f"line-{number}", own_id=False, error=RequestParseError(
                f"duplicate custom_id {item.custom_id!r} (first on line "
                f"{first_line[item.custom_id]}); custom_ids must be unique, this line was "
                "not run", param="custom_id", code="duplicate_custom_id",
                line_number=number))
        first_line.setdefault(item.custom_id, number)
        if item.custom_id in done:
            skipped += 1
        else:
            items.append(item)
    return items, skipped


def _parse(number: int, raw: bytes) -> WorkItem:
    try:
        request = parse_request_line(raw, line_number=number)
    except RequestParseError as exc:
        if exc.custom_id is not None:
            return WorkItem(number, exc.custom_id, error=exc)
        return WorkItem(number, f"line-{number}", error=exc, own_id=False)
    if request.custom_id is None:
        return WorkItem(number, f"line-{number}", request=request, own_id=False)
    return WorkItem(number, request.custom_id, request=request)


def run(args: argparse.Namespace) -> int:
    """Run ``inflight generate``; returns 0 once every line has an output line."""
    def fail(message: str, status: int = 2) -> int:
        print(f"inflight generate: error: {message}", file=sys.stderr)
        return status

    if args.input != "-" and not os.path.isfile(args.input):
        return fail(f"input file {args.input!r} does not exist")
    if args.input != "-" and os.path.exists(args.output) and os.path.samefile(args.input,
                                                                              args.output):
        return fail("the output file must not be the input file")
    try:
        engine_args = engine_args_from(args)
    except InvalidRequestError as exc:
        return fail(str(exc))
    try:
        lines = read_input_lines(args.input)
        done = prepare_output(args.output, resume=not args.no_resume)
    except OSError as exc:
        return fail(str(exc))
    items, skipped = plan_lines(lines, done)
    say = (lambda _: None) if args.quiet else (lambda m: print(m, file=sys.stderr))
    if skipped:
        say(f"resuming: {skipped} line(s) already in {args.output}")
    if not items:
        say("nothing to do")
        return 0
    started = time.perf_counter()
    progress = Progress(len(items), enabled=not args.quiet)
    try:
        with OutputWriter(args.output) as writer:
            write_parse_errors(items, writer, progress)
            if any(item.request is not None for item in items):
                from worker.engine import LLMEngine

                try:
                    engine = LLMEngine(engine_args)
                except (InvalidRequestError, OSError) as exc:
                    progress.close()
                    return fail(f"could not load the model {engine_args.model!r}: {exc}", 1)
                progress.restart_clock()
                window = args.window or 2 * engine_args.max_num_seqs
                run_requests(engine, items, writer, progress, window=max(1, window))
    except KeyboardInterrupt:
        progress.close()
        say(f"interrupted after {progress.done} line(s); run the same command to resume")
        return 130
    progress.close()
    say(f"{progress.done} line(s) written to {args.output}: {progress.done - progress.failed} "
        f"ok, {progress.failed} failed, {skipped} skipped; {progress.tokens} tokens generated "
        f"({progress.tokens_per_second:.1f} tok/s); {time.perf_counter() - started:.1f}s "
        "in all")
    return 0
