"""Asynchronous successive halving that pauses (ASHA, Li et al., "A System for Massively Parallel
Hyperparameter Tuning", MLSys 2020, algorithm 2): which paused trial to resume next, and how far.

A pausing trial trains in segments. Its first segment runs to the first rung (``min_resource``); when it ends
the trial is PAUSED. Whenever a slot is free the driver asks ``promotion``: from the highest rung down, the
trials that reached rung ``k`` are ranked by their objective there; the best ``floor(n / reduction_factor)``
of them earn the next rung, and the best of those still paused at ``k`` is resumed (from its checkpoint) up to
the next rung, or up to its own last step. When no paused trial has earned a promotion, the driver starts a new
trial instead. So no trial trains past a rung before it has beaten enough others there, and a rung's first
trials are never promoted only because they came first (what a pruner that cannot pause has to do).

Pure functions of the trials' recorded points: the driver calls them inside its transaction, so a restarted
control plane decides the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dlcloud.schemas.studies import Direction


@dataclass(frozen=True)
class Rungs:
    """The rung ladder: ``min_resource * reduction_factor^k``; a trial's last step is its own ``last``."""

    min_resource: int
    reduction_factor: int

    def first_budget(self, last: int) -> int:
        return min(self.min_resource, last)

    def next_budget(self, budget: int, last: int) -> int:
        """The step a trial paused at ``budget`` trains to when promoted: the next rung, at most ``last``."""
        r = self.min_resource
        while r <= budget:
            r *= self.reduction_factor
        return min(r, last)

    def below(self, last: int) -> list[int]:
        """The rungs a trial that ends at ``last`` can pause at (those before ``last``)."""
        out, r = [], self.min_resource
        while r < last:
            out.append(r)
            r *= self.reduction_factor
        return out


@dataclass(frozen=True)
class Candidate:
    """What ``promotion`` needs of a trial: the objective's points (step -> value), the step its last segment
    trains to, its own last step, and whether it is PAUSED (only a paused trial can be resumed)."""

    number: int
    points: dict[int, float]
    budget: int | None
    last: int
    paused: bool


def rung_value(points: dict[int, float], rung: int, best: bool, direction: Direction) -> float | None:
    """A trial's objective at ``rung``: the best of its points up to that step (``best``), else the value at
    the last step up to it; None when it reported nothing by then."""
    upto = [(step, v) for step, v in points.items() if step <= rung]
    if not upto:
        return None
    if best:
        pick = min if direction == Direction.MINIMIZE else max
        return pick(v for _, v in upto)
    return max(upto)[1]


def reached(c: Candidate, rung: int) -> bool:
    return bool(c.points) and max(c.points) >= rung


def ranked(members: Sequence[tuple[float, Candidate]], direction: Direction) -> list[tuple[float, Candidate]]:
    """Best first; equal values by trial number (the earlier first)."""
    sign = 1.0 if direction == Direction.MINIMIZE else -1.0
    return sorted(members, key=lambda m: (sign * m[0], m[1].number))


def promotion(
    candidates: Sequence[Candidate], rungs: Rungs, direction: Direction, *, best: bool
) -> tuple[Candidate, int] | None:
    """The paused trial to resume now and the step to train it to, or None: no paused trial has earned it."""
    ladder = sorted({r for c in candidates for r in rungs.below(c.last)}, reverse=True)
    for rung in ladder:
        members = []
        for c in candidates:
            if not reached(c, rung):
                continue
            value = rung_value(c.points, rung, best, direction)
            if value is not None:
                members.append((value, c))
        top = ranked(members, direction)[: len(members) // rungs.reduction_factor]
        for _, c in top:
            if c.paused and c.budget == rung:
                return c, rungs.next_budget(rung, c.last)
    return None


def finishing(
    candidates: Sequence[Candidate], rungs: Rungs, direction: Direction, *, best: bool
) -> tuple[Candidate, int] | None:
    """When nothing else can run (no new trial may start, none runs, none is promotable) and no trial has
    trained to its last step yet: the best paused trial of the highest rung any paused trial reached, so a
    study with few trials still trains one to the end (the paper's ASHA never runs out of new trials)."""
    paused = [c for c in candidates if c.paused and c.budget is not None]
    if not paused:
        return None
    top = max(c.budget or 0 for c in paused)
    at = [c for c in paused if c.budget == top]
    valued = [(v, c) for c in at if (v := rung_value(c.points, top, best, direction)) is not None]
    c = ranked(valued, direction)[0][1] if valued else min(at, key=lambda x: x.number)
    return c, rungs.next_budget(top, c.last)


def standing(c: Candidate, candidates: Sequence[Candidate], rungs: Rungs, direction: Direction, *, best: bool) -> str:
    """Why a paused trial was not promoted, in words: its rank at its rung."""
    rung = c.budget or 0
    members = [
        (v, x)
        for x in candidates
        if reached(x, rung) and (v := rung_value(x.points, rung, best, direction)) is not None
    ]
    order = ranked(members, direction)
    place = next((i for i, (_, x) in enumerate(order) if x.number == c.number), None)
    value = rung_value(c.points, rung, best, direction)
    shown = "nothing" if value is None else f"{value:g}"
    where = f"#{place + 1} of {len(order)}" if place is not None else f"unranked of {len(order)}"
    earned = len(order) // rungs.reduction_factor
    return f"{shown} at step {rung}, {where} there; the best {earned} earned the next rung"
