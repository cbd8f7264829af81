"""``entropy_coeff``: the entropy bonus (``loss - entropy_coeff * entropy``, veRL's actor)
reaches the weights. Its entropies carry gradient when the coefficient is positive; at 0
they are a metric, computed without one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.require import require

require("verl")

from tests.support.tiny_policy import one_group, tiny_model_dir, trainer_on, update_of  # noqa: E402
from trainer_client.backends.hf_prefix import prompt_prefix  # noqa: E402
from trainer_client.training.logprobs import response_logprobs, shared_prefix  # noqa: E402

SIGNAL = [("408", 1.0), ("512 is it", 0.0), ("<tool_call>x</tool_call>", 0.5), ("4 0 8", 0.0)]
NO_SIGNAL = [(text, 1.0) for text, _ in SIGNAL]  # equal rewards: no policy gradient at all


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("sharing", [False, True], ids=["plain", "shared-prefix"])
def test_the_entropy_gradient_is_that_of_the_entropy(tiny: Path, sharing: bool) -> None:
    """The gradient of ``response_logprobs``' entropies (``entropy_grad``) equals autograd's on
    the entropy of each row's own forward pass, also through a detached shared prefix."""
    from trainer_client.backends.models import load_model

    tokenizer, model = load_model(str(tiny))
    batch = one_group(tokenizer, SIGNAL)
    prompts = [t.prompt_ids for t in batch.trajectories]
    responses = [t.response_ids for t in batch.trajectories]

    model.zero_grad(set_to_none=True)
    for p, r in zip(prompts, responses, strict=True):
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : -1].float() / 0.7
        (-(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)).sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    prefix = shared_prefix(model, prompt_prefix(prompts), detach=True) if sharing else None
    _, entropy = response_logprobs(
        model,
        prompts,
        responses,
        pad_token_id=int(tokenizer.pad_token_id),
        temperature=0.7,
        with_entropy=True,
        entropy_grad=True,
        prefix=prefix,
    )
    entropy.sum().backward()
    if prefix is not None:
        prefix.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"no entropy gradient reached {name}"
        assert torch.allclose(p.grad, expected[name], rtol=1e-3, atol=1e-6), name


def test_an_entropy_coefficient_changes_the_update(tiny: Path, tmp_path: Path) -> None:
    """Same batch, same seed: entropy_coeff 0.1 gives another update than 0."""
    updates = []
    for coeff in (0.0, 0.1):
        with trainer_on(tiny, tmp_path / str(coeff), lr=1e-5, entropy_coeff=coeff) as trainer:
            updates.append(update_of(trainer, one_group(trainer.tokenizer, SIGNAL)))
    differing = sum(int((updates[0][n] != updates[1][n]).sum()) for n in updates[0])
    assert differing > 0, "entropy_coeff had no effect on the update"


def mean_entropy(trainer: Any, batch: Any) -> float:
    with torch.no_grad():
        _, entropy = response_logprobs(
            trainer.model,
            [t.prompt_ids for t in batch.trajectories],
            [t.response_ids for t in batch.trajectories],
            pad_token_id=trainer.pad_token_id,
            with_entropy=True,
        )
    mask = batch.response_mask
    return float((entropy * mask).sum() / mask.sum())


def test_the_entropy_bonus_alone_raises_the_entropy(tiny: Path, tmp_path: Path) -> None:
    """Equal rewards carry no policy gradient: with entropy_coeff > 0 the update follows the
    bonus alone, and the policy's entropy on the batch rises (a sign error would lower it)."""
    with trainer_on(tiny, tmp_path, lr=1e-3, entropy_coeff=0.1) as trainer:
        batch = one_group(trainer.tokenizer, NO_SIGNAL)
        before = mean_entropy(trainer, batch)
        for _ in range(3):
            moved = update_of(trainer, batch)
        after = mean_entropy(trainer, batch)
    assert any(bool(d.any()) for d in moved.values()), "the bonus moved no weight"
    assert after > before, f"entropy went from {before:.6f} to {after:.6f}"
