"""Tool schemas in the prompt: rendered through the chat template's ``tools=`` support.

SmolLM2's template ignores ``tools``; a Qwen-style template renders them in its system
turn. The default ("auto") shows the server's schemas only where the template renders
them and the prompt does not already describe the tools, so the built-in few-shot
prompts (which describe the calculator inline) are unchanged.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import InProcessInvoker
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.rollout.core import RolloutConfig, RolloutCore, Task
from trainer_client.templates.factory import make_renderer
from trainer_client.templates.render import (
    openai_tool_schemas,
    prompt_mentions_tools,
    prompt_tools,
    template_renders_tools,
)

# Qwen2.5's tool block, verbatim; plain ChatML for the messages.
QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}'
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CALCULATOR_DESCRIPTOR = {  # as /v1/tools returns it
    "name": "calculator",
    "description": "Evaluate an arithmetic expression exactly.",
    "inputSchema": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}
CALCULATOR = openai_tool_schemas([CALCULATOR_DESCRIPTOR])
PLAIN_PROMPT = [{"role": "user", "content": "What is 17 * 23?"}]


@pytest.fixture(scope="module")
def qwen_style_tokenizer(smol_tokenizer: Any) -> Any:
    tokenizer = copy.deepcopy(smol_tokenizer)
    tokenizer.chat_template = QWEN_STYLE_TEMPLATE
    return tokenizer


def test_mcp_descriptors_become_template_schemas() -> None:
    assert openai_tool_schemas([CALCULATOR_DESCRIPTOR]) == [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression exactly.",
                "parameters": CALCULATOR_DESCRIPTOR["inputSchema"],
            },
        }
    ]
    assert openai_tool_schemas(CALCULATOR) == CALCULATOR  # already in template form


def test_smollm2_template_takes_tools_but_does_not_render_them(smol_tokenizer: Any) -> None:
    renderer = make_renderer(smol_tokenizer)
    assert not template_renders_tools(smol_tokenizer) and not renderer.renders_tools
    assert renderer.prompt_ids(PLAIN_PROMPT, CALCULATOR) == renderer.prompt_ids(PLAIN_PROMPT)


def test_qwen_style_template_renders_the_tools(qwen_style_tokenizer: Any) -> None:
    renderer = make_renderer(qwen_style_tokenizer)
    assert template_renders_tools(qwen_style_tokenizer) and renderer.renders_tools
    text = qwen_style_tokenizer.decode(renderer.prompt_ids(PLAIN_PROMPT, CALCULATOR))
    assert "<tools>\n" + json.dumps(CALCULATOR[0]) + "\n</tools>" in text
    assert text.endswith("<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n")
    assert "<tools>" not in qwen_style_tokenizer.decode(renderer.prompt_ids(PLAIN_PROMPT))


def test_the_rollout_feeds_the_model_the_rendered_tools(qwen_style_tokenizer: Any) -> None:
    tok = qwen_style_tokenizer
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'
    generator = ScriptedGenerator(
        [
            ScriptedTurn(tok.encode(call, add_special_tokens=False)),
            ScriptedTurn(tok.encode("<answer>391</answer>")),
        ],
        tokenizer=tok,
        eos_token_ids=[2],
    )
    invoker = InProcessInvoker({"calculator": lambda expression: 391})
    core = RolloutCore(tok, generator, invoker, RolloutConfig())
    trajectory = asyncio.run(core.run(Task(PLAIN_PROMPT, tools=CALCULATOR)))
    assert trajectory.final_answer == "391"
    first_prompt = tok.decode(generator.calls[0].prompt_ids)
    assert '"name": "calculator"' in first_prompt and "# Tools" in first_prompt


@pytest.mark.parametrize(
    ("mode", "messages", "dataset", "renders", "fmt", "expected"),
    [
        ("auto", PLAIN_PROMPT, None, True, "hermes", CALCULATOR),
        ("auto", PLAIN_PROMPT, None, False, "hermes", None),  # SmolLM2: nothing to render with
        ("auto", PLAIN_PROMPT, None, True, "search_r1", None),  # <search> tags, not function calls
        ("auto", [{"role": "system", "content": "Use the calculator tool."}], None, True, "hermes", None),
        ("server", [{"role": "system", "content": "Use the calculator tool."}], None, False, "search_r1", CALCULATOR),
        ("none", PLAIN_PROMPT, [CALCULATOR_DESCRIPTOR], True, "hermes", None),
        ("auto", PLAIN_PROMPT, [CALCULATOR_DESCRIPTOR], False, "search_r1", CALCULATOR),  # the dataset's own
    ],
)  # fmt: skip
def test_which_schemas_a_prompt_shows(
    mode: str, messages: list, dataset: list | None, renders: bool, fmt: str, expected: list | None
) -> None:
    chosen = prompt_tools(
        mode,
        messages=messages,
        dataset_tools=dataset,
        server_tools=CALCULATOR,
        renders_tools=renders,
        format=fmt,
    )
    assert chosen == expected


def test_inline_descriptions_are_recognised_by_tool_name() -> None:
    from tools.data import arithmetic

    row = arithmetic.build_rows(n_train=0, n_test=1, seed=0)["test"][0]
    assert prompt_mentions_tools(row["prompt"], CALCULATOR)
    assert not prompt_mentions_tools(PLAIN_PROMPT, CALCULATOR)
    assert not prompt_mentions_tools([{"role": "user", "content": "the calculators"}], CALCULATOR)
    with pytest.raises(ValueError, match="tool schema mode must be one of auto, server, none"):
        prompt_tools(
            "always", messages=[], dataset_tools=None, server_tools=None, renders_tools=True, format=""
        )


def qwen_style_model_dir(smol_tokenizer: Any, path: Path) -> Path:
    """A local 'model' directory for --model: SmolLM2's tokenizer with the Qwen-style template."""
    from trainer_client.backends.models import resolve_model_path

    tokenizer = copy.deepcopy(smol_tokenizer)
    tokenizer.chat_template = QWEN_STYLE_TEMPLATE
    tokenizer.save_pretrained(path)
    (path / "config.json").write_bytes((resolve_model_path("smollm2") / "config.json").read_bytes())
    return path


