"""Reward parity with BFCL: the gold made imperfect, scored by a real server and by BFCL itself.

Used by ``tests/envs/test_reward_parity_bfcl.py`` (a sample) and ``bench/environments/reward_parity_bfcl.py``
(every task). ``perturbations`` turns a task's gold into non-gold trajectories of many kinds
(each a list of turns of calls); ``bfcl_verdict`` is BFCL's own evaluation of one (its length
check, then ``multi_turn_checker`` over call strings, which it ``eval``s: only ever our own
perturbed gold here); ``served_verdict`` plays it through a server (a session bound to the
task, ``/v1/calls`` turn by turn, then ``/v1/verify`` with ``tool_use`` in eval mode).
"""

from __future__ import annotations

import contextlib
import copy
import decimal
import inspect
import random
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import mpmath
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

from protocol import decode_results
from tools.envs.bfcl.data import Entry, function_docs
from tools.envs.bfcl.state import api_class
from tools.envs.pack import EnvTask, Pack

OWNER = {doc["name"]: name for name, docs in function_docs().items() for doc in docs}  # function -> class
UNKNOWN_TOOL = "open_the_pod_bay_doors"  # no BFCL class has it: the server refuses it, BFCL's eval fails it
# Kinds whose outcome is named and documented rather than expected to agree (see docs/environments.md).
NAMED = frozenset({"schema_refused"})


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass
class Trajectory:
    """A trajectory to score: per user turn, the calls the model makes (in order)."""

    kind: str
    turns: list[list[Call]]
    note: str = ""
    changed: Call | None = None  # the call a kind changed, where one did


@dataclass
class Outcome:
    category: str
    task: str
    kind: str
    bfcl: bool  # BFCL's verdict: the entry is correct
    bfcl_error: str
    ours: float  # the served eval-mode reward
    components: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    @property
    def agrees(self) -> bool:
        return self.ours == (1.0 if self.bfcl else 0.0) and self.components.get("benchmark") == self.ours


# --------------------------------------------------------------------------- perturbations


def gold_turns(task: EnvTask) -> list[list[Call]]:
    by_id = {c.id: c for c in task.gold.calls}
    return [
        [Call(by_id[i].name, copy.deepcopy(by_id[i].arguments)) for i in ids]
        for ids in task.metadata["turn_calls"]
    ]


