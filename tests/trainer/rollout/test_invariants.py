"""Invariants of the rollout core over random trajectories.

A scripted generator replays random model turns (calls, malformed calls, several calls,
prose, answers; with or without EOS) through the real SmolLM2 tokenizer; an in-process
invoker runs plain Python tools. For every trajectory we check the token bookkeeping
(masks, log-probs, what the generator was fed), that every mask-0 token is template or
observation text, the budgets, and the session lifecycle.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

import protocol
from tests.trainer.conftest import InProcessInvoker
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.parsers.registry import ParsedCall, ParseOutcome
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task, Trajectory
from trainer_client.templates.render import SEARCH_R1_TEMPLATE

EOS = 2  # <|im_end|> in SmolLM2
MARKER_TOKENS = 12  # "\n...[truncated 123 tokens]" in SmolLM2 tokens, generously

TOOLS = {
    "echo": lambda text: text,
    "add": lambda a, b: a + b,
    "fail": lambda: (_ for _ in ()).throw(ValueError("the tool failed on purpose")),
    "words": lambda n: " ".join(f"w{i}" for i in range(n)),
    "search": lambda query: f"Doc about {query}. " * 3,
}


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


# --------------------------------------------------------------------------- random scripts

_filler = st.sampled_from(["", "Let me think. ", "I will use a tool. ", "Hmm, ok. "])
_call = st.one_of(
    st.builds(lambda t: {"name": "echo", "arguments": {"text": t}}, st.sampled_from(["hi", "a b c", "x"])),
    st.builds(
        lambda a, b: {"name": "add", "arguments": {"a": a, "b": b}}, st.integers(0, 99), st.integers(0, 99)
    ),
    st.just({"name": "fail", "arguments": {}}),
    st.just({"name": "nope", "arguments": {}}),
    st.builds(lambda n: {"name": "words", "arguments": {"n": n}}, st.integers(1, 150)),
)


def _hermes_turn(kind: str, filler: str, calls: list[dict], tail: str) -> str:
    if kind == "calls":
        return filler + "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls) + tail
    if kind == "bad":
        return filler + '<tool_call>{"name": "add", "arguments": {"a": 1 "b": 2}}</tool_call>' + tail
    if kind == "answer":
        return filler + "<answer>42</answer>"
    return filler + "No tools needed."


_hermes_turns = st.tuples(
    st.sampled_from(["calls", "calls", "calls", "bad", "answer", "text"]),
    _filler,
    st.lists(_call, min_size=1, max_size=4),
    st.sampled_from(["", " and then more text"]),
    st.booleans(),
)

_search_turns = st.tuples(
    st.sampled_from(["search", "search", "answer", "text", "empty"]),
    _filler,
    st.sampled_from(["Paris", "capital of France", "rivers"]),
    st.booleans(),
)


def _search_turn(kind: str, filler: str, query: str) -> str:
    if kind == "search":
        return f"{filler}<search>{query}</search>"
    if kind == "empty":
        return f"{filler}<search> </search>"
    if kind == "answer":
        return f"{filler}<answer>Paris</answer>"
    return filler + "No search."


_configs = st.fixed_dictionaries(
    {
        "max_turns": st.integers(1, 5),
        "max_calls_per_turn": st.integers(1, 3),
        "max_obs_tokens": st.integers(24, 160),
        "response_length": st.integers(40, 500),
    }
)


# --------------------------------------------------------------------------- the checks


def _segments(tr: Trajectory, generator: ScriptedGenerator) -> list[tuple[int, list[int]]]:
    """(start offset in the response, generated ids) of every model turn, checking what
    the generator was fed and the mask/log-probs of each turn."""
    segments = []
    for call in generator.calls_for(tr.session_id):
        k = len(call.prompt_ids) - len(tr.prompt_ids)
        assert k >= 0
        assert call.prompt_ids == tr.prompt_ids + tr.response_ids[:k]
        out = call.output
        assert tr.response_ids[k : k + len(out.token_ids)] == out.token_ids
        assert tr.response_mask[k : k + len(out.token_ids)] == [1] * len(out.token_ids)
        assert tr.response_logprobs[k : k + len(out.token_ids)] == out.log_probs
        segments.append((k, out.token_ids))
    return segments


def check_trajectory(
    tr: Trajectory,
    tokenizer: Any,
    generator: ScriptedGenerator,
    invoker: InProcessInvoker,
    core: RolloutCore,
) -> None:
    cfg = core.config
    n = len(tr.response_ids)
    assert len(tr.response_mask) == n == len(tr.response_logprobs)
    assert set(tr.response_mask) <= {0, 1}
    assert n <= cfg.response_length
    assert tr.error is None, tr.error

    segments = _segments(tr, generator)
    assert len(segments) == tr.metrics["assistant_turns"] <= cfg.max_turns
    # Mask-1 tokens are exactly the generated tokens, in order; the rest carry log-prob 0.
    assert [t for t, m in zip(tr.response_ids, tr.response_mask, strict=True) if m] == [
        t for _, ids in segments for t in ids
    ]
    assert all(lp == 0.0 for lp, m in zip(tr.response_logprobs, tr.response_mask, strict=True) if not m)
    # The trajectory ends with a model turn; between turns lie only mask-0 observation runs.
    runs = []
    pos = 0
    for k, ids in segments:
        assert k >= pos
        runs.append(tr.response_ids[pos:k])
        pos = k + len(ids)
    assert pos == n
    observation_runs = runs[1:]
    assert runs[0] == []
    assert len(observation_runs) == tr.metrics["observation_turns"]

    # Every mask-0 token is template or observation text: compare with the chat template's
    # own rendering of the recorded conversation (or the text template for Search-R1).
    n_prompt = len(tr.task.messages)
    assistant_idx = [i for i, m in enumerate(tr.messages) if m["role"] == "assistant"]
    assert len(assistant_idx) == len(segments)
    assert all(i >= n_prompt for i in assistant_idx)
    for turn, run in enumerate(observation_runs):
        observations = tr.messages[assistant_idx[turn] + 1 : assistant_idx[turn + 1]]
        assert observations and all(m["role"] == "tool" for m in observations)
        assert len(observations) <= cfg.max_calls_per_turn + 2
        # Observation budget: content tokens (markers aside) plus what the template adds.
        empty = [dict(m, content="") for m in observations]
        overhead = len(core.renderer.splice(empty, [EOS]).observation_ids)
        n_cut = sum("...[truncated " in m["content"] for m in observations)
        boundary = len(run) - len(core.renderer.splice(observations, [EOS]).observation_ids)
        assert 0 <= boundary <= len(core.renderer.turn_end_ids)
        assert len(run) - boundary <= cfg.max_obs_tokens + overhead + n_cut * (MARKER_TOKENS + 2)
        if cfg.tool_result_template is not None:
            text = SEARCH_R1_TEMPLATE.replace("{content}", "\n".join(m["content"] for m in observations))
            assert tokenizer.decode(run) == text
    if cfg.tool_result_template is None and observation_runs:
        last_obs = assistant_idx[-1]  # the conversation up to the last observation
        expected = tokenizer.apply_chat_template(
            tr.messages[:last_obs], tokenize=False, add_generation_prompt=True, tools=tr.task.tools
        )
        assert tokenizer.decode(tr.prompt_ids + tr.response_ids[: segments[-1][0]]) == expected

    # Calls: the trajectory's session on every call, unique ids, per-turn budget.
    mine = [b for b in invoker.batches if b and b[0].session == tr.session_id]
    assert all(c.session == tr.session_id for b in mine for c in b)
    assert all(len(b) <= cfg.max_calls_per_turn for b in mine)
    assert sum(len(b) for b in mine) == tr.metrics["calls"]
    # The session is released exactly once.
    assert invoker.released.count(tr.session_id) == 1
    # One call record per call run or refused, each pointing at the tool message with its result.
    assert len(tr.calls) == tr.metrics["calls"] + tr.metrics["refused_calls"]
    for record in tr.calls:
        if record["message"] < len(tr.messages):  # else the length budget cut that turn
            message = tr.messages[record["message"]]
            assert (message["role"], message["name"]) == ("tool", record["name"]), (record, message)
            assert message["content"].startswith("Error") == (record["error"] is not None), (record, message)
        turn_start = assistant_idx[record["turn"] - 1]  # turns count from 1
        turn_end = assistant_idx[record["turn"]] if record["turn"] < len(assistant_idx) else None
        assert turn_start < record["message"] and (turn_end is None or record["message"] < turn_end)

    # The stop reason agrees with how the trajectory ended.
    last_ids = segments[-1][1]
    if tr.stop_reason == StopReason.ANSWER:
        assert tr.final_answer is not None
    else:
        assert tr.final_answer is None
    if tr.stop_reason == StopReason.MAX_TURNS:
        assert len(segments) == cfg.max_turns
    if tr.stop_reason == StopReason.EOS:
        assert last_ids[-1] == EOS
    if tr.stop_reason == StopReason.NO_TOOL_CALL:
        assert last_ids[-1] != EOS
    assert tr.num_turns == 1 + len(segments) + len(observation_runs)
    if currently_in_test_context():  # coverage statistics: pytest --hypothesis-show-statistics
        event(f"stop={tr.stop_reason.value}")
        event(f"observation turns={min(len(observation_runs), 2)}{'+' if len(observation_runs) >= 2 else ''}")
        if tr.metrics["truncated_observations"]:
            event("an observation was truncated")


def _run(core: RolloutCore, tasks: list[Task]) -> list[Trajectory]:
    return asyncio.run(core.run_batch(tasks))


# --------------------------------------------------------------------------- property tests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scripts=st.lists(st.lists(_hermes_turns, min_size=1, max_size=6), min_size=1, max_size=4),
    config=_configs,
    parallel=st.booleans(),
)
def test_hermes_rollouts_keep_invariants(
    smol_tokenizer: Any, scripts: list, config: dict, parallel: bool
) -> None:
    tok = smol_tokenizer
    tasks = [Task([{"role": "user", "content": f"Task {i}: use the tools."}]) for i in range(len(scripts))]
    cfg = RolloutConfig(format="hermes", parser_options={"parallel_calls": parallel}, **config)
    invoker = InProcessInvoker(TOOLS)
    by_prompt = {}
    generator = ScriptedGenerator(lambda ids: by_prompt[tuple(ids)], tokenizer=tok, eos_token_ids=[EOS])
    core = RolloutCore(tok, generator, invoker, cfg)
    for task, script in zip(tasks, scripts, strict=True):
        turns = [
            ScriptedTurn(encode(tok, _hermes_turn(kind, filler, calls, tail)) + ([EOS] if eos else []))
            for kind, filler, calls, tail, eos in script
        ]
        by_prompt[tuple(core.renderer.prompt_ids(task.messages))] = turns
    for tr in _run(core, tasks):
        check_trajectory(tr, tok, generator, invoker, core)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scripts=st.lists(st.lists(_search_turns, min_size=1, max_size=5), min_size=1, max_size=3),
    config=_configs,
)
def test_search_r1_rollouts_keep_invariants(smol_tokenizer: Any, scripts: list, config: dict) -> None:
    tok = smol_tokenizer
    tasks = [
        Task([{"role": "user", "content": f"Question {i}: where is the Louvre?"}])
        for i in range(len(scripts))
    ]
    cfg = RolloutConfig(format="search_r1", tool_result_template="search_r1", **config)
    invoker = InProcessInvoker(TOOLS)
    by_prompt = {}
    generator = ScriptedGenerator(lambda ids: by_prompt[tuple(ids)], tokenizer=tok, eos_token_ids=[EOS])
    core = RolloutCore(tok, generator, invoker, cfg)
    for task, script in zip(tasks, scripts, strict=True):
        turns = [
            ScriptedTurn(encode(tok, _search_turn(kind, filler, query)) + ([EOS] if eos else []))
            for kind, filler, query, eos in script
        ]
        by_prompt[tuple(core.renderer.prompt_ids(task.messages))] = turns
    for tr in _run(core, tasks):
        check_trajectory(tr, tok, generator, invoker, core)


# --------------------------------------------------------------------------- targeted cases


def _core(
    tok: Any, turns: list[str], invoker: InProcessInvoker, **config: Any
) -> tuple[RolloutCore, ScriptedGenerator]:
    generator = ScriptedGenerator(
        [ScriptedTurn(encode(tok, t)) for t in turns], tokenizer=tok, eos_token_ids=[EOS]
    )
    return RolloutCore(tok, generator, invoker, RolloutConfig(**config)), generator


def test_full_trajectory_matches_the_chat_template(smol_tokenizer: Any) -> None:
    tok = smol_tokenizer
    invoker = InProcessInvoker(TOOLS)
    core, generator = _core(
        tok,
        [
            'I add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call> and ramble on',
            '<tool_call>{"name": "echo", "arguments": {"text": "hi"}} </tool_call>',
            "It is <answer>5</answer>",
        ],
        invoker,
    )
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "What is 2+3?"}])))
    assert tr.stop_reason == StopReason.ANSWER and tr.final_answer == "5"
    assert [m["content"] for m in tr.messages if m["role"] == "tool"] == ["5", "hi"]
    # The stop string ended turn 1 before the rambling; <|im_end|>\n closed it with mask 0.
    rendered = tok.apply_chat_template(tr.messages, tokenize=False)
    ours = tok.decode(tr.prompt_ids + tr.response_ids)
    assert rendered == ours + "<|im_end|>\n"
    assert (
        encode(tok, rendered)[: len(tr.prompt_ids) + len(tr.response_ids)] == tr.prompt_ids + tr.response_ids
    )
    check_trajectory(tr, tok, generator, invoker, core)


def test_session_is_released_when_the_invoker_raises(smol_tokenizer: Any) -> None:
    invoker = InProcessInvoker(TOOLS, raise_on="echo")
    core, _ = _core(
        smol_tokenizer, ['<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>'], invoker
    )
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "hi"}])))
    assert tr.stop_reason == StopReason.ERROR
    assert tr.error == "ConnectionError: tool server unreachable while calling echo"
    assert invoker.released == [tr.session_id]
    assert [c.session for c in invoker.calls] == [tr.session_id]


def test_session_is_released_when_generation_fails(smol_tokenizer: Any) -> None:
    class Broken:
        async def generate(self, request_id: str, **kwargs: Any) -> Any:
            raise RuntimeError("engine crashed")

    invoker = InProcessInvoker(TOOLS)
    core = RolloutCore(smol_tokenizer, Broken(), invoker)
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "hi"}])))
    assert (tr.stop_reason, tr.error) == (StopReason.ERROR, "RuntimeError: engine crashed")
    assert invoker.released == [tr.session_id]


def test_tool_errors_become_observations(smol_tokenizer: Any) -> None:
    invoker = InProcessInvoker(TOOLS)
    core, _ = _core(
        smol_tokenizer,
        [
            '<tool_call>{"name": "fail", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "nope"}</tool_call>',
            "ok",
        ],
        invoker,
        max_turns=3,
    )
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "hi"}])))
    tool_texts = [m["content"] for m in tr.messages if m["role"] == "tool"]
    assert tool_texts == ["Error (tool_error): the tool failed on purpose", "Error (unknown_tool): nope"]
    assert tr.metrics["tool_errors"] == 2
    assert tr.stop_reason == StopReason.NO_TOOL_CALL


def test_budgets_calls_per_turn_and_observation_truncation(smol_tokenizer: Any) -> None:
    tok = smol_tokenizer
    invoker = InProcessInvoker(TOOLS)
    calls = "".join(
        f'<tool_call>{{"name": "words", "arguments": {{"n": {n}}}}}</tool_call>' for n in (300, 5, 7)
    )
    core, generator = _core(
        tok,
        [calls, "done"],
        invoker,
        parser_options={"parallel_calls": True},
        max_calls_per_turn=2,
        max_obs_tokens=100,
        response_length=400,
    )
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "hi"}])))
    assert [len(b) for b in invoker.batches] == [2]
    tool_msgs = [m for m in tr.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 3
    assert tool_msgs[0]["content"].startswith("w0 w1") and "...[truncated " in tool_msgs[0]["content"]
    assert tool_msgs[2]["content"] == "Error: not run (words): at most 2 tool calls per turn are allowed"
    assert tr.metrics["dropped_calls"] == 1 and tr.metrics["truncated_observations"] == 1
    check_trajectory(tr, tok, generator, invoker, core)


def test_response_length_is_never_exceeded(smol_tokenizer: Any) -> None:
    tok = smol_tokenizer
    invoker = InProcessInvoker(TOOLS)
    long_call = '<tool_call>{"name": "words", "arguments": {"n": 60}}</tool_call>'
    core, generator = _core(
        tok, [long_call] * 5, invoker, response_length=120, max_turns=5, max_obs_tokens=500
    )
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "hi"}])))
    assert tr.stop_reason == StopReason.LENGTH
    assert len(tr.response_ids) <= 120
    # The observation that would not fit was left out rather than cut mid-template.
    assert tr.messages[-1]["role"] == "assistant"
    check_trajectory(tr, tok, generator, invoker, core)


def test_trajectories_run_concurrently(smol_tokenizer: Any) -> None:
    tok = smol_tokenizer
    invoker = InProcessInvoker(TOOLS, delay_s=0.02)
    call = encode(tok, '<tool_call>{"name": "echo", "arguments": {"text": "x"}}</tool_call>')
    done = encode(tok, "<answer>x</answer>")
    generator = ScriptedGenerator(
        [ScriptedTurn(call, delay_s=0.02), ScriptedTurn(done, delay_s=0.02)],
        tokenizer=tok,
        eos_token_ids=[EOS],
    )
    core = RolloutCore(tok, generator, invoker)
    tasks = [Task([{"role": "user", "content": f"q{i}"}]) for i in range(4)]
    trajectories = asyncio.run(core.run_batch(tasks))
    assert [t.stop_reason for t in trajectories] == [StopReason.ANSWER] * 4
    order = [c.request_id for c in generator.calls]
    # All four first turns were generated before any second turn: nobody waited for another.
    assert set(order[:4]) == {t.session_id for t in trajectories}
    assert len({t.session_id for t in trajectories}) == 4


def test_verifier_scores_before_the_session_is_released(smol_tokenizer: Any) -> None:
    events: list[str] = []

    class Invoker(InProcessInvoker):
        async def release_session(self, session_id: str) -> None:
            events.append("release")
            await super().release_session(session_id)

    class Verifier:
        requests: list[protocol.VerifyRequest] = []

        async def verify(self, requests: list[protocol.VerifyRequest]) -> list[protocol.VerifyResult]:
            events.append("verify")
            self.requests.extend(requests)
            return [protocol.VerifyResult(score=1.0, components={"em": 1.0}) for _ in requests]

    verifier = Verifier()
    invoker = Invoker(TOOLS)
    generator = ScriptedGenerator([ScriptedTurn(encode(smol_tokenizer, "<answer>Paris</answer>"))])
    core = RolloutCore(
        smol_tokenizer, generator, invoker, RolloutConfig(verifier="exact_match"), verifier=verifier
    )
    prompt = [  # a worked example first: it must not be scored as the model's answer
        {"role": "user", "content": "Capital of Italy?"},
        {"role": "assistant", "content": "<answer>Rome</answer>"},
        {"role": "user", "content": "Capital of France?"},
    ]
    tr = asyncio.run(core.run(Task(prompt, ground_truth="Paris")))
    assert events == ["verify", "release"]
    assert (tr.reward_score, tr.reward_components) == (1.0, {"em": 1.0})
    (request,) = verifier.requests
    assert (request.verifier, request.ground_truth, request.session) == (
        "exact_match",
        "Paris",
        tr.session_id,
    )
    assert request.response == "<answer>Paris</answer>"
    assert request.response_start == 3
    assert request.response_messages() == [{"role": "assistant", "content": "<answer>Paris</answer>"}]


@pytest.mark.parametrize("bad", [{"max_turns": 0}, {"response_length": -1}, {"max_obs_tokens": 1.5}])
def test_config_rejects_bad_budgets(bad: dict) -> None:
    with pytest.raises(ValueError, match="must be a positive integer"):
        RolloutConfig(**bad)


def test_client_cost_per_turn_is_recorded(smol_tokenizer: Any) -> None:
    invoker = InProcessInvoker(TOOLS)
    core, _ = _core(
        smol_tokenizer, ['<tool_call>{"name": "words", "arguments": {"n": 400}}</tool_call>', "ok"], invoker
    )
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "hi"}])))
    assert tr.metrics["client_s"] > 0.0
    assert tr.metrics["generate_s"] >= 0.0 and tr.metrics["tool_s"] > 0.0


# --------------------------------------------------------------------------- calls that cannot be sent


def test_an_unserialisable_call_is_a_parse_error_and_its_neighbour_runs(smol_tokenizer: Any) -> None:
    """Even a custom parser's output is checked before it can join a batch of calls."""

    class LooseParser:
        name = "loose"
        stop_strings = ("</answer>",)

        def parse(self, text: str) -> ParseOutcome:
            if "<answer>" in text:
                return ParseOutcome(final_answer="5")
            return ParseOutcome(
                calls=[ParsedCall("echo", {"text": {"1+1"}}), ParsedCall("add", {"a": 2, "b": 3})]
            )

    invoker = InProcessInvoker(TOOLS)
    generator = ScriptedGenerator(
        [ScriptedTurn(encode(smol_tokenizer, t)) for t in ("calls", "<answer>5</answer>")],
        tokenizer=smol_tokenizer,
        eos_token_ids=[EOS],
    )
    core = RolloutCore(smol_tokenizer, generator, invoker, parser=LooseParser())  # type: ignore[arg-type]
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "hi"}])))
    assert tr.stop_reason == StopReason.ANSWER
    assert [(c.name, c.arguments) for c in invoker.calls] == [("add", {"a": 2, "b": 3})]
    assert [m["content"] for m in tr.messages if m["role"] == "tool"] == [
        "5",
        "Error: echo: argument text cannot be sent as JSON: a set is not JSON; use a list",
    ]
    assert tr.metrics["parse_errors"] == 1


