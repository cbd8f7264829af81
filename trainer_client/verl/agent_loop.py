"""veRL AgentLoop plug-in: our rollout core with veRL's server manager as the generator.

veRL (0.9.1) makes one agent-loop instance per trajectory and calls
``await loop.run(sampling_params, **dataset_fields)``; the instance gets veRL's
``server_manager`` (vLLM/SGLang replicas behind ``generate(request_id, prompt_ids=...,
sampling_params=...) -> TokenOutput``), which is exactly the ``Generator`` interface of
the rollout core. So this loop only translates:

- **settings** from the agent-loop YAML kwargs (``trainer-client verl-config`` writes
  the YAML): ``server_urls``, ``format``, ``toolset``, budgets, ``verifier`` and
  ``verifier_arguments``, ... (``verl_config.LoopSettings``), with per-sample overrides
  from the dataset's ``extra_info`` (top-level keys in ``verl_config.OVERRIDABLE``, or a
  ``toolfactory`` dict holding them);
- **inputs**: ``raw_prompt`` (chat messages), ``reward_model.ground_truth``;
- **outputs**: the ``Trajectory`` becomes an ``AgentLoopOutput`` (prompt/response ids,
  ``response_mask`` 1 = model and 0 = tool tokens, log-probs, ``num_turns``). The reward
  comes from the tool server's ``/v1/verify`` inside the loop and is returned as
  ``reward_score``, so veRL skips its own reward function. Tool-call statistics go to
  ``metrics`` (timings) and ``extra_fields`` (counts, stop reason, reward components).
- **images**: with a vision-language model veRL hands the loop its processor; the rollout
  core then splices tool results' images as image tokens (``vision.VisionChatRenderer``,
  with veRL's ``data.mm_processor_kwargs``), passes them to ``generate`` as ``image_data``,
  and the output carries them as ``multi_modal_data={"images": [...]}``, which veRL's
  post-processing turns into ``pixel_values``/``image_grid_thw`` for the trainer.

Registration, two ways: the agent-loop YAML (``agent_loop_config_path``) names the
class as ``_target_`` with its settings (no plug-in discovery needed); and importing
this module registers the name ``toolfactory`` in veRL's registry (unless the YAML
already did), which the ``verl.plugins`` entry point does in every veRL process; the
settings then come from ``$TOOLFACTORY_URL``. Select the loop with
``actor_rollout_ref.rollout.agent.default_agent_loop`` or a dataset ``agent_name`` column.

One HTTP client per process and event loop is shared by all trajectories, so the
tool calls of concurrent trajectories are batched into few POSTs.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

# First: registers veRL's "cpu" platform (VERL_PLATFORM=cpu) before any veRL code asks for one.
import trainer_client.verl.cpu_platform  # noqa: F401

# isort: split
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    _agent_loop_registry,
)

from trainer_client.client.tool_client import ToolClient
from trainer_client.rollout.core import RolloutConfig, RolloutCore, Task, Trajectory
from trainer_client.rollout.dataset import TaskRow
from trainer_client.shared import URL_ENV, LoopClients, plain
from trainer_client.templates.render import openai_tool_schemas
from trainer_client.verl import config as verl_config
from trainer_client.verl.config import AGENT_NAME, LoopSettings

logger = logging.getLogger(__name__)

TARGET = verl_config.TARGET  # "trainer_client.verl.agent_loop.ToolFactoryAgentLoop"

# Keys of ``reward_extra_info``: veRL stacks them across the batch, so every sample
# must carry the same ones (the reward components differ between verifiers and live
# in ``extra_fields["toolfactory"]`` instead).
REWARD_EXTRA_KEYS = ("tool_calls", "tool_errors", "parse_errors", "verify_ok")


def rollout_config_for(
    settings: LoopSettings,
    sampling_params: Mapping[str, Any],
    response_length: int,
    mm_processor_kwargs: Mapping[str, Any] | None = None,
) -> RolloutConfig:
    """The rollout-core config of one trajectory: settings + veRL's sampling params (and its
    ``data.mm_processor_kwargs`` for a VLM's processor)."""
    params = dict(sampling_params)
    if settings.max_tokens_per_turn is not None:
        params["max_tokens"] = settings.max_tokens_per_turn
    return RolloutConfig(
        format=settings.format,
        parser_options=dict(settings.parser_options),
        max_turns=settings.max_turns,
        max_calls_per_turn=settings.max_calls_per_turn,
        max_obs_tokens=settings.max_obs_tokens,
        response_length=response_length,
        sampling_params=params,
        tool_result_template=settings.tool_result_template,
        toolset=settings.toolset,
        verifier=settings.verifier if settings.compute_reward else None,
        verifier_arguments=dict(settings.verifier_arguments),
        user_tool=settings.user_tool,
        max_user_turns=settings.max_user_turns,
        mm_processor_kwargs=dict(mm_processor_kwargs or {}),
    )


