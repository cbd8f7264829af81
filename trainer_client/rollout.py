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
not fit is replaced by such a line (see ``RolloutCore._render``).

The output ``Trajectory`` carries what veRL's ``AgentLoopOutput`` needs (``images`` for its
``multi_modal_data``). The session is released at the end of every trajectory, also when
generation or a tool fails.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypedDict, runtime_checkable

import orjson

import protocol
from trainer_client.backends.base import STOP_ABORTED, STOP_LENGTH, Generator
from trainer_client.parsers import ParsedCall, ParseOutcome, ToolCallParser, check_call, get_parser
from trainer_client.templates import ObservationRenderer, Splice, make_renderer
from trainer_client.user_sim import simulator_messages, user_reply
from trainer_client.vision import for_verifier, image_blocks, not_shown, observation_content

logger = logging.getLogger(__name__)

TRUNCATION_MARKER = "\n...[truncated {n} tokens]"
HIDDEN_TOOL = "Error (unknown_tool): no tool named {name!r} is available to you"


@runtime_checkable
class ToolInvoker(Protocol):
    """Runs tool calls for the rollout. Results come back one per call, in order."""

    async def call_tools(self, calls: list[protocol.Call]) -> list[protocol.Result]: ...

    async def release_session(self, session_id: str) -> None: ...


@runtime_checkable
class Verifier(Protocol):
    """Scores finished trajectories (e.g. the tool server's ``/v1/verify``)."""

    async def verify(self, requests: list[protocol.VerifyRequest]) -> list[protocol.VerifyResult]: ...


class StopReason(StrEnum):
    """Why a trajectory ended."""

    ANSWER = "answer"  # the model gave a final <answer>
    EOS = "eos"  # the model ended its turn (EOS) without a call or an answer
    MAX_TURNS = "max_turns"  # the turn budget ran out while the model was still calling tools
    LENGTH = "length"  # the response-length budget (or a turn's max_tokens) ran out
    NO_TOOL_CALL = "no_tool_call"  # generation stopped without EOS, call or answer
    ERROR = "error"  # generation, a tool invocation or the renderer failed (see Trajectory.error)
    USER_STOP = "user_stop"  # the simulated user ended the conversation (a stop signal)
    MAX_USER_TURNS = "max_user_turns"  # the simulated user had said all it may (max_user_turns)
    USER_ERROR = "user_error"  # the simulated user could not be asked (see Trajectory.error)
    # The session's state is gone (its replica died or restarted, or it expired): the rest
    # of the trajectory would run against an empty world, so it ends unscored (see error).
    SESSION_LOST = "session_lost"


