"""Few-shot text prompts for environment tasks (tools/data/env_prompts.py).

What matters is that the text the prompt shows is the text the trainer reads: the worked
examples' calls parse back (hermes parser) to the calls they demonstrate, and a
trajectory written the way the examples are written scores 1.0 with ``tool_use`` in eval
mode, a wrong one clearly less in train mode.
"""

from __future__ import annotations

import json

import pytest

from protocol import ToolError, VerifyRequest
from tools.data.env_prompts import build_env_prompt, example_messages, prompt_rows, tool_lines
from tools.data.environments import build_rows
from tools.envs.pack import Pack, call_depths
from tools.envs.procedural import pack
from tools.envs.procedural.examples import worked_examples
from tools.verifiers.tool_use.reward import score
from trainer_client.parsers.registry import HermesParser


@pytest.fixture(scope="module")
def bank() -> Pack:
    return pack(world="bank", seed=0, tasks=40, levels=[1, 2], parameter_expansion=0.0)


@pytest.fixture(scope="module")
def examples(bank: Pack) -> list[list[dict]]:
    return worked_examples(bank, count=6, levels=(1, 2))


def _descriptors(p: Pack, names: list[str] | None = None) -> list[dict]:
    return [t.descriptor() for t in p.tools if names is None or t.name in names]


def test_tool_lines_name_every_argument_and_mark_optional_ones(bank: Pack) -> None:
    lines = tool_lines(_descriptors(bank, ["get_balance", "list_transactions"])).splitlines()
    assert lines[0] == "- get_balance(account_id: string): Get an account's balance and status."
    assert lines[1].startswith("- list_transactions(account_id: string, kind?: string, limit?: integer): ")


