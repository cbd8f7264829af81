"""``tool_use``: the fine-grained, verifiable reward of a trajectory in an environment pack.

``score(pack, task, world, request, mode=..., weights=...)`` reads the session's call
log (``world.calls``: what ran, the server's record, never a re-parse of the text), the
session's final world, and the model's turns (``request.response_messages()``), and
returns every component below on every trajectory, truncated ones included.

Components (floats in [0, 1] unless marked as a count):

- ``format``: share of the model's tool-call attempts that parsed. A tool message
  marked ``"error": "parse"`` is one unparseable attempt; every call that reached the
  server (ran, or was refused by it) is a parsed one. With no attempts: 1.0 when the task
  has no gold calls, else 0.0 (as ``precision``): a trajectory that never tries a call the
  task needs earns no credit for the calls it did not get wrong.
- ``schema``: share of the calls made that were valid: the tool exists, the task exposes
  it (``task.tools``), and the arguments satisfy its ``input_schema``. Calls the server
  refused before they reached the world (a tool message with a ``name`` and no entry in
  ``world.calls``) count as invalid. With no calls: as ``format``.
- ``matched``: share of gold calls matched by a call with agreeing arguments
  (``values``: BFCL-style normalisation) that succeeded — or failed, for a gold
  call that fails in the gold replay too (τ² has lookups that are expected to fail) —
  one to one, in dependency order (``match``: an exact search, not a greedy guess). A read
  (a tool without ``writes``) repeated with the same arguments stands for no further gold
  call than the gold has copies of it: a repeated search, whose words are not compared,
  does not solve a second lookup. A gold lookup (a ``compare`` that leaves arguments out)
  is matched only by a call whose result holds its targets (``targets``: what later calls or
  the answer need); a call whose result misses them is a failed call.
- FTRL's outcome measures (Ye et al. 2025, arXiv 2508.08791), with S = solved sub-goals
  (gold calls matched by a call whose output equals ``GoldCall.output`` when that is
  set), N = calls made, G = gold calls: ``precision`` = S/N, ``completeness`` = S/G,
  ``f1`` = 2S/(N+G) (the harmonic mean of the two). ``f1_step`` is the paper's
  per-step reward 2·S_t/(N_t+1) (S_t, N_t: sub-goals solved and calls made in assistant
  turn t; it is F1 with the completeness of one turn taken as S_t/1), averaged over the
  turns that made calls and capped at 1 (a turn that solves k sub-goals in parallel
  earns 2k/(k+1) in the paper; ``details.steps`` keeps each turn's [N_t, S_t]). Without turn
  information every call is its own turn. Empty cases: no calls and no gold calls → 1.0;
  no calls but gold calls → 0.0.
- ``calls``: 1.0 when every gold call is solved (S == G), else 0.0 (τ²-style "actions").
- ``state``: 1.0 when the session's world equals the gold world (``pack.replay(task)``,
  cached per pack and task) record for record, else 0.0; ``state_fraction``: the share of
  records either world changed that end equal (``World.matching_fraction``: a dense
  signal). No world (session gone): both 0.0.
- ``answer``: the final answer (the final reply: the last assistant message when it made no
  tool call, else none; its last ``<answer>`` block if any, else its text) equals
  ``task.gold.answer`` after SQuAD-style normalisation, or numerically (relative tolerance
  1e-6) when both read as numbers. 1.0 when the task requires no answer.
- ``communicate``: share of ``task.gold.communicate`` strings present (normalised, as
  whole words; numbers by value) in the model's replies (its turns that made no tool call);
  a reply stating more distinct values than twice the strings plus 4 tells nothing. 1.0
  when there are none.
- ``extra_calls`` (count): calls made beyond the matched ones (N − M), refused and
  failed ones included; ``failed_calls`` (count): calls that ran and failed (an error in
  ``world.calls``), except those matched to a gold call that fails in the replay too;
  ``penalty`` = min(1, 0.1·extra_calls + 0.1·failed_calls).
- ``success``: the product of the components ``task.reward_basis`` names (eval mode's
  verdict; on a pack with a judge in eval mode, the judge's).

``details`` explain the components. With ``reveal_gold=False`` (the server passes it for a
caller that may not see gold: a token scoped to some toolsets) they hold no gold value: no
gold argument, output, answer or communicate string, no tool name a gold call uses, and
the state differences and missing communicate strings only as counts
(``details["gold_hidden"]`` says so).

Two combinations (``score``): ``mode="eval"`` is the product of the components the task
names in ``task.reward_basis`` (τ²-style all or nothing; names are case-insensitive, and
τ²'s ``DB``/``ACTION``/``COMMUNICATE`` mean ``state``/``calls``/``communicate``);
``mode="train"`` is Σ weight·component over ``DEFAULT_WEIGHTS`` (or ``weights``, which
replaces them: components it does not name weigh 0), clipped to [0, 1]. A gold replay
scores 1.0 in both. On an imported benchmark's pack (``Pack.judge``: BFCL, τ²), eval mode's
score is instead the benchmark's own verdict on the trajectory, exactly (BFCL: its
multi-turn checker, 1.0 or 0.0); it is also the component ``benchmark``, its checks are
``benchmark_<check>``, ``details["benchmark"]`` says whether it passed and why not, and
every finer component above stays as it is (for training, or to read beside the verdict).
"""

