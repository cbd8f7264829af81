"""``exact_match`` and ``f1``: SQuAD-style answer matching against one or more golds.

Both read the answer from the final model text (last ``<answer>`` block, else the whole
text) and every acceptable gold from ``ground_truth`` (see ``tools.verifiers.text``).
Options in ``request.arguments``:

- ``require_answer_tag`` (bool, default false): score 0 when the text has no
  ``<answer>`` tag, as Search-R1 does, instead of matching the whole text.

These are the reward of Search-R1-style QA and must keep up with a trainer scoring
whole batches, so they are plain synchronous functions that allocate little.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from protocol import VerifyRequest, VerifyResult, verifier
from tools.verifiers.text import (
    GroundTruthError,
    extract_answer,
    final_text,
    gold_answers,
    normalize_answer,
    normalize_gold,
)


def _prepare(request: VerifyRequest) -> tuple[str, bool, list[str]] | VerifyResult:
    """Answer, tagged flag and golds; or a zero result saying what was wrong."""
    answer, tagged = extract_answer(final_text(request))
    try:
        golds = gold_answers(request.ground_truth)
    except GroundTruthError as exc:
        return VerifyResult(0.0, {}, {"error": str(exc), "answer": answer})
    if not tagged and request.arguments.get("require_answer_tag"):
        return VerifyResult(0.0, {}, {"error": "no <answer> tag in the response", "answer": answer})
    return answer, tagged, golds


@verifier(name="exact_match", timeout_s=5.0, blocking=False)
def exact_match(request: VerifyRequest) -> VerifyResult:
    """1.0 when the normalised answer equals any normalised gold answer, else 0.0."""
    prepared = _prepare(request)
    if isinstance(prepared, VerifyResult):
        prepared.components["exact_match"] = 0.0
        return prepared
    answer, tagged, golds = prepared
    normalized = normalize_answer(answer)
    matched = None
    for gold in golds:
        if normalize_gold(gold) == normalized:
            matched = gold
            break
    score = 1.0 if matched is not None else 0.0
    return VerifyResult(
        score,
        {"exact_match": score},
        {"answer": answer, "normalized": normalized, "tagged": tagged, "matched": matched, "golds": golds},
    )


def token_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> tuple[float, float, float]:
    """Token-level (F1, precision, recall) of two normalised token lists (SQuAD definition).

    Two empty lists agree perfectly (1.0); one empty list scores 0.
    """
    if not prediction_tokens or not gold_tokens:
        same = float(prediction_tokens == gold_tokens)
        return same, same, same
    common = Counter(prediction_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0, 0.0, 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


@verifier(name="f1", timeout_s=5.0, blocking=False)
def f1(request: VerifyRequest) -> VerifyResult:
    """Token-level F1 between the normalised answer and the best-matching gold answer."""
    prepared = _prepare(request)
    if isinstance(prepared, VerifyResult):
        prepared.components.update(f1=0.0, precision=0.0, recall=0.0)
        return prepared
    answer, tagged, golds = prepared
    prediction_tokens = normalize_answer(answer).split()
    best: tuple[float, float, float] = (-1.0, 0.0, 0.0)
    best_gold: Any = None
    for gold in golds:
        scores = token_f1(prediction_tokens, normalize_gold(gold).split())
        if scores[0] > best[0]:
            best, best_gold = scores, gold
    score, precision, recall = best
    return VerifyResult(
        score,
        {"f1": score, "precision": precision, "recall": recall},
        {
            "answer": answer,
            "normalized": " ".join(prediction_tokens),
            "tagged": tagged,
            "best_gold": best_gold,
        },
    )
