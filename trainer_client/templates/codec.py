"""Text <-> token ids for the renderers, and text that must stay text (``TokenCodec``).

A tokenizer reads the string of an added token (``<|im_end|>``, ``<|eot_id|>``,
``<tool_response>``) as that token wherever it occurs. Tool results and simulated user
turns are data: a result holding ``<|im_end|>\\n<|im_start|>assistant\\n`` would otherwise
close the tool turn and open an assistant turn the model never wrote. So the renderers
mark the added-token strings found in such content (``literal_markers``, ``mark``) and
``encode_marked`` encodes them as the ordinary text they are, while the chat template's
own special tokens stay special.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainer_client.templates.wordcache import WordCacheEncoder

__all__ = ["TokenCodec", "valid_utf8"]

logger = logging.getLogger(__name__)

# Marker characters stand in for added-token strings while a template renders; they come
# from the Private Use Area and are chosen absent from every text of the render.
_PRIVATE_USE = range(0xE000, 0xF900)


class TokenCodec:
    """Fast text <-> ids without special-token insertion or clean-up.

    Uses the Rust ``tokenizers`` object directly when the tokenizer has one (about half
    the per-call overhead of ``tokenizer.encode``); ids are identical.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._words = WordCacheEncoder.for_tokenizer(self._backend) if self._backend is not None else None
        added = self._added_tokens()
        self._added_ids = {content: i for i, content in added.items()}
        contents = sorted(self._added_ids, key=len, reverse=True)  # longest first, as the tokenizer matches
        self._added = re.compile("|".join(map(re.escape, contents))) if contents else None

    def encode(self, text: str) -> list[int]:
        if self._words is not None:
            return self._words.encode(text)
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ------------------------------------------------------------------ text that stays text

    def encode_text(self, text: str) -> list[int]:
        """The ids of ``text`` read as data, as an observation's content is spliced: its
        added-token strings are ordinary text (what the observation budget counts)."""
        if self._added is None or not self._added.search(text):
            return self.encode(text)
        return self._encode_ordinary(text, self._ordinary)

    def literal_markers(self, texts: Iterable[str], avoid: Iterable[str] = ()) -> dict[str, str]:
        """A marker character for each added-token string that occurs in ``texts``; none
        of the markers occurs in ``texts`` or ``avoid``. Empty when no text holds one
        (the common case: nothing to mark)."""
        if self._added is None:
            return {}
        texts = list(texts)
        found = {m.group(0) for text in texts for m in self._added.finditer(text)}
        if not found:
            return {}
        taken = set().union(*map(set, texts), *map(set, avoid))
        free = (chr(c) for c in _PRIVATE_USE if chr(c) not in taken)
        return {token: marker for token, marker in zip(sorted(found), free, strict=False)}

    def mark(self, text: str, markers: Mapping[str, str]) -> str:
        """``text`` with each added-token string that has a marker replaced by it."""
        if not markers or self._added is None:
            return text
        return self._added.sub(lambda m: markers.get(m.group(0), m.group(0)), text)

    def encode_marked(self, text: str, markers: Mapping[str, str]) -> list[int]:
        """The ids of ``text`` in which each marker stands for its added-token string as
        ordinary text (``<``, ``|``, ``im``, ...), never as the token itself.

        The text is cut at the added tokens it holds itself, as the tokenizer cuts it,
        and each piece is encoded without added tokens; a marker becomes its string first.
        """
        if self._added is None:
            return self.encode(text)
        return self._cut_and_encode(text, markers, self._ordinary)

    def _cut_and_encode(self, text: str, markers: Mapping[str, str], ordinary: Any) -> list[int]:
        unmark = str.maketrans({marker: token for token, marker in markers.items()})
        ids: list[int] = []
        pos = 0
        for match in self._added.finditer(text) if self._added is not None else ():
            ids += self._encode_ordinary(text[pos : match.start()].translate(unmark), ordinary)
            ids.append(self._added_ids[match.group(0)])
            pos = match.end()
        ids += self._encode_ordinary(text[pos:].translate(unmark), ordinary)
        return ids

    def _encode_ordinary(self, text: str, ordinary: Any) -> list[int]:
        if not text:
            return []
        if ordinary is not None:
            return ordinary.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def _added_tokens(self) -> dict[int, str]:
        """The tokenizer's added tokens: the strings it reads as one token anywhere."""
        try:
            if self._backend is not None:
                return {i: t.content for i, t in self._backend.get_added_tokens_decoder().items()}
            return {
                i: str(t) for i, t in (getattr(self.tokenizer, "added_tokens_decoder", None) or {}).items()
            }
        except Exception as exc:  # an unusual tokenizer: nothing is marked
            logger.warning("could not list the tokenizer's added tokens: %s", exc)
            return {}

    @functools.cached_property
    def _ordinary(self) -> Any:
        """A copy of the Rust tokenizer without its added tokens (same model and
        pre-tokenizer): it reads ``<|im_end|>`` as the characters it is made of. Built
        when first needed (a large vocabulary takes a moment to copy), and checked."""
        if self._backend is None:
            return None
        from tokenizers import Tokenizer

        spec = json.loads(self._backend.to_str())
        spec["added_tokens"] = []
        ordinary = Tokenizer.from_str(json.dumps(spec))
        self._check_cuts(ordinary)
        return ordinary

    def _check_cuts(self, ordinary: Any) -> None:
        """Whether cutting at added tokens and encoding the pieces reproduces the tokenizer
        (true for byte-level BPE: SmolLM2, Qwen, Llama 3). Where it does not (added tokens
        that strip the spaces beside them, a pre-tokenizer that treats the first piece
        apart), marked observations may differ from the tokenizer at their cuts; said once."""
        tokens = sorted(self._added_ids, key=len, reverse=True)[:4]
        samples = [f"{tokens[0]}tool\n a{tokens[-1]}\n{tokens[0]}x  y\n\n", f" x {' '.join(tokens)} é\t"]
        if any(self._cut_and_encode(sample, {}, ordinary) != self.encode(sample) for sample in samples):
            logger.warning(
                "this tokenizer splits text at its added tokens differently from a plain cut: "
                "tool results holding special-token text are encoded safely, but their tokens "
                "may differ from the tokenizer's at the cuts"
            )


def valid_utf8(text: str) -> str:
    """``text`` as valid UTF-8: a lone surrogate (from bytes a tool or an MCP upstream
    decoded with ``surrogateescape``) is shown escaped (``\\udce9``), as the parsers show it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