from __future__ import annotations

import contextlib
import math
import re
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from protocol import VerifyRequest, VerifyResult
from tools.envs.pack import EnvTask, EnvTool, GoldCall, Pack, call_depths
from tools.envs.world import CallRecord, World
from tools.verifiers.text import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    content_text,
    extract_answer,
    normalize_answer,
    normalize_gold,
)
from tools.verifiers.tool_use.match import Candidate, match_calls
from tools.verifiers.tool_use.schema import compile_schema, schema_problem
from tools.verifiers.tool_use.targets import holds, lookup_targets
from tools.verifiers.tool_use.values import argument_difference, arguments_agree, same_value, standardize

__all__ = ["COMPONENTS", "DEFAULT_WEIGHTS", "score"]

COMPONENTS = (
    "format",
    "schema",
    "matched",
    "precision",
    "completeness",
    "f1",
    "f1_step",
    "calls",
    "state",
    "state_fraction",
    "answer",
    "communicate",
    "extra_calls",
    "failed_calls",
    "penalty",
    "success",
)
NOT_BASIS = frozenset(("extra_calls", "failed_calls", "penalty", "success"))  # counts, a cost, the verdict

# Train weights: half of the reward is the task done (``success``: every component the task is
# judged on, as eval mode combines them), half is progress. So a trajectory that fails the task
# earns at most 0.5 (less: it misses some progress component), and a reward above 0.5 means the
# task was done. Within the progress half, per-call credit carries most: each solved gold call
# pays completeness/G and f1 keeps extra calls from paying; the answer and what is said pay less
# than one right call, so a bare guess (no call, a lucky answer) never earns as much as the right
# first call, and a repeated or junk call earns nothing (it stands for no gold call, see
# _candidates) and costs the penalty. Format and schema pay 0 for no attempt on a task that needs
# calls, so a failed call with the same reply scores at least the guess. The positive weights sum
# to 1, so a perfect trajectory scores exactly 1.0 (tests/verifiers/test_tool_use_shortcuts.py and
# tests/verifiers/test_reward_hacking.py check the bound and the ranking).
DEFAULT_WEIGHTS: dict[str, float] = {
    "success": 0.5,
    "format": 0.05,
    "schema": 0.025,
    "completeness": 0.225,
    "f1": 0.1,
    "answer": 0.05,
    "communicate": 0.05,
    "penalty": -0.2,
}
PENALTY_PER_EXTRA = 0.1
PENALTY_PER_FAILED = 0.1
BASIS_ALIASES = {"db": "state", "action": "calls", "actions": "calls", "env_assertion": "state"}
MODES = ("train", "eval")
_ABSENT = object()
_FACTS_PER_TASK = 4096  # cached (call -> schema problem, agreeing gold calls) entries per task
# A tool-call block, closed or cut off at the end. Written as an unrolled loop (no lazy
# ``.*?``, which retried the closing tag at every character and was the slowest step).
# A number as written in prose (1,234.50, -3, 7549.5); not the digits of a longer number or an id
# (A-7001 is not 7001: a letter or hyphen-joined word before it).
# Not the digits of a date (2026-11-23) or a time (09:30) either: those are values of their own.
_NUMBER = re.compile(
    r"(?<![\w.\-:/])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.:/\-]\d)"
    r"|(?<![\w.\-:/])-?\d+(?:\.\d+)?(?![\w]|[.:/\-]\d)"
)
# The other values a reply can state: dates and record ids (A-7001, E-3005).
_DATE_OR_ID = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b[A-Z]{1,4}-\d+\b")
# A reply that states more distinct values than this (beyond twice what it must tell) tells
# nothing: listing "0 1 2 ... 200" must not earn a number it happens to contain.
_SPARE_VALUES = 4
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>[^<]*(?:<(?!/tool_call>)[^<]*)*(?:</tool_call>|\Z)")
_DETAIL_LIMIT = 20  # list entries kept in details (a runaway trajectory must not bloat them)


