"""Faster CPU generation with HF models: compute a shared prompt prefix once, and GQA decoding without copies.

Both are exact (same tokens, same log-probs up to float rounding) and both matter on a
CPU: few-shot prompts share hundreds of tokens across a batch, and transformers' SDPA
path copies the key/value cache for grouped-query attention at every decode step.

* ``SharedPrefixGenerator``: an ``HFGenerator`` that prefills the prompt prefix a batch
  shares once and reuses its key/value cache (attention is causal, so the prefix's keys
  do not depend on what follows).
* ``use_gqa_decode_attention(model)``: an attention function for one-token decode steps
  that lays a KV head's query heads out as query positions instead of repeating the KV
  head for each of them.
* The cache helpers (``common_prefix_length``, ``prompt_prefix``, ``cache_layers``, ``expanded_cache``) are
  shared with the trainer's log-prob computation (``trainer_client.training.logprobs``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch

from trainer_client.backends.hf import HFGenerator

__all__ = [
    "MIN_SHARED_PREFIX",
    "SharedPrefixGenerator",
    "cache_layers",
    "common_prefix_length",
    "expanded_cache",
    "prompt_prefix",
    "use_gqa_decode_attention",
]

logger = logging.getLogger(__name__)

# Tokens a batch must share before its prefix is computed once: below this, the saving
# is smaller than the bookkeeping (an extra forward pass and a cache copy).
MIN_SHARED_PREFIX = 32


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of token sequences."""
    if not sequences:
        return 0
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for other in sequences[1:]:
        i = 0
        while i < n and other[i] == first[i]:
            i += 1
        n = i
        if n == 0:
            break
    return n


def prompt_prefix(prompts: Sequence[Sequence[int]], min_length: int = MIN_SHARED_PREFIX) -> list[int] | None:
    """The prefix all prompts share (each keeps at least one token of its own), if long enough to be worth it."""
    if not prompts:
        return None
    shared = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
    return list(prompts[0][:shared]) if shared >= min_length else None


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of an HF cache (transformers 5 ``DynamicCache``)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return [(k, v) for k, v in cache]  # legacy tuple format


def expanded_cache(
    layers: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: int, length: int, capacity: int | None = None
) -> Any:
    """A fresh ``DynamicCache`` holding the first ``length`` positions of a one-row prefix, for ``rows`` rows.

    Without ``capacity``, ``expand`` makes views, so the prefix is stored once and the
    model's own cache update (a concatenation) never writes to it: right for one
    forward pass. With ``capacity`` (decoding), every layer gets a preallocated buffer
    that new positions are written into, instead of re-concatenating the whole cache at
    every step (half of a CPU decode step otherwise).
    """
    from transformers import DynamicCache

    cache = DynamicCache(
        [
            (k[:, :, :length].expand(rows, -1, -1, -1), v[:, :, :length].expand(rows, -1, -1, -1))
            for k, v in layers
        ]
    )
    if capacity is not None:
        cache.layers = [
            _preallocated_layer_class()(layer.keys, layer.values, capacity) for layer in cache.layers
        ]
    return cache


