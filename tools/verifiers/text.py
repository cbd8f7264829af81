"""Shared text helpers for verifiers: find the model's answer, normalise it, read the gold.

Every verifier scores the *final* model text: ``request.response`` when given, else the
content of the last assistant message of the rollout (``request.response_messages()``:
the messages from ``response_start`` on, so worked examples in the prompt never count as
the model's). Within it the answer is
the text of the LAST ``<answer>`` block; an ``<answer>`` left open at the end (a
generation stopped on ``</answer>``, which engines strip) counts as closed by the end of
the text. Without any ``<answer>`` tag the whole final text (stripped) is the answer.

``ground_truth`` may take any of these shapes (see :func:`gold_answers`):

- a string: one acceptable answer;
- a number (int / float / Decimal): rendered without a trailing ``.0``;
- a bool: ``"yes"`` / ``"no"`` (how FanOutQA-style yes/no answers are phrased);
- a list / tuple / set: several acceptable answers (any one matches);
- a dict: the answers under the first present key of ``target``, ``targets``,
  ``answers``, ``answer``, ``ground_truth`` (Search-R1 uses ``{"target": [...]}``).

These functions are on the hot path of ``exact_match`` (tens of thousands of calls per
second), so regexes and translation tables are built once at import time.
"""

from __future__ import annotations

import re
import string
import unicodedata
from decimal import Decimal
from functools import lru_cache
from typing import Any

from protocol import VerifyRequest

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
GOLD_KEYS = ("target", "targets", "answers", "answer", "ground_truth")

_ARTICLES = frozenset(("a", "an", "the"))
_ASCII_PUNCT = str.maketrans("", "", string.punctuation)
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\r?\n)+")
_NON_WORD = re.compile(r"[^\w\s]|_")  # punctuation and symbols, any script
_CODE_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


class GroundTruthError(ValueError):
    """``ground_truth`` has a shape this verifier cannot read; the message says which."""


def final_text(request: VerifyRequest) -> str:
    """The model's final text: ``response`` if set, else the last assistant message's content."""
    if request.response is not None:
        return request.response
    for message in reversed(request.response_messages()):
        if message.get("role") == "assistant":
            return content_text(message.get("content"))
    return ""


def assistant_texts(request: VerifyRequest) -> list[str]:
    """Everything the model wrote, one string per assistant turn (``response`` last).

    ``response`` is appended only when it is not already the last assistant message, so
    callers that pass both do not see the final turn twice.
    """
    texts = [
        content_text(m.get("content")) for m in request.response_messages() if m.get("role") == "assistant"
    ]
    if request.response is not None and (not texts or texts[-1] != request.response):
        texts.append(request.response)
    return texts


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text blocks of an OpenAI/MCP block list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(block.get("text", "") if isinstance(block, dict) else str(block) for block in content)
    return str(content)


def extract_answer(text: str, strip: bool = True) -> tuple[str, bool]:
    """The answer inside the last ``<answer>`` block, and whether a tag was found.

    Without a tag the whole text is returned with ``False``. ``strip=False`` keeps
    surrounding whitespace (code answers need their indentation).
    """
    start = text.rfind(ANSWER_OPEN)
    if start < 0:
        return (text.strip() if strip else text), False
    start += len(ANSWER_OPEN)
    end = text.find(ANSWER_CLOSE, start)
    answer = text[start:] if end < 0 else text[start:end]
    return (answer.strip() if strip else answer), True


def extract_code(text: str, languages: tuple[str, ...] = ("python", "py", "python3", "")) -> str:
    """The last fenced code block whose language is in ``languages``; else ``text`` itself.

    An unterminated final fence (generation cut at a stop string) still counts. Leading
    blank lines and trailing whitespace go; the first line's indentation stays.
    """
    blocks = [body for lang, body in _CODE_FENCE.findall(text) if lang.lower() in languages]
    return _LEADING_BLANK_LINES.sub("", blocks[-1] if blocks else text).rstrip()


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lowercase, drop punctuation and articles, fold whitespace.

    ASCII text takes the exact SQuAD path (``string.punctuation`` removed). Other text is
    first NFKC-normalised and case-folded (so composed and decomposed accents, full-width
    digits and ``ß``/``ss`` agree), then every character that is neither a word character
    nor whitespace is removed: Unicode punctuation and symbols, as SQuAD does for ASCII.
    """
    if text.isascii():
        text = text.lower().translate(_ASCII_PUNCT)
    else:
        text = _NON_WORD.sub("", unicodedata.normalize("NFKC", text).casefold())
    # Only word characters and whitespace are left, so SQuAD's \b(a|an|the)\b is a token test.
    return " ".join([token for token in text.split() if token not in _ARTICLES])


# Gold answers repeat (a GRPO group scores n samples against one gold; epochs repeat
# prompts), so their normal forms are cached; model answers are not (they rarely repeat).
normalize_gold = lru_cache(maxsize=65536)(normalize_answer)


def format_number(value: int | float | Decimal) -> str:
    """A number as a model would write it: ``42``, ``2.5``, never ``42.0`` or ``1e+06``."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    text = format(Decimal(str(value)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def gold_answers(ground_truth: Any) -> list[str]:
    """All acceptable answers as strings; see the module docstring for accepted shapes.

    Raises GroundTruthError for None, empty collections and unsupported types.
    """
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, bool | int | float | Decimal):
        return [format_number(ground_truth)]
    if isinstance(ground_truth, dict):
        for key in GOLD_KEYS:
            if key in ground_truth:
                return gold_answers(ground_truth[key])
        raise GroundTruthError(
            f"ground_truth dict needs one of the keys {list(GOLD_KEYS)}, got {sorted(ground_truth)}"
        )
    if isinstance(ground_truth, list | tuple | set | frozenset):
        if all(type(item) is str for item in ground_truth) and ground_truth:
            return list(ground_truth)  # the common case, without recursion
        golds: list[str] = []
        for item in ground_truth:
            golds.extend(gold_answers(item))
        if not golds:
            raise GroundTruthError("ground_truth is an empty list: no acceptable answer given")
        return golds
    if ground_truth is None:
        raise GroundTruthError("ground_truth is missing (null): nothing to compare the answer with")
    if hasattr(ground_truth, "tolist"):  # numpy arrays/scalars, as read back from parquet
        return gold_answers(ground_truth.tolist())
    raise GroundTruthError(
        f"ground_truth must be a string, number, list or dict, got {type(ground_truth).__name__}"
    )


def question_text(request: VerifyRequest) -> str:
    """The task's question, or ``""``.

    With ``response_start`` set it is the last user message of the prompt (earlier ones
    may be worked examples); without it, the first user message of the chat.
    """
    prompt = request.prompt_messages()
    users = [m for m in prompt or request.messages or () if m.get("role") == "user"]
    if not users:
        return ""
    return content_text((users[-1] if prompt else users[0]).get("content"))
