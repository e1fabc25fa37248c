"""``inflight generate INPUT.jsonl -o OUTPUT.jsonl``: offline batch generation, resumable.

Input lines are OpenAI Batch input lines or plain ``{"prompt": ...}`` / ``{"messages": [...]}``
lines; output lines are in the OpenAI Batch output format, written as each request
finishes. A bad line gets an error line and the run goes on. Rerunning the same command
skips every custom_id already in the output file (lines without one are ``line-<n>``).
Every line runs on ``--model`` whatever model it names; the answers name ``--model``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cli.engine_flags import add_engine_flags, engine_args_from
from cli.generate_loop import Progress, WorkItem, run_requests
from cli.jsonl_io import ResultsFile, count_input_lines, iter_input_lines, prepare_output
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
custom_id is known as line-<n>). Every line runs on --model, whatever model
it names (one run is one model, as a batch is); each answer's "model" names
--model. The service routes by the line's model instead (inflight enqueue)."""


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


class LinePlanner:
    """Turns input lines into WorkItems one at a time, leaving out custom_ids in ``done``.

    A line whose custom_id repeats an earlier line's is refused and keyed ``line-<n>``, so
    resuming never confuses the two. Only the ids seen are remembered (for that check), not
    the requests, so memory does not grow with the bodies. ``skipped`` counts the lines
    left out so far; ``on_skip`` is called for each.
    """

    def __init__(self, done: set[str], on_skip: Callable[[], None] | None = None) -> None:
        self.done = done
        self.skipped = 0
        self._on_skip = on_skip
        self._first_line: dict[str, int] = {}

    def items(self, lines: Iterable[tuple[int, bytes]]) -> Iterator[WorkItem]:
        """The WorkItem of every line still to answer, in file order."""
        for number, raw in lines:
            item = self._checked(_parse(number, raw))
            if item.custom_id in self.done:
                self.skipped += 1
                if self._on_skip is not None:
                    self._on_skip()
            else:
                yield item

    def _checked(self, item: WorkItem) -> WorkItem:
        first = self._first_line.setdefault(item.custom_id, item.line_number)
        if first == item.line_number:
            return item
        return WorkItem(item.line_number, f"line-{item.line_number}", own_id=False,
                        error=RequestParseError(
                            f"duplicate custom_id {item.custom_id!r} (first on line {first}); "
                            "custom_ids must be unique, this line was not run",
                            param="custom_id", code="duplicate_custom_id",
                            line_number=item.line_number))


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
        done = prepare_output(args.output, resume=not args.no_resume)
        total = None if args.quiet else count_input_lines(args.input)  # the bar's length
    except OSError as exc:
        return fail(str(exc))
    say = (lambda _: None) if args.quiet else (lambda m: print(m, file=sys.stderr))
    if done:
        say(f"resuming: {len(done)} line(s) already in {args.output}")
    started = time.perf_counter()
    progress = Progress(total, enabled=not args.quiet)
    planner = LinePlanner(done, on_skip=progress.line_skipped)
    engine_source = _EngineSource(engine_args, progress)
    try:
        with ResultsFile(args.output) as writer:
            window = max(1, args.window or 2 * engine_args.max_num_seqs)
            run_requests(engine_source, planner.items(iter_input_lines(args.input)), writer,
                         progress, window=window)
    except EngineLoadError as exc:
        progress.close()
        return fail(f"could not load the model {engine_args.model!r}: {exc}", 1)
    except OSError as exc:
        progress.close()
        return fail(str(exc))
    except KeyboardInterrupt:
        progress.close()
        say(f"interrupted after {progress.done} line(s); run the same command to resume")
        return 130
    if progress.done == 0:
        progress.close()
        say("nothing to do")
        return 0
    progress.close()
    say(f"{progress.done} line(s) written to {args.output}: {progress.done - progress.failed} "
        f"ok, {progress.failed} failed, {planner.skipped} skipped; {progress.tokens} tokens generated "
        f"({progress.tokens_per_second:.1f} tok/s); {time.perf_counter() - started:.1f}s "
        "in all")
    return 0


class EngineLoadError(Exception):
    """The model could not be loaded (the message says why)."""


class _EngineSource:
    """Loads the engine at the first request that needs it (a file of refused lines never
    loads a model) and starts the tokens/s clock once it is loaded."""

    def __init__(self, engine_args: Any, progress: Progress) -> None:
        self._args = engine_args
        self._progress = progress
        self._engine: Any = None

    def __call__(self) -> Any:
        if self._engine is None:
            from worker.engine import LLMEngine

            try:
                self._engine = LLMEngine(self._args)
            except (InvalidRequestError, OSError) as exc:
                raise EngineLoadError(str(exc)) from exc
            self._progress.restart_clock()
        return self._engine
