"""One-to-one matching of executed calls to gold calls, respecting ``depends_on``.

Input: for each gold call (in dependency order: every gold call after the ones it
depends on), its *candidates*: the indices of executed calls that may stand for it
(same tool, compared arguments agree, the call succeeded), each flagged ``solved``
when its output also equals the gold output (or the gold sets none).

A matching assigns each gold call at most one candidate, each call to at most one gold
call, such that a gold call is matched only when every gold call it depends on is
matched to an *earlier* call (the model needed that output first). Among all such
matchings we want the most solved sub-goals S, then the most matched gold calls M.

Greedy (each gold call takes its earliest free candidate) is not optimal in general:
a call that fits two gold calls (say one compares fewer arguments) can be taken by the
wrong one, and a repeated call with the right output may come after a first one whose
output was stale. So the search is exact: depth-first over the gold calls in
dependency order, pruned by the bound (S + gold calls left that have a solving
candidate, M + gold calls left that have any). Two dominance rules keep it linear in
the usual case, and both are safe for a gold call whose candidate calls no other gold
call wants ("uncontested"):

- leaving it unmatched never helps: adding it to any matching that leaves it out only
  constrains its dependents, which that matching cannot have matched either;
- among its feasible candidates only the earliest, and the earliest solving one, need
  trying: an earlier match time is a looser constraint on its dependents, and solving
  is better than not.

Contested gold calls (a call that fits several) get the full branching. The search
stops after ``budget`` steps and keeps the best matching found so far (``exact`` False;
its first leaf is the greedy matching) — only adversarial logs with many
interchangeable calls get there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["Candidate", "Matching", "match_calls"]

DEFAULT_BUDGET = 20_000


class Candidate(NamedTuple):  # a tuple: built for every plausible (call, gold call) pair
    call: int  # index into the call log
    solved: bool  # its output also matches the gold output


@dataclass(slots=True)
class Matching:
    """``calls[g]``: the call index matched to gold call ``g`` (or -1); ``solved[g]`` likewise."""

    calls: list[int]
    solved: list[bool]
    exact: bool = True
    steps: int = 0
    blocked: list[bool] = field(default_factory=list)  # gold call had candidates but none was usable

    @property
    def matched_count(self) -> int:
        return sum(1 for c in self.calls if c >= 0)

    @property
    def solved_count(self) -> int:
        return sum(self.solved)


def match_calls(
    candidates: Sequence[Sequence[Candidate]],
    depends_on: Sequence[Sequence[int]],
    *,
    budget: int = DEFAULT_BUDGET,
) -> Matching:
    """The best matching (most solved, then most matched) under the dependency order.

    ``candidates[g]`` are gold call ``g``'s candidates, in call order; ``depends_on[g]``
    the indices of the gold calls it depends on, all smaller than ``g``.
    """
    n = len(candidates)
    order = candidates
    seen: set[int] = set()
    shared: set[int] = set()  # calls that are candidates of more than one gold call
    for options in order:
        for option in options:
            if option.call in seen:
                shared.add(option.call)
            seen.add(option.call)
    if not shared:
        fast = _uncontested(order, depends_on)
        if fast is not None:
            return fast
    contested = [any(o.call in shared for o in options) for options in order]
    # static bounds: gold calls from g on that could be solved / matched at all
    can_solve, can_match = [0] * (n + 1), [0] * (n + 1)
    for g in range(n - 1, -1, -1):
        can_solve[g] = can_solve[g + 1] + any(o.solved for o in order[g])
        can_match[g] = can_match[g + 1] + bool(order[g])
    current = [-1] * n
    current_solved = [False] * n
    best: list[Any] = [[-1] * n, [False] * n, (-1, -1)]
    used: set[int] = set()
    steps = 0
    exhausted = False

    def options_of(g: int, after: int) -> list[Candidate]:
        feasible = [o for o in order[g] if o.call > after and o.call not in used]
        if contested[g] or len(feasible) < 2:
            return sorted(feasible, key=lambda o: not o.solved)  # solving first, then by time
        first = feasible[0]
        if first.solved:
            return [first]
        solving = next((o for o in feasible if o.solved), None)
        return [first] if solving is None else [solving, first]

    def search(g: int, solved: int, matched: int) -> None:
        nonlocal steps, exhausted
        steps += 1
        if steps > budget:
            exhausted = True
            return
        if (solved + can_solve[g], matched + can_match[g]) <= best[2]:
            return  # even the best case for the remaining gold calls cannot beat the best
        if g == n:
            best[0], best[1], best[2] = list(current), list(current_solved), (solved, matched)
            return
        after = -1
        options: list[Candidate] = []
        if all(current[d] >= 0 for d in depends_on[g]):
            after = max((current[d] for d in depends_on[g]), default=-1)
            options = options_of(g, after)
        for option in options:
            used.add(option.call)
            current[g], current_solved[g] = option.call, option.solved
            search(g + 1, solved + option.solved, matched + 1)
            used.discard(option.call)
            current[g], current_solved[g] = -1, False
            if exhausted:
                return
        if not options or contested[g]:  # unmatched: dominated when its calls are uncontested
            search(g + 1, solved, matched)

    search(0, 0, 0)
    blocked = [bool(candidates[g]) and best[0][g] < 0 for g in range(n)]
    return Matching(best[0], best[1], exact=not exhausted, steps=steps, blocked=blocked)


def _uncontested(
    order: Sequence[Sequence[Candidate]], depends_on: Sequence[Sequence[int]]
) -> Matching | None:
    """The matching in one pass when no call fits two gold calls and no choice is needed.

    By the dominance rules each gold call then takes its earliest feasible candidate;
    only when that one does not solve but a later one does is there a choice (None:
    the caller searches).
    """
    n = len(order)
    calls, solved = [-1] * n, [False] * n
    for g, options in enumerate(order):
        if not options:
            continue
        after = -1  # the latest call matched to a dependency
        for d in depends_on[g]:
            if calls[d] < 0:
                break  # a dependency is unmatched: so is this one
            after = max(after, calls[d])
        else:
            feasible = [o for o in options if o.call > after]
            if not feasible:
                continue
            if not feasible[0].solved and any(o.solved for o in feasible):
                return None
            calls[g], solved[g] = feasible[0].call, feasible[0].solved
    blocked = [bool(order[g]) and calls[g] < 0 for g in range(n)]
    return Matching(calls, solved, exact=True, steps=n, blocked=blocked)