# --------------------------------------------------------------------------- per-process shared state

_CLIENTS = LoopClients()  # per (event loop, URLs, options): a worker's trajectories batch together
_CORES: OrderedDict[Any, RolloutCore] = OrderedDict()
_MAX_CORES = 64
# Tool schemas read from the server, per (URLs, toolset): (when read, schemas). Re-read after
# a while, so that a server restarted with other tools is picked up by a long training run.
_TOOL_SCHEMAS: dict[Any, tuple[float, list[dict[str, Any]]]] = {}
TOOL_SCHEMAS_TTL_S = 300.0


def shared_client(urls: tuple[str, ...], options: Mapping[str, Any] | None = None) -> ToolClient:
    """The process's ``ToolClient`` for these URLs on the running event loop."""
    key = (urls, repr(sorted((options or {}).items())))
    return _CLIENTS.get(key, lambda: ToolClient(list(urls), **dict(options or {})))


async def server_tool_schemas(
    client: ToolClient, urls: tuple[str, ...], toolset: str | None
) -> list[dict[str, Any]]:
    """The toolset's schemas from the server, cached for ``TOOL_SCHEMAS_TTL_S``."""
    key = (urls, toolset)
    cached = _TOOL_SCHEMAS.get(key)
    if cached is None or time.monotonic() - cached[0] > TOOL_SCHEMAS_TTL_S:
        cached = _TOOL_SCHEMAS[key] = (
            time.monotonic(),
            openai_tool_schemas(await client.list_tools(toolset)),
        )
    return cached[1]


def _core_for(
    tokenizer: Any, generator: Any, client: ToolClient, config: RolloutConfig, processor: Any = None
) -> RolloutCore:
    """Cached rollout cores: building one renders template probes, so reuse it per config."""
    key = (id(tokenizer), id(generator), id(client), id(processor), repr(asdict(config)))
    core = _CORES.get(key)
    if core is None:
        core = RolloutCore(tokenizer, generator, client, config, verifier=client, processor=processor)
        _CORES[key] = core
        while len(_CORES) > _MAX_CORES:
            _CORES.popitem(last=False)
    else:
        _CORES.move_to_end(key)
    return core


# --------------------------------------------------------------------------- the loop


