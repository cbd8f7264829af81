"""The environment builder against a scripted model and a real small one.

The scripted endpoint (tests/support/scripted_openai.py) is a real uvicorn server that
answers each stage from a script: a small library world with one invalid answer per
stage (rejected, then retried with the reason), a tool that leaks its answer (the gate
rejects it and the task that uses it), and a task whose gold call fails (rejected as not
solvable). The pack that comes out is loaded without importing its code, its tools run
in the sandbox, and its gold trajectories score 1.0 under the tool_use reward.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from protocol import ToolError, VerifyRequest, decode_results, decode_verify_results
from tests.support.openai_server import create_app, dead_url, serve_in_thread, shared_chat_model
from tests.support.reward_hacks import check_task
from tests.support.scripted_openai import ScriptedChat
from tests.support.server import running_server, server_config
from tools.envs.builder import BuildConfig, ChatModel, SandboxExecutor, build, load_built_pack
from tools.envs.builder.cli import configure, run
from tools.envs.builder.gate import ProbePool, leak_probes, mentions, run_gate
from tools.envs.builder.loader import SANDBOXED, assemble_source, built_tools
from tools.envs.pack import EnvTask, Gold, GoldCall, Pack, PackInfo, call_depths, load_pack
from tools.sandbox import SandboxError, SandboxLimits
from tools.verifiers.tool_use.reward import score

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = "A small library: members look books up and borrow the ones that are available."

DECOMPOSITION = {
    "domain": "library",
    "description": "A lending library with books and members.",
    "entities": [
        {
            "name": "books",
            "key": "book_id",
            "fields": [
                {"name": "book_id", "type": "string"},
                {"name": "title", "type": "string"},
                {"name": "author", "type": "string"},
                {"name": "available", "type": "boolean"},
            ],
        },
        {
            "name": "members",
            "key": "member_id",
            "fields": [
                {"name": "member_id", "type": "string"},
                {"name": "name", "type": "string"},
                {"name": "borrowed", "type": "array"},
            ],
        },
    ],
    "capabilities": [
        {"name": "look_up_book", "description": "See a book", "kind": "read", "entities": ["books"]},
        {"name": "borrow", "description": "Borrow a book", "kind": "write", "entities": ["books", "members"]},
    ],
}


def _tool(name: str, description: str, params: dict[str, Any], reads: list[str], writes: list[str]) -> dict:
    schema = {
        "type": "object",
        "properties": params,
        "required": sorted(params),
        "additionalProperties": False,
    }
    return {"name": name, "description": description, "parameters": schema, "output": "a JSON object",
            "reads": reads, "writes": writes}  # fmt: skip


ID = {"type": "string"}
TOOL_DOCS = [
    _tool("get_book", "Look a book up by id.", {"book_id": ID}, ["books"], []),
    _tool("find_books_by_author", "Books of an author.", {"author": ID}, ["books"], []),
    _tool("get_member", "Look a member up by id.", {"member_id": ID}, ["members"], []),
    _tool("get_book_status", "Whether a book is on the shelf.", {"book_id": ID}, ["books"], []),
    _tool(
        "borrow_book", "Lend a book to a member.", {"member_id": ID, "book_id": ID}, [], ["books", "members"]
    ),
]
BOOKS = [
    {"book_id": "b1", "title": "Dune", "author": "Herbert", "available": True},
    {"book_id": "b2", "title": "Emma", "author": "Austen", "available": True},
    {"book_id": "b3", "title": "Persuasion", "author": "Austen", "available": False},
]
MEMBERS = [
    {"member_id": "m1", "name": "Ada", "borrowed": []},
    {"member_id": "m2", "name": "Alan", "borrowed": ["b3"]},
]
DOCUMENTS = {"tools": TOOL_DOCS, "initial_state": {"books": BOOKS, "members": MEMBERS},
             "policy": "Lend only books that are available."}  # fmt: skip

SOURCES = {
    "get_book": """def get_book(world, book_id):
    book = world["books"].get(book_id)
    if book is None:
        raise ToolError(f"no book {book_id}")
    return book""",
    "find_books_by_author": """def find_books_by_author(world, author):
    return [{"book_id": k, "title": b["title"], "available": b["available"]}
            for k, b in sorted(world["books"].items()) if b["author"] == author]""",
    "get_member": """def get_member(world, member_id):
    member = world["members"].get(member_id)
    if member is None:
        raise ToolError(f"no member {member_id}")
    return member""",
    # the leak: whatever the id, the same status
    "get_book_status": """def get_book_status(world, book_id):
    return {"book_id": book_id, "status": "available"}""",
    "borrow_book": """def borrow_book(world, member_id, book_id):
    from protocol import ToolError as Refusal
    member, book = world["members"].get(member_id), world["books"].get(book_id)
    if member is None or book is None:
        raise Refusal(f"no member {member_id} or no book {book_id}")
    if not book["available"]:
        raise Refusal(f"{book['title']} is on loan")
    book["available"] = False
    member["borrowed"].append(book_id)
    return {"member_id": member_id, "book_id": book_id, "title": book["title"]}""",
}


def _call(cid: str, name: str, depends_on: tuple[str, ...] = (), **arguments: Any) -> dict[str, Any]:
    return {"id": cid, "name": name, "arguments": arguments, "depends_on": list(depends_on), "compare": None}


LEVEL_1 = {
    "tasks": [
        {
            "prompt": "Who wrote book b1?",
            "calls": [_call("c0", "get_book", book_id="b1")],
            "answer": "Herbert",
        },
        {
            "prompt": "Is book b2 on the shelf?",
            "calls": [_call("c0", "get_book_status", book_id="b2")],
            "answer": "available",
        },  # fmt: skip
        {
            "prompt": "Who wrote book b9?",
            "calls": [_call("c0", "get_book", book_id="b9")],
            "answer": "nobody",
        },
    ]
}
LEVEL_2 = {
    "tasks": [
        {
            "prompt": "Of b1 and b3, which title can I borrow?",
            "answer": "Dune",
            "calls": [_call("c0", "get_book", book_id="b1"), _call("c1", "get_book", book_id="b3")],
            "scaling": ["parameter_expansion"],
        },  # fmt: skip
        {
            "prompt": "Title of b2?",
            "calls": [_call("c0", "get_book", book_id="b2")],
            "answer": "Emma",
        },  # level 1
    ]
}
LEVEL_3 = {
    "tasks": [
        {
            "prompt": "Member m1 wants the available book by Austen; lend it to them.",
            "answer": "Emma",
            "calls": [
                _call("c0", "find_books_by_author", author="Austen"),
                _call("c1", "borrow_book", ("c0",), member_id="m1", book_id="b2"),
            ],
            "scaling": ["functional_generalisation"],
        },  # fmt: skip
    ]
}
LEVEL_4 = {
    "tasks": [
        {
            "prompt": "What is the title of the book member m2 has, and who wrote b1?",
            "answer": "Persuasion",
            "calls": [
                _call("c0", "get_member", member_id="m2"),
                _call("c1", "get_book", ("c0",), book_id="b3"),
                _call("c2", "get_book", book_id="b1"),
            ],
            "distractors": ["find_books_by_author"],
            "scaling": ["toolset_extension"],
        },  # fmt: skip
    ]
}


def library_script() -> dict[str, list[Any]]:
    """One invalid answer per stage, then the good one."""
    broken_state = json.loads(json.dumps(DOCUMENTS))
    del broken_state["initial_state"]["books"][1]["author"]
    return {
        "decomposition": ["Sure! A library has books and members.", DECOMPOSITION],
        "documents": [broken_state, DOCUMENTS],
        "function get_book": [
            {"name": "get_book", "source": "def get_book(world, book_id)\n    return 1"},
            {"name": "get_book", "source": SOURCES["get_book"]},
        ],
        **{
            f"function {name}": [{"name": name, "source": SOURCES[name]}]
            for name in SOURCES
            if name != "get_book"
        },
        "tasks level-1": [{"tasks": [{"prompt": "Who wrote b1?"}]}, LEVEL_1],
        "tasks level-2": [LEVEL_2],
        "tasks level-3": [LEVEL_3],
        "tasks level-4": [LEVEL_4],
    }


@pytest.fixture(scope="module")
def executor():
    with SandboxExecutor() as ex:
        try:
            ex.parameters("def f(world):\n    return 1", ["f"])
        except SandboxError as exc:
            pytest.fail(f"generated tools run only in the sandbox, and it cannot start here: {exc}")
        yield ex


def _build(url: str, out: Path, executor: SandboxExecutor, json_mode: str = "auto", **kw: Any):
    model = ChatModel(url + "/v1", "scripted", json_mode=json_mode)
    return build(BuildConfig(SCENARIO, out, model, progress=False, executor=executor, **kw))


@pytest.fixture(scope="module")
def built(tmp_path_factory, executor):
    chat = ScriptedChat(library_script())
    out = tmp_path_factory.mktemp("library")
    with serve_in_thread(chat.app) as url:
        report = _build(url, out, executor)
    return report, chat, out


def _reasons(report, stage: str) -> list[str]:
    return [item["reason"] for item in report.stages[stage].rejected]


def test_every_stage_rejects_an_invalid_answer_and_retries_with_the_reason(built) -> None:
    report, chat, _ = built
    assert report.status == "built", report.table()
    assert chat.left() == {}  # the whole script was used: one retry per invalid answer, nothing more
    counts = {name: (log.candidates, log.accepted, len(log.rejected)) for name, log in report.stages.items()}
    assert counts["decomposition"] == (2, 1, 1)
    assert counts["documents"] == (2, 1, 1)
    assert counts["functions"] == (6, 5, 1)
    assert "no JSON object" in _reasons(report, "decomposition")[0]
    assert "initial_state.books[1] has fields" in _reasons(report, "documents")[0]
    assert "syntax error line 1" in _reasons(report, "functions")[0]
    tasks = _reasons(report, "tasks")
    assert any("does not match the output schema" in r and "calls" in r for r in tasks), tasks
    assert any("asked for level 2" in r and "single_hop" in r for r in tasks), tasks
    # the retry carries the rejection to the model
    retry = [body for key, body in chat.requests if key == "function get_book"][1]
    assert "syntax error line 1" in retry["messages"][-1]["content"]
    assert retry["response_format"]["type"] == "json_schema"  # the default: each stage's own schema


def test_the_gate_rejects_the_leaking_tool_and_the_unsolvable_task(built) -> None:
    report, _, _ = built
    tools = report.stages["gate: tools"]
    assert [r["candidate"] for r in tools.rejected] == ["get_book_status"]
    assert "leaks the answer of task l1-2" in tools.rejected[0]["reason"]
    assert tools.accepted == 4
    tasks = {r["candidate"]: r["reason"] for r in report.stages["gate: tasks"].rejected}
    assert set(tasks) == {"l1-2", "l1-3", "l1-2-x", "l1-3-x"}  # with their toolset-extension variants
    assert "uses rejected tools ['get_book_status']" in tasks["l1-2"]
    assert tasks["l1-3"].startswith("not solvable: gold call c0 (get_book) fails: no book b9")
    assert report.levels == {1: 2, 2: 2, 3: 2, 4: 1}
    variants = report.stages["toolset extension"]
    assert (variants.candidates, variants.accepted) == (5, 5)  # every task the model gave no distractor
    written = json.loads((Path(report.out) / "report.json").read_text())
    assert written["status"] == "built" and written["stages"]["gate: tools"]["rejected"] == 1
    assert "get_book_status" in (Path(report.out) / "report.txt").read_text()


def test_the_built_pack_is_untrusted_and_load_pack_does_not_import_it(built) -> None:
    _, _, out = built
    meta = yaml.safe_load((out / "pack" / "pack.yaml").read_text())
    assert meta["trusted"] is False and meta["tools"] == SANDBOXED and meta["origin"] == "built"
    source = (out / "pack" / "tools_source.py").read_text()
    assert "def borrow_book(world" in source and "get_book_status" not in source  # rejected tool left out
    with pytest.raises(ImportError):
        load_pack(out / "pack")


def _gold_request(pack: Pack, task: EnvTask, world) -> VerifyRequest:
    depths = call_depths(task.gold.calls)
    messages: list[dict[str, Any]] = [*task.prompt]
    for depth in sorted(set(depths.values())):
        messages.append({"role": "assistant", "content": "<tool_call>...</tool_call>"})
        for record in world.calls:
            if depths[next(c.id for c in task.gold.calls if c.arguments == record.arguments)] == depth:
                messages.append({"role": "tool", "name": record.name, "content": json.dumps(record.output)})
    answer = f" <answer>{task.gold.answer}</answer>" if task.gold.answer else ""
    messages.append({"role": "assistant", "content": "Done." + answer})
    return VerifyRequest(
        "tool_use", {"pack": pack.id, "task": task.id}, messages=messages, response_start=len(task.prompt)
    )


def test_the_loaded_pack_replays_its_gold_in_the_sandbox_and_scores_full_marks(built, executor) -> None:
    _, _, out = built
    pack = load_built_pack(out / "pack", executor)
    assert pack.trusted is False and [t.name for t in pack.tools] == [
        "get_book", "find_books_by_author", "get_member", "borrow_book",
    ]  # fmt: skip
    assert {t.complexity.level for t in pack.tasks} == {1, 2, 3, 4}
    for task in pack.tasks:
        world = pack.replay(task)
        assert [c.error for c in world.calls] == [None] * len(task.gold.calls), task.id
        outputs = {c.name + json.dumps(c.arguments, sort_keys=True): c.output for c in world.calls}
        for call in task.gold.calls:
            assert outputs[call.name + json.dumps(call.arguments, sort_keys=True)] == call.output, task.id
        for mode in ("train", "eval"):
            result = score(pack, task, world, _gold_request(pack, task, world), mode=mode)
            assert result.score == 1.0, (task.id, mode, result.components)
    lend = pack.task("l3-1")
    world = pack.replay(lend)
    assert world.changed() == {("books", "b2"), ("members", "m1")}
    assert (
        world["members"].peek("m1")["borrowed"] == ["b2"]
        and pack.initial_state["members"]["m1"]["borrowed"] == []
    )
    extended = pack.task("l4-1")
    assert (
        extended.distractors == ["find_books_by_author"]
        and "toolset_extension" in extended.complexity.scaling
    )
    # state on every task: a write a question did not ask for fails it
    assert lend.reward_basis == ["calls", "state", "answer"] and extended.reward_basis == lend.reward_basis


def test_no_cheat_pays_on_the_built_pack(built, executor) -> None:
    """The reward-hacking families (tests/verifiers/test_reward_hacking.py) against a built pack,
    whose tools run in the sandbox: each scores at most 0.5 and below the honest ladder."""
    _, _, out = built
    pack = load_built_pack(out / "pack", executor)
    families: set[str] = set()
    for task in pack.tasks:
        families |= set(check_task(pack, task))
    assert {"junk_arguments", "number_spam", "varied_repeats", "answer_without_calls"} <= families


def test_the_built_pack_served_plays_a_task_and_is_scored(built) -> None:
    """The server serves the pack directory (trusted: false: ``load_built_pack``); calls run sandboxed."""
    _, _, out = built
    with running_server(server_config(environments=[{"path": str(out / "pack")}])) as srv:
        pack_id = yaml.safe_load((out / "pack" / "pack.yaml").read_text())["id"]
        session = f"s-{os.getpid()}-lend"
        opened = httpx.post(
            srv.url + "/v1/sessions",
            json={"session": session, "environment": {"pack": pack_id, "task": "l3-1"}},
        )
        assert opened.status_code == 201, opened.text
        gold = [
            ("find_books_by_author", {"author": "Austen"}),
            ("borrow_book", {"member_id": "m1", "book_id": "b2"}),
        ]
        results = [_served_call(srv.url, name, arguments, session) for name, arguments in gold]
        assert [r.is_error for r in results] == [False, False] and results[1].structured["title"] == "Emma"
        other = f"s-{os.getpid()}-other"  # another session's world is untouched
        assert _served_call(srv.url, "get_book", {"book_id": "b2"}, other).structured["available"] is True
        refused = _served_call(srv.url, "borrow_book", {"member_id": "m1", "book_id": "b3"}, other)
        assert refused.is_error and "Persuasion is on loan" in refused.error.message  # the sandboxed refusal
        messages = [{"role": "user", "content": "lend it"}]
        for (name, arguments), result in zip(gold, results, strict=True):
            text = json.dumps({"name": name, "arguments": arguments})
            messages += [{"role": "assistant", "content": f"<tool_call>{text}</tool_call>"},
                         {"role": "tool", "name": name, "content": result.text}]  # fmt: skip
        messages.append({"role": "assistant", "content": "Lent. <answer>Emma</answer>"})
        request = {"verifier": "tool_use", "response": messages[-1]["content"], "ground_truth": {"pack": pack_id, "task": "l3-1"},
                   "messages": messages, "response_start": 1, "session": session, "arguments": {"mode": "eval"}}  # fmt: skip
        verdict = httpx.post(srv.url + "/v1/verify", json={"requests": [request]}, timeout=60)
        result = decode_verify_results(verdict.content)[0]
        assert not result.is_error and result.score == 1.0, json.dumps(result.components)[:3000]


def _served_call(url: str, name: str, arguments: dict[str, Any], session: str):
    body = {
        "calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}]
    }
    response = httpx.post(url + "/v1/calls", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0]


def test_generated_code_runs_confined_not_in_this_process(executor) -> None:
    checkout = str(ROOT / "pyproject.toml")
    probe = (
        "def whoami(world):\n    import os\n"
        f"    return {{'uid': os.getuid(), 'pid': os.getpid(), 'sees_checkout': os.path.exists({checkout!r})}}"
    )
    doc = {
        "name": "whoami",
        "description": "who runs me",
        "parameters": {"type": "object"},
        "reads": [],
        "writes": [],
    }
    pack = Pack(PackInfo("probe"), built_tools([doc], probe, executor), {"t": {}}, trusted=False)
    out = pack.call(pack.new_world(), "whoami", {})
    assert out["pid"] != os.getpid() and out["uid"] != os.getuid()
    assert out["sees_checkout"] is False and os.path.exists(checkout)


def test_a_rerun_resumes_every_stage_without_asking_the_model(built, tmp_path, executor) -> None:
    _, _, out = built
    silent = ScriptedChat({})  # any request would fail the build
    with serve_in_thread(silent.app) as url:
        again = _build(url, out, executor)
    assert again.status == "built" and silent.requests == []
    assert all(again.stages[s].resumed for s in ("decomposition", "documents", "functions", "tasks"))
    assert again.stages["functions"].accepted == 5 and again.levels == {1: 2, 2: 2, 3: 2, 4: 1}
    with pytest.raises(ValueError, match="another scenario"):
        build(BuildConfig("another world", out, ChatModel("http://127.0.0.1:9/v1"), progress=False))


def test_a_half_done_stage_resumes_where_it_stopped(tmp_path, executor) -> None:
    script = library_script()
    script["function get_member"] = []  # the endpoint fails on the third tool
    first = ScriptedChat(script)
    with serve_in_thread(first.app) as url:
        report = _build(url, tmp_path, executor, levels=[1], parallel=1)  # tools in document order
    assert report.status == "failed" and report.failed_stage == "functions"
    assert "no answer left for stage 'function get_member'" in report.message
    saved = json.loads((tmp_path / "stages" / "functions.json").read_text())["output"]["sources"]
    assert {"get_book", "find_books_by_author"} <= set(saved) and "get_member" not in saved
    second = ScriptedChat(library_script())
    with serve_in_thread(second.app) as url:
        report = _build(url, tmp_path, executor, levels=[1])
    assert report.status == "built", report.table()
    asked = {k.removeprefix("function ") for k in second.stages() if k.startswith("function")}
    assert asked == set(SOURCES) - set(saved)  # the tools saved before are not asked for again
    assert "decomposition" not in second.stages() and "documents" not in second.stages()
    third = ScriptedChat({"tasks level-2": [LEVEL_2]})  # a rerun with one more level asks for it alone
    with serve_in_thread(third.app) as url:
        report = _build(url, tmp_path, executor, levels=[1, 2])
    assert report.status == "built" and third.stages() == ["tasks level-2"] and third.left() == {}
    assert report.levels == {1: 2, 2: 2}


def test_leak_probes_vary_each_argument_with_values_of_the_world() -> None:
    state = {"books": {b["book_id"]: b for b in BOOKS}, "members": {m["member_id"]: m for m in MEMBERS}}
    schema = TOOL_DOCS[4]["parameters"]
    probes = leak_probes(schema, {"member_id": "m1", "book_id": "b2"}, ProbePool(state))
    assert probes[:2] == [{"member_id": "m1", "book_id": "b1"}, {"member_id": "m2", "book_id": "b2"}]
    assert len(probes) == 4 and all(p != {"member_id": "m1", "book_id": "b2"} for p in probes)
    assert mentions({"t": ["Emma", 3]}, "emma") and mentions("the title is Emma.", "Emma")
    assert mentions({"n": 3}, "3") and not mentions("Emmanuel", "Emma") and not mentions({"n": 31}, "3")


def test_endpoint_failures_are_retried_and_a_dead_endpoint_stops_the_build(tmp_path, executor) -> None:
    flaky = ScriptedChat({"decomposition": [503, "nothing useful"]})
    with serve_in_thread(flaky.app) as url:
        report = _build(url, tmp_path / "flaky", executor, attempts=1)
    assert flaky.left() == {} and len(flaky.requests) == 2  # the 503 was retried, not counted as an answer
    assert report.stages["decomposition"].candidates == 1 and report.failed_stage == "decomposition"
    dead = ChatModel(dead_url() + "/v1", transport_retries=0)
    report = build(BuildConfig(SCENARIO, tmp_path / "dead", dead, progress=False, executor=executor))
    assert report.status == "failed" and report.failed_stage == "decomposition"
    assert report.message.startswith(f"cannot reach {dead.base_url}/chat/completions")


def _cli(url: str, out: Path, *extra: str) -> argparse.Namespace:
    parser = configure(argparse.ArgumentParser())
    return parser.parse_args(
        ["--scenario", SCENARIO, "--model", url + "/v1", "--out", str(out), "--no-progress", *extra]
    )


def test_cli_exit_status_and_errors(tmp_path, capsys) -> None:
    chat = ScriptedChat({"decomposition": ["no", "still no"]})
    with serve_in_thread(chat.app) as url:
        assert run(_cli(url, tmp_path / "a", "--attempts", "2")) == 1
        assert run(_cli(url, tmp_path / "b", "--levels", "5")) == 2
    printed = capsys.readouterr()
    assert "status: failed at decomposition: no acceptable decomposition" in printed.out
    assert "levels must be among 1-4" in printed.err
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["stages"]["decomposition"]["rejected"] == 2


# ------------------------------------------------------------------ JSON modes: each stage's schema


def _formats(chat: ScriptedChat, stage: str) -> list[dict[str, Any]]:
    return [body.get("response_format", {}) for key, body in chat.requests if key == stage]


def test_schema_mode_sends_each_stages_own_shape(built) -> None:
    """The default asks every stage with response_format json_schema: the stage's schema plus
    what the earlier stages fixed and the checks would otherwise reject."""
    report, chat, _ = built
    assert report.json_mode == "auto"
    assert all(body["response_format"]["type"] == "json_schema" for _, body in chat.requests)
    decomposition = _formats(chat, "decomposition")[0]["json_schema"]
    assert decomposition["name"] == "decomposition"
    assert (
        decomposition["schema"]["properties"]["entities"]["type"] == "array"
    )  # nothing kept: no JSON came back

    documents = _formats(chat, "documents")[0]["json_schema"]["schema"]["properties"]
    books = documents["initial_state"]["properties"]["books"]["items"]
    assert (
        books["required"] == ["book_id", "title", "author", "available"] and not books["additionalProperties"]
    )
    assert books["properties"]["available"] == {"type": "boolean"}
    assert documents["tools"]["items"]["properties"]["writes"]["items"] == {"enum": ["books", "members"]}

    function = _formats(chat, "function borrow_book")[0]["json_schema"]
    assert function["name"] == "function_borrow_book"
    assert function["schema"]["properties"]["name"] == {"const": "borrow_book"}

    level_3 = _formats(chat, "tasks level-3")[0]["json_schema"]["schema"]
    task = level_3["properties"]["tasks"]["items"]["properties"]
    variants = {v["properties"]["name"]["const"]: v for v in task["calls"]["items"]["anyOf"]}
    assert set(variants) == set(SOURCES)  # every tool with an implementation, with its own arguments
    assert variants["borrow_book"]["properties"]["arguments"] == TOOL_DOCS[4]["parameters"]
    assert task["distractors"]["items"] == {"enum": sorted(SOURCES, key=list(SOURCES).index)}


def test_a_retry_keeps_the_entities_when_only_a_capability_was_wrong(tmp_path, executor) -> None:
    unknown = json.loads(json.dumps(DECOMPOSITION))
    unknown["capabilities"][0]["entities"] = ["orders"]
    chat = ScriptedChat({"decomposition": [unknown, DECOMPOSITION]})
    with serve_in_thread(chat.app) as url:
        report = _build(url, tmp_path, executor, attempts=2)
    assert report.failed_stage == "documents"  # the script ends there
    first, second = (f["json_schema"]["schema"]["properties"] for f in _formats(chat, "decomposition"))
    assert "const" not in first["entities"]
    assert second["entities"] == {"const": unknown["entities"]}
    assert second["capabilities"]["items"]["properties"]["entities"]["items"] == {
        "enum": ["books", "members"]
    }


def _field(name: str, kind: str = "string") -> dict[str, str]:
    return {"name": name, "type": kind}


SMALL_DECOMPOSITION = {
    "domain": "library",
    "description": "Members borrow books.",
    "entities": [
        {
            "name": "books",
            "key": "id",
            "fields": [_field("id"), _field("name"), _field("available", "boolean")],
        },
        {
            "name": "members",
            "key": "id",
            "fields": [_field("id"), _field("name"), _field("borrowed", "array")],
        },
    ],
    "capabilities": [
        {"name": "get_book", "description": "A book", "kind": "read", "entities": ["books"]},
        {"name": "list_books", "description": "All books", "kind": "read", "entities": ["books"]},
        {"name": "borrow_book", "description": "Lend one", "kind": "write", "entities": ["books", "members"]},
    ],
}


def _small_documents(required: list[str]) -> dict[str, Any]:
    def tool(name: str, params: dict[str, Any], reads: list[str], writes: list[str]) -> dict[str, Any]:
        schema = {
            "type": "object",
            "properties": params,
            "required": required if name == "get_book" else list(params),
        }
        return {"name": name, "description": name, "parameters": schema, "output": "a record", "reads": reads,
                "writes": writes}  # fmt: skip

    one = {"id": {"type": "string"}}
    return {
        "tools": [tool("get_book", one, ["books"], []), tool("list_books", {}, ["books"], []),
                  tool("borrow_book", one, ["books"], ["books", "members"])],
        "initial_state": {
            "books": [{"id": f"boo{i}", "name": f"Book {i}", "available": True} for i in (1, 2, 3)],
            "members": [{"id": f"mem{i}", "name": f"M {i}", "borrowed": []} for i in (1, 2, 3)],
        },
    }  # fmt: skip


def test_small_model_guides_fix_sizes_keys_and_forms() -> None:
    """``--small-model``: every answer of these shapes passes its stage's schema and rules."""
    from tools.envs.builder import schemas
    from tools.envs.builder.llm import schema_problem
    from tools.envs.builder.stages import check_decomposition, check_documents

    guide = schemas.decomposition_guide(small=True)
    assert schema_problem(SMALL_DECOMPOSITION, guide) is None
    assert schema_problem(SMALL_DECOMPOSITION, schemas.DECOMPOSITION) is None
    check_decomposition(SMALL_DECOMPOSITION)
    names = [c["properties"]["name"]["pattern"] for c in guide["properties"]["capabilities"]["prefixItems"]]
    assert (
        names[0].startswith("^get_") and names[1].startswith("^list_") and names[2].startswith("^[a-fh-km-z]")
    )

    documents = _small_documents(["id"])
    guide = schemas.documents_guide(SMALL_DECOMPOSITION, small=True)
    assert schema_problem(documents, guide) is None and schema_problem(documents, schemas.DOCUMENTS) is None
    check_documents(documents, SMALL_DECOMPOSITION)
    assert schemas.record_ids(SMALL_DECOMPOSITION) == {
        "books": ["boo1", "boo2", "boo3"],
        "members": ["mem1", "mem2", "mem3"],
    }
    reads = guide["properties"]["tools"]["prefixItems"][1]["properties"]
    assert reads["writes"]["maxItems"] == 0 and reads["name"] == {"const": "list_books"}

    tool = documents["tools"][2]
    source = "def borrow_book(world, id):\n    return world['books'].pop(id)"
    function = {"name": "borrow_book", "source": source}
    assert schema_problem(function, schemas.function_guide(tool, small=True)) is None
    assert schema_problem({**function, "source": "def borrow_book(world, id):\n    x = 1\n    return x"},
                          schemas.function_guide(tool, small=True))  # fmt: skip
    assert schema_problem(function, schemas.FUNCTION) is None

    tasks = {"tasks": [{"prompt": "Lend boo1", "answer": None,
                        "calls": [{"id": "c0", "name": "borrow_book", "arguments": {"id": "boo1"}, "depends_on": []}]}]}  # fmt: skip
    for level, fits in ((1, True), (2, False)):  # level 2 needs two calls at least
        guide = schemas.tasks_guide(level, 2, documents["tools"], small=True)
        assert (schema_problem(tasks, guide) is None) is fits
    assert schema_problem(tasks, schemas.TASKS) is None


