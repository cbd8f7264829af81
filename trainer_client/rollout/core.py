"""The engine-agnostic rollout core: generate -> parse -> invoke -> update, per trajectory.

One coroutine runs one trajectory; ``RolloutCore.run_batch`` runs them all concurrently,
so a slow tool or a long generation in one trajectory never blocks another. Per turn:

1. **Generate** from ``prompt_ids + response_ids`` (token ids in, ids + log-probs out). The
   generated ids are appended as they are (mask 1, their log-probs); they are decoded
   only to be parsed.
2. **Parse** the turn's text with the configured format (given the task's tool schemas);
   malformed calls, and calls whose arguments cannot travel as JSON, become error
   observations for the model, never exceptions.
3. **Invoke** the calls through a ``ToolInvoker`` (the batched HTTP client, or anything
   with the same two methods), with the trajectory's session id on every call.
4. **Update**: render the results as an observation token delta (``templates``) and
   append it with mask 0 and log-prob 0, enforcing the observation, call, turn and
   total-length budgets.

A turn without a call ends the trajectory, unless the user speaks next: a static later
turn of the task (``Task.user_turns``), else a simulated user (``Task.user_scenario``,
see ``user_sim``) asked through the invoker's ``llm`` model tool. The user's message
is spliced like an observation (mask 0). A static turn may make more tools available
(``Task.new_tools``, BFCL's missed functions): the prompt, rendered once, lists only the
tools available from the start, so the turn's message announces the new ones, and a call
to a tool still held back is refused here, before it reaches the server.

Images: given a VLM's processor, a result's image blocks stay in the tool message and are
spliced as image tokens (``vision.VisionChatRenderer``), and every later ``generate`` gets
the images so far as ``image_data`` (veRL's keyword); without one, each image becomes a line
of text saying it was not shown. ``max_obs_tokens`` counts image tokens: an image that does
not fit is replaced by such a line (see ``observation_budget``).

The output ``Trajectory`` carries what veRL's ``AgentLoopOutput`` needs (``images`` for its
``multi_modal_data``). The session is leased while the trajectory runs (an invoker with
``lease_session``, as ``ToolClient``, renews it on the server, so generation may take longer
than the server's session TTL) and released at the end of every trajectory, also when
generation or a tool fails, or the rollout is cancelled (Ctrl-C).

Where the parts live: the records (``RolloutConfig``, ``Task``, ``Trajectory``, ...) in
``types``, re-exported here; a trajectory's mutable state in ``state``;
turn parsing in ``parse``; the observation budget in ``observation_budget``; the
user's later turns in ``user_turns``; the observation texts in ``observations``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import protocol
from trainer_client.backends.base import STOP_ABORTED, STOP_LENGTH, Generator
from trainer_client.parsers.registry import ParsedCall, ToolCallParser, get_parser
from trainer_client.rollout.observation_budget import ObservationBudget
from trainer_client.rollout.observations import HIDDEN_TOOL, not_run_text, parse_errors_text, result_text
from trainer_client.rollout.parse import turn_parser
from trainer_client.rollout.progress import BatchProgress
from trainer_client.rollout.state import TrajectoryState
from trainer_client.rollout.types import (
    TRUNCATION_MARKER,
    CallRecord,
    RolloutConfig,
    StopReason,
    Task,
    ToolInvoker,
    Trajectory,
    Verifier,
    bind_session,
)
from trainer_client.rollout.user_turns import UserTurns
from trainer_client.templates.factory import make_renderer
from trainer_client.templates.render import ObservationRenderer
from trainer_client.templates.vision import for_verifier, observation_content

# The records live in ``types``; they are re-exported here, where users import them.
__all__ = [
    "TRUNCATION_MARKER",
    "RolloutConfig",
    "RolloutCore",
    "StopReason",
    "Task",
    "ToolInvoker",
    "Trajectory",
    "Verifier",
]

logger = logging.getLogger(__name__)


class RolloutCore:
    """Runs trajectories against a generator and a tool invoker.

    Build one per (tokenizer, config); it is safe to share between concurrent
    trajectories and cheap to call ``run`` on. The renderer and parser default to the
    ones named in ``config``; ``processor`` (a VLM's) makes the default renderer show
    tool results' images as image tokens.
    """

    def __init__(
        self,
        tokenizer: Any,
        generator: Generator,
        invoker: ToolInvoker,
        config: RolloutConfig | None = None,
        *,
        verifier: Verifier | None = None,
        renderer: ObservationRenderer | None = None,
        parser: ToolCallParser | None = None,
        processor: Any = None,
    ) -> None:
        self.config = config or RolloutConfig()
        self.tokenizer = tokenizer
        self.generator = generator
        self.invoker = invoker
        self.verifier = verifier
        self.parser = parser or get_parser(self.config.format, **self.config.parser_options)
        self._parse = turn_parser(self.parser)
        self.renderer = renderer or make_renderer(
            tokenizer,
            self.config.tool_result_template,
            chat_template_kwargs=self.config.chat_template_kwargs,
            processor=processor,
            mm_processor_kwargs=self.config.mm_processor_kwargs,
        )
        self.vision = bool(getattr(self.renderer, "vision", False))
        self.codec = getattr(self.renderer, "codec", None) or _Codec(tokenizer)
        self.eos_token_ids = frozenset(self.renderer.eos_token_ids)
        self._budget = ObservationBudget(self.renderer, self.codec, self.config)
        self._users = UserTurns(invoker, self.config)

    # ------------------------------------------------------------------ public API

    async def run_batch(
        self,
        tasks: Sequence[Task],
        *,
        max_concurrency: int | None = None,
        sampling_params: dict[str, Any] | None = None,
    ) -> list[Trajectory]:
        """Roll out all tasks concurrently; results in task order. Progress goes to the log (INFO)."""
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        progress = BatchProgress(len(tasks))

        async def one(task: Task) -> Trajectory:
            async with gate or contextlib.nullcontext():
                trajectory = await self.run(task, sampling_params=sampling_params)
            progress.finished_one()
            return trajectory

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    async def run(
        self,
        task: Task,
        *,
        session_id: str | None = None,
        sampling_params: dict[str, Any] | None = None,
    ) -> Trajectory:
        """Roll out one task. ``sampling_params`` override the config's for this trajectory
        (veRL passes its own per call, e.g. greedy for validation).

        Never raises for model, tool or generator failures: they end the trajectory with
        ``StopReason.ERROR`` and the message in ``Trajectory.error``."""
        state = TrajectoryState(task, session_id or protocol.new_session_id())
        try:
            lease = getattr(self.invoker, "lease_session", None)
            if lease is not None:  # renewed while the trajectory lives: a slow policy keeps its world
                lease(state.session_id)
            state.prompt_ids = self.renderer.prompt_ids(task.messages, task.tools)
            await self._loop(state, {**self.config.sampling_params, **(sampling_params or {})})
            if state.stop_reason != StopReason.SESSION_LOST:
                await self._verify(state)
        except Exception as exc:
            logger.exception("trajectory %s failed", state.session_id)
            state.stop_reason = StopReason.ERROR
            state.error = f"{type(exc).__name__}: {exc}"
        finally:
            await self._release(state)
        return state.to_trajectory()

    # ------------------------------------------------------------------ the loop

    async def _loop(self, s: TrajectoryState, sampling_params: dict[str, Any]) -> None:
        cfg = self.config
        base_params, turn_cap = self._turn_params(sampling_params)
        for turn in range(cfg.max_turns):
            # 1. Generate, within what is left of the response budget.
            remaining = cfg.response_length - len(s.response_ids)
            if remaining <= 0:
                s.stop_reason = StopReason.LENGTH
                return
            params = dict(base_params)
            params["max_tokens"] = remaining if turn_cap is None else min(int(turn_cap), remaining)

            started = time.perf_counter()
            output = await self.generator.generate(
                s.session_id,
                prompt_ids=s.prompt_ids + s.response_ids,
                sampling_params=params,
                **self._media(s),
            )
            s.metrics["generate_s"] += time.perf_counter() - started
            if output.stop_reason == STOP_ABORTED:
                raise RuntimeError("the generation engine aborted the request")

            # 2. Parse the turn (appended as generated: mask 1, its log-probs).
            cpu_start = time.perf_counter()
            turn_ids = list(output.token_ids)[:remaining]
            log_probs = list(output.log_probs)[: len(turn_ids)] if output.log_probs is not None else []
            if len(log_probs) != len(turn_ids):
                s.metrics["missing_logprobs"] = True
                log_probs = log_probs + [0.0] * (len(turn_ids) - len(log_probs))
            s.append(turn_ids, 1, log_probs)
            s.assistant_turns += 1

            ended_with_eos = bool(turn_ids) and turn_ids[-1] in self.eos_token_ids
            text = self.codec.decode(turn_ids[:-1] if ended_with_eos else turn_ids)
            outcome = self._parse(text, s.tools)
            s.messages.append({"role": "assistant", "content": text})
            s.metrics["parse_errors"] += len(outcome.errors)
            s.metrics["client_s"] += time.perf_counter() - cpu_start

            # The trajectory ends here unless a call was made or the user speaks next.
            user_turn_next = self._users.may_speak(s)
            if outcome.final_answer is not None:
                s.final_answer = outcome.final_answer
                if not user_turn_next:
                    s.stop_reason = StopReason.ANSWER
                    return
            if len(s.response_ids) >= cfg.response_length or (
                output.stop_reason == STOP_LENGTH and not outcome.calls
            ):
                s.stop_reason = StopReason.LENGTH
                return
            ends_turn = outcome.final_answer is not None or (not outcome.calls and not outcome.errors)
            if ends_turn and not user_turn_next:
                if s.task.user_scenario and s.simulated_turns >= cfg.max_user_turns:
                    s.stop_reason = StopReason.MAX_USER_TURNS
                else:
                    s.stop_reason = StopReason.EOS if ended_with_eos else StopReason.NO_TOOL_CALL
                return
            if turn == cfg.max_turns - 1:
                s.stop_reason = StopReason.MAX_TURNS
                return

            # 3. Invoke the calls, or ask the user for the next turn.
            if ends_turn:  # the model answered the user, who goes on with the next request
                user_turn = await self._users.next(s)
                if user_turn is None:  # the user ended the conversation (stop_reason says how)
                    return
                observations = user_turn
            else:
                observations = await self._invoke(s, outcome.calls, outcome.errors)
                if s.stop_reason == StopReason.SESSION_LOST:
                    return

            # 4. Update: splice the observations in (mask 0), within the budgets.
            cpu_start = time.perf_counter()
            splice = self._budget.splice(observations, turn_ids, s.task.tools, s.metrics)
            s.metrics["client_s"] += time.perf_counter() - cpu_start
            if len(s.response_ids) + len(splice.ids) >= cfg.response_length:
                s.stop_reason = StopReason.LENGTH
                return
            s.append(splice.ids, 0, None)
            if splice.images:
                s.images += splice.images
                s.metrics["images"] = s.metrics.get("images", 0) + len(splice.images)
                s.metrics["image_tokens"] = s.metrics.get("image_tokens", 0) + sum(splice.image_tokens)
            s.messages.extend(observations)
            s.observation_turns += 1
        s.stop_reason = StopReason.MAX_TURNS  # unreachable: the last turn returns above

    def _turn_params(self, sampling_params: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """The sampling params of every turn (the parser's stop strings added, log-probs on)
        and the per-turn token cap (``max_tokens`` or ``max_new_tokens``), taken out of them."""
        base_params = dict(sampling_params)
        stop = base_params.get("stop") or ()
        stops = [stop] if isinstance(stop, str) else list(stop)  # engines take one string or a list
        base_params["stop"] = stops + [x for x in self.parser.stop_strings if x not in stops]
        base_params["logprobs"] = True
        turn_cap = base_params.pop("max_tokens", base_params.pop("max_new_tokens", None))
        return base_params, turn_cap

    def _media(self, s: TrajectoryState) -> dict[str, Any]:
        """The keyword arguments that give the engine the trajectory's images (veRL's
        ``image_data``); none for text, so text-only generators see no change."""
        if not s.images:
            return {}
        media: dict[str, Any] = {"image_data": list(s.images)}
        if self.config.mm_processor_kwargs:
            media["mm_processor_kwargs"] = dict(self.config.mm_processor_kwargs)
        return media

    async def _invoke(
        self, s: TrajectoryState, parsed: list[ParsedCall], errors: list[str]
    ) -> list[dict[str, Any]]:
        """Run the turn's calls (up to the per-turn budget): one observation per call run,
        then one for the calls over the budget and one for all parse errors, so a turn has
        at most ``max_calls_per_turn + 2`` observations."""
        limit = self.config.max_calls_per_turn
        # A call to a tool still held back is refused here (in its place among the results);
        # the reward counts it as a call the server refused: a tool message with a name.
        observations: list[dict[str, Any]] = [
            {"role": "tool", "name": c.name, "content": HIDDEN_TOOL.format(name=c.name)}
            for c in parsed[:limit]
        ]
        calls = [
            (i, protocol.Call(protocol.new_call_id(), c.name, c.arguments, s.session_id))
            for i, c in enumerate(parsed[:limit])
            if c.name not in s.hidden
        ]
        refused = len(observations) - len(calls)
        s.metrics["refused_calls"] += refused
        s.metrics["tool_errors"] += refused
        # The observations are spliced right after the assistant message, in this order.
        records = [
            CallRecord(
                turn=s.assistant_turns,
                message=len(s.messages) + i,
                name=c.name,
                elapsed_ms=0.0,
                cached=False,
                error=protocol.ErrorKind.UNKNOWN_TOOL.value,
            )
            for i, c in enumerate(parsed[:limit])
        ]
        if calls:
            started = time.perf_counter()
            if not s.bound:
                await self._bind(s)
            results = await self.invoker.call_tools([call for _, call in calls])
            s.metrics["tool_s"] += time.perf_counter() - started
            if len(results) != len(calls):
                raise RuntimeError(f"the tool invoker returned {len(results)} results for {len(calls)} calls")
            s.metrics["calls"] += len(calls)
            for (i, call), result in zip(calls, results, strict=True):
                if result.is_error:
                    s.metrics["tool_errors"] += 1
                content = observation_content(result, result_text(result), vision=self.vision)
                observations[i] = {"role": "tool", "name": call.name, "content": content}
                error = result.error.kind.value if result.error is not None else None
                if result.is_error and error is None:
                    error = protocol.ErrorKind.TOOL_ERROR.value
                records[i].update(elapsed_ms=result.elapsed_ms, cached=result.cached, error=error)
                s.note_lost_session(result.error)
        s.calls += records
        dropped = parsed[limit:]
        if dropped:
            s.metrics["dropped_calls"] += len(dropped)
            names = [c.name for c in dropped]
            observations.append({"role": "tool", "content": not_run_text(names, limit)})
        if errors:  # marked, so that a reward can count the calls that did not parse
            observations.append({"role": "tool", "content": parse_errors_text(errors), "error": "parse"})
        return observations

    async def _bind(self, s: TrajectoryState) -> None:
        s.bound = True
        await bind_session(self.invoker, s.session_id, s.task)

    async def _verify(self, s: TrajectoryState) -> None:
        name = s.task.verifier or self.config.verifier
        if self.verifier is None or name is None:
            return
        # Only the rollout's own messages count as the model's: worked examples in the
        # prompt must not be scored as its answers or tool calls.
        start = len(s.task.messages)
        last = next((m["content"] for m in reversed(s.messages[start:]) if m.get("role") == "assistant"), "")
        # A task's own arguments (a dataset row's extra_info) win, as in reward_bridge.
        arguments = s.task.metadata.get("verifier_arguments") or self.config.verifier_arguments
        request = protocol.VerifyRequest(
            verifier=name,
            ground_truth=s.task.ground_truth,
            response=last,
            messages=for_verifier(s.messages),
            session=s.session_id,
            arguments=dict(arguments),
            request_id=s.session_id,
            response_start=start,
        )
        started = time.perf_counter()
        try:
            (result,) = await self.verifier.verify([request])
        except Exception as exc:  # a failed verification leaves the reward unset
            logger.warning("verification of %s failed: %s", s.session_id, exc)
            s.metrics["verify_error"] = f"{type(exc).__name__}: {exc}"
            return
        finally:
            s.metrics["verify_s"] = time.perf_counter() - started
        if result.is_error:
            s.metrics["verify_error"] = result.error.message if result.error else "verifier error"
            s.note_lost_session(result.error)
            return
        s.reward_score = float(result.score)
        s.reward_components = dict(result.components)
        s.reward_details = dict(result.details)

    async def _release(self, s: TrajectoryState) -> None:
        try:
            await self.invoker.release_session(s.session_id)
        except Exception as exc:  # the server expires sessions anyway; never mask the result
            logger.warning("releasing session %s failed: %s", s.session_id, exc)
            s.metrics["release_error"] = f"{type(exc).__name__}: {exc}"


class _Codec:
    """Fallback codec when a custom renderer brings none."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)