# --------------------------------------------------------------------------- per pack and task caches


@dataclass
class _TaskView:
    """What scoring needs of one task, built once: gold calls in dependency order, the gold world."""

    task: EnvTask
    golds: list[GoldCall]
    deps: list[list[int]]
    by_name: dict[str, list[int]]
    exposed: frozenset[str] | None
    answer: str | None
    communicate: list[str]
    # tool -> (argument, {standardised gold value: gold indices}): a cheap first filter, see _probes
    probes: dict[str, tuple[str, dict[str, list[int]]]] = field(default_factory=dict)
    facts: dict[tuple[str, bytes], tuple[str | None, tuple[int, ...]]] = field(default_factory=dict)
    gold_world: World | None = None
    gold_fails: list[bool] = field(default_factory=list)  # gold calls that fail in the replay too
    gold_changed: frozenset[tuple[str, str]] | None = None
    targets: list[tuple[Any, ...]] = field(default_factory=list)  # what each gold lookup must find
    # (tool, canonical arguments) -> how many gold calls are exactly that call (see _candidates)
    gold_copies: Counter[tuple[str, bytes]] = field(default_factory=Counter)


@dataclass
class _PackView:
    ref: weakref.ref[Pack]
    tools: dict[str, EnvTool]
    checks: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, _TaskView] = field(default_factory=dict)


# Keyed by id(pack) and checked against a weak reference, so a reloaded pack with the same
# id is never scored against a stale gold world. Shared by the server's worker threads: a
# race can only compute an entry twice (the replay is deterministic), never mix two up.
_PACKS: dict[int, _PackView] = {}


def _pack_view(pack: Pack) -> _PackView:
    key = id(pack)
    view = _PACKS.get(key)
    if view is None or view.ref() is not pack:
        view = _PackView(
            weakref.ref(pack, lambda _, key=key: _PACKS.pop(key, None)), {t.name: t for t in pack.tools}
        )
        _PACKS[key] = view
    return view


def _task_view(view: _PackView, pack: Pack, task: EnvTask) -> _TaskView:
    cached = view.tasks.get(task.id)
    if cached is not None and cached.task is task:
        return cached
    depths = call_depths(task.gold.calls)
    golds = sorted(task.gold.calls, key=lambda c: depths[c.id])  # stable: dependency order
    index = {c.id: i for i, c in enumerate(golds)}
    by_name: dict[str, list[int]] = {}
    for i, call in enumerate(golds):
        by_name.setdefault(call.name, []).append(i)
    cached = _TaskView(
        task=task,
        golds=golds,
        deps=[[index[d] for d in c.depends_on] for c in golds],
        by_name=by_name,
        exposed=None if task.tools is None else frozenset(task.tools),
        answer=task.gold.answer,
        communicate=[normalize_answer(s) for s in task.gold.communicate],
    )
    cached.probes = _probes(view, golds, by_name)
    for call in golds:
        with contextlib.suppress(TypeError):
            cached.gold_copies[_call_key(call.name, call.arguments)] += 1
    view.tasks[task.id] = cached
    return cached


def _probes(
    view: _PackView, golds: Sequence[GoldCall], by_name: Mapping[str, list[int]]
) -> dict[str, tuple[str, dict[str, list[int]]]]:
    """Per tool, an argument every gold call of it compares as a string with no default.

    A matching call must then carry that argument with the same standardised value, so
    one dictionary lookup picks the gold calls worth comparing in full (the matching
    otherwise compares every call with every gold call of the same tool).
    """
    out = {}
    for name, indices in by_name.items():
        properties = _properties(view.tools.get(name))
        shared: set[str] | None = None
        for g in indices:
            gold = golds[g]
            names = {
                arg
                for arg in (gold.arguments if gold.compare is None else gold.compare)
                if type(gold.arguments.get(arg)) is str and "default" not in (properties.get(arg) or {})
            }
            shared = names if shared is None else shared & names
        if shared:
            arg = min(shared)
            table: dict[str, list[int]] = {}
            for g in indices:
                table.setdefault(standardize(golds[g].arguments[arg]), []).append(g)
            out[name] = (arg, table)
    return out