@pytest.mark.parametrize(
    "turn",
    [
        "<tool_call>" + "[" * 1000 + "</tool_call>",
        '<tool_call>{"name": "echo", "arguments": {"text": ' + "[" * 1000,
        "<tool_call>{'name': 'echo', 'arguments': {'text': " + "-" * 3000 + "1}}</tool_call>",
    ],
)
def test_deeply_nested_calls_do_not_end_the_trajectory(smol_tokenizer: Any, turn: str) -> None:
    invoker = InProcessInvoker(TOOLS)
    core, generator = _core(smol_tokenizer, [turn, "<answer>x</answer>"], invoker)
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "hi"}])))
    assert (tr.stop_reason, tr.error) == (StopReason.ANSWER, None)
    assert tr.metrics["parse_errors"] == 1 and invoker.calls == []
    check_trajectory(tr, smol_tokenizer, generator, invoker, core)


def test_pythonic_positional_arguments_bind_to_the_task_schema(smol_tokenizer: Any) -> None:
    add_schema = {
        "type": "function",
        "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {}, "b": {}}}},
    }
    invoker = InProcessInvoker(TOOLS)
    core, _ = _core(smol_tokenizer, ["[add(2, b=3)]", "<answer>5</answer>"], invoker, format="pythonic")
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "2+3?"}], tools=[add_schema])))
    assert [(c.name, c.arguments) for c in invoker.calls] == [("add", {"a": 2, "b": 3})]
    assert tr.stop_reason == StopReason.ANSWER
    core, _ = _core(
        smol_tokenizer, ["[add(2, b=3)]", "<answer>5</answer>"], InProcessInvoker(TOOLS), format="pythonic"
    )
    without = asyncio.run(core.run(Task([{"role": "user", "content": "2+3?"}])))
    assert "uses positional arguments" in next(m["content"] for m in without.messages if m["role"] == "tool")


