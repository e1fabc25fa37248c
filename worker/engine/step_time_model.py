"""How a step's wall time grows with its rows, learnt from the engine's own recent steps.

The model is a line, ``seconds = fixed + per_row * rows``, fitted by exponentially
weighted least squares (each new step weighs 1, the one before ``decay``, ...), so it
follows the machine and the workload as they change. ``rows`` are the step's scheduled
query rows (decode rows and prompt tokens alike). The interactive step budget
(``interactive_step_ms``, :mod:`worker.engine.admission`) asks it how many rows fit in a
step of a given length: a few dozen on two CPU cores, where every row costs about the
same, and hundreds on a GPU, where a step costs about the same whatever its rows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepTimeModel:
    decay: float = 0.95  # weight of the steps seen so far at each new one (~20 steps of memory)
    min_steps: int = 4  # no estimate before this many steps
    steps: int = 0
    _w: float = 0.0  # weighted sums: of 1, rows, seconds, rows^2, rows * seconds
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        """Learn one step of ``rows`` rows that took ``seconds`` (empty steps are ignored)."""
        if rows <= 0 or seconds <= 0:
            return
        d = self.decay
        self._w = d * self._w + 1.0
        self._x = d * self._x + rows
        self._y = d * self._y + seconds
        self._xx = d * self._xx + rows * rows
        self._xy = d * self._xy + rows * seconds
        self.steps += 1

    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_row)`` seconds, or None before ``min_steps`` steps. When the recent
        steps all had about the same rows (no slope to read) or the slope reads negative
        (noise), the whole time is put on the rows: ``(0, mean seconds / mean rows)``,
        which overestimates a step with fewer rows, never one with more."""
        if self.steps < self.min_steps:
            return None
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x > (0.1 * mean_x) ** 2:  # rows spread by more than a tenth of their mean
            per_row = (self._xy / self._w - mean_x * mean_y) / var_x
            fixed = mean_y - per_row * mean_x
            if per_row > 0 and fixed >= 0:
                return fixed, per_row
        return 0.0, mean_y / mean_x

    def rows_within(self, seconds: float) -> int | None:
        """The most rows a step may have to take at most ``seconds`` (0 when even an empty
        one would not), or None before there is an estimate."""
        fitted = self.fit()
        if fitted is None:
            return None
        fixed, per_row = fitted
        return max(0, int((seconds - fixed) / per_row))
