"""BFCL's multi-turn scores as its leaderboard shows them, from per-trajectory verdicts.

BFCL's accuracy of a category is the share of its entries its checker counts correct
(``save_eval_results``); the leaderboard's "Multi Turn Overall Acc" is the unweighted mean
of the four categories, a category not evaluated counting 0 there and shown as "N/A" in its
own column (``calculate_unweighted_accuracy``, ``get_category_score``). Accuracies print as
percentages with two decimals. BFCL runs one sample per entry; with k samples per entry an
entry counts the share of its samples that passed (the expected accuracy of one sample).

Feed ``leaderboard`` one ``(pack or category, task id, reward)`` per trajectory: the reward is
the eval-mode ``tool_use`` score (or its ``benchmark`` component), BFCL's 1.0 or 0.0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tools.envs.bfcl.data import CATEGORIES

__all__ = ["CategoryScore", "Leaderboard", "category_of", "leaderboard"]

ENTRIES_PER_CATEGORY = 200  # every BFCL v4 multi-turn category has 200 entries
_COLUMNS = {
    "multi_turn_base": "Base",
    "multi_turn_miss_func": "Miss Func",
    "multi_turn_miss_param": "Miss Param",
    "multi_turn_long_context": "Long Context",
}


@dataclass(frozen=True)
class CategoryScore:
    category: str
    correct: float  # entries counted correct (fractional with k samples per entry)
    entries: int  # entries scored
    samples: int  # trajectories scored
    total: int = ENTRIES_PER_CATEGORY  # entries in the category

    @property
    def accuracy(self) -> float:
        """BFCL's accuracy: correct over the entries scored (BFCL itself requires all of them)."""
        return self.correct / self.entries if self.entries else 0.0

    @property
    def complete(self) -> bool:
        return self.entries == self.total


@dataclass(frozen=True)
class Leaderboard:
    categories: dict[str, CategoryScore]

    @property
    def overall(self) -> float:
        """Multi Turn Overall Acc: the unweighted mean of the four, a missing category as 0."""
        return sum(self.categories[c].accuracy for c in CATEGORIES if c in self.categories) / len(CATEGORIES)

    def table(self) -> str:
        """The leaderboard's multi-turn columns, one header line and one value line."""
        cells = {"Multi Turn Overall Acc": _percent(self.overall)}
        for category in CATEGORIES:
            score = self.categories.get(category)
            cells[_COLUMNS.get(category, category)] = "N/A" if score is None else _percent(score.accuracy)
        widths = [max(len(k), len(v)) for k, v in cells.items()]
        head = " | ".join(k.ljust(w) for k, w in zip(cells, widths, strict=True))
        values = " | ".join(v.ljust(w) for v, w in zip(cells.values(), widths, strict=True))
        notes = [
            f"{c}: {s.entries} of {s.total} entries scored (BFCL scores all of them)"
            for c, s in self.categories.items()
            if not s.complete
        ]
        return "\n".join([head, values, *notes])


def category_of(name: str) -> str:
    """The BFCL category of a pack id (``bfcl_multi_turn_base``) or of a category name."""
    category = name.removeprefix("bfcl_")
    if category not in CATEGORIES:
        raise ValueError(
            f"{name!r} is not a BFCL multi-turn pack or category; known: {', '.join(CATEGORIES)}"
        )
    return category


def leaderboard(verdicts: Iterable[tuple[str, str, float]]) -> Leaderboard:
    """BFCL's accuracy per category from ``(pack or category, task id, reward)`` triples."""
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, task, reward in verdicts:
        samples[category_of(name)][task].append(1.0 if reward == 1.0 else 0.0)
    return Leaderboard(
        {
            category: CategoryScore(
                category,
                correct=sum(sum(r) / len(r) for r in by_task.values()),
                entries=len(by_task),
                samples=sum(len(r) for r in by_task.values()),
            )
            for category, by_task in sorted(samples.items(), key=lambda item: CATEGORIES.index(item[0]))
        }
    )


def _percent(value: float) -> str:
    return f"{value * 100:.2f}%"
