"""CPU generation with HF transformers behind veRL's ``generate`` interface.

Concurrent trajectories each await ``generate``; a small batching queue collects the
requests that arrive within a few milliseconds, left-pads them into one batch and runs a
manual KV-cache decode loop in a worker thread (the event loop stays free for tool calls
of other trajectories). Each row keeps its own sampling parameters, seed, stop strings
and token budget, and stops on its own; results are split back per request.

Log-probabilities are those of the distribution the token was sampled from, before
top-k/top-p filtering: ``log_softmax(logits / temperature)`` (raw logits when greedy),
which is what a trainer recomputes for the same tokens.

Stopping: a thread running torch cannot be cancelled from outside, so the generation
thread checks a flag before every block of the model (a forward pre-hook on each layer,
present while the generator runs: a long prompt's prefill is one forward pass) and before
every token; ``aclose`` (run on Ctrl-C too) sets it, and the batch in flight ends within one
layer's work instead of running to its token budget.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer_client.backends.base import (
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_STOP,
    STOP_COMPLETED,
    STOP_LENGTH,
    TokenOutput,
    check_text_request,
    max_new_tokens,
)
from trainer_client.backends.models import autocast

logger = logging.getLogger(__name__)


class GenerationStopped(RuntimeError):
    """The generator was closed while a batch was being decoded (its requests get no output)."""


@dataclass
class _Request:
    prompt_ids: list[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: list[str]
    stop_ids: frozenset[int]
    repetition_penalty: float
    want_logprobs: bool
    generator: torch.Generator | None
    future: asyncio.Future[TokenOutput]
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish: str | None = None
    stop_str: str | None = None


class HFGenerator:
    """A ``Generator`` running a causal LM from transformers on CPU (or any torch device).

    ``max_batch_size`` bounds one shared forward pass; ``batch_wait_s`` is how long the
    queue waits for more requests after the first one arrives. ``compute_dtype`` (e.g.
    ``torch.bfloat16``) runs the model under ``torch.autocast`` to that dtype, as a trainer
    with float32 master weights computes its log-probs; unset: the weights' own dtype.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 8,
        batch_wait_s: float = 0.005,
        default_max_tokens: int = 256,
        eos_token_ids: Iterable[int] | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.default_max_tokens = default_max_tokens
        self.device = next(model.parameters()).device
        self.compute_dtype = compute_dtype
        eos = set(eos_token_ids or ())
        for source in (getattr(model, "generation_config", None), tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                eos.add(value)
            elif value:
                eos.update(int(v) for v in value)
        self.eos_token_ids = frozenset(eos)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else min(self.eos_token_ids or {0}))
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stop = threading.Event()  # set by aclose: generation ends at the next layer
        self._in_thread = threading.local()  # marks the generation thread (the hooks stop only it)
        self._hooks: list[Any] = []  # the layers' stop checks, while the generator runs
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.batches: list[int] = []  # size of every batch run, for inspection and benchmarks

    # ------------------------------------------------------------------ public API

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput:
        check_text_request(
            "HFGenerator (a text-only backend)",
            prompt_ids,
            kwargs,
            "serve a vision-language model with vLLM/SGLang under veRL, or roll out without a processor "
            "(images become text notes)",
        )
        loop = asyncio.get_running_loop()
        request = self._make_request(list(prompt_ids), sampling_params, loop.create_future())
        if request.max_tokens <= 0:
            return TokenOutput(
                [],
                [] if request.want_logprobs else None,
                stop_reason=STOP_LENGTH,
                extra_fields={"finish_reason": FINISH_LENGTH},
            )
        self._ensure_worker()
        assert self._queue is not None
        await self._queue.put(request)
        return await request.future

    async def aclose(self) -> None:
        """Stop the batching task and the worker thread (a later ``generate`` restarts them).

        A batch being generated stops before its next layer (its requests get no output), so
        this returns within one layer's work, also while the caller is being cancelled (Ctrl-C).
        """
        self._stop.set()
        try:
            if self._worker is not None and self._loop is asyncio.get_running_loop():
                self._worker.cancel()
                try:
                    await self._worker
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # the caller itself is being cancelled (Ctrl-C): not ours to swallow
        finally:
            self._worker = None
            if self._executor is not None:
                self._executor.shutdown(wait=True)  # one layer's work at most: the flag is set
                self._executor = None
            for hook in self._hooks:  # the model may be trained or served by others next
                hook.remove()
            self._hooks = []

    # ------------------------------------------------------------------ batching

    def _make_request(
        self, prompt_ids: list[int], params: dict[str, Any], future: asyncio.Future[TokenOutput]
    ) -> _Request:
        temperature = float(params.get("temperature", 1.0) or 0.0)
        top_k = int(params.get("top_k", -1) or -1)
        seed = params.get("seed")
        generator = None
        if seed is not None:
            # on the model's device: torch.multinomial refuses a CPU generator for CUDA probabilities
            generator = torch.Generator(device=self.device).manual_seed(int(seed))
        budget = max_new_tokens(params, self.default_max_tokens)
        budget = min(budget, self.max_positions - len(prompt_ids))
        stop = params.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        return _Request(
            prompt_ids=prompt_ids,
            temperature=temperature,
            top_p=float(params.get("top_p", 1.0) or 1.0),
            top_k=top_k,
            max_tokens=budget,
            stop=[s for s in stop if s],
            stop_ids=self.eos_token_ids | frozenset(int(t) for t in params.get("stop_token_ids") or ()),
            repetition_penalty=float(params.get("repetition_penalty", 1.0) or 1.0),
            want_logprobs=bool(params.get("logprobs", False)),
            generator=generator,
            future=future,
        )

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._loop is not loop:
            # First use, or a new event loop (e.g. successive asyncio.run calls).
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._serve(), name="hf-generator-batching")
        if self._executor is None:
            self._stop.clear()  # after aclose: its thread has ended
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="hf-generate"
            )
            self._hooks = [
                block.register_forward_pre_hook(self._layer_hook)
                for blocks in self.model.modules()
                if isinstance(blocks, torch.nn.ModuleList)
                for block in blocks
            ]

    async def _serve(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    if self._queue.empty():
                        break
                    batch.append(self._queue.get_nowait())
                    continue
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout))
                except TimeoutError:
                    break
            live = [r for r in batch if not r.future.cancelled()]
            if not live:
                continue
            self.batches.append(len(live))
            try:
                await loop.run_in_executor(self._executor, self._generate, live)  # one batch at a time
            except GenerationStopped as exc:  # closed mid-batch: not a failure to report
                for r in live:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            except Exception as exc:
                logger.exception("batched generation failed")
                for r in live:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            for r in live:
                if not r.future.done():
                    r.future.set_result(self._output(r, len(live)))

    def _output(self, r: _Request, batch_size: int) -> TokenOutput:
        finish = r.finish or FINISH_LENGTH
        extra: dict[str, Any] = {"finish_reason": finish, "batch_size": batch_size}
        if r.stop_str is not None:
            extra["stop_str"] = r.stop_str
        return TokenOutput(
            token_ids=r.tokens,
            log_probs=r.log_probs if r.want_logprobs else None,
            stop_reason=STOP_LENGTH if finish == FINISH_LENGTH else STOP_COMPLETED,
            extra_fields=extra,
        )

    # ------------------------------------------------------------------ the decode loop (worker thread)

    def _generate(self, batch: list[_Request]) -> None:
        """``_run_batch`` in the generation thread, marked so that the layer hooks may stop it."""
        self._in_thread.active = True
        try:
            with autocast(self.device, self.compute_dtype):  # thread-local: entered in this thread
                self._run_batch(batch)
        finally:
            self._in_thread.active = False

    def _layer_hook(self, module: Any, args: Any) -> None:
        # Only the generation thread: a trainer may run the same model in another thread.
        if getattr(self._in_thread, "active", False):
            self._check_stopped()

    def _check_stopped(self) -> None:
        if self._stop.is_set():
            raise GenerationStopped("the generator was closed while this request was being generated")

    @torch.inference_mode()
    def _run_batch(self, batch: list[_Request]) -> None:
        self._check_stopped()
        width = max(len(r.prompt_ids) for r in batch)
        rows = len(batch)
        input_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((rows, width), dtype=torch.long)
        for i, r in enumerate(batch):
            n = len(r.prompt_ids)
            input_ids[i, width - n :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            attention[i, width - n :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        self._decode_from(batch, out, attention, positions[:, -1])

    def _decode_from(
        self, batch: list[_Request], out: Any, attention: torch.Tensor, last_pos: torch.Tensor
    ) -> None:
        """Token by token from a prefilled cache (``out``) until every row has finished."""
        rows = len(batch)
        past = out.past_key_values
        logits = out.logits[:, -1, :].float()
        steps = max(r.max_tokens for r in batch)
        stop_window = max((len(s) for r in batch for s in r.stop), default=0) + 2
        for _ in range(steps):
            self._check_stopped()
            next_ids = []
            for i, r in enumerate(batch):
                if r.finish is not None:
                    next_ids.append(self.pad_token_id)
                    continue
                token, log_prob = self._sample(r, logits[i])
                r.tokens.append(token)
                r.log_probs.append(log_prob)
                next_ids.append(token)
                self._check_stop(r, token, stop_window)
            if all(r.finish is not None for r in batch):
                break
            step_ids = torch.tensor(next_ids, dtype=torch.long, device=self.device).unsqueeze(1)
            attention = torch.cat(
                [attention, torch.ones((rows, 1), dtype=torch.long, device=self.device)], dim=1
            )
            last_pos = last_pos + 1
            out = self.model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=last_pos.unsqueeze(1),
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()

    def _sample(self, r: _Request, logits: torch.Tensor) -> tuple[int, float]:
        if r.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted(set(r.prompt_ids) | set(r.tokens)), dtype=torch.long, device=logits.device
            )
            values = logits[seen]
            logits = logits.clone()
            logits[seen] = torch.where(
                values > 0, values / r.repetition_penalty, values * r.repetition_penalty
            )
        if r.temperature <= 0.0:
            token = int(torch.argmax(logits))
            return token, float(torch.log_softmax(logits, -1)[token])
        scaled = logits / r.temperature
        log_probs = torch.log_softmax(scaled, -1)
        filtered = scaled
        if 0 < r.top_k < filtered.shape[-1]:
            kth = torch.topk(filtered, r.top_k).values[-1]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        if r.top_p < 1.0:
            sorted_logits, order = torch.sort(filtered, descending=True)
            cumulative = torch.softmax(sorted_logits, -1).cumsum(-1)
            drop = cumulative - torch.softmax(sorted_logits, -1) >= r.top_p  # keep the token crossing top_p
            filtered = filtered.clone()
            filtered[order[drop]] = float("-inf")
        probs = torch.softmax(filtered, -1)
        token = int(torch.multinomial(probs, 1, generator=r.generator))
        return token, float(log_probs[token])

    def _check_stop(self, r: _Request, token: int, window: int) -> None:
        if token in r.stop_ids:
            r.finish = FINISH_EOS
            return
        if r.stop:
            tail = self._decode(r.tokens[-window:])
            for s in r.stop:
                if s in tail:
                    r.finish, r.stop_str = FINISH_STOP, s
                    return
        if len(r.tokens) >= r.max_tokens:
            r.finish = FINISH_LENGTH

    def _decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)
