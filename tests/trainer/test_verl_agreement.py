"""Token-for-token agreement of our splicing with veRL 0.9.1's continuous-token builder.

For each chat template (SmolLM2's ChatML, Qwen2.5's ChatML with tools, Llama 3.1) we run
rollouts with the scripted generator, then replay the same conversation through veRL's
builder exactly as veRL's ToolAgentLoop does (``build_initial_tokens``,
``merge_assistant_tokens``, ``merge_context_tokens``, ``align_response_metadata``) and
compare ids, masks and log-probs. Model turns end with EOS here, as veRL assumes.

No tokenizer can be downloaded: the Qwen and Llama templates (``chat_templates``) are
assigned to copies of the SmolLM2 tokenizer, with the special tokens they need added.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.require import require
from tests.trainer.chat_templates import llama31_tokenizer, qwen25_tokenizer
from tests.trainer.conftest import InProcessInvoker
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task, Trajectory

ct_wiring = require(
    "verl.utils.tokenizer.continuous_token_wiring",
    reason="veRL 0.9.1 is not installed (pip install 'toolfactory[trainer]'); agreement cannot be checked",
)

ECHO_SCHEMA = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Return the text unchanged.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}


# --------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def qwen_tokenizer(smol_tokenizer: Any) -> Any:
    return qwen25_tokenizer(smol_tokenizer)


@pytest.fixture(scope="module")
def llama_tokenizer(smol_tokenizer: Any) -> Any:
    return llama31_tokenizer(smol_tokenizer)


def _ids(tok: Any, text: str) -> list[int]:
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


# --------------------------------------------------------------------------- veRL replay


def verl_replay(
    builder: Any, tr: Trajectory, generator: ScriptedGenerator
) -> tuple[list[int], list[int], list[float]]:
    """Rebuild the trajectory with veRL's builder, the way ToolAgentLoop drives it."""
    tools = tr.task.tools
    messages = list(tr.task.messages)
    runtime = builder.build_initial_tokens(messages, tools=tools)
    assert runtime == tr.prompt_ids
    mask: list[int] = []
    logprobs: list[float] = []
    outputs = iter(generator.calls_for(tr.session_id))
    i = len(messages)
    while i < len(tr.messages):
        if tr.messages[i]["role"] == "assistant":
            out = next(outputs).output
            merge = builder.merge_assistant_tokens(runtime, out.token_ids)
            mask, logprobs = builder.align_response_metadata(
                merge, mask, logprobs, assistant_logprobs=out.log_probs
            )
            messages.append(tr.messages[i])
            i += 1
        else:
            j = i
            while j < len(tr.messages) and tr.messages[j]["role"] == "tool":
                j += 1
            previous = list(messages)
            messages.extend(tr.messages[i:j])
            merge = builder.merge_context_tokens(previous, messages, runtime, tools=tools)
            mask, logprobs = builder.align_response_metadata(merge, mask, logprobs)
            i = j
        runtime = merge.token_ids
    return runtime[len(tr.prompt_ids) :], mask, logprobs


def rollout(
    tok: Any,
    turns: list[str],
    eos: int,
    *,
    tools: list[dict] | None = None,
    **config: Any,
) -> tuple[Trajectory, ScriptedGenerator]:
    invoker = InProcessInvoker({"echo": lambda text: text, "add": lambda a, b: a + b})
    generator = ScriptedGenerator([ScriptedTurn(_ids(tok, t) + [eos]) for t in turns], eos_token_ids=[eos])
    core = RolloutCore(
        tok, generator, invoker, RolloutConfig(response_length=4096, max_obs_tokens=4096, **config)
    )
    task = Task([{"role": "user", "content": "Please echo things for me."}], tools=tools)
    tr = asyncio.run(core.run(task))
    assert tr.error is None
    return tr, generator


def assert_agrees(builder: Any, tr: Trajectory, generator: ScriptedGenerator) -> None:
    ids, mask, logprobs = verl_replay(builder, tr, generator)
    assert ids == tr.response_ids
    assert mask == tr.response_mask
    assert logprobs == tr.response_logprobs


# --------------------------------------------------------------------------- tests

_texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
    | st.sampled_from([" ", "\n", "\t", "é"]),
    min_size=0,
    max_size=40,
)


def _hermes_turns(texts: list[str], per_turn: int) -> list[str]:
    turns = []
    for k in range(0, len(texts), per_turn):
        calls = "\n".join(
            f"<tool_call>\n{json.dumps({'name': 'echo', 'arguments': {'text': t}})}\n</tool_call>"
            for t in texts[k : k + per_turn]
        )
        turns.append(f"Calling.\n{calls}")
    return [*turns, "<answer>done</answer>"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(_texts, min_size=1, max_size=4))
def test_smollm2_chatml_agrees_with_verl(smol_tokenizer: Any, texts: list[str]) -> None:
    tr, generator = rollout(smol_tokenizer, _hermes_turns(texts, 1), eos=2, max_turns=len(texts) + 1)
    assert tr.stop_reason == StopReason.ANSWER
    builder = ct_wiring.create_continuous_token_builder(smol_tokenizer, model_family="qwen")
    assert_agrees(builder, tr, generator)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(_texts, min_size=1, max_size=6))
