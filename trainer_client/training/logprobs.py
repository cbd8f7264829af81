"""Per-token log-probs of responses under a causal LM, with gradients: what the GRPO loss needs.

One signature, two computations: ``response_logprobs(..., prefix=None)`` runs every row
in full (left-padded prompt, then the response); with ``prefix`` (a ``SharedPrefix`` of
the prompt prefix all rows share, see ``shared_prefix``) each row feeds only what follows
the prefix and attends to its cached keys and values. Both give the same numbers (causal
attention); the second is what makes few-shot prompts affordable on a CPU, since the
shared part runs once per step instead of once per row. A detached prefix even
back-propagates once per step (``SharedPrefix.backward``), however many micro-batches used it.

Log-probs use ``logits / temperature``, as the sampler and veRL's actor do; entropies
carry gradient only when asked (``entropy_grad``: an entropy bonus in the loss), else they
are a metric computed without one. The
vocabulary projection runs in row chunks under activation checkpointing: the full
``(rows, tokens, vocab)`` logits and their softmax would not fit in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.utils.checkpoint

from trainer_client.backends.hf_prefix import (
    cache_layers,
    expanded_cache,
)

__all__ = ["SharedPrefix", "response_logprobs", "shared_prefix"]


@dataclass
class SharedPrefix:
    """The key/value cache of a prompt prefix, computed once and reused by many rows.

    ``layers`` are the (keys, values) the rows attend to. With ``detach=True`` (see
    :func:`shared_prefix`) they are leaves that collect the rows' gradients; then
    :meth:`backward` pushes those through the prefix computation once, however many
    micro-batches used it, which is exact and costs one prefix backward per step.
    """

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    graph: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def backward(self) -> None:
        if self.graph is None:
            return
        outputs, grads = [], []
        for (k, v), (gk, gv) in zip(self.layers, self.graph, strict=True):
            for leaf, node in ((k, gk), (v, gv)):
                if leaf.grad is not None:
                    outputs.append(node)
                    grads.append(leaf.grad)
        if outputs:
            torch.autograd.backward(outputs, grads)
        self.graph = None


def shared_prefix(model: Any, ids: Sequence[int], *, detach: bool = False) -> SharedPrefix:
    """Run ``ids`` (one row) through ``model`` and keep its key/value cache.

    ``detach`` (with grad enabled): the rows get leaf copies, so that each micro-batch's
    backward stops there, and :meth:`SharedPrefix.backward` finishes once per step.
    """
    device = next(model.parameters()).device
    body, _head = _body_and_head(model)
    tokens = torch.tensor([list(ids)], device=device)
    out = (
        body(input_ids=tokens, use_cache=True)
        if body is not None
        else model(input_ids=tokens, use_cache=True)
    )
    layers = cache_layers(out.past_key_values)
    if detach and torch.is_grad_enabled():
        leaves = [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in layers]
        return SharedPrefix(list(ids), leaves, layers)
    return SharedPrefix(list(ids), layers)


def response_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    prefix: SharedPrefix | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and optionally entropies) of ``responses`` given ``prompts``.

    Returns tensors of shape ``(rows, max_response_len)``, zeros past each response's
    end. Gradients flow when called with grad enabled: through the log-probs always, through
    the entropies only with ``entropy_grad``. With ``prefix``, every prompt must start with
    ``prefix.ids`` and extend beyond it.
    """
    entropy: Literal["grad", "metric"] | None = (
        ("grad" if entropy_grad else "metric") if with_entropy else None
    )
    rows = len(prompts)
    device = next(model.parameters()).device
    body, head = _body_and_head(model)
    shared, cache = 0, None
    if prefix is not None:
        shared = len(prefix.ids)
        if any(len(p) <= shared or list(p[:shared]) != prefix.ids for p in prompts):
            raise ValueError("every prompt must start with the shared prefix and extend beyond it")
        cache = expanded_cache(prefix.layers, rows, shared)
    suffixes = [list(p[shared:]) for p in prompts]
    s_width = max(len(s) for s in suffixes)
    r_width = max(max((len(r) for r in responses), default=0), 1)
    input_ids = torch.full((rows, s_width + r_width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((rows, shared + s_width + r_width), dtype=torch.long)
    attention[:, :shared] = 1
    labels = torch.full((rows, r_width), pad_token_id, dtype=torch.long)
    valid = torch.zeros((rows, r_width), dtype=torch.float32)
    for i, (s, r) in enumerate(zip(suffixes, responses, strict=True)):
        input_ids[i, s_width - len(s) : s_width] = torch.tensor(s, dtype=torch.long)
        attention[i, shared + s_width - len(s) : shared + s_width + len(r)] = 1
        if r:
            input_ids[i, s_width : s_width + len(r)] = torch.tensor(list(r), dtype=torch.long)
            labels[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
            valid[i, : len(r)] = 1.0
    input_ids, attention, labels, valid = (t.to(device) for t in (input_ids, attention, labels, valid))
    positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, shared:]
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": positions,
        "past_key_values": cache,
        "use_cache": cache is not None,
    }
    if body is None:  # a model whose head does more than a linear layer: logits as the model makes them
        logits = model(**inputs, logits_to_keep=r_width + 1).logits[:, :-1]
        log_probs, entropies = _token_logprobs(logits, labels, temperature, entropy, head=None)
        return log_probs * valid, (entropies * valid if with_entropy else None)
    # position s_width-1+j predicts response token j
    hidden = body(**inputs).last_hidden_state[:, s_width - 1 : s_width - 1 + r_width]
    vocab = int(getattr(head, "out_features", 0) or head.weight.shape[0])
    chunk = max(1, LOGITS_CHUNK_ELEMENTS // (r_width * vocab))
    pieces = [
        torch.utils.checkpoint.checkpoint(
            _token_logprobs,
            hidden[i : i + chunk],
            labels[i : i + chunk],
            temperature,
            entropy,
            head,
            use_reentrant=False,
        )
        if torch.is_grad_enabled()
        else _token_logprobs(hidden[i : i + chunk], labels[i : i + chunk], temperature, entropy, head)
        for i in range(0, rows, chunk)
    ]
    log_probs = torch.cat([p[0] for p in pieces]) * valid
    entropies = torch.cat([p[1] for p in pieces]) * valid if with_entropy else None
    return log_probs, entropies


LOGITS_CHUNK_ELEMENTS = 1 << 26  # float32 logits per chunk (256 MB)


def _body_and_head(model: Any) -> tuple[Any, Any]:
    """(decoder without the LM head, the LM head) when logits are exactly ``head(hidden)``, else (None, None)."""
    config = getattr(model, "config", None)
    if any(
        getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    ):
        return None, None
    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if body is None or body is model or not isinstance(head, torch.nn.Linear):
        return None, None
    return body, head


def _token_logprobs(
    hidden_or_logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    entropy: Literal["grad", "metric"] | None,
    head: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``labels`` and, by ``entropy``, the entropies under ``logits / temperature``:
    ``"grad"`` with gradient (an entropy bonus), ``"metric"`` without, None: zeros."""
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    logits = (head(hidden_or_logits) if head is not None else hidden_or_logits).float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    # flash-attn's in-place backward overwrites the logits, which the entropy's backward still
    # needs (veRL's actor turns it off when it computes the entropy too)
    log_probs = logprobs_from_logits(logits, labels, inplace_backward=entropy != "grad")
    if entropy == "grad":
        return log_probs, entropy_from_logits(logits)
    with torch.no_grad():
        entropies = entropy_from_logits(logits) if entropy == "metric" else torch.zeros_like(log_probs)
    return log_probs, entropies