def test_examples_are_text_turns_whose_calls_parse_back_to_the_demonstrated_ones(examples) -> None:
    parser = HermesParser()
    for chat in examples:
        shown = [c["function"] for m in chat if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
        text = example_messages(chat)
        assert all(set(m) == {"role", "content"} for m in text)  # no tool_calls: the template drops them
        parsed = []
        for message in text:
            if message["role"] == "assistant" and "<tool_call>" in message["content"]:
                outcome = parser.parse(message["content"])
                assert (
                    not outcome.errors and len(outcome.calls) == 1
                )  # one call per turn, as the parser reads
                parsed += [{"name": c.name, "arguments": c.arguments} for c in outcome.calls]
        assert parsed == shown
        # every call is followed by its result; the reply closes the example
        roles = [m["role"] for m in text]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert roles.count("tool") == len(shown)
        last = text[-1]["content"]
        assert last.startswith("Done.") or (last.startswith("<answer>") and last.endswith("</answer>"))


def test_prompt_is_system_then_matching_examples_then_the_task(bank: Pack, examples) -> None:
    task = next(t for t in bank.tasks if t.tools == ["withdraw"])
    prompt = build_env_prompt(bank.policy, _descriptors(bank, task.tools), task.prompt, examples, shots=2)
    system = prompt[0]
    assert system["role"] == "system" and system["content"].startswith(bank.policy.strip())
    assert "- withdraw(account_id: string, amount: number)" in system["content"]
    assert "get_balance(" not in system["content"]  # only the task's tools are described
    assert prompt[-1] == task.prompt[-1]
    demonstrated = [m["content"] for m in prompt[1:-1] if "<tool_call>" in m["content"]]
    assert any('"name": "withdraw"' in text for text in demonstrated)  # an example using the task's tool
    assert sum(m["role"] == "user" for m in prompt) == 3  # two examples and the task


def test_examples_for_a_prompt_with_every_tool_show_different_tools(bank: Pack, examples) -> None:
    # a prompt that lists every tool (a shared prefix for all tasks) gets examples that
    # together show as many tools as the pool has, not the same call twice
    prompt = build_env_prompt(bank.policy, _descriptors(bank), bank.tasks[0].prompt, examples, shots=3)
    calls = [m["content"] for m in prompt if m["content"].startswith("<tool_call>")]
    shown = {json.loads(text.split("\n")[1])["name"] for text in calls}
    pool = {c["function"]["name"] for chat in examples for m in chat for c in m.get("tool_calls") or ()}
    assert len(pool) >= 3 and len(shown) >= min(len(pool), 4)
    again = build_env_prompt(bank.policy, _descriptors(bank), bank.tasks[1].prompt, examples, shots=3)
    assert again[:-1] == prompt[:-1]  # the same system text and examples: one prefix


def test_shots_out_of_range_is_refused(bank: Pack, examples) -> None:
    with pytest.raises(ValueError, match="shots"):
        build_env_prompt(bank.policy, _descriptors(bank), bank.tasks[0].prompt, examples, shots=7)
    assert sum(m["role"] == "user" for m in build_env_prompt("", [], bank.tasks[0].prompt, examples, 0)) == 1


def test_prompt_rows_keep_ground_truth_and_extra_info(bank: Pack, examples) -> None:
    rows = build_rows(bank, seed=0, levels=[1, 2])["test"]
    prompts = {t.id: t.prompt for t in bank.tasks}
    out = prompt_rows(rows, bank.policy, prompts, examples, shots=2)
    assert [r["reward_model"] for r in out] == [r["reward_model"] for r in rows]
    assert [r["extra_info"] for r in out] == [r["extra_info"] for r in rows]
    assert all(r["prompt"][-1] == prompts[r["extra_info"]["task"]][-1] for r in out)
    json.dumps(out)  # rows are plain data (parquet-ready)


def _trajectory(p: Pack, task, calls) -> tuple:
    """A trajectory written as the examples are: one call per turn, then the reply; run on a fresh world."""
    world = p.new_world(task)
    messages = list(task.prompt)
    for call in calls:
        messages.append({"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"})
        try:
            content = json.dumps(p.call(world, call["name"], call["arguments"]))
        except ToolError as exc:  # logged in world.calls as a failed call, as the server does
            content = f"Error: {exc}"
        messages.append({"role": "tool", "name": call["name"], "content": content})
    reply = f"<answer>{task.gold.answer}</answer>" if task.gold.answer is not None else "Done."
    messages.append({"role": "assistant", "content": reply})
    request = VerifyRequest(
        verifier="tool_use",
        ground_truth={"pack": p.id, "task": task.id},
        messages=messages,
        response_start=len(task.prompt),
    )
    return world, request


def test_the_taught_format_scores_full_and_a_wrong_call_scores_clearly_less(bank: Pack) -> None:
    for task in [t for t in bank.tasks if t.complexity.level in (1, 2)][:12]:
        depths = call_depths(task.gold.calls)
        gold = [
            {"name": c.name, "arguments": c.arguments}
            for c in sorted(task.gold.calls, key=lambda c: depths[c.id])
        ]
        world, request = _trajectory(bank, task, gold)
        assert score(bank, task, world, request, mode="eval").score == 1.0, task.id
        right = score(bank, task, world, request, mode="train").score
        wrong_calls = [{**gold[0], "arguments": {**gold[0]["arguments"], "account_id": "A-9999"}}, *gold[1:]]
        world, request = _trajectory(bank, task, wrong_calls)
        assert score(bank, task, world, request, mode="eval").score == 0.0, task.id
        assert right - score(bank, task, world, request, mode="train").score >= 0.2, task.id


def test_multi_step_prompts_show_one_two_chained_and_three_call_solutions() -> None:
    """``few_shot_rows(..., example_levels=[1, 2, 3, 4])``: every row shares one prefix whose
    worked examples make 1, 2, 2 (the second using an id the first returned) and 3 calls, and
    whose system text says a task may need several calls."""
    from tools.data.env_prompts import MULTI_CALL_FORMAT, few_shot_rows
    from tools.envs.procedural import world_module

    p = pack(
        world="bank",
        seed=0,
        tasks=60,
        levels=[1, 2, 3],
        distractors=len(world_module("bank").TOOLS),
        toolset_extension=1.0,
        parameter_expansion=0.0,
    )
    rows = build_rows(p, seed=0, test_fraction=0.2, levels=[1, 2, 3])
    rows = few_shot_rows(p, rows, 4, [1, 2, 3], 0, example_levels=[1, 2, 3, 4], call_format=MULTI_CALL_FORMAT)
    prompts = [r["prompt"] for split in ("train", "test") for r in rows[split]]
    assert len({json.dumps(prompt[:-1]) for prompt in prompts}) == 1, "one shared prefix"
    prefix = prompts[0][:-1]
    assert MULTI_CALL_FORMAT in prefix[0]["content"] and "several calls" in prefix[0]["content"]
    calls_per_example: list[int] = []
    for message in prefix[1:]:
        if message["role"] == "user":
            calls_per_example.append(0)
        elif "<tool_call>" in message["content"]:
            calls_per_example[-1] += 1
    assert calls_per_example == [1, 2, 2, 3]
    # the chain (third example): the second call uses an account id only the first result shows
    third = [i for i, m in enumerate(prefix) if m["role"] == "user"][2]
    request, lookup, result, action = (m["content"] for m in prefix[third : third + 4])
    used = json.loads(action.split("\n")[1])["arguments"]["account_id"]
    assert used in result and used not in request and "find_accounts" in lookup
    with pytest.raises(ValueError, match="shots must be the 4 example levels"):
        few_shot_rows(p, rows, 3, [1, 2, 3], 0, example_levels=[1, 2, 3, 4])


def test_tagged_replies_put_every_final_reply_in_answer_tags_and_score_full(bank: Pack) -> None:
    """The one-format prompt (``TAGGED_MULTI_CALL_FORMAT``): a change's reply is
    ``<answer>Done. ...</answer>``, and the verifier scores that reply as it scores "Done."."""
    from tools.data.env_prompts import TAGGED_MULTI_CALL_FORMAT

    chats = worked_examples(bank, count=4, levels=[1, 2, 3, 4], seed=0)
    mixed = [m["content"] for chat in chats for m in example_messages(chat) if m["role"] == "assistant"]
    tagged = [
        m["content"]
        for chat in chats
        for m in example_messages(chat, tagged_replies=True)
        if m["role"] == "assistant"
    ]
    finals = [t for t in tagged if not t.startswith("<tool_call>")]
    assert any(m.startswith("Done.") for m in mixed)  # the mixed prompt has untagged replies
    assert finals and all(t.startswith("<answer>") and t.endswith("</answer>") for t in finals)
    assert "<answer>Done." in TAGGED_MULTI_CALL_FORMAT
    for task in [t for t in bank.tasks if t.gold.answer is None][:6]:  # changes
        gold = [{"name": c.name, "arguments": c.arguments} for c in task.gold.calls]
        world, request = _trajectory(bank, task, gold)
        request.messages[-1]["content"] = "<answer>Done.</answer>"
        assert score(bank, task, world, request, mode="eval").score == 1.0, task.id
