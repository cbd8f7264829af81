"""The generation interface of the rollout core: veRL's server-manager ``generate``.

It mirrors veRL 0.9.1 field for field: ``verl.workers.rollout.llm_server.LLMServerClient.generate``
(the server manager veRL hands to agent loops) and ``verl.workers.rollout.replica.TokenOutput``.
So veRL's own server manager (vLLM/SGLang behind it) plugs into the rollout core unchanged,
and our CPU backends plug into veRL-shaped code.

``sampling_params`` keys (vLLM names, as veRL passes them through):
``max_tokens`` (or ``max_new_tokens``), ``temperature``, ``top_p``, ``top_k``, ``seed``,
``repetition_penalty``, ``stop`` (strings), ``stop_token_ids``, ``logprobs`` (bool: return
the log-probability of each sampled token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# veRL's ``TokenOutput.stop_reason`` values.
STOP_COMPLETED = "completed"  # EOS or a stop string / stop token
STOP_LENGTH = "length"  # max_tokens reached
STOP_ABORTED = "aborted"  # the engine dropped the request

# Finer detail our backends put in ``extra_fields["finish_reason"]`` (veRL folds them into
# "completed"): which of EOS, a stop string or the token budget ended the turn.
FINISH_EOS = "eos"
FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(slots=True)
class TokenOutput:
    """One generation turn: token ids out, with per-token log-probabilities.

    Same field names as veRL's ``TokenOutput`` (a pydantic model there); the rollout core
    reads only attributes, so either class works.
    """

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Generator(Protocol):
    """Anything with veRL's ``server_manager.generate`` signature.

    ``request_id`` is stable for a trajectory (veRL uses it for sticky routing and prefix
    caching); ``prompt_ids`` is the whole context so far (prompt + response tokens).

    Images: once a trajectory holds images, the rollout core passes ``image_data`` (the
    decoded Pillow images so far, in the order of their image tokens in ``prompt_ids``) and,
    when set, ``mm_processor_kwargs``, as veRL's server manager takes them; a vision engine
    computes pixel values from them. Text trajectories never pass them, so a text-only
    backend needs nothing; one that cannot see must refuse ``image_data`` rather than
    generate as if the images were not there. Other extra keywords may be ignored.
    """

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput: ...


def max_new_tokens(sampling_params: dict[str, Any], default: int) -> int:
    """The token budget of one request (``max_tokens`` or ``max_new_tokens``)."""
    value = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
    return default if value is None else int(value)


def check_text_request(backend: str, prompt_ids: list[int], kwargs: dict[str, Any], images_hint: str) -> None:
    """The checks every text backend makes of a ``generate`` call: some context, and no images
    (``images_hint``: where a request with images should go instead)."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: generation needs at least one token of context")
    if kwargs.get("image_data"):
        raise ValueError(f"{backend} cannot take image_data: {images_hint}")
