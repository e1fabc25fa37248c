"""Is a cost linear in the work? A least-squares line through (size, cost) points, and how
far each point sits from it.

A stage is called linear when no point costs much more than the fitted line predicts and
the marginal cost per unit stays the same as the work grows: a quadratic stage shows up as
a worst ratio well above 1 and a marginal cost that grows from the first interval between
sizes to the last (4.2x at 1k, 5k and 20k).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True)
class LinearFit:
    """``cost ≈ intercept + slope * size``, with each point's cost over the fitted cost
    (``ratios``) and the marginal cost per unit between neighbouring sizes (``marginal``)."""

    slope: float
    intercept: float
    ratios: tuple[float, ...]
    marginal: tuple[float, ...]

    @property
    def worst_ratio(self) -> float:
        """The largest cost over fitted cost (1.0 on a perfect line)."""
        return max(self.ratios)

    @property
    def marginal_growth(self) -> float:
        """The last interval's marginal cost over the first's (1.0 on a perfect line)."""
        if len(self.marginal) < 2 or self.marginal[0] <= 0:
            return 1.0 if len(self.marginal) < 2 else float("inf")
        return self.marginal[-1] / self.marginal[0]


def fit_line(sizes: Sequence[float], costs: Sequence[float]) -> LinearFit:
    """Least-squares line through the points (at least two distinct sizes)."""
    if len(sizes) != len(costs) or len(set(sizes)) < 2:
        raise ValueError("need costs at two or more distinct sizes")
    n = len(sizes)
    mean_x, mean_y = sum(sizes) / n, sum(costs) / n
    sxx = sum((x - mean_x) ** 2 for x in sizes)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, costs, strict=True))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    ratios = tuple(y / (intercept + slope * x) if intercept + slope * x > 0 else float("inf")
                   for x, y in zip(sizes, costs, strict=True))
    pairs = sorted(zip(sizes, costs, strict=True))
    marginal = tuple((y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in pairwise(pairs))
    return LinearFit(slope=slope, intercept=intercept, ratios=ratios, marginal=marginal)