def _gold_world(pack: Pack, task_view: _TaskView) -> World:
    if task_view.gold_world is None:
        world = pack.replay(task_view.task)  # deterministic: replayed once per task
        # replay runs the gold calls in the order of task_view.golds (stable sort by depth)
        task_view.gold_fails = [record.error is not None for record in world.calls]
        said = [
            *([normalize_answer(task_view.answer)] if task_view.answer is not None else []),
            *task_view.communicate,
        ]
        task_view.targets = lookup_targets(
            task_view.golds, [record.output for record in world.calls], task_view.deps, said
        )
        task_view.gold_world = world
    return task_view.gold_world


def _properties(tool: EnvTool | None) -> Mapping[str, Any]:
    if tool is None:
        return {}
    return tool.input_schema.get("properties") or {}


# --------------------------------------------------------------------------- reading the trajectory


@dataclass
class _Turns:
    parse_errors: int = 0
    step_of_call: list[int] = field(default_factory=list)  # the assistant turn of each world call
    refused: list[tuple[int, str]] = field(default_factory=list)  # (turn, tool) refused before the world


def _read_turns(messages: Sequence[Mapping[str, Any]], calls: Sequence[CallRecord]) -> _Turns:
    """Parse errors, and which assistant turn made each call (tool messages name the tool).

    Tool messages of calls that ran line up with ``world.calls`` in order; a named tool
    message with no call in the log was refused by the server (unknown tool, invalid
    arguments). When they do not line up one to one, a longest common subsequence of the
    tool names aligns them.
    """
    turns = _Turns()
    result_steps: list[int] = []  # per named tool message: its assistant turn, its tool
    result_names: list[str] = []
    step = -1
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            step += 1
        elif role == "tool":
            if message.get("error") == "parse":
                turns.parse_errors += 1
            else:
                name = message.get("name")
                if name:
                    result_steps.append(step if step >= 0 else 0)
                    result_names.append(str(name))
    names = [c.name for c in calls]
    if not result_names:
        turns.step_of_call = list(range(len(calls)))  # no turn information: one call per turn
        return turns
    if result_names == names:
        turns.step_of_call = result_steps
        return turns
    pairs = _align(result_names, names)
    aligned = {i for i, _ in pairs}
    turns.refused = [(result_steps[i], result_names[i]) for i in range(len(result_names)) if i not in aligned]
    step_of_call = [-1] * len(names)
    for i, j in pairs:
        step_of_call[j] = result_steps[i]
    spare = max(step, 0) + 1
    for j, value in enumerate(step_of_call):
        if value < 0:  # a call with no tool message: a turn of its own
            step_of_call[j], spare = spare, spare + 1
    turns.step_of_call = step_of_call
    return turns