def test_qwen25_template_with_parallel_calls_agrees_with_verl(qwen_tokenizer: Any, texts: list[str]) -> None:
    im_end = qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")
    tr, generator = rollout(
        qwen_tokenizer,
        _hermes_turns(texts, 2),
        eos=im_end,
        tools=[ECHO_SCHEMA],
        parser_options={"parallel_calls": True},
        max_turns=len(texts) + 1,
    )
    assert tr.stop_reason == StopReason.ANSWER
    assert "<tool_response>" in qwen_tokenizer.decode(tr.response_ids)
    builder = ct_wiring.create_continuous_token_builder(qwen_tokenizer, hf_model_type="qwen2")
    assert_agrees(builder, tr, generator)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(_texts, min_size=1, max_size=4))
def test_llama31_template_agrees_with_verl(llama_tokenizer: Any, texts: list[str]) -> None:
    eot = llama_tokenizer.convert_tokens_to_ids("<|eot_id|>")
    turns = [json.dumps({"name": "echo", "parameters": {"text": t}}) for t in texts] + ["It is done."]
    tr, generator = rollout(
        llama_tokenizer, turns, eos=eot, format="llama3_json", tools=[ECHO_SCHEMA], max_turns=len(texts) + 1
    )
    assert tr.stop_reason == StopReason.EOS
    assert tr.metrics["calls"] == len(texts)
    assert "<|start_header_id|>ipython<|end_header_id|>" in llama_tokenizer.decode(tr.response_ids)
    builder = ct_wiring.create_continuous_token_builder(llama_tokenizer, hf_model_type="llama")
    assert_agrees(builder, tr, generator)


def test_smollm2_auto_builder_drops_the_chatml_newline(smol_tokenizer: Any) -> None:
    """veRL picks its generic builder for SmolLM2 (model_type "llama"), which does not restore
    the ``\\n`` ChatML puts after ``<|im_end|>``. We follow the template (as veRL's own Qwen
    builder does); the only difference is that one boundary token per observation turn."""
    tr, generator = rollout(smol_tokenizer, _hermes_turns(["a", "b"], 1), eos=2, max_turns=3)
    builder = ct_wiring.create_continuous_token_builder(smol_tokenizer, hf_model_type="llama")
    verl_ids, verl_mask, _ = verl_replay(builder, tr, generator)
    newline = _ids(smol_tokenizer, "\n")
    ours = [(t, m) for t, m in zip(tr.response_ids, tr.response_mask, strict=True)]
    restored = [i for i in range(1, len(ours)) if ours[i - 1] == (2, 1) and ours[i] == (newline[0], 0)]
    assert len(restored) == 2
    assert [p for i, p in enumerate(ours) if i not in restored] == list(zip(verl_ids, verl_mask, strict=True))
    # Ours is what the chat template renders for the same conversation; veRL's generic one is not.
    rendered = smol_tokenizer.apply_chat_template(tr.messages, tokenize=False)
    assert rendered.startswith(smol_tokenizer.decode(tr.prompt_ids + tr.response_ids))
    assert not rendered.startswith(smol_tokenizer.decode(tr.prompt_ids + verl_ids))


@pytest.mark.parametrize("template", ["smollm2", "qwen25", "llama31"])
def test_stop_string_turns_are_closed_like_the_template(
    template: str, smol_tokenizer: Any, qwen_tokenizer: Any, llama_tokenizer: Any
) -> None:
    """Without EOS (a stop string ended the turn) we insert the whole turn close before the
    observation; veRL's loop has no such case. The observation tokens after it are veRL's
    delta, and the text is the chat template's rendering of the same conversation."""
    tok = {"smollm2": smol_tokenizer, "qwen25": qwen_tokenizer, "llama31": llama_tokenizer}[template]
    fmt = "llama3_json" if template == "llama31" else "hermes"
    first = (
        json.dumps({"name": "echo", "parameters": {"text": "hi"}})
        if fmt == "llama3_json"
        else '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
    )
    invoker = InProcessInvoker({"echo": lambda text: text})
    generator = ScriptedGenerator([ScriptedTurn(_ids(tok, first)), ScriptedTurn(_ids(tok, "Done."))])
    core = RolloutCore(tok, generator, invoker, RolloutConfig(format=fmt, max_turns=2))
    tools = [ECHO_SCHEMA]
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "Echo hi."}], tools=tools)))
    assert tr.stop_reason == StopReason.NO_TOOL_CALL
    start = tr.response_mask.index(0)
    end = tr.response_mask.index(1, start)
    close = core.renderer.turn_end_ids
    assert tr.response_ids[start : start + len(close)] == close
    builder = ct_wiring.create_continuous_token_builder(tok, model_family="default")
    delta = builder.tokenize_context_incremental_messages(tr.messages[:2], tr.messages[:3], tools=tools)
    assert tr.response_ids[start + len(close) : end] == delta
    rendered = tok.apply_chat_template(tr.messages, tokenize=False, tools=tools)
    ours = tok.decode(tr.prompt_ids + tr.response_ids)
    assert rendered == ours + tok.decode(close)