def test_a_lost_session_ends_the_trajectory_unscored(smol_tokenizer: Any) -> None:
    """``unknown_session`` (the replica restarted, or the session expired) ends the trajectory
    at once: the rest would run against an empty world, so nothing more is generated, the
    verifier is not asked, and the session is still released."""
    lost = "session s is not on this replica: the process it was opened on is gone"

    class Invoker(InProcessInvoker):
        async def call_tools(self, calls: list[protocol.Call]) -> list[protocol.Result]:
            if len(self.batches) == 1:  # the second turn's calls find the session gone
                self.batches.append(list(calls))
                return [
                    protocol.Result.failure(c.call_id, protocol.ErrorKind.UNKNOWN_SESSION, lost)
                    for c in calls
                ]
            return await super().call_tools(calls)

    class Verifier:
        asked = 0

        async def verify(self, requests: list[protocol.VerifyRequest]) -> list[protocol.VerifyResult]:
            Verifier.asked += 1
            return [protocol.VerifyResult(score=1.0) for _ in requests]

    call = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
    turns = [call, call, call, "<answer>hi</answer>"]
    generator = ScriptedGenerator([ScriptedTurn(encode(smol_tokenizer, t) + [EOS]) for t in turns])
    invoker = Invoker(TOOLS)
    config = RolloutConfig(max_turns=5, verifier="exact_match")
    core = RolloutCore(smol_tokenizer, generator, invoker, config, verifier=Verifier())
    tr = asyncio.run(core.run(Task([{"role": "user", "content": "q"}], ground_truth="hi")))
    assert (tr.stop_reason, tr.error, tr.reward_score) == (StopReason.SESSION_LOST, lost, None)
    assert len(generator.calls) == 2 and Verifier.asked == 0
    assert [m["content"] for m in tr.messages if m["role"] == "tool"] == [
        "hi"
    ]  # the lost turn is not spliced
    assert [r["error"] for r in tr.calls] == [None, "unknown_session"]
    assert invoker.released == [tr.session_id]