def test_the_trainer_shows_each_task_its_schemas(qwen_style_tokenizer: Any, tmp_path: Path) -> None:
    from tools.data import arithmetic, write_parquet
    from trainer_client.training.grpo import GRPOConfig, GRPOTrainer, task_from_row

    class Invoker(InProcessInvoker):
        toolsets: list[str | None] = []

        async def list_tools(self, toolset: str | None = None) -> list[dict[str, Any]]:
            self.toolsets.append(toolset)
            return [CALCULATOR_DESCRIPTOR]

    own_tool = {"name": "lookup", "inputSchema": {"type": "object", "properties": {"key": {}}}}
    plain = task_from_row({"prompt": PLAIN_PROMPT, "reward_model": {"ground_truth": 391}})
    inline = task_from_row(arithmetic.build_rows(n_train=0, n_test=1, seed=0)["test"][0])
    own = task_from_row({"prompt": PLAIN_PROMPT, "extra_info": {"tools": [own_tool]}})
    invoker = Invoker({})
    data = write_parquet(arithmetic.build_rows(n_train=1, n_test=0, seed=0)["train"], tmp_path / "t.parquet")
    config = GRPOConfig(train_data=str(data), toolset="math", out_dir=str(tmp_path / "run"))
    trainer = GRPOTrainer(config, invoker=invoker)
    trainer.train_tasks, trainer.eval_tasks = [plain, inline], [own]
    trainer.train_core = RolloutCore(
        qwen_style_tokenizer, ScriptedGenerator([]), invoker, config.rollout_config()
    )
    asyncio.run(trainer._show_tools())
    asyncio.run(trainer._show_tools())  # once per run: the server is asked once
    assert invoker.toolsets == ["math"]
    assert plain.tools == CALCULATOR
    assert inline.tools is None  # its prompt describes the calculator already
    assert own.tools == openai_tool_schemas([own_tool])
    with pytest.raises(ValueError, match="tool_schemas must be one of auto, server, none"):
        GRPOConfig(train_data="unused", tool_schemas="always")
