"""Each token's text, for the trajectory view's token boundaries (when a tokenizer is configured).

A rollout record holds token ids and the decoded text of each run of model or observation
tokens, not each token's text. With ``workbench.tokenizer`` set, the server decodes ids
one by one with the ``tokenizers`` library (Rust, no torch), loaded on first use.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tool_server.config import ConfigError

__all__ = ["TokenText"]


class TokenText:
    def __init__(self, tokenizer: str | None) -> None:
        self.path = _tokenizer_file(tokenizer) if tokenizer else None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def texts(self, ids: list[int]) -> list[str] | None:
        """The text of each id (None without a tokenizer). Blocking: call from a worker thread."""
        if self.path is None:
            return None
        with self._lock:
            if self._tokenizer is None:
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_file(str(self.path))
        tokenizer = self._tokenizer
        return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def _tokenizer_file(tokenizer: str) -> Path:
    path = Path(tokenizer).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"workbench.tokenizer: no tokenizer.json at {path}")
    return path
