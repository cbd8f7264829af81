"""What a gold lookup must find: the values its result has to hold for the call to count.

A gold call whose ``compare`` leaves arguments out (free-text search words, filters that only
narrow a lookup) would otherwise be matched by any successful call of its tool: two junk
searches that return nothing would "solve" every lookup of a task. So such a call is solved
only when its result *holds its targets*:

- ``GoldCall.finds`` when the pack sets it (any JSON scalars: record ids, labels);
- else, from the gold replay: the ids of the records in its gold output that something
  downstream uses — a later gold call's arguments name the id, or one of the record's values
  is the gold answer or a string the model must communicate;
- else the ids of every record its gold output holds (the lookup must find what the gold found).

A record is a JSON object with an ``"id"``. A result holds a target when any scalar anywhere
in it equals the target (numbers by value). A gold call with no uncompared argument, or whose
gold output holds no record, has no targets: its arguments decide it, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from tools.envs.pack import GoldCall
from tools.verifiers.text import normalize_answer

__all__ = ["holds", "lookup_targets"]

Target = str | int | float


def lookup_targets(
    golds: Sequence[GoldCall],
    outputs: Sequence[Any],
    deps: Sequence[Sequence[int]],
    said: Sequence[str],
) -> list[tuple[Target, ...]]:
    """Per gold call (in ``golds`` order), the values its result must hold; () for none.

    ``outputs``: each gold call's output in the gold replay; ``deps``: the indices each gold
    call depends on; ``said``: the gold answer and communicate strings (normalised).
    """
    wanted = set(said)
    used_by: list[set[Target]] = [set() for _ in golds]
    for g, depends in enumerate(deps):
        scalars = set(_scalars(golds[g].arguments))
        for d in depends:
            used_by[d] |= scalars
    out: list[tuple[Target, ...]] = []
    for g, gold in enumerate(golds):
        if gold.finds is not None:
            out.append(tuple(gold.finds))
            continue
        if gold.compare is None or not set(gold.arguments) - set(gold.compare):
            out.append(())
            continue
        records = [r for r in _records(outputs[g]) if _is_scalar(r["id"])]
        used = [
            r["id"]
            for r in records
            if r["id"] in used_by[g] or any(_said(v, wanted) for v in _scalars(r) if isinstance(v, str | int))
        ]
        out.append(tuple(dict.fromkeys(used or [r["id"] for r in records])))
    return out


def holds(output: Any, targets: Sequence[Target]) -> bool:
    """Whether every target is a scalar somewhere in ``output``."""
    if not targets:
        return True
    found = list(_scalars(output))
    return all(any(_same(value, target) for value in found) for target in targets)


def _said(value: str | int, wanted: set[str]) -> bool:
    return bool(wanted) and not isinstance(value, bool) and normalize_answer(str(value)) in wanted


def _same(value: Any, target: Target) -> bool:
    if isinstance(value, bool) or isinstance(target, bool):
        return value is target
    if isinstance(target, int | float) and isinstance(value, int | float):
        return math.isclose(value, target, rel_tol=1e-9, abs_tol=1e-9)
    return type(value) is type(target) and value == target


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def _scalars(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _scalars(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _scalars(item)
    elif value is not None:
        yield value


def _records(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if "id" in value:
            yield value
        for item in value.values():
            yield from _records(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _records(item)
