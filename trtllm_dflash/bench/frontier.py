"""The Pareto frontier of (interactivity, throughput per GPU) points and reading it at fixed interactivity.

A point is on the frontier when no other point is at least as good on both axes and better on
one (more tokens/s/user and more tokens/s/GPU are both better). Along the frontier, throughput
falls as interactivity rises; a monotone interpolant (PCHIP, or linear) reads it between measured
points and never beyond them. Below the lowest measured interactivity a deployment still delivers at
least the best throughput measured at or above it: that lower bound is reported as such.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Point = tuple[float, float]  # (interactivity tok/s/user, throughput tok/s/GPU)
METHODS = ("pchip", "linear")
ON_FRONTIER, AT_OR_ABOVE = "frontier", "at_or_above"  # how a reading was made (see read_frontier)


def pareto_frontier(points: Iterable[Point | tuple[float | None, float | None]]) -> list[Point]:
    """Non-dominated points, by rising interactivity (and so falling throughput); None coordinates are skipped."""
    valid = sorted({(float(x), float(y)) for x, y in points if x is not None and y is not None}, reverse=True)
    frontier: list[Point] = []
    for x, y in valid:  # from the most interactive down: keep a point only when it adds throughput
        if not frontier or y > frontier[-1][1]:
            frontier.append((x, y))
    return frontier[::-1]


def interpolate(frontier: Sequence[Point], xs: Iterable[float], method: str = "pchip") -> list[float | None]:
    """Throughput on the frontier at each x; None outside the measured interactivity range (no extrapolation)."""
    if method not in METHODS:
        raise ValueError(f"unknown interpolation {method!r} (choose from {', '.join(METHODS)})")
    xs = list(xs)
    if not frontier:
        return [None] * len(xs)
    lo, hi = frontier[0][0], frontier[-1][0]
    if len(frontier) == 1:
        return [frontier[0][1] if x == lo else None for x in xs]
    f = curve(frontier, method)
    return [float(f(x)) if lo <= x <= hi else None for x in xs]


def read_frontier(frontier: Sequence[Point], xs: Iterable[float],
                  method: str = "pchip") -> list[tuple[float | None, str | None]]:
    """(throughput, basis) at each interactivity floor x. Inside the measured range: the frontier,
    interpolated (basis "frontier"). Below it: the best throughput measured at or above x, a lower bound
    (basis "at_or_above"; on a frontier that is its first point). Above it: (None, None), n/a."""
    xs = list(xs)
    readings = [(y, ON_FRONTIER if y is not None else None) for y in interpolate(frontier, xs, method)]
    if frontier:
        lo, best = frontier[0]
        readings = [(best, AT_OR_ABOVE) if x < lo else r for x, r in zip(xs, readings)]
    return readings


def curve(frontier: Sequence[Point], method: str):
    """A callable over [first x, last x] of the frontier."""
    import numpy as np

    x = np.array([p[0] for p in frontier])
    y = np.array([p[1] for p in frontier])
    if method == "linear":
        return lambda v: np.interp(v, x, y)
    from scipy.interpolate import PchipInterpolator

    return PchipInterpolator(x, y, extrapolate=False)
