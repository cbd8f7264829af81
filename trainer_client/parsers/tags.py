"""Tags in model text (``<tool_call>``, ``<search>``, ``<answer>``), found in one pass.

Early in RL a policy writes tags opened twice, never closed or closed without being
opened, and whole turns of nothing but tags. A regular expression such as
``<tag>(.*?)</tag>`` retries from every opener, which takes quadratic time on a run of
openers (0.5 MB of ``<answer>`` took 230 s); ``TagScanner`` looks for each tag once, so
reading a turn is linear in its length whatever it holds.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["TagScanner", "find_answer"]

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

BodyEnd = Literal["close", "reopened", "unclosed"]


def find_answer(text: str) -> str | None:
    """The content of the first ``<answer>`` that is closed, stripped, or None.

    The first opener is the one: if no ``</answer>`` follows it, none follows a later one.
    """
    start = text.find(ANSWER_OPEN)
    if start == -1:
        return None
    end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
    return None if end == -1 else text[start + len(ANSWER_OPEN) : end].strip()


class TagScanner:
    """The opening and closing tags of one format in one text, read front to back.

    Each search starts where the previous one for the same tag stopped, and a found tag
    is remembered until the caller moves past it, so a caller whose position only moves
    forward reads the text once per tag.
    """

    def __init__(self, text: str, open_tag: str, close_tag: str) -> None:
        self.text = text
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._found: dict[str, tuple[int, int]] = {}  # tag -> (searched from, found at or -1)

    def find(self, tag: str, pos: int) -> int:
        """The first ``tag`` at or after ``pos``; -1 when there is none."""
        cached = self._found.get(tag)
        if cached is not None:
            searched_from, found = cached
            if searched_from <= pos and (found == -1 or pos <= found):
                return found
        found = self.text.find(tag, pos)
        self._found[tag] = (pos, found)
        return found

    def next_tag(self, pos: int) -> tuple[Literal["open", "close"], int] | None:
        """The next tag at or after ``pos``, opening or closing, and where it starts."""
        opens, closes = self.find(self.open_tag, pos), self.find(self.close_tag, pos)
        if closes != -1 and (opens == -1 or closes < opens):
            return "close", closes
        return None if opens == -1 else ("open", opens)

    def body_end(self, body_start: int) -> tuple[BodyEnd, int]:
        """How the body that starts at ``body_start`` ends: at its closing tag, at another
        opening tag that comes first (its own was never closed), or at the end of the text."""
        opens, closes = self.find(self.open_tag, body_start), self.find(self.close_tag, body_start)
        if closes != -1 and (opens == -1 or closes < opens):
            return "close", closes
        if opens != -1:
            return "reopened", opens
        return "unclosed", len(self.text)
