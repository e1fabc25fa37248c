"""Lua scripts queued on a pipeline, for a single server and a Redis Cluster alike.

A plain pipeline sends EVALSHA and loads the scripts it lacks when it executes. A cluster
pipeline refuses EVALSHA (a node that never saw the script could not run it), so there the
script goes with its body (EVAL; the server caches it by its SHA all the same). Either way
every key the script touches must be in ``keys``, all of one hash slot on a cluster
(``worker.queue.keys``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.client import Pipeline
from redis.commands.core import Script


def queue_script(
    pipe: Any, script: Script, *, keys: Sequence[str], args: Sequence[str | int | float]
) -> None:
    """Queue one call of ``script`` on ``pipe`` (its reply comes with the pipeline's)."""
    if isinstance(pipe, Pipeline):
        script(keys=list(keys), args=list(args), client=pipe)
    else:
        pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