def _align(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of ``a`` and ``b``."""
    rows, cols = len(a), len(b)
    table = [[0] * (cols + 1) for _ in range(rows + 1)]
    for i in range(rows - 1, -1, -1):
        for j in range(cols - 1, -1, -1):
            table[i][j] = table[i + 1][j + 1] + 1 if a[i] == b[j] else max(table[i + 1][j], table[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < rows and j < cols:
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def _number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "").replace("$", "").replace("%", "").strip()
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _replies(request: VerifyRequest, messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], str]:
    """What the model told the user: its turns that made no tool call (no tool message follows
    them before the next assistant turn), and the final reply — the last assistant turn when it
    is one, else "" (a trajectory whose last turn called a tool said nothing after the evidence:
    an answer given before its calls is a guess). ``request.response``, when set, is the final reply.
    """
    replies: list[str] = []
    last: str | None = None
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            if last is not None:
                replies.append(last)
            last = content_text(message.get("content"))
        elif role == "tool":
            last = None  # the turn made a call: not a reply
    if last is not None:
        replies.append(last)
    final = last or ""
    if request.response is not None:
        final = request.response
        if not replies or replies[-1] != final:
            replies.append(final)
    return replies, final


def _prose(text: str) -> str:
    """A reply's words: without tool-call blocks, answer tags apart from their words
    (``<answer>Done. 25</answer>`` tells the user 25: normalising the text drops the tags'
    punctuation, which would glue "answer" to the first and last words)."""
    text = _TOOL_CALL_BLOCK.sub(" ", text)
    return text.replace(ANSWER_OPEN, " ").replace(ANSWER_CLOSE, " ")


def _communicated(raw: Sequence[str], normal: Sequence[str], replies: Sequence[str]) -> list[str]:
    """The strings of ``raw`` (``normal``: normalised) that no reply tells; see ``score``.

    A number is told when a reply states a number of the same value (normalising would make
    2.5 read as 25); any other text when its words are said, whole. A reply that states more
    distinct values (numbers, dates, ids) than twice what there is to tell plus a few tells
    nothing: a list of every number is not an answer.
    """
    allowance = 2 * len(raw) + _SPARE_VALUES
    said_parts: list[str] = []
    numbers: list[float] = []
    for reply in replies:
        prose = _prose(reply)
        stated = [v for token in _NUMBER.findall(prose) if (v := _number(token)) is not None]
        if len(set(stated)) + len(set(_DATE_OR_ID.findall(prose))) > allowance:
            continue
        said_parts.append(normalize_answer(prose))
        numbers += stated
    said = f" {' '.join(said_parts)} "

    def told(text: str, normal: str) -> bool:
        value = _number(text)
        if value is None:
            return f" {normal} " in said
        return any(math.isclose(value, v, rel_tol=1e-9, abs_tol=1e-9) for v in numbers)

    return [text for text, normal in zip(raw, normal, strict=True) if not told(text, normal)]


def _answer_matches(answer: str, gold: str) -> bool:
    if normalize_answer(answer) == normalize_gold(gold):
        return True
    a, g = _number(answer), _number(gold)
    return a is not None and g is not None and math.isclose(a, g, rel_tol=1e-6, abs_tol=1e-9)


# --------------------------------------------------------------------------- the components


def _call_key(name: str, arguments: Any) -> tuple[str, bytes]:
    """A call's identity: its tool and its arguments as canonical JSON (TypeError if not JSON)."""
    return name, orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)


def _call_facts(
    view: _PackView, task_view: _TaskView, call: CallRecord
) -> tuple[str | None, tuple[int, ...]]:
    """What a call's name and arguments alone decide: its schema problem (or None) and the
    gold calls whose compared arguments it matches.

    Cached per task by the call's canonical JSON: the samples of a GRPO group (and the
    epochs of a run) repeat the same calls, and this is most of the reward's work.
    """
    try:
        key = _call_key(call.name, call.arguments)
    except TypeError:  # arguments that are not JSON (only a direct Python caller can send them)
        return _decide(view, task_view, call)
    facts = task_view.facts.get(key)
    if facts is None:
        if len(task_view.facts) >= _FACTS_PER_TASK:
            task_view.facts.clear()
        facts = task_view.facts[key] = _decide(view, task_view, call)
    return facts


def _decide(view: _PackView, task_view: _TaskView, call: CallRecord) -> tuple[str | None, tuple[int, ...]]:
    tool = view.tools.get(call.name)
    if tool is None:
        return f"no tool {call.name!r} in this environment", ()
    problem = None
    if task_view.exposed is not None and call.name not in task_view.exposed:
        problem = f"tool {call.name!r} is not offered by this task"
    else:
        check = view.checks.get(call.name)
        if check is None:
            check = view.checks[call.name] = compile_schema(tool.input_schema)
        if not check(call.arguments):
            problem = schema_problem(tool.input_schema, call.arguments)
    probe = task_view.probes.get(call.name)
    if probe is None:
        golds = task_view.by_name.get(call.name, ())
    else:
        value = call.arguments.get(probe[0])
        golds = probe[1].get(standardize(value), ()) if type(value) is str else ()
    properties = _properties(tool)
    agree = tuple(
        g
        for g in golds
        if arguments_agree(
            call.arguments, task_view.golds[g].arguments, task_view.golds[g].compare, properties
        )
    )
    return problem, agree