@dataclass
class RolloutConfig:
    """Everything that shapes a rollout. Budgets are per trajectory unless noted.

    ``max_obs_tokens`` bounds the content tokens of one observation turn (the tool
    results of that turn together, template tokens not counted): longer results are
    cut, to within a token or two, and end with a visible ``truncation_marker``. ``response_length`` bounds all response tokens (model + observation),
    as veRL's ``rollout.response_length``. ``tool_result_template`` None renders results
    as ``tool`` messages with the chat template; a text template such as
    ``templates.SEARCH_R1_TEMPLATE`` (or ``"search_r1"``) puts them inside the assistant
    turn. ``toolset`` names the server toolset; the invoker is built for it (the core
    only records it).

    ``user_tool`` is the server tool that plays a task's simulated user (the ``llm``
    model tool, or any tool taking ``messages`` and answering text); ``max_user_turns``
    bounds the simulated user's messages per trajectory. Tasks without a user scenario
    never call it.

    ``mm_processor_kwargs`` go to every call of a VLM's processor (``min_pixels``,
    ``max_pixels``, ...): set them as veRL's ``data.mm_processor_kwargs``.
    """

    format: str = "hermes"
    parser_options: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 4
    max_calls_per_turn: int = 4
    max_obs_tokens: int = 512
    response_length: int = 1024
    sampling_params: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0, "top_p": 1.0})
    tool_result_template: str | None = None
    toolset: str | None = None
    verifier: str | None = None
    verifier_arguments: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    truncation_marker: str = TRUNCATION_MARKER
    user_tool: str = "llm"
    max_user_turns: int = 10
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.user_tool, str) or not self.user_tool:
            raise ValueError(f"RolloutConfig.user_tool must name a server tool, got {self.user_tool!r}")
        for name in (
            "max_turns",
            "max_calls_per_turn",
            "max_obs_tokens",
            "response_length",
            "max_user_turns",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RolloutConfig.{name} must be a positive integer, got {value!r}")


@dataclass
class Task:
    """One prompt to roll out. ``tools`` are JSON tool schemas given to the chat template.

    ``user_turns`` are the user's later messages of a multi-turn conversation (BFCL
    multi-turn: ``metadata["turns"]`` from the dataset), each a list of messages: when the
    model ends a turn without calling a tool, the next one is spliced in (mask 0) and
    the model goes on, until none is left. ``user_scenario`` (from ``extra_info.user_sim``)
    gives the task a simulated user, asked for each later message once the static turns
    are spent, until it sends a stop signal or ``RolloutConfig.max_user_turns`` is reached.
    ``new_tools[i]`` (JSON tool schemas) become available with ``user_turns[i]``: until
    then a call to one of them is refused as an unknown tool.
    """

    messages: list[dict[str, Any]]
    ground_truth: Any = None
    tools: list[dict[str, Any]] | None = None
    verifier: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    user_turns: list[list[dict[str, Any]]] = field(default_factory=list)
    user_scenario: str | None = None
    new_tools: list[list[dict[str, Any]]] = field(default_factory=list)


@dataclass
class Trajectory:
    """One finished rollout, shaped like veRL's ``AgentLoopOutput`` (plus inspection data).

    ``response_mask`` is 1 for model tokens and 0 for observation/template tokens;
    ``response_logprobs`` holds the sampling log-probs of model tokens and 0.0 elsewhere.
    ``num_turns`` counts as veRL does: 1 (the prompt) + assistant turns + observation turns.
    ``calls`` has one ``CallRecord`` per tool call the rollout made or refused, in order;
    ``reward_details`` is the verifier's ``details`` (what it matched, per component).
    ``images`` are the images the model saw (Pillow images, in the order of their image
    tokens in ``prompt_ids + response_ids``): veRL's ``multi_modal_data["images"]``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    num_turns: int
    stop_reason: StopReason
    session_id: str
    messages: list[dict[str, Any]]
    final_answer: str | None = None
    reward_score: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    task: Task | None = None
    calls: list[CallRecord] = field(default_factory=list)
    reward_details: dict[str, Any] = field(default_factory=dict)
    images: list[Any] = field(default_factory=list)


class CallRecord(TypedDict):
    """One tool call of a trajectory, for inspection (the workbench, ``trainer-client show``).

    ``message`` is the index in ``Trajectory.messages`` of the tool message with its result
    (past the end when the response-length budget cut the turn before the splice);
    ``elapsed_ms`` and ``cached`` are the server's; ``error`` is the error kind, or None.
    """

    turn: int
    message: int
    name: str
    elapsed_ms: float
    cached: bool
    error: str | None


def announce_tools(schemas: Sequence[dict[str, Any]]) -> str:
    """The text that makes tools available mid-conversation, appended to the user's turn:
    the prompt's tool list was rendered once and cannot change without breaking the
    token prefix. One JSON schema a line, as chat templates list tools."""
    lines = "\n".join(orjson.dumps(schema).decode() for schema in schemas)
    return f"\n\nTools you can call from now on:\n<tools>\n{lines}\n</tools>"


def result_text(result: protocol.Result) -> str:
    """The observation a model sees for one result: its text, else its structured output."""
    text = result.text
    if not text and result.structured is not None:
        text = orjson.dumps(result.structured, default=str).decode()
    if result.is_error and not text and result.error is not None:
        text = f"Error ({result.error.kind.value}): {result.error.message}"
    return text


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
        self._parse = _parse_function(self.parser)
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

    # ------------------------------------------------------------------ public API

    async def run_batch(
        self,
        tasks: Sequence[Task],
        *,
        max_concurrency: int | None = None,
        sampling_params: dict[str, Any] | None = None,
    ) -> list[Trajectory]:
        """Roll out all tasks concurrently; results in task order."""
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def one(task: Task) -> Trajectory:
            if gate is None:
                return await self.run(task, sampling_params=sampling_params)
            async with gate:
                return await self.run(task, sampling_params=sampling_params)

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
        state = _State(task, session_id or protocol.new_session_id())
        try:
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

    async def _loop(self, s: _State, sampling_params: dict[str, Any]) -> None:
        cfg = self.config
        base_params = dict(sampling_params)
        stops = list(base_params.get("stop") or ())
        base_params["stop"] = stops + [x for x in self.parser.stop_strings if x not in stops]
        base_params["logprobs"] = True
        turn_cap = base_params.pop("max_tokens", base_params.pop("max_new_tokens", None))

        for turn in range(cfg.max_turns):
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
            outcome = _checked(self._parse(text, s.tools))
            s.messages.append({"role": "assistant", "content": text})
            s.metrics["parse_errors"] += len(outcome.errors)
            s.metrics["client_s"] += time.perf_counter() - cpu_start

            user_turn_next = self._user_may_speak(s)
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

            if ends_turn:  # the model answered the user, who goes on with the next request
                user_turn = await self._user_turn(s)
                if user_turn is None:  # the user ended the conversation (stop_reason says how)
                    return
                observations = user_turn
            else:
                observations = await self._invoke(s, outcome.calls, outcome.errors)
                if s.stop_reason == StopReason.SESSION_LOST:
                    return

            cpu_start = time.perf_counter()
            splice = self._render(observations, turn_ids, s.task.tools, s)
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

    def _media(self, s: _State) -> dict[str, Any]:
        """The keyword arguments that give the engine the trajectory's images (veRL's
        ``image_data``); none for text, so text-only generators see no change."""
        if not s.images:
            return {}
        media: dict[str, Any] = {"image_data": list(s.images)}
        if self.config.mm_processor_kwargs:
            media["mm_processor_kwargs"] = dict(self.config.mm_processor_kwargs)
        return media

    def _user_may_speak(self, s: _State) -> bool:
        if s.next_user_turn < len(s.task.user_turns):
            return True
        return bool(s.task.user_scenario) and s.simulated_turns < self.config.max_user_turns

    async def _user_turn(self, s: _State) -> list[dict[str, Any]] | None:
        """The user's next message(s): a static turn while any is left, else the simulated
        user's. None when the simulated user ends the conversation or cannot be asked."""
        if s.next_user_turn < len(s.task.user_turns):
            turn = [dict(m) for m in s.task.user_turns[s.next_user_turn]]
            added = s.task.new_tools[s.next_user_turn] if s.next_user_turn < len(s.task.new_tools) else []
            s.next_user_turn += 1
            s.metrics["user_turns"] += 1
            if added:
                s.reveal(added)
                turn[-1] = dict(turn[-1], content=str(turn[-1].get("content") or "") + announce_tools(added))
            return turn
        text = await self._ask_user(s)
        if text is None:
            return None
        reply = user_reply(text)
        if not reply.text:
            return self._user_failed(s, "it answered with an empty message")
        if reply.stop is not None:  # recorded, not spliced: no model turn follows it
            s.messages.append({"role": "user", "content": reply.text})
            s.metrics["user_stop"] = reply.stop
            s.stop_reason = StopReason.USER_STOP
            return None
        s.simulated_turns += 1
        s.metrics["user_turns"] += 1
        return [{"role": "user", "content": reply.text}]

    async def _ask_user(self, s: _State) -> str | None:
        """The simulated user's answer to the conversation so far, through ``user_tool``.

        Stateless and without the trajectory's session: the session belongs to the
        task's world, which the user never touches."""
        assert s.task.user_scenario is not None
        arguments = {"messages": simulator_messages(s.task.user_scenario, s.messages)}
        call = protocol.Call(protocol.new_call_id(), self.config.user_tool, arguments, None)
        started = time.perf_counter()
        try:
            results = await self.invoker.call_tools([call])
        except Exception as exc:  # the client's own failure: the conversation cannot go on
            return self._user_failed(s, f"{type(exc).__name__}: {exc}")
        finally:
            s.metrics["user_s"] += time.perf_counter() - started
        if len(results) != 1:
            return self._user_failed(s, f"the tool invoker returned {len(results)} results for 1 call")
        (result,) = results
        if result.is_error:
            return self._user_failed(s, result_text(result) or "an error without a message")
        return result_text(result)

    def _user_failed(self, s: _State, why: str) -> None:
        s.stop_reason = StopReason.USER_ERROR
        s.error = f"the simulated user (server tool {self.config.user_tool!r}) failed: {why}"

    async def _invoke(self, s: _State, parsed: list[ParsedCall], errors: list[str]) -> list[dict[str, Any]]:
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
                _note_lost_session(s, result.error)
        s.calls += records
        dropped = parsed[limit:]
        if dropped:
            s.metrics["dropped_calls"] += len(dropped)
            names = ", ".join(c.name for c in dropped)
            observations.append(
                {
                    "role": "tool",
                    "content": f"Error: not run ({names}): at most {limit} tool calls per turn are allowed",
                }
            )
        if errors:  # marked, so that a reward can count the calls that did not parse
            text = "\n".join(f"Error: {message}" for message in errors)
            observations.append({"role": "tool", "content": text, "error": "parse"})
        return observations

    async def _bind(self, s: _State) -> None:
        """Bind the session to the task's environment task (if any) before its first call,
        so that its world starts from the task's state."""
        s.bound = True
        environment = task_environment(s.task)
        if environment is None:
            return
        bind = getattr(self.invoker, "create_session", None)
        if bind is None:
            raise RuntimeError(
                f"the task plays {environment} but the tool invoker cannot bind a session "
                "(it needs create_session(session, environment=...), as ToolClient has)"
            )
        await bind(s.session_id, environment=environment)

    def _render(
        self, observations: list[dict[str, Any]], turn_ids: list[int], tools: Any, s: _State
    ) -> Splice:
        """The splice for ``observations``, their content cut to about ``max_obs_tokens``.

        Image tokens count. An image is whole or not shown: images are kept in order while
        their tokens fit the budget, each one that does not is replaced by a line saying so
        (``vision.not_shown``), and the text shares what is left as before."""
        budget = self.config.max_obs_tokens
        splice = self.renderer.splice(observations, turn_ids, tools)
        if len(splice.observation_ids) <= budget:
            return splice
        empty = [dict(o, content="") for o in observations]  # memoized by the renderer after the first turn
        overhead = len(self.renderer.splice(empty, turn_ids, tools).observation_ids)
        if len(splice.observation_ids) - overhead <= budget:
            return splice
        # Over budget: short results stay whole, long ones share the rest and end with a marker.
        s.metrics["truncated_observations"] += 1
        blocks = [b for o in observations for b in image_blocks(o.get("content"))]
        notes = self._fit_images(splice, blocks, budget) if splice.images else {}
        if notes:
            s.metrics["images_not_shown"] = s.metrics.get("images_not_shown", 0) + len(notes)
        kept = sum(
            c + self.renderer.placeholder_extra for i, c in enumerate(splice.image_tokens) if i not in notes
        )
        text_budget = max(0, budget - kept - sum(len(self.codec.encode(n)) for n in notes.values()))
        content_ids = [self.codec.encode(_content_text(o.get("content"))) for o in observations]
        limits = _share(text_budget, [len(ids) for ids in content_ids])
        first_image = 0
        for k, (o, ids, limit) in enumerate(zip(observations, content_ids, limits, strict=True)):
            cut = None if limit is None else self._cut(ids, limit)
            count = len(image_blocks(o.get("content")))
            mine = {i - first_image: n for i, n in notes.items() if first_image <= i < first_image + count}
            observations[k] = _with_content(o, cut, mine)
            first_image += count
        return self.renderer.splice(observations, turn_ids, tools)

    def _fit_images(self, splice: Splice, blocks: list[dict[str, Any]], budget: int) -> dict[int, str]:
        """The images of ``splice`` that do not fit ``budget`` (kept in order while they do),
        each with the text that takes its place."""
        extra = self.renderer.placeholder_extra
        notes: dict[int, str] = {}
        used = 0
        for i, tokens in enumerate(splice.image_tokens):
            if used + tokens + extra <= budget:
                used += tokens + extra
            else:
                notes[i] = not_shown(
                    blocks[i], f"its {tokens + extra} tokens do not fit max_obs_tokens={budget}"
                )
        return notes

    def _cut(self, ids: list[int], max_tokens: int) -> str:
        marker = self.config.truncation_marker.format(n=len(ids) - max_tokens)
        return self.codec.decode(ids[:max_tokens]) + marker

    async def _verify(self, s: _State) -> None:
        name = s.task.verifier or self.config.verifier
        if self.verifier is None or name is None:
            return
        # Only the rollout's own messages count as the model's: worked examples in the
        # prompt must not be scored as its answers or tool calls.
        start = len(s.task.messages)
        last = next((m["content"] for m in reversed(s.messages[start:]) if m.get("role") == "assistant"), "")
        request = protocol.VerifyRequest(
            verifier=name,
            ground_truth=s.task.ground_truth,
            response=last,
            messages=for_verifier(s.messages),
            session=s.session_id,
            arguments=dict(self.config.verifier_arguments),
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
            _note_lost_session(s, result.error)
            return
        s.reward_score = float(result.score)
        s.reward_components = dict(result.components)
        s.reward_details = dict(result.details)

    async def _release(self, s: _State) -> None:
        try:
            await self.invoker.release_session(s.session_id)
        except Exception as exc:  # the server expires sessions anyway; never mask the result
            logger.warning("releasing session %s failed: %s", s.session_id, exc)
            s.metrics["release_error"] = f"{type(exc).__name__}: {exc}"


def _note_lost_session(s: _State, error: protocol.ErrorInfo | None) -> None:
    """End the trajectory when the server no longer holds its session (``unknown_session``)."""
    if error is not None and error.kind == protocol.ErrorKind.UNKNOWN_SESSION and s.error is None:
        s.stop_reason = StopReason.SESSION_LOST
        s.error = error.message


def task_environment(task: Task) -> dict[str, str] | None:
    """The environment task a rollout plays, ``{"pack", "task"}``: from the task's metadata
    (a dataset row's ``extra_info``), else from a ground truth of that shape."""
    for source in (task.metadata, task.ground_truth):
        if (
            isinstance(source, dict)
            and isinstance(source.get("pack"), str)
            and isinstance(source.get("task"), str)
        ):
            return {"pack": source["pack"], "task": source["task"]}
    return None


def _tool_name(schema: dict[str, Any]) -> str:
    """The name in a JSON tool schema (``{"type": "function", "function": {...}}`` or flat)."""
    spec = schema.get("function") if isinstance(schema.get("function"), dict) else schema
    return str(spec.get("name") or "")


def _parse_function(parser: ToolCallParser) -> Callable[[str, Any], ParseOutcome]:
    """``parser.parse`` with the task's tool schemas where it takes them (custom parsers
    may implement ``parse(text)`` only)."""
    parse: Callable[..., ParseOutcome] = parser.parse
    try:
        parameters = inspect.signature(parse).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return lambda text, tools: parse(text)
    if any(p.name == "tools" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return lambda text, tools: parse(text, tools=tools)
    return lambda text, tools: parse(text)


def _checked(outcome: ParseOutcome) -> ParseOutcome:
    """The outcome with every call checked to encode as JSON (a custom parser's too): a
    call that cannot is that call's parse error, and never reaches a batch of calls."""
    checked = ParseOutcome(errors=list(outcome.errors), final_answer=outcome.final_answer)
    for call in outcome.calls:
        checked.add(check_call(call))
    return checked


def _content_text(content: Any) -> str:
    """The text of a message's content: a string, or its text blocks joined."""
    if isinstance(content, list):
        return "\n".join(str(b.get("text") or "") for b in content if b.get("type") == "text")
    return str(content or "")


def _with_content(message: dict[str, Any], cut: str | None, notes: dict[int, str]) -> dict[str, Any]:
    """``message`` with its text replaced by ``cut`` (None keeps it) and its images numbered
    in ``notes`` replaced by those texts. Cut text takes the first text block's place."""
    content = message.get("content")
    if not isinstance(content, list):
        return message if cut is None else dict(message, content=cut)
    blocks: list[dict[str, Any]] = []
    image = 0
    placed = False
    for block in content:
        if block.get("type") == "image":
            note = notes.get(image)
            image += 1
            blocks.append(block if note is None else {"type": "text", "text": note})
        elif block.get("type") == "text" and cut is not None:
            if not placed:
                blocks.append({"type": "text", "text": cut})
                placed = True
        else:
            blocks.append(block)
    return dict(message, content=blocks)


def _share(available: int, lengths: list[int]) -> list[int | None]:
    """Token limits per observation: None keeps it whole; an int cuts it there.

    Water-filling: observations shorter than an equal share keep all their tokens, and
    what they leave is shared among the longer ones.
    """
    limits: list[int | None] = [None] * len(lengths)
    left, remaining = max(0, available), len(lengths)
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        share = left // remaining
        if lengths[i] <= share:
            left -= lengths[i]
        else:
            limits[i] = share
            left -= share
        remaining -= 1
    return limits


class _Codec:
    """Fallback codec when a custom renderer brings none."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


class _State:
    """Mutable per-trajectory state."""

    __slots__ = (
        "task",
        "session_id",
        "bound",
        "next_user_turn",
        "simulated_turns",
        "tools",
        "hidden",
        "prompt_ids",
        "response_ids",
        "response_mask",
        "response_logprobs",
        "messages",
        "assistant_turns",
        "observation_turns",
        "stop_reason",
        "final_answer",
        "reward_score",
        "reward_components",
        "reward_details",
        "calls",
        "images",
        "error",
        "metrics",
    )

    def __init__(self, task: Task, session_id: str) -> None:
        self.task = task
        self.session_id = session_id
        self.bound = False  # the session was bound to its environment task (if it has one)
        self.next_user_turn = 0  # index into task.user_turns
        self.simulated_turns = 0  # messages of the simulated user spliced in
        self.tools: list[dict[str, Any]] = list(task.tools or [])  # the tools available now
        shown = {_tool_name(t) for t in self.tools}
        self.hidden = {_tool_name(t) for turn in task.new_tools for t in turn} - shown  # not yet available
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.messages: list[dict[str, Any]] = list(task.messages)
        self.assistant_turns = 0
        self.observation_turns = 0
        self.stop_reason = StopReason.ERROR
        self.final_answer: str | None = None
        self.reward_score: float | None = None
        self.reward_components: dict[str, float] = {}
        self.reward_details: dict[str, Any] = {}
        self.calls: list[CallRecord] = []
        self.images: list[Any] = []  # decoded, in the order of their image tokens
        self.error: str | None = None
        self.metrics: dict[str, Any] = {
            "generate_s": 0.0,
            "tool_s": 0.0,
            "client_s": 0.0,
            "calls": 0,
            "tool_errors": 0,
            "parse_errors": 0,
            "dropped_calls": 0,
            "truncated_observations": 0,
            "user_turns": 0,
            "user_s": 0.0,
            "refused_calls": 0,
        }

    def reveal(self, schemas: list[dict[str, Any]]) -> None:
        """Make ``schemas`` available from now on (a user turn announced them)."""
        self.tools = self.tools + list(schemas)
        self.hidden -= {_tool_name(t) for t in schemas}

    def append(self, ids: list[int], mask: int, log_probs: list[float] | None) -> None:
        self.response_ids += ids
        self.response_mask += [mask] * len(ids)
        self.response_logprobs += log_probs if log_probs is not None else [0.0] * len(ids)

    def to_trajectory(self) -> Trajectory:
        self.metrics["assistant_turns"] = self.assistant_turns
        self.metrics["observation_turns"] = self.observation_turns
        return Trajectory(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            response_mask=self.response_mask,
            response_logprobs=self.response_logprobs,
            num_turns=1 + self.assistant_turns + self.observation_turns,
            stop_reason=self.stop_reason,
            session_id=self.session_id,
            messages=self.messages,
            final_answer=self.final_answer,
            reward_score=self.reward_score,
            reward_components=self.reward_components,
            metrics=self.metrics,
            error=self.error,
            task=self.task,
            calls=self.calls,
            reward_details=self.reward_details,
            images=self.images,
        )