def perturbations(pack: Pack, task: EnvTask, rng: random.Random) -> Iterator[Trajectory]:
    """The gold, then one trajectory per kind that applies to ``task`` (seeded by ``rng``)."""
    gold = gold_turns(task)
    yield Trajectory("gold", gold)
    spots = [(t, i) for t, turn in enumerate(gold) for i in range(len(turn))]
    with_args = [(t, i) for t, i in spots if gold[t][i].arguments]

    def edited() -> list[list[Call]]:
        return copy.deepcopy(gold)

    if spots:
        turns = edited()
        t, i = rng.choice(spots)
        dropped = turns[t].pop(i)
        yield Trajectory("dropped", turns, f"turn {t}: {dropped.name}")
        turns = edited()
        t = rng.choice([t for t, turn in enumerate(gold) if turn])
        turns[t] = []
        yield Trajectory("turn_left_empty", turns, f"turn {t}")
        turns = edited()
        t, i = rng.choice(spots)
        turns[t].insert(i + 1, copy.deepcopy(gold[t][i]))
        yield Trajectory("extra_repeat", turns, f"turn {t}: {gold[t][i].name} twice")
    others = [(t, s) for t in range(len(gold)) for s in spots if s[0] != t]
    if others:
        turns = edited()
        t, (u, i) = rng.choice(others)
        turns[t].insert(rng.randint(0, len(turns[t])), copy.deepcopy(gold[u][i]))
        yield Trajectory("extra_from_other_turn", turns, f"turn {u}'s {gold[u][i].name} also in turn {t}")
    pairs = [(t, i) for t, turn in enumerate(gold) for i in range(len(turn) - 1)]
    if pairs:
        turns = edited()
        t, i = rng.choice(pairs)
        turns[t][i], turns[t][i + 1] = turns[t][i + 1], turns[t][i]
        yield Trajectory("swapped", turns, f"turn {t}: {gold[t][i].name} <-> {gold[t][i + 1].name}")
    later = [(t, turn) for t, turn in enumerate(gold[:-1]) if turn]
    if later:
        turns = edited()
        t, _ = rng.choice(later)
        turns[t + 1].insert(0, turns[t].pop())
        yield Trajectory("moved_to_next_turn", turns, f"last call of turn {t}")
    earlier = [t for t, turn in enumerate(gold) if t and turn]
    if earlier:
        turns = edited()
        t = rng.choice(earlier)
        turns[t - 1].append(turns[t].pop(0))
        yield Trajectory("moved_to_previous_turn", turns, f"first call of turn {t}")
    for kind, change in (
        ("value_changed", _other_value),
        ("case_or_format", _recased),
        ("int_float", _int_float),
    ):
        candidates = [
            (t, i, k) for t, i in with_args for k, v in gold[t][i].arguments.items() if change(v) is not None
        ]
        if candidates:
            turns = edited()
            t, i, k = rng.choice(candidates)
            before = turns[t][i].arguments[k]
            turns[t][i].arguments[k] = change(before)
            yield Trajectory(
                kind, turns, f"turn {t}: {gold[t][i].name}({k}={before!r} -> {turns[t][i].arguments[k]!r})"
            )
    defaults = [(t, i, k, d) for t, i in spots for k, d in _defaults(gold[t][i]).items()]
    if defaults:
        turns = edited()
        t, i, k, d = rng.choice(defaults)
        call = turns[t][i]
        if k in call.arguments:
            del call.arguments[k]
            note = f"turn {t}: {call.name} leaves {k}={d!r} (its default) out"
        else:
            call.arguments[k] = copy.deepcopy(d)
            note = f"turn {t}: {call.name} spells out {k}={d!r} (its default)"
        yield Trajectory("default_spelled_or_left_out", turns, note)
    lists = [
        (t, i, k)
        for t, i in with_args
        for k, v in gold[t][i].arguments.items()
        if isinstance(v, list) and len(set(map(repr, v))) > 1
    ]
    if lists:
        turns = edited()
        t, i, k = rng.choice(lists)
        turns[t][i].arguments[k] = list(reversed(turns[t][i].arguments[k]))
        yield Trajectory("list_reversed", turns, f"turn {t}: {gold[t][i].name}({k}) reversed")
    turns = edited()
    t = rng.randrange(len(turns))
    turns[t].insert(rng.randint(0, len(turns[t])), Call(UNKNOWN_TOOL, {}))
    yield Trajectory("unknown_tool", turns, f"turn {t}")
    if len(gold) > 1:
        yield Trajectory("stopped_early", edited()[:-1], "the conversation ends before the last user turn")


def schema_refused(task: EnvTask, rng: random.Random) -> Trajectory | None:
    """The gold with one integer argument sent as its digits in a string: our server refuses
    the call (its schema), BFCL runs it (it checks no type). A named difference."""
    gold = gold_turns(task)
    candidates = [
        (t, i, k)
        for t, turn in enumerate(gold)
        for i, call in enumerate(turn)
        for k, v in call.arguments.items()
        if type(v) is int and (OWNER.get(call.name), k) != ("TicketAPI", "ticket_id")
    ]
    if not candidates:
        return None
    t, i, k = rng.choice(candidates)
    gold[t][i].arguments[k] = str(gold[t][i].arguments[k])
    return Trajectory("schema_refused", gold, f"turn {t}: {gold[t][i].name}({k}) as a string", gold[t][i])


def _other_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 1.0
    if isinstance(value, str):
        return value + "2" if value else "x"
    return None


def _recased(value: Any) -> Any:
    """The same string as a person might write it differently: another case, or separators swapped."""
    if not isinstance(value, str) or not value.strip():
        return None
    for variant in (
        value.upper(),
        value.lower(),
        value.title(),
        value.replace("_", " "),
        value.replace("-", "/"),
    ):
        if variant != value:
            return variant
    return None


def _int_float(value: Any) -> Any:
    if type(value) is int:
        return float(value)
    if type(value) is float and value.is_integer():
        return int(value)
    return None


def _defaults(call: Call) -> dict[str, Any]:
    owner = OWNER.get(call.name)
    if owner is None:
        return {}
    parameters = inspect.signature(getattr(api_class(owner), call.name)).parameters
    return {
        name: p.default
        for name, p in parameters.items()
        # None and list defaults stay out: our schema refuses a null (BFCL does not), and
        # post_tweet's list defaults are written out for BFCL anyway (call_string)
        if name != "self"
        and p.default not in (inspect.Parameter.empty, None)
        and not isinstance(p.default, list)
    }


# --------------------------------------------------------------------------- BFCL's side