def _candidates(
    view: _PackView,
    task_view: _TaskView,
    calls: Sequence[CallRecord],
    facts: Sequence[tuple[str | None, tuple[int, ...]]],
) -> tuple[list[list[Candidate]], set[int]]:
    """For each gold call, the successful calls that may stand for it (and whether they solve
    it); and the calls that *missed*: they ran, agree with a gold lookup's compared arguments,
    but their result does not hold what it must find (``targets``) — a failed call.

    A read (a tool that does not write) repeated with the same arguments learns nothing new,
    so its repeats beyond the gold's own copies of that exact call stand for no gold call:
    else a repeated search, whose free-text words are not compared, would solve a second
    lookup it never made (a shortcut a GRPO group learns at once).
    """
    out: list[list[Candidate]] = [[] for _ in task_view.golds]
    missed: set[int] = set()
    fails = task_view.gold_fails
    targets = task_view.targets
    seen: Counter[tuple[str, bytes]] = Counter()
    for index, (call, (_, golds)) in enumerate(zip(calls, facts, strict=True)):
        tool = view.tools.get(call.name)
        if golds and tool is not None and not tool.writes:
            try:
                key = _call_key(call.name, call.arguments)
            except TypeError:
                key = None
            if key is not None:
                seen[key] += 1
                if seen[key] > max(1, task_view.gold_copies[key]):
                    continue  # a repeat: an extra call
        failed = call.error is not None
        for g in golds:
            if failed != fails[g]:
                continue  # a failed call stands only for a gold call that fails in the replay too
            if not failed and not holds(call.output, targets[g]):
                missed.add(index)  # an empty or wrong result: it found nothing the task needs
                continue
            expected = task_view.golds[g].output
            solved = (
                failed or expected is None or call.output == expected or same_value(call.output, expected)
            )
            out[g].append(Candidate(index, solved))
    return out, missed


def _why_unmatched(
    view: _PackView,
    task_view: _TaskView,
    g: int,
    calls: Sequence[CallRecord],
    blocked: bool,
    reveal_gold: bool,
    missed: set[int],
) -> str:
    gold = task_view.golds[g]
    tool = gold.name if reveal_gold else "its tool"  # which tool the gold uses is gold too
    same_name = [i for i, c in enumerate(calls) if c.name == gold.name]
    if not same_name:
        return f"no call to {tool}"
    if blocked:
        deps = ", ".join(task_view.golds[d].id for d in task_view.deps[g])
        return (
            f"matching calls came before the calls it depends on ({deps}) or were used for another gold call"
        )
    missing = [i for i in same_name if i in missed]
    if missing:
        return f"call {missing[0]}: its result does not hold what the task needs (an empty or wrong lookup)"
    properties = _properties(view.tools.get(gold.name))
    for i in same_name:
        difference = argument_difference(calls[i].arguments, gold.arguments, gold.compare, properties)
        if difference is not None:
            return f"call {i}: {difference if reveal_gold else 'its arguments differ from the gold call'}"
    if task_view.gold_fails[g]:
        return f"the gold call fails in the replay, but every call to {tool} with its arguments succeeded"
    return f"every call to {tool} with its arguments failed"


def _state_components(
    pack: Pack, task_view: _TaskView, world: World | None, reveal_gold: bool = True
) -> tuple[float, float, dict[str, Any]]:
    """Exact match and ``World.matching_fraction`` against the gold world, from one pass.

    World.differences and matching_fraction would each recompute both worlds' changed
    records; the gold world's are computed once per task, the session's once here. The
    comparison reads records by value, so it also works for a world built over another
    copy of the same base (a reloaded pack), where World.differences refuses. Without
    ``reveal_gold``, the differences are only counted: their keys name records the gold wrote.
    """
    if world is None:
        return 0.0, 0.0, {"error": "no world: the session is gone (expired or released)"}
    gold = _gold_world(pack, task_view)
    if task_view.gold_changed is None:
        task_view.gold_changed = frozenset(gold.changed())
    changed = world.changed() | task_view.gold_changed
    differences = []
    for name, key in sorted(changed):
        mine, theirs = world[name].peek(key, _ABSENT), gold[name].peek(key, _ABSENT)
        if mine is _ABSENT or theirs is _ABSENT:
            if mine is not theirs:
                differences.append((name, key))
        elif _record_state(world, mine) != _record_state(gold, theirs):
            differences.append((name, key))
    fraction = 1.0 - len(differences) / len(changed) if changed else 1.0
    exact = 0.0 if differences else 1.0
    if not reveal_gold:
        return exact, fraction, {"differences": len(differences)}
    return exact, fraction, {"differences": [list(d) for d in differences[:_DETAIL_LIMIT]]}