class ToolFactoryAgentLoop(AgentLoopBase):
    """veRL agent loop that runs toolfactory's rollout core against a tool server.

    Constructed by veRL with its usual arguments plus the YAML kwargs (see
    :class:`LoopSettings`); ``tools`` (veRL's in-process tool list) is ignored: the
    tools live on the server.
    """

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        hf_model_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            trainer_config,
            server_manager,
            tokenizer,
            processor,
            dataset_cls,
            data_config,
            hf_model_type=hf_model_type,
        )
        kwargs.pop("tools", None)  # veRL's in-process tool list: our tools live on the server
        self.agent_name = kwargs.pop("name", AGENT_NAME)  # veRL passes the YAML entry's name too
        if "server_urls" not in kwargs and "server_url" not in kwargs and os.environ.get(URL_ENV):
            kwargs["server_urls"] = os.environ[URL_ENV]  # the entry-point registration carries no kwargs
        self.settings = LoopSettings.from_kwargs(kwargs)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        settings = self.settings.with_overrides(kwargs.get("extra_info"))
        response_length = min(settings.response_length or self.response_length, self.response_length)
        config = rollout_config_for(settings, sampling_params, response_length, self._mm_processor_kwargs())
        client = shared_client(settings.server_urls, settings.client_options)
        core = _core_for(self.tokenizer, self.server_manager, client, config, self._vision_processor())
        task = await self._task(settings, client, kwargs)
        trajectory = await core.run(task)
        # Checked on the rendered prompt the core already made (rendering is not free), so
        # an over-long prompt costs one rollout before this stops the run.
        prompt_tokens = len(trajectory.prompt_ids)
        if prompt_tokens > self.prompt_length:  # veRL would cut it from the left; say so instead
            raise ValueError(
                f"the prompt has {prompt_tokens} tokens but rollout.prompt_length is {self.prompt_length}: "
                "raise actor_rollout_ref.rollout.prompt_length (and data.max_prompt_length)"
            )
        if trajectory.error is not None:
            logger.warning("toolfactory trajectory ended with an error: %s", trajectory.error)
        return self.to_output(trajectory, settings, want_logprobs=bool(sampling_params.get("logprobs")))

    def _vision_processor(self) -> Any:
        """veRL's processor when it can process images (a VLM's), else None (text)."""
        processor = getattr(self, "processor", None)
        return processor if getattr(processor, "image_processor", None) is not None else None

    def _mm_processor_kwargs(self) -> dict[str, Any]:
        return dict(plain(getattr(self, "mm_processor_kwargs", None)) or {})

    async def _task(self, settings: LoopSettings, client: ToolClient, kwargs: dict[str, Any]) -> Task:
        """The row veRL hands over, read the way every dataset row is read (``dataset.TaskRow``):
        ``extra_info`` lands in the task's metadata (an environment's pack and task, a
        verifier, the tools), so a veRL rollout binds its session like a local one does."""
        if not isinstance(plain(kwargs.get("raw_prompt")), list):
            raise ValueError("the toolfactory agent loop needs raw_prompt (chat messages) from the dataset")
        row = TaskRow.from_row(
            {
                "prompt": kwargs.get("raw_prompt"),
                "reward_model": kwargs.get("reward_model"),
                "extra_info": kwargs.get("extra_info"),
                "data_source": kwargs.get("data_source"),
            },
            index=int(plain(kwargs.get("index")) or 0),
        )
        task = row.task()
        task.metadata["index"] = plain(kwargs.get("index"))
        if settings.tools is not None:  # the loop's own list (even an empty one) wins over the row's
            task.tools = openai_tool_schemas(settings.tools)
        elif task.tools is None and settings.tool_schemas == "server":
            task.tools = await server_tool_schemas(client, settings.server_urls, settings.toolset)
        return task

    def to_output(self, t: Trajectory, settings: LoopSettings, *, want_logprobs: bool) -> AgentLoopOutput:
        """A ``Trajectory`` as veRL's ``AgentLoopOutput`` (responses cut to rollout.response_length)."""
        n = self.response_length
        reward = t.reward_score
        verify_ok = reward is not None
        if reward is None and settings.compute_reward and settings.reward_on_error is not None:
            reward = float(settings.reward_on_error)
        calls = int(t.metrics.get("calls", 0))
        stats = {
            "tool_calls": calls,
            "tool_errors": int(t.metrics.get("tool_errors", 0)),
            "parse_errors": int(t.metrics.get("parse_errors", 0)),
            "verify_ok": float(verify_ok),
        }
        extra_fields: dict[str, Any] = {
            "turn_scores": [],
            "tool_rewards": [],
            AGENT_NAME: {
                **stats,
                "stop_reason": str(t.stop_reason),
                "final_answer": t.final_answer,
                "reward_components": dict(t.reward_components),
                "error": t.error,
                "session_id": t.session_id,
                "dropped_calls": int(t.metrics.get("dropped_calls", 0)),
                "truncated_observations": int(t.metrics.get("truncated_observations", 0)),
            },
        }
        if reward is not None:
            extra_fields["reward_extra_info"] = {k: float(stats[k]) for k in REWARD_EXTRA_KEYS}
        media: dict[str, Any] = {}
        if t.images:  # veRL re-processes them into pixel_values / image_grid_thw for the trainer
            media = {
                "multi_modal_data": {"images": list(t.images)},
                "mm_processor_kwargs": self._mm_processor_kwargs(),
            }
        return AgentLoopOutput(
            prompt_ids=list(t.prompt_ids),
            response_ids=list(t.response_ids[:n]),
            response_mask=list(t.response_mask[:n]),
            response_logprobs=list(t.response_logprobs[:n]) if want_logprobs else None,
            reward_score=reward,
            num_turns=t.num_turns,
            metrics=AgentLoopMetrics(
                generate_sequences=float(t.metrics.get("generate_s", 0.0)),
                tool_calls=float(t.metrics.get("tool_s", 0.0)),
                compute_score=float(t.metrics.get("verify_s", 0.0)),
            ),
            extra_fields=extra_fields,
            **media,
        )


# Like veRL's ``@register(name)``, but an entry that veRL already loaded from the
# agent-loop YAML (it carries the settings) is kept: this module is imported lazily, by
# the first ``instantiate`` of that very entry, and must not replace it with a bare one.
# veRL's only public way in, ``register``, always overwrites; so this one line writes its
# (private) registry directly, with ``setdefault``. Registered bare (entry point, no YAML),
# the settings come from ``$TOOLFACTORY_URL``.
_agent_loop_registry.setdefault(AGENT_NAME, {"_target_": TARGET})
