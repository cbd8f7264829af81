"""A scripted generator: replays given token sequences after given delays.

It lets the rollout core be tested with a real tokenizer but no model (property tests
over random trajectories), and lets the overlap benchmark emulate slow generation
without a GPU. It behaves like an engine where it matters: it honours ``max_tokens``,
EOS / ``stop_token_ids`` and (given a tokenizer) ``stop`` strings, and records exactly
what it was fed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_client.backends.base import (
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_STOP,
    STOP_COMPLETED,
    STOP_LENGTH,
    TokenOutput,
    max_new_tokens,
)


@dataclass(slots=True)
class ScriptedTurn:
    """What the generator answers on one turn; ``log_probs`` default to fixed fake values."""

    token_ids: list[int]
    delay_s: float = 0.0
    log_probs: list[float] | None = None


@dataclass(slots=True)
class GenerateCall:
    """One recorded ``generate`` call (copies of its inputs and the output); ``image_data``
    is the images the call was given (veRL's keyword), None for text."""

    request_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    output: TokenOutput
    image_data: list[Any] | None = None


def fake_logprob(token_id: int) -> float:
    """A deterministic, non-zero stand-in log-probability for a token."""
    return -((token_id * 2654435761) % 997 + 1) / 1000.0


@dataclass
class _RequestState:
    script: Sequence[ScriptedTurn]
    turn: int = 0


Script = Sequence[ScriptedTurn] | Callable[[list[int]], Sequence[ScriptedTurn]]


class ScriptedGenerator:
    """Replays a script per request id.

    ``script`` is one sequence of turns used for every request, or a function of the
    first prompt of a request returning that request's turns; ``assign`` sets the turns
    of one request id up front. Past the end of a script the generator answers with
    ``eos_token_id`` alone (or raises if none was given).
    """

    def __init__(
        self,
        script: Script,
        *,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        self._script = script
        self._tokenizer = tokenizer
        self._eos = frozenset(eos_token_ids)
        self._states: dict[str, _RequestState] = {}
        self.calls: list[GenerateCall] = []

    def assign(self, request_id: str, turns: Sequence[ScriptedTurn]) -> None:
        """Give one request its own turns (instead of ``script``), e.g. per dataset row."""
        self._states[request_id] = _RequestState(turns)

    def calls_for(self, request_id: str) -> list[GenerateCall]:
        return [c for c in self.calls if c.request_id == request_id]

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput:
        state = self._states.get(request_id)
        if state is None:
            script = self._script(list(prompt_ids)) if callable(self._script) else self._script
            state = self._states[request_id] = _RequestState(script)
        if state.turn < len(state.script):
            turn = state.script[state.turn]
        elif self._eos:
            turn = ScriptedTurn([min(self._eos)])
        else:
            raise RuntimeError(f"script for request {request_id} has only {len(state.script)} turns")
        state.turn += 1
        if turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        output = self._cut(turn, sampling_params)
        images = kwargs.get("image_data")
        self.calls.append(
            GenerateCall(
                request_id,
                list(prompt_ids),
                dict(sampling_params),
                output,
                None if images is None else list(images),
            )
        )
        return output

    def _cut(self, turn: ScriptedTurn, params: dict[str, Any]) -> TokenOutput:
        """Apply the engine's stopping rules to the scripted tokens."""
        ids = list(turn.token_ids)
        limit = max_new_tokens(params, len(ids))
        stop_ids = self._eos | frozenset(params.get("stop_token_ids") or ())
        stops = [s for s in params.get("stop") or () if s]
        finish = FINISH_LENGTH
        end = len(ids)
        for i, token in enumerate(ids):
            if i >= limit:
                end, finish = limit, FINISH_LENGTH
                break
            if token in stop_ids:
                end, finish = i + 1, FINISH_EOS
                break
            if stops and self._tokenizer is not None:
                text = self._tokenizer.decode(ids[: i + 1], skip_special_tokens=False)
                if any(s in text for s in stops):
                    end, finish = i + 1, FINISH_STOP
                    break
        else:
            finish = FINISH_LENGTH if len(ids) >= limit else FINISH_STOP
        ids = ids[:end]
        if turn.log_probs is not None:
            log_probs = list(turn.log_probs[:end])
        else:
            log_probs = [fake_logprob(t) for t in ids]
        return TokenOutput(
            token_ids=ids,
            log_probs=log_probs if params.get("logprobs") else None,
            stop_reason=STOP_LENGTH if finish == FINISH_LENGTH else STOP_COMPLETED,
            extra_fields={"finish_reason": finish},
        )