@functools.cache  # transformers is imported on first use, the class made once
def _preallocated_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` that writes new positions into spare capacity (grows by half when full)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
            super().__init__()
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True
            self._length = 0
            self._k = keys.new_empty((*keys.shape[:2], max(capacity, keys.shape[-2]), keys.shape[-1]))
            self._v = values.new_empty((*values.shape[:2], self._k.shape[-2], values.shape[-1]))
            self.update(keys, values)

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            end = self._length + key_states.shape[-2]
            if end > self._k.shape[-2]:
                grown = max(end, self._k.shape[-2] * 3 // 2)
                for name in ("_k", "_v"):
                    old = getattr(self, name)
                    new = old.new_empty((*old.shape[:2], grown, old.shape[-1]))
                    new[:, :, : self._length] = old[:, :, : self._length]
                    setattr(self, name, new)
            self._k[:, :, self._length : end] = key_states
            self._v[:, :, self._length : end] = value_states
            self._length = end
            self.keys = self._k[:, :, :end]
            self.values = self._v[:, :, :end]
            return self.keys, self.values

    return PreallocatedLayer


class SharedPrefixGenerator(HFGenerator):
    """``HFGenerator`` that computes the prompt prefix shared by a batch once.

    Few-shot prompts are long (SmolLM2 arithmetic: ~560 of ~620 prompt tokens are the
    same system turn and worked examples), and every turn re-reads the whole context.
    This keeps the key/value cache of the longest shared prefix seen (a few anchors);
    a batch whose rows share at least ``min_prefix`` tokens with an anchor starts from a
    slice of it and prefills only the rest. Sampling, stopping and log-probs are the
    parent's; only the prefill differs, and it is exact (causal attention).
    """

    def __init__(
        self, *args: Any, min_prefix: int = MIN_SHARED_PREFIX, max_anchors: int = 4, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.min_prefix = min_prefix
        self.max_anchors = max_anchors
        self._anchors: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.prefix_tokens_reused = 0
        self.prefill_tokens = 0

    def clear_prefix_cache(self) -> None:
        """Drop cached prefixes: call after the weights change (every optimizer step)."""
        self._anchors.clear()

    def _prefix_for(self, prompts: list[list[int]], capacity: int) -> tuple[int, Any]:
        ids = prompt_prefix(prompts, self.min_prefix)
        if ids is None:
            return 0, None
        shared = len(ids)
        best, best_len = None, 0
        for anchor in self._anchors:
            n = common_prefix_length([anchor[0][:shared], prompts[0][:shared]])
            if n > best_len:
                best, best_len = anchor, n
        if best is None or best_len < self.min_prefix:
            ids = prompts[0][:shared]
            out = self.model(
                input_ids=torch.tensor([ids], device=self.device), use_cache=True, logits_to_keep=1
            )
            best, best_len = (ids, cache_layers(out.past_key_values)), shared
            self._anchors.insert(0, best)
            del self._anchors[self.max_anchors :]
            self.prefill_tokens += shared
        return best_len, expanded_cache(best[1], len(prompts), best_len, capacity)

    @torch.inference_mode()
    def _run_batch(self, batch: list[Any]) -> None:
        self._check_stopped()  # before the prefill: a closed generator starts nothing
        prompts = [r.prompt_ids for r in batch]
        capacity = max(len(p) for p in prompts) + max(r.max_tokens for r in batch) + 1
        shared, cache = self._prefix_for(prompts, capacity)
        if cache is None:
            self.prefill_tokens += sum(len(p) for p in prompts)
            super()._run_batch(batch)
            return
        rows = len(batch)
        suffixes = [p[shared:] for p in prompts]
        width = max(len(s) for s in suffixes)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((rows, shared + width), dtype=torch.long)
        attention[:, :shared] = 1
        for i, s in enumerate(suffixes):
            input_ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            attention[i, shared + width - len(s) :] = 1
        self.prefix_tokens_reused += shared * rows
        self.prefill_tokens += sum(len(s) for s in suffixes)
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._decode_from(batch, out, attention, positions[:, -1])


# --------------------------------------------------------------------------- decode attention for GQA on CPU

GQA_ATTENTION = "toolfactory_gqa_sdpa"


def _gqa_sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA that never copies the key/value cache for grouped-query attention when decoding.

    transformers' ``sdpa`` path repeats every KV head for its query heads when a mask is
    given (always, with padded batches): on CPU that copy is most of a decode step
    (SmolLM2: 9 query heads share 3 KV heads; py-spy showed ~60 % of decode time in
    ``repeat_kv``). With one query token, the query heads of a KV head can instead be laid
    out as that head's "query positions", which is the same computation without a copy.
    Prefill and training (more than one query token) use transformers' own ``sdpa``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    batch, heads, _, dim = query.shape
    grouped = query.reshape(batch, heads // groups, groups, dim)
    mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=False
    )
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_gqa_decode_attention(model: Any) -> bool:
    """Switch ``model`` to :func:`_gqa_sdpa` (same results, faster CPU decoding); False if unsupported."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        AttentionInterface.register(GQA_ATTENTION, _gqa_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_ATTENTION, sdpa_mask)
        model.set_attn_implementation(GQA_ATTENTION)
    except (ImportError, AttributeError, ValueError) as exc:
        logger.info("keeping the model's attention implementation: %s", exc)
        return False
    return True