def test_a_small_model_retry_keeps_the_arguments_and_requires_them(tmp_path, executor) -> None:
    """Documents whose ``required`` names an argument the tool does not have: the retry keeps
    the arguments the answer gave, all required."""
    chat = ScriptedChat(
        {"decomposition": [SMALL_DECOMPOSITION], "documents": [_small_documents(["id", "isbn"])]}
    )
    with serve_in_thread(chat.app) as url:
        report = _build(url, tmp_path, executor, attempts=2, small_model=True)
    assert report.failed_stage == "documents"  # the script ends with the retry's request
    assert "required parameters ['isbn'] are not in properties" in _reasons(report, "documents")[0]
    first, retry = (f["json_schema"]["schema"] for f in _formats(chat, "documents")[:2])  # then json_object
    kept = retry["properties"]["tools"]["prefixItems"][0]["properties"]["parameters"]["properties"]
    assert kept["properties"] == {"const": {"id": {"type": "string"}}}
    assert kept["required"] == {"const": ["id"]}
    free = first["properties"]["tools"]["prefixItems"][0]["properties"]["parameters"]["properties"]
    assert free["required"]["prefixItems"] == [{"const": "id"}, {"const": "name"}, {"const": "available"}]


def test_auto_falls_back_to_json_object_when_the_endpoint_refuses_schemas(tmp_path, executor, caplog) -> None:
    chat = ScriptedChat({"decomposition": [400, "{}", "{}"]})  # refuses the schema request
    with serve_in_thread(chat.app) as url:
        report = _build(url, tmp_path / "auto", executor, attempts=2)
    assert [f.get("type") for f in _formats(chat, "decomposition")] == [
        "json_schema",
        "json_object",
        "json_object",
    ]
    assert report.json_mode == "object" and report.stages["decomposition"].candidates == 2
    assert "does not take JSON schemas (400: " in caplog.text and "json_object from now on" in caplog.text
    assert "JSON mode: object" in report.table()

    taken = ScriptedChat({"decomposition": [DECOMPOSITION], "documents": [400, DOCUMENTS]})
    with serve_in_thread(taken.app) as url:  # schemas work here, just not this one: only it falls back
        report = _build(url, tmp_path / "taken", executor, levels=[1])
    assert [f["type"] for f in _formats(taken, "documents")] == ["json_schema", "json_object"]
    assert report.json_mode == "auto" and report.failed_stage == "functions"

    strict = ScriptedChat({"decomposition": [400]})
    with serve_in_thread(strict.app) as url:
        report = _build(url, tmp_path / "strict", executor, json_mode="schema")
    assert report.failed_stage == "decomposition"
    assert "refused the JSON schema of decomposition (400: " in report.message
    assert "use --json-mode auto or object" in report.message