def _record_state(world: World, record: Any) -> Any:
    return world.record_state(record) if world.record_state is not None else record


def _f1_step(
    step_of_call: Sequence[int], refused: Sequence[tuple[int, str]], solved_calls: set[int]
) -> tuple[float | None, dict[int, list[int]]]:
    steps: dict[int, list[int]] = {}  # turn -> [calls made, sub-goals solved]
    for index, step in enumerate(step_of_call):
        entry = steps.get(step)
        if entry is None:
            entry = steps[step] = [0, 0]
        entry[0] += 1
        if index in solved_calls:
            entry[1] += 1
    for step, _ in refused:
        steps.setdefault(step, [0, 0])[0] += 1
    if not steps:
        return None, steps
    return sum(min(1.0, 2 * s / (n + 1)) for n, s in steps.values()) / len(steps), steps


# --------------------------------------------------------------------------- score


def score(
    pack: Pack,
    task: EnvTask,
    world: World | None,
    request: VerifyRequest,
    *,
    mode: str = "train",
    weights: Mapping[str, float] | None = None,
    reveal_gold: bool = True,
) -> VerifyResult:
    """Every component of the ``tool_use`` reward, and their combination for ``mode``.

    ``reveal_gold=False``: ``details`` without gold values (see the module's docstring);
    the score and components are the same.
    """
    if mode not in MODES:
        raise ValueError(f"tool_use mode must be one of {MODES}, got {mode!r}")
    plan = _weights(weights) if mode == "train" else None
    basis = _basis(task)

    view = _pack_view(pack)
    task_view = _task_view(view, pack, task)
    calls: list[CallRecord] = list(world.calls) if world is not None else []
    messages = request.response_messages()
    turns = _read_turns(messages, calls)
    refused = len(turns.refused)

    n_made = len(calls) + refused
    attempts = n_made + turns.parse_errors
    golds = task_view.golds
    gold_count = len(golds)
    no_calls = 1.0 if gold_count == 0 else 0.0  # the score of a trajectory that made no call
    format_score = (n_made / attempts) if attempts else no_calls
    _gold_world(pack, task_view)  # the replay also says which gold calls are expected to fail
    facts = [_call_facts(view, task_view, call) for call in calls]
    schema_problems = [
        {"call": i, "name": calls[i].name, "problem": problem}
        for i, (problem, _) in enumerate(facts)
        if problem is not None
    ]
    schema_score = (len(calls) - len(schema_problems)) / n_made if n_made else no_calls

    candidates, missed = _candidates(view, task_view, calls, facts)
    matching = match_calls(candidates, task_view.deps)
    matches: dict[str, int] = {}
    unmatched: list[dict[str, Any]] = []
    not_solved: list[dict[str, Any]] = []
    solved_calls: set[int] = set()
    for g, (c, s) in enumerate(zip(matching.calls, matching.solved, strict=True)):
        if c < 0:
            why = _why_unmatched(view, task_view, g, calls, matching.blocked[g], reveal_gold, missed)
            unmatched.append({"gold": golds[g].id, "why": why})
            continue
        matches[golds[g].id] = c
        if s:
            solved_calls.add(c)
        else:
            entry = {"gold": golds[g].id, "call": c, "output": calls[c].output}
            if reveal_gold:
                entry["gold_output"] = golds[g].output
            not_solved.append(entry)
    matched, solved = len(matches), len(solved_calls)
    used = set(matches.values())
    failed = [i for i, c in enumerate(calls) if (c.error is not None or i in missed) and i not in used]
    extra = n_made - matched

    precision = solved / n_made if n_made else no_calls
    completeness = solved / gold_count if gold_count else 1.0
    f1 = 2 * solved / (n_made + gold_count) if n_made + gold_count else 1.0
    f1_step, steps = _f1_step(turns.step_of_call, turns.refused, solved_calls)
    if f1_step is None:
        f1_step = no_calls

    state, state_fraction, state_details = _state_components(pack, task_view, world, reveal_gold)

    replies, final = _replies(request, messages)
    answer_text, tagged = extract_answer(_TOOL_CALL_BLOCK.sub(" ", final))
    answer = 1.0 if task_view.answer is None else float(_answer_matches(answer_text, task_view.answer))
    missing = (
        _communicated(task.gold.communicate, task_view.communicate, replies) if task_view.communicate else []
    )
    communicate = 1.0 - len(missing) / len(task_view.communicate) if task_view.communicate else 1.0

    components = {
        "format": format_score,
        "schema": schema_score,
        "matched": matched / gold_count if gold_count else 1.0,
        "precision": precision,
        "completeness": completeness,
        "f1": f1,
        "f1_step": f1_step,
        "calls": 1.0 if solved == gold_count else 0.0,
        "state": state,
        "state_fraction": state_fraction,
        "answer": answer,
        "communicate": communicate,
        "extra_calls": float(extra),
        "failed_calls": float(len(failed)),
        "penalty": min(1.0, PENALTY_PER_EXTRA * extra + PENALTY_PER_FAILED * len(failed)),
    }
    components["success"] = math.prod(components[name] for name in basis)
    if plan is not None:
        # rounded so that float sums of weights like 0.05 + 0.3 + ... give exactly 1.0 for a perfect run
        total = round(math.fsum(weight * components[name] for name, weight in plan.items()), 12)
        combined = min(1.0, max(0.0, total))
    else:
        combined = components["success"]
    verdict = pack.judge(task, messages, calls, world) if mode == "eval" and pack.judge is not None else None
    if verdict is not None:  # an imported benchmark: its own evaluator's number is the reward
        combined = components["success"] = verdict.reward
        components["benchmark"] = verdict.reward
        components.update({f"benchmark_{name}": value for name, value in verdict.checks.items()})

    details: dict[str, Any] = {
        "mode": mode,
        "counts": {"solved": solved, "matched": matched, "calls": n_made, "gold": gold_count},
        "matches": matches,
        "unmatched": unmatched[:_DETAIL_LIMIT],
        "not_solved": not_solved[:_DETAIL_LIMIT],
        "extra": [i for i in range(len(calls)) if i not in used][:_DETAIL_LIMIT],
        "failed": [
            {"call": i, "name": calls[i].name, "error": calls[i].error or "found nothing the task needs"}
            for i in failed
        ][:_DETAIL_LIMIT],
        "refused": [{"turn": t, "name": n} for t, n in turns.refused][:_DETAIL_LIMIT],
        "parse_errors": turns.parse_errors,
        "schema_problems": schema_problems[:_DETAIL_LIMIT],
        "steps": {str(t): entry for t, entry in steps.items()},
        "state": state_details,
        "answer": {"answer": answer_text, "tagged": tagged, "gold": task_view.answer},
        "communicate_missing": missing,
    }
    if verdict is not None:
        details["benchmark"] = {"passed": verdict.passed, "reason": verdict.reason if reveal_gold else None}
    if not reveal_gold:
        _hide_gold(details)
    if not matching.exact:
        details["matching"] = f"search stopped after {matching.steps} steps: best matching found so far"
    if plan is not None:
        details["weights"] = dict(plan)
    else:
        details["basis"] = basis
    return VerifyResult(combined, components, details)