def call_string(call: Call) -> str:
    """``call`` as BFCL's decoder writes a function-calling model's call: ``name(k=repr(v), ...)``.

    post_tweet's list defaults are written out: BFCL's method shares one default list per
    process (a mention on one tweet posted without mentions would change every such tweet);
    ours gives each call a fresh one (``packs``), and this keeps BFCL's run the same.
    """
    arguments = dict(call.arguments)
    owner = OWNER.get(call.name)
    if owner is not None:
        for name, p in inspect.signature(getattr(api_class(owner), call.name)).parameters.items():
            if isinstance(p.default, list) and name not in arguments:
                arguments[name] = []
    return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def bfcl_verdict(entry: Entry, category: str, trajectory: Trajectory) -> tuple[bool, str]:
    """BFCL's evaluation of ``trajectory`` (``_evaluate_single_multi_turn_entry``'s steps):
    valid, and its error type. Each non-empty turn is one step; an empty one has none."""
    if len(trajectory.turns) != len(entry.ground_truth):
        return False, "multi_turn:force_terminated"
    model = [[[call_string(c) for c in turn]] if turn else [] for turn in trajectory.turns]
    test_entry = {
        "id": entry.id,
        "initial_config": entry.initial_config,
        "involved_classes": entry.involved_classes,
    }
    name = f"parity_{uuid.uuid4().hex}"
    defaults = api_class("TwitterAPI").post_tweet.__defaults__
    try:
        with decimal.localcontext():
            precision = mpmath.mp.prec
            try:
                api_class("TwitterAPI").post_tweet.__defaults__ = copy.deepcopy(defaults)  # a fresh process's
                result = multi_turn_checker(model, entry.ground_truth, test_entry, category, name)
            finally:
                mpmath.mp.prec = precision
    finally:
        api_class("TwitterAPI").post_tweet.__defaults__ = defaults
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[key]
    return bool(result["valid"]), str(result.get("error_type", ""))


# --------------------------------------------------------------------------- our side, served


class Served:
    """Plays trajectories through a real server: one session per trajectory, bound to its task."""

    def __init__(self, url: str, prefixes: dict[str, str]) -> None:
        self.url = url
        self.prefixes = prefixes  # pack id -> the prefix its tools are served under
        self.client = httpx.Client(base_url=url, timeout=120)

    def close(self) -> None:
        self.client.close()

    def verdict(self, pack: Pack, task: EnvTask, trajectory: Trajectory) -> dict[str, Any]:
        """The ``/v1/verify`` result (eval mode) of ``trajectory`` played in a fresh session."""
        prefix = self.prefixes[pack.id]
        session = f"parity-{uuid.uuid4().hex}"
        opened = self.client.post(
            "/v1/sessions", json={"session": session, "environment": {"pack": pack.id, "task": task.id}}
        )
        assert opened.status_code == 201, opened.text
        messages: list[dict[str, Any]] = list(task.prompt)
        try:
            for number, turn in enumerate(trajectory.turns):
                if number:
                    messages.extend(task.metadata["turns"][number - 1])
                if turn:
                    messages.append(
                        {"role": "assistant", "content": f"<tool_call> x{len(turn)} </tool_call>"}
                    )
                    messages.extend(self._play(session, prefix, turn))
                messages.append({"role": "assistant", "content": "Done."})
            body = {
                "requests": [
                    {
                        "verifier": "tool_use",
                        "ground_truth": {"pack": pack.id, "task": task.id},
                        "messages": messages,
                        "response_start": len(task.prompt),
                        "session": session,
                        "arguments": {"mode": "eval"},
                    }
                ]
            }
            verified = self.client.post("/v1/verify", json=body)
            assert verified.status_code == 200, verified.text
            return verified.json()["results"][0]
        finally:
            self.client.delete(f"/v1/sessions/{session}")

    def _play(self, session: str, prefix: str, turn: Sequence[Call]) -> list[dict[str, Any]]:
        calls = [
            {
                "call_id": uuid.uuid4().hex,
                "name": prefix + c.name,
                "arguments": c.arguments,
                "session": session,
            }
            for c in turn
        ]
        response = self.client.post("/v1/calls", json={"calls": calls})
        assert response.status_code == 200, response.text
        results = decode_results(response.content)
        return [
            {"role": "tool", "name": call["name"], "content": result.text or ""}
            for call, result in zip(calls, results, strict=True)
        ]


@contextlib.contextmanager
def served(url: str, prefixes: dict[str, str]) -> Iterator[Served]:
    player = Served(url, prefixes)
    try:
        yield player
    finally:
        player.close()