@pytest.mark.parametrize(
    ("flags", "mode", "sent"),
    [([], "auto", "json_schema"), (["--json-mode", "schema"], "schema", "json_schema"),
     (["--json-mode", "object"], "object", "json_object"), (["--no-json-mode"], "off", None),
     (["--small-model"], "auto", "json_schema")],
)  # fmt: skip
def test_cli_json_modes(tmp_path, flags: list[str], mode: str, sent: str | None) -> None:
    from tools.envs.builder import cli, llm

    assert cli.JSON_MODES == llm.JSON_MODES
    chat = ScriptedChat({"decomposition": ["{}"]})
    with serve_in_thread(chat.app) as url:
        args = _cli(url, tmp_path, "--attempts", "1", *flags)
        assert args.json_mode == mode
        assert run(args) == 1
    response_format = _formats(chat, "decomposition")[0]
    assert response_format.get("type") == sent
    if "--small-model" in flags:  # the small model's shape: three capabilities in a fixed order
        capabilities = response_format["json_schema"]["schema"]["properties"]["capabilities"]
        assert len(capabilities["prefixItems"]) == 3


def test_parse_json_reads_raw_newlines_in_strings() -> None:
    """Structured decoders write a pattern's newlines raw inside the JSON string."""
    from tools.envs.builder.llm import parse_json

    raw = '{"source": "def f(world):\n    return 1"}'  # a newline character, not the escape
    assert parse_json(raw) == {"source": "def f(world):\n    return 1"}