def _hide_gold(details: dict[str, Any]) -> None:
    """Take the gold answer and the communicate strings missed (as a count) out of
    ``details``; ``unmatched``, ``not_solved`` and ``state`` are built without gold values."""
    del details["answer"]["gold"]
    details["communicate_missing"] = len(details["communicate_missing"])
    details["gold_hidden"] = (
        "gold values are left out: this token may not see gold (a token for every toolset may)"
    )


def _weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    if weights is None:
        return DEFAULT_WEIGHTS
    plan: dict[str, float] = {}
    for name, weight in weights.items():
        if name not in COMPONENTS:
            raise ValueError(
                f"unknown tool_use component {name!r} in weights; known: {', '.join(COMPONENTS)}"
            )
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise ValueError(f"weight of {name!r} must be a finite number, got {weight!r}")
        plan[name] = float(weight)
    return plan


def _basis(task: EnvTask) -> list[str]:
    out = []
    for raw in task.reward_basis:
        name = BASIS_ALIASES.get(str(raw).lower(), str(raw).lower())
        if name not in COMPONENTS or name in NOT_BASIS:
            raise ValueError(
                f"task {task.id!r}: reward_basis names {raw!r}, which is not a tool_use component; "
                f"use some of {', '.join(c for c in COMPONENTS if c not in NOT_BASIS)}"
            )
        out.append(name)
    return out
