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
dependency order, trying solved candidates first and then "leave it unmatched", pruned
by the bound (S + gold calls left, M + gold calls left). Its first leaf *is* the greedy
matching, and the bound ends the search as soon as every gold call is solved, so the
usual case (each gold call has one or two candidates) costs a few dozen steps. The
search stops after ``budget`` steps and keeps the best matching found so far
(``Matching.exact`` False) — only adversarial logs with many interchangeable calls
get there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Candidate", "Matching", "match_calls"]

DEFAULT_BUDGET = 20_000


@dataclass(frozen=True, slots=True)
class Candidate:
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
    order = [sorted(options, key=lambda c: (not c.solved, c.call)) for options in candidates]
    current = [-1] * n
    current_solved = [False] * n
    best: list[list] = [[-1] * n, [False] * n, (-1, -1)]
    used: set[int] = set()
    steps = 0
    exhausted = False

    def search(g: int, solved: int, matched: int) -> None:
        nonlocal steps, exhausted
        steps += 1
        if steps > budget:
            exhausted = True
            return
        left = n - g
        if (solved + left, matched + left) <= best[2]:
            return  # even solving every remaining gold call cannot beat the best
        if g == n:
            best[0], best[1], best[2] = list(current), list(current_solved), (solved, matched)
            return
        after = -1
        possible = True
        for d in depends_on[g]:
            if current[d] < 0:
                possible = False
                break
            after = max(after, current[d])
        if possible:
            for option in order[g]:
                if option.call > after and option.call not in used:
                    used.add(option.call)
                    current[g], current_solved[g] = option.call, option.solved
                    search(g + 1, solved + option.solved, matched + 1)
                    used.discard(option.call)
                    current[g], current_solved[g] = -1, False
                    if exhausted or best[2] == (n, n):
                        return
        search(g + 1, solved, matched)

    search(0, 0, 0)
    blocked = [bool(candidates[g]) and best[0][g] < 0 for g in range(n)]
    return Matching(best[0], best[1], exact=not exhausted, steps=steps, blocked=blocked)
