"""Arithmetic tasks that need a calculator: products of 3-4 digit numbers and word problems.

A 135M model cannot multiply 4821 by 367 in its head, but it can learn to write
``<tool_call>{"name": "calculator", "arguments": {"expression": "4821 * 367"}}</tool_call>``
and copy the result into ``<answer>``. The kinds of problem:

- ``multiply``: ``a * b`` with 3-4 digit operands (1 operation);
- ``product_of_three``: ``a * b * c`` as a word problem (2 operations);
- ``sum_of_products``: ``a * b + c * d`` as a word problem (3 operations);
- ``difference_of_products``: ``a * b - c * d`` (positive) as a word problem (3 operations).

``extra_info.num_steps`` is the number of arithmetic operations; the word problems need
the model to build the expression (one call with all of it, or one call per step).
The ground truth is the exact integer. Everything is drawn from ``random.Random(seed)``,
so a seed gives the same rows on any machine; test problems never repeat in train.

FACTS.md: SmolLM2-135M-Instruct makes no valid calls from a format description alone,
but does with three worked examples in the prompt, so :func:`few_shot_messages` builds
those (question, tool call, tool result, answer) and the builder prepends ``few_shot``
of them (default 3) to every prompt.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

DATA_SOURCE = "toolfactory/arithmetic"
ABILITY = "arithmetic"
TOOL_NAME = "calculator"

CALCULATOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Evaluate an arithmetic expression exactly, e.g. '(3 + 4) * 2'.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression to evaluate."}},
            "required": ["expression"],
        },
    },
}

# The instructions of every arithmetic prompt. The trainer and the demo may reuse or
# replace it (build_prompt takes a system_prompt argument).
ARITHMETIC_SYSTEM_PROMPT = (
    "You solve arithmetic problems. You cannot multiply large numbers in your head, so you "
    "always use the calculator tool.\n"
    "You have this tool:\n"
    f"<tools>\n{json.dumps(CALCULATOR_SCHEMA)}\n</tools>\n"
    "To call it, write:\n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>\n'
    "The result comes back in the next message. When you have the final number, write it "
    "as <answer>NUMBER</answer> and stop."
)

ToolRole = Literal["tool", "user"]


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str
    question: str
    expression: str
    answer: int
    num_steps: int
    operands: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WorkedExample:
    """A solved problem for the prompt: the calls made (expression, result) and the answer."""

    question: str
    calls: tuple[tuple[str, int], ...]
    answer: int


# Fixed examples, one per problem shape; the generator never emits their expressions.
FEW_SHOT_EXAMPLES: tuple[WorkedExample, ...] = (
    WorkedExample("What is 4721 * 386?", (("4721 * 386", 4721 * 386),), 4721 * 386),
    WorkedExample(
        "A bakery sold 142 cakes at 2315 cents each and 87 pies at 1490 cents each. "
        "How many cents did it take in?",
        (("142 * 2315 + 87 * 1490", 142 * 2315 + 87 * 1490),),
        142 * 2315 + 87 * 1490,
    ),
    WorkedExample(
        "A depot has 36 racks. Each rack holds 48 bins and each bin holds 275 screws. "
        "How many screws are in the depot?",
        (("36 * 48", 36 * 48), (f"{36 * 48} * 275", 36 * 48 * 275)),
        36 * 48 * 275,
    ),
    WorkedExample(
        "Compute 9034 times 617.",
        (("9034 * 617", 9034 * 617),),
        9034 * 617,
    ),
)


def tool_call_text(expression: str) -> str:
    """An assistant turn that calls the calculator, in the hermes ``<tool_call>`` format."""
    call = {"name": TOOL_NAME, "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def tool_result_message(result: int | str, tool_role: ToolRole = "tool") -> dict[str, str]:
    """The tool's reply as a chat message.

    ``"tool"`` leaves the wrapping to the model's chat template (Qwen turns it into a
    user turn with ``<tool_response>``), which is how the rollout core renders real
    results. ``"user"`` wraps it in ``<tool_response>`` explicitly, for templates that
    have no tool role.
    """
    if tool_role == "tool":
        return {"role": "tool", "content": str(result)}
    if tool_role == "user":
        return {"role": "user", "content": f"<tool_response>\n{result}\n</tool_response>"}
    raise ValueError(f"tool_role must be 'tool' or 'user', got {tool_role!r}")


def few_shot_messages(k: int = 3, tool_role: ToolRole = "tool") -> list[dict[str, str]]:
    """``k`` worked examples as chat turns: user, assistant call, tool result, ..., answer."""
    if not 0 <= k <= len(FEW_SHOT_EXAMPLES):
        raise ValueError(f"few-shot count must be between 0 and {len(FEW_SHOT_EXAMPLES)}, got {k}")
    messages: list[dict[str, str]] = []
    for example in FEW_SHOT_EXAMPLES[:k]:
        messages.append({"role": "user", "content": example.question})
        for expression, result in example.calls:
            messages.append({"role": "assistant", "content": tool_call_text(expression)})
            messages.append(tool_result_message(result, tool_role))
        messages.append({"role": "assistant", "content": f"<answer>{example.answer}</answer>"})
    return messages


def build_prompt(
    question: str,
    few_shot: int = 3,
    tool_role: ToolRole = "tool",
    system_prompt: str = ARITHMETIC_SYSTEM_PROMPT,
) -> list[dict[str, str]]:
    """System instructions, ``few_shot`` worked examples, then the question."""
    return [
        {"role": "system", "content": system_prompt},
        *few_shot_messages(few_shot, tool_role),
        {"role": "user", "content": question},
    ]


# ---------------------------------------------------------------- problem generators
def _digits(rng: random.Random, low: int = 3, high: int = 4) -> int:
    """A number with between ``low`` and ``high`` digits, the digit count drawn uniformly."""
    digits = rng.randint(low, high)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _multiply(rng: random.Random) -> Problem:
    a, b = _digits(rng), _digits(rng)
    template = rng.choice(
        (
            "What is {a} * {b}?",
            "Compute {a} times {b}.",
            "Calculate the product of {a} and {b}.",
            "{a} x {b} = ?",
        )
    )
    return Problem("multiply", template.format(a=a, b=b), f"{a} * {b}", a * b, 1, (a, b))


_THREE_TEMPLATES = (
    "A warehouse has {a} aisles. Each aisle has {b} shelves and each shelf holds {c} parcels. "
    "How many parcels are in the warehouse?",
    "A school orders {a} boxes. Each box holds {b} packs and each pack holds {c} pencils. "
    "How many pencils does the school get?",
    "A farm has {a} orchards with {b} trees each, and every tree gives {c} apples. "
    "How many apples does the farm harvest?",
)
_SUM_TEMPLATES = (
    "A shop sold {a} boxes at {b} dollars each and {c} crates at {d} dollars each. "
    "How many dollars did the shop take in?",
    "A library has {a} shelves holding {b} pages of records each and {c} cabinets holding "
    "{d} pages each. How many pages does it hold in total?",
    "A factory makes {a} batches of {b} bolts and {c} batches of {d} nuts. "
    "How many parts does it make altogether?",
)
_DIFFERENCE_TEMPLATES = (
    "Alice bought {a} tickets at {b} cents each. Bob bought {c} tickets at {d} cents each. "
    "How many more cents did Alice spend than Bob?",
    "Team A shipped {a} pallets of {b} kilograms and team B shipped {c} pallets of {d} kilograms. "
    "How many more kilograms did team A ship?",
)


def _product_of_three(rng: random.Random) -> Problem:
    a, b, c = rng.randint(12, 99), rng.randint(12, 99), _digits(rng, 3, 3)
    question = rng.choice(_THREE_TEMPLATES).format(a=a, b=b, c=c)
    return Problem("product_of_three", question, f"{a} * {b} * {c}", a * b * c, 2, (a, b, c))


def _sum_of_products(rng: random.Random) -> Problem:
    a, b, c, d = _digits(rng, 2, 3), _digits(rng), _digits(rng, 2, 3), _digits(rng)
    question = rng.choice(_SUM_TEMPLATES).format(a=a, b=b, c=c, d=d)
    return Problem("sum_of_products", question, f"{a} * {b} + {c} * {d}", a * b + c * d, 3, (a, b, c, d))


def _difference_of_products(rng: random.Random) -> Problem:
    while True:
        a, b, c, d = _digits(rng, 2, 3), _digits(rng), _digits(rng, 2, 3), _digits(rng)
        if a * b > c * d:
            break
    question = rng.choice(_DIFFERENCE_TEMPLATES).format(a=a, b=b, c=c, d=d)
    return Problem(
        "difference_of_products", question, f"{a} * {b} - {c} * {d}", a * b - c * d, 3, (a, b, c, d)
    )


GENERATORS: dict[str, Callable[[random.Random], Problem]] = {
    "multiply": _multiply,
    "product_of_three": _product_of_three,
    "sum_of_products": _sum_of_products,
    "difference_of_products": _difference_of_products,
}
DEFAULT_MIX: dict[str, float] = {
    "multiply": 0.4,
    "product_of_three": 0.15,
    "sum_of_products": 0.25,
    "difference_of_products": 0.2,
}


def generate_problems(n: int, seed: int = 0, mix: dict[str, float] | None = None) -> list[Problem]:
    """``n`` distinct problems (by expression), drawn deterministically from ``seed``."""
    mix = mix or DEFAULT_MIX
    unknown = set(mix) - set(GENERATORS)
    if unknown:
        raise ValueError(f"unknown problem kinds {sorted(unknown)}; known: {sorted(GENERATORS)}")
    kinds, weights = list(mix), list(mix.values())
    rng = random.Random(seed)
    problems: list[Problem] = []
    seen = {expression for example in FEW_SHOT_EXAMPLES for expression, _ in example.calls}
    while len(problems) < n:
        problem = GENERATORS[rng.choices(kinds, weights)[0]](rng)
        if problem.expression not in seen:
            seen.add(problem.expression)
            problems.append(problem)
    return problems


def build_rows(
    n_train: int = 2000,
    n_test: int = 200,
    seed: int = 0,
    few_shot: int = 3,
    tool_role: ToolRole = "tool",
    mix: dict[str, float] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}`` in veRL's format; the first ``n_test`` problems are the test split."""
    if n_train < 0 or n_test < 0:
        raise ValueError("split sizes must not be negative")
    problems = generate_problems(n_train + n_test, seed, mix)
    splits = {"test": problems[:n_test], "train": problems[n_test:]}
    rows: dict[str, list[dict[str, Any]]] = {}
    for split, chosen in splits.items():
        rows[split] = [
            {
                "data_source": DATA_SOURCE,
                "prompt": build_prompt(p.question, few_shot, tool_role),
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": p.answer},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "kind": p.kind,
                    "question": p.question,
                    "expression": p.expression,
                    "num_steps": p.num_steps,
                    "operands": list(p.operands),
                    "few_shot": few_shot,
                },
            }
            for index, p in enumerate(chosen)
        ]
    return rows