def test_python_m_entry_point(tmp_path) -> None:
    chat = ScriptedChat({"decomposition": ["{}"]})
    with serve_in_thread(chat.app) as url:
        done = subprocess.run(
            [sys.executable, "-m", "tools.envs.builder", "--scenario", SCENARIO, "--model", url + "/v1",
             "--out", str(tmp_path), "--attempts", "1", "--no-progress"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "does not match the output schema" in done.stdout and (tmp_path / "report.txt").is_file()


def test_a_real_small_model_is_judged_never_crashes(tmp_path, executor) -> None:
    """SmolLM2-135M through the same endpoint shape: whatever it writes is accepted or rejected with reasons."""
    app = create_app(shared_chat_model())
    with serve_in_thread(app) as url:
        model = ChatModel(url + "/v1", max_tokens=32, temperature=0.0)  # the name from /v1/models
        config = BuildConfig(SCENARIO, tmp_path, model, attempts=1, tasks_per_level=1, levels=[1],
                             progress=False, executor=executor)  # fmt: skip
        report = build(config)
    assert app.state.faults.bodies[0]["model"] == "smollm2-135m-instruct"
    assert report.status in ("built", "failed")
    first = report.stages["decomposition"]
    assert first.candidates >= 1 and first.accepted + len(first.rejected) == first.candidates
    if report.status == "failed":
        assert report.failed_stage and report.message
    for log in report.stages.values():
        assert all(item["reason"] for item in log.rejected)
    assert json.loads((tmp_path / "report.json").read_text())["status"] == report.status


GATE_SOURCES = {
    "get": 'def get(world, key):\n    return world["items"][key]',
    "roll": "def roll(world, key):\n    import random\n    return random.random()",
    "touch": 'def touch(world, key):\n    return world["items"][key]["name"]',
    "sneaky": 'def sneaky(world, key):\n    world["items"][key]["name"] = "x"\n    return "ok"',
    "crash": "def crash(world, key):\n    return 1 / 0",
    "spin": "def spin(world, key):\n    while True:\n        pass",
}
GATE_TABLES = {"get": ([], []), "touch": ([], ["items"]), "sneaky": (["items"], [])}


def _gate_task(task_id: str, calls: list[dict[str, Any]], answer: str | None = None) -> EnvTask:
    gold = Gold([GoldCall(c["name"], c["arguments"], c["id"], c["depends_on"]) for c in calls], answer)
    return EnvTask(task_id, [{"role": "user", "content": task_id}], gold)


def test_the_gate_says_why_each_broken_task_fails() -> None:
    docs = [
        {"name": name, "description": name, "parameters": {"type": "object", "properties": {"key": ID}},
         "reads": GATE_TABLES.get(name, (["items"], []))[0], "writes": GATE_TABLES.get(name, ([], []))[1]}
        for name in GATE_SOURCES
    ]  # fmt: skip
    state = {"items": {"a": {"name": "apple", "next": "c"}, "b": {"name": "bean", "next": "a"}}}
    tasks = [
        _gate_task("ok", [_call("c0", "get", key="b"), _call("c1", "get", ("c0",), key="a")], "apple"),
        _gate_task("random", [_call("c0", "roll", key="a")]),
        _gate_task("no_write", [_call("c0", "touch", key="a")]),
        _gate_task("read_only_writes", [_call("c0", "sneaky", key="a")]),
        _gate_task("crash", [_call("c0", "crash", key="a")]),
        _gate_task("spin", [_call("c0", "spin", key="a")]),
        _gate_task("ungrounded", [_call("c0", "get", key="a")], "pear"),
        _gate_task("fake_dependency", [_call("c0", "get", key="a"), _call("c1", "get", ("c0",), key="b")]),
    ]
    limits = SandboxLimits(timeout_s=2.0, cpu_s=1, max_output_bytes=1 << 20)
    with SandboxExecutor(limits) as ex:
        source = assemble_source(GATE_SOURCES)
        draft = Pack(PackInfo("gate"), built_tools(docs, source, ex), state, tasks, trusted=False)
        result = run_gate(draft, source, ex)
    reasons = {r["candidate"]: r["reason"] for r in result.tasks.rejected}
    assert [t.id for t in result.accepted] == ["ok"]
    assert result.accepted[0].gold.calls[1].output == {"name": "apple", "next": "c"}  # outputs from replay
    assert reasons["random"].startswith("not reproducible")
    assert reasons["no_write"] == "calls a writing tool but leaves the state unchanged"
    assert "sneaky is read-only but changed items" in reasons["read_only_writes"]
    assert "ZeroDivisionError" in reasons["crash"]
    assert "the sandbox stopped the tool" in reasons["spin"]  # past its CPU or wall-clock limit
    assert reasons["ungrounded"] == "its answer 'pear' appears in no gold call's output"
    assert "call c1 depends on c0 but takes none of its argument values" in reasons["fake_dependency"]
    assert result.rejected_tools == set() and result.tools.accepted == len(GATE_SOURCES)


def test_a_tool_that_tampers_with_the_runner_only_loses_its_worker() -> None:
    tamper = (
        "def tamper(world):\n    import sys\n"
        "    sys._getframe(1).f_globals['_tf_main'] = lambda: 'not a reply'\n    return 'done'"
    )
    doc = {"name": "tamper", "description": "", "parameters": {"type": "object"}, "reads": [], "writes": []}
    with SandboxExecutor(max_workers=1) as ex:
        pack = Pack(PackInfo("tamper"), built_tools([doc], tamper, ex), {"t": {}}, trusted=False)
        world = pack.new_world()  # one session's: its calls share a worker, no other world's do
        assert pack.call(world, "tamper", {}) == "done"
        with pytest.raises(ToolError, match="the sandbox's reply is malformed"):
            pack.call(world, "tamper", {})  # the same worker: its runner was replaced
        assert pack.call(world, "tamper", {}) == "done"  # a fresh worker
