"""``tool-server env`` as a user runs it (real subprocesses), and ``python -m tools.data build``
for pack tasks, read back with the trainer's own dataset loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import env_pack
from tests.support.require import require
from tests.support.server import REPO
from tools.envs.pack import load_pack
from trainer_client.rollout.dataset import load_tasks

SOURCE = "tests.support.env_pack:pack"
pytestmark = pytest.mark.timeout(120)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "env", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "environments": [
                    {"source": SOURCE},
                    {"source": SOURCE, "arguments": {"pack_id": "shop_b", "broken": True}, "toolset": "b"},
                ]
            }
        )
    )
    return path


def test_list_and_show(config: Path) -> None:
    listed = cli("list", "--config", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["id"], r["toolset"], r["tools"], r["tasks"]) for r in rows] == [
        ("shop", "shop", 4, 3),
        ("shop_b", "b", 4, 6),
    ]
    shown = cli("show", "shop", "--config", str(config), "--json")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["tasks_per_level"] == {"1": 2, "3": 1}
    assert [t["name"] for t in summary["tools"]] == [t.name for t in env_pack.TOOLS]
    assert summary["policy"] == env_pack.POLICY
    text = cli("show", "b", "--config", str(config))  # by toolset name too
    assert text.returncode == 0 and "shop_b" in text.stdout and "level 3: 2" in text.stdout


def test_validate_passes_a_good_pack_and_names_each_broken_task(config: Path) -> None:
    good = cli("validate", "shop", "--config", str(config))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "3 of 3 tasks valid" in good.stdout
    bad = cli("validate", SOURCE, "--arg", "broken=true")
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    assert any(line.startswith("shop/gold_fails: gold call cancel_order") for line in lines)
    assert any(
        line.startswith("shop/missing_tool: gold calls use tools the pack lacks: refund_order")
        for line in lines
    )
    assert any(line.startswith("shop/wrong_level: complexity: scenario 'multi_hop'") for line in lines)
    assert not any(
        line.startswith(("shop/look", "shop/cancel_patched", "shop/user_then_cancel")) for line in lines
    )
    assert "3 of 6 tasks valid, 3 with problems" in bad.stdout
    allowed = cli("validate", SOURCE, "--arg", "broken=true", "--allow-failing-gold")
    assert allowed.returncode == 1  # the missing tool and the wrong level remain
    assert "gold_fails" not in allowed.stdout
    assert "4 of 6 tasks valid, 2 with problems; 2 gold calls fail in the replay (allowed)" in allowed.stdout


def test_export_writes_a_directory_that_loads_and_validates(tmp_path: Path) -> None:
    out = tmp_path / "shop"
    exported = cli("export", SOURCE, "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert "tools: tests.support.env_pack" in exported.stdout
    loaded = load_pack(out)
    original = env_pack.pack()
    assert [t.to_dict() for t in loaded.tasks] == [t.to_dict() for t in original.tasks]
    assert loaded.initial_state == original.initial_state
    assert cli("validate", str(out), "--quiet").returncode == 0


def test_export_finds_the_module_of_a_typed_procedural_world(tmp_path: Path) -> None:
    """The typed world's tools come from two modules; the typed one exports them all."""
    source = "tools.envs.procedural:pack"
    args = ("--arg", "world=bank", "--arg", "tasks=12", "--arg", "parameter_type_generalisation=1.0")
    exported = cli("export", source, "--out", str(tmp_path / "bank"), *args)
    assert exported.returncode == 0, exported.stderr
    assert "tools: tools.envs.procedural.typed.bank" in exported.stdout
    loaded = load_pack(tmp_path / "bank")
    assert {"get_balances", "find_transactions"} <= {t.name for t in loaded.tools}
    assert cli("validate", str(tmp_path / "bank"), "--quiet").returncode == 0


def test_bad_input_gets_a_configuration_error(config: Path) -> None:
    unknown = cli("show", "nope", "--config", str(config))
    assert unknown.returncode == 2
    assert "neither a pack directory nor a 'module:callable' source" in unknown.stderr
    assert "the config's packs: shop, shop_b" in unknown.stderr
    bad_argument = cli("validate", SOURCE, "--arg", "colour=red")
    assert bad_argument.returncode == 2 and "bad arguments" in bad_argument.stderr
    helped = cli("--help")
    assert helped.returncode == 0 and "validate" in helped.stdout and "--arg key=value" in helped.stdout


def build_data(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "tools.data",
        "build",
        "--out",
        str(out),
        "--tasks",
        f"env:{SOURCE}",
        *extra,
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_data_build_writes_rows_the_trainer_reads(tmp_path: Path) -> None:
    built = build_data(tmp_path, "--env-test-fraction", "0.34", "--seed", "1")
    assert built.returncode == 0, built.stderr
    rows = [
        row
        for split in ("train", "test")
        for row in load_tasks(tmp_path / "env" / "shop" / f"{split}.parquet")
    ]
    assert sorted(r.extra_info["task"] for r in rows) == ["cancel_patched", "look", "user_then_cancel"]
    assert sorted(r.extra_info["split"] for r in rows) == ["test", "train", "train"]
    pack = env_pack.pack()
    for row in rows:
        task = pack.task(row.extra_info["task"])
        assert row.data_source == "env/shop"
        assert row.ground_truth == {"pack": "shop", "task": task.id}
        assert row.messages == [{"role": "system", "content": env_pack.POLICY}, *task.prompt]
        assert row.extra_info["level"] == task.complexity.level and row.extra_info["pack"] == "shop"
        rollout_task = row.task()
        assert rollout_task.verifier == "tool_use"
        assert rollout_task.metadata["pack"] == "shop" and rollout_task.metadata["task"] == task.id
        exposed = task.tools or [t.name for t in env_pack.TOOLS]
        assert [t["name"] for t in row.extra_info["tools"]] == exposed
        # the chat template gets them as function schemas, each as the pack declares it
        assert [t["function"]["name"] for t in rollout_task.tools] == exposed
        for schema in rollout_task.tools:
            assert schema["function"]["parameters"] == pack.tool(schema["function"]["name"]).input_schema


def test_data_build_tool_schemas_round_trip_exactly(tmp_path: Path) -> None:
    assert build_data(tmp_path, "--env-test-fraction", "0").returncode == 0
    pack = env_pack.pack()
    for row in load_tasks(tmp_path / "env" / "shop" / "train.parquet"):
        for descriptor in row.extra_info["tools"]:
            assert descriptor["inputSchema"] == pack.tool(descriptor["name"]).input_schema
        for schema in row.task().tools or []:  # what the chat template gets
            assert schema["function"]["parameters"] == pack.tool(schema["function"]["name"]).input_schema


def test_data_build_levels_prefix_and_errors(tmp_path: Path) -> None:
    built = build_data(tmp_path, "--env-levels", "3", "--env-prefix", "s2_", "--env-test-fraction", "0")
    assert built.returncode == 0, built.stderr
    (row,) = load_tasks(tmp_path / "env" / "shop" / "train.parquet")
    assert row.extra_info["task"] == "user_then_cancel"
    assert [t["name"] for t in row.extra_info["tools"]] == ["s2_" + t.name for t in env_pack.TOOLS]
    assert not (tmp_path / "env" / "shop" / "test.parquet").exists()
    none = build_data(tmp_path, "--env-levels", "4")
    assert none.returncode == 1 and "has no tasks of level [4]" in none.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "tools.data", "build", "--out", str(tmp_path), "--tasks", "env:/no/such/pack"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "neither a pack directory" in missing.stderr


def test_the_docs_example_pack_validates_and_serves(tmp_path: Path) -> None:
    """docs/environments.md works as written: its pack directory validates and plays a bound task."""
    import uuid

    import httpx

    from protocol import decode_results
    from tests.support.docs_blocks import files_in
    from tests.support.server import running_server

    files = files_in(REPO / "docs" / "environments.md")
    assert set(files) >= {"shop_tools.py", "my_shop/pack.yaml", "my_shop/state.json", "my_shop/tasks.jsonl"}
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}
    validated = subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "env", "validate", "my_shop", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert "2 of 2 tasks valid" in validated.stdout
    config = {
        "environments": [{"path": str(tmp_path / "my_shop")}],
        "tools": [],
        "sessions": {"ttl_s": 1.0, "sweep_interval_s": 0.2},  # so that the session below expires
    }
    with running_server(config, env={"PYTHONPATH": f"{tmp_path}:{REPO}"}) as srv:
        session = "s-" + uuid.uuid4().hex
        environment = {"pack": "my_shop", "task": "new_order"}
        opened = httpx.post(srv.url + "/v1/sessions", json={"session": session, "environment": environment})
        assert opened.status_code == 201, opened.text
        body = {
            "calls": [
                {
                    "call_id": uuid.uuid4().hex,
                    "name": "cancel_order",
                    "arguments": {"order_id": "o7"},
                    "session": session,
                }
            ]
        }
        (result,) = decode_results(httpx.post(srv.url + "/v1/calls", json=body, timeout=30).content)
        assert not result.is_error and result.structured == {"status": "cancelled", "total": 5}
        time.sleep(2.5)  # idle past the TTL: the sweeper closes the session and drops its world
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'toolfactory_tool_gauge{name="worlds_live",tool="verify_tool_use"} 0.0' in metrics
        assert 'toolfactory_tool_gauge{name="worlds_created",tool="verify_tool_use"} 1.0' in metrics
        body["calls"][0]["call_id"] = uuid.uuid4().hex  # a new call (the old id replays its result)
        (late,) = decode_results(httpx.post(srv.url + "/v1/calls", json=body, timeout=30).content)
        assert late.error is not None and late.error.kind.value == "unknown_session"


def test_serving_two_packs_with_the_same_tool_names_needs_a_prefix(tmp_path: Path) -> None:
    def check(environments: list[dict]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump({"tools": [], "environments": environments}))
        command = [sys.executable, "-m", "tool_server.cli", "check-config", "--config", str(path)]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)

    other = {"source": SOURCE, "arguments": {"pack_id": "shop_b"}}
    clash = check([{"source": SOURCE}, other])
    assert clash.returncode == 2
    assert "environment 'shop_b': its tool 'get_user' has the name of a tool already served" in clash.stderr
    assert "prefix" in clash.stderr
    twice = check([{"source": SOURCE}, {"source": SOURCE, "prefix": "b_"}])
    assert twice.returncode == 2 and "two environments have the id 'shop'" in twice.stderr
    both = check([{"source": SOURCE}, {**other, "prefix": "b_"}])
    assert both.returncode == 0, both.stderr
    assert "toolsets: shop, shop_b, verifiers" in both.stdout
    neither = check([{"toolset": "x"}])
    assert neither.returncode == 2 and "give exactly one of 'path' and 'source'" in neither.stderr


BUILT_SOURCE = """
def get_item(world, item_id):
    item = world["items"].peek(item_id)
    if item is None:
        raise ToolError("no item " + item_id)
    return item


def mark_sold(world, item_id):
    item = world["items"][item_id]
    item["sold"] = True
    return item
"""


def test_a_built_pack_validates_and_serves_its_tools_from_the_sandbox(tmp_path: Path) -> None:
    """A pack the builder wrote (trusted: false) is read without importing its code: its tools run
    in sandbox workers, for `env validate` and for the server alike."""
    import uuid

    import httpx

    from protocol import decode_results
    from tests.support.server import running_server
    from tools.envs.builder.loader import write_built_pack
    from tools.envs.pack import Complexity, EnvTask, Gold, GoldCall, PackInfo

    item_id = {"type": "object", "properties": {"item_id": {"type": "string"}}, "required": ["item_id"]}
    documents = [
        {
            "name": "get_item",
            "description": "Get an item.",
            "parameters": item_id,
            "reads": ["items"],
            "writes": [],
        },
        {
            "name": "mark_sold",
            "description": "Sell it.",
            "parameters": item_id,
            "reads": ["items"],
            "writes": ["items"],
        },
    ]
    calls = [GoldCall("mark_sold", {"item_id": "i1"})]
    task = EnvTask(
        "sell", [{"role": "user", "content": "Sell i1."}], Gold(calls), Complexity.from_calls(calls)
    )
    state = {"items": {"i1": {"sold": False}}}
    root = write_built_pack(
        tmp_path / "built", PackInfo("built_shop", origin="built"), documents, BUILT_SOURCE, state, [task]
    )
    validated = cli("validate", str(root), "--quiet")
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert "1 of 1 tasks valid" in validated.stdout

    def run(srv: Any, name: str, session: str) -> Any:
        body = {
            "calls": [
                {
                    "call_id": uuid.uuid4().hex,
                    "name": name,
                    "arguments": {"item_id": "i1"},
                    "session": session,
                }
            ]
        }
        return decode_results(httpx.post(srv.url + "/v1/calls", json=body, timeout=60).content)[0]

    with running_server({"tools": [], "environments": [{"path": str(root)}]}) as srv:
        seller, other = f"s-{uuid.uuid4().hex}", f"s-{uuid.uuid4().hex}"
        sold = run(srv, "mark_sold", seller)
        assert not sold.is_error, sold.text
        assert sold.structured == {"sold": True}
        assert run(srv, "get_item", seller).structured == {"sold": True}
        assert run(srv, "get_item", other).structured == {"sold": False}


def test_env_build_is_a_tool_server_command(tmp_path: Path) -> None:
    """``tool-server env build`` runs the builder (tests/envs/test_builder.py tests the pipeline):
    a dead endpoint ends the build with its URL in the report, and bad options exit 2."""
    out = tmp_path / "build"
    dead = cli("build", "--scenario", "a tiny shop", "--model", "http://127.0.0.1:9/v1", "--model-name", "m",
               "--out", str(out), "--no-progress")  # fmt: skip
    assert dead.returncode == 1, dead.stderr
    assert "cannot reach http://127.0.0.1:9/v1" in dead.stdout + dead.stderr
    assert (out / "report.json").is_file()
    missing = cli("build", "--model", "http://127.0.0.1:9/v1", "--out", str(out))
    assert missing.returncode == 2 and "--scenario" in missing.stderr


def test_data_build_env_shots_writes_few_shot_prompts_for_procedural_packs(tmp_path: Path) -> None:
    """``--env-shots K``: each prompt is the system text (policy, tools, call format), K worked
    examples as text turns, then the task; ground truth and extra_info stay as without it."""
    from tools.envs.procedural import pack

    arguments = {"world": "bank", "tasks": 12, "levels": "[1, 2]", "pack_id": "bank-shots"}
    common = [sys.executable, "-m", "tools.data", "build", "--tasks", "env:tools.envs.procedural:pack"]
    common += [a for key, value in arguments.items() for a in ("--env-arg", f"{key}={value}")]
    plain = subprocess.run(
        [*common, "--out", str(tmp_path / "plain")], cwd=REPO, capture_output=True, text=True
    )
    shots = subprocess.run(
        [*common, "--out", str(tmp_path / "shots"), "--env-shots", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 0 and shots.returncode == 0, plain.stderr + shots.stderr
    tasks = {t.id: t for t in pack(world="bank", tasks=12, levels=[1, 2], pack_id="bank-shots").tasks}
    for split in ("train", "test"):
        bare = load_tasks(tmp_path / "plain" / "env" / "bank-shots" / f"{split}.parquet")
        shown = load_tasks(tmp_path / "shots" / "env" / "bank-shots" / f"{split}.parquet")
        assert [r.ground_truth for r in bare] == [r.ground_truth for r in shown]
        assert [r.extra_info for r in bare] == [r.extra_info for r in shown]
        for row in shown:
            roles = [m["role"] for m in row.messages]
            assert roles[0] == "system" and "<tool_call>" in row.messages[0]["content"]
            assert roles.count("user") == 3, roles  # two worked examples, then the task
            assert sum("<tool_call>" in m["content"] for m in row.messages if m["role"] == "assistant") >= 2
            assert row.messages[-1] == tasks[row.ground_truth["task"]].prompt[-1]
    refused = build_data(tmp_path / "bad", "--env-shots", "2")  # the test pack is not procedural
    assert refused.returncode != 0 and "not procedural" in refused.stdout + refused.stderr


# --------------------------------------------------------------------------- env score


def _tool_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _scripted_tau2_rollouts(tmp_path: Path, policies: dict[str, Any]) -> dict[str, Path]:
    """``trainer-client rollout --script`` of the τ² mock pack (solo rows), one file per policy.

    A policy maps (row index, task) to the calls the agent makes (then it tells the facts);
    every trajectory is verified by a real server with ``tool_use`` in eval mode.
    """
    from tests.support.server import running_server, server_config
    from tools.envs.tau2 import packs as tau2

    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.data",
            "build",
            "--out",
            str(tmp_path),
            "--tasks",
            "env:tools.envs.tau2:pack",
        ]
        + ["--env-arg", "domain=mock", "--env-test-fraction", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    data = tmp_path / "env" / "tau2-mock" / "train.parquet"
    pack = tau2.pack("mock")
    rows = load_tasks(data)
    config = server_config(environments=[{"source": "tools.envs.tau2:pack", "arguments": {"domain": "mock"}}])
    out: dict[str, Path] = {}
    with running_server(config) as server:
        for name, policy in policies.items():
            script = tmp_path / f"{name}.script.jsonl"
            with open(script, "w") as handle:
                for row in rows:
                    task = pack.task(row.extra_info["task"])
                    turns = [_tool_call(c.name, c.arguments) for c in policy(row.index, task)]
                    turns.append("Done. " + " ".join(task.gold.communicate))
                    handle.write(json.dumps({"index": row.index, "turns": turns}) + "\n")
            out[name] = tmp_path / f"{name}.jsonl"
            rolled = subprocess.run(
                [sys.executable, "-m", "trainer_client.cli.command", "rollout", "--server", server.url]
                + ["--data", str(data), "--script", str(script), "--verifier", "tool_use"]
                + ["--verifier-args", '{"mode": "eval"}', "--out", str(out[name]), "--no-progress"],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert rolled.returncode == 0, rolled.stderr
    return out


def test_env_score_prints_tau2s_pass_hat_k_of_rollouts(tmp_path: Path) -> None:
    """Gold scores 100 %; an imperfect scripted policy scores what τ²'s own code computes."""
    import math

    from tests.envs.tau2.parity import Call, Trajectory, tau2_reward
    from tools.envs.tau2.domain import import_tau2

    def gold(index: int, task: Any) -> list[Any]:
        return task.gold.calls

    def drops_last_call(index: int, task: Any) -> list[Any]:  # on every other task
        return task.gold.calls[:-1] if index % 2 else task.gold.calls

    def idle(index: int, task: Any) -> list[Any]:  # does nothing on every third task
        return [] if index % 3 == 0 else task.gold.calls

    policies = {"gold": gold, "drops": drops_last_call, "idle": idle}
    runs = _scripted_tau2_rollouts(tmp_path, policies)

    gold_score = cli("score", str(runs["gold"]), "--json")
    assert gold_score.returncode == 0, gold_score.stderr
    (report,) = json.loads(gold_score.stdout)["tau2"]
    assert report["pack"] == "tau2-mock" and report["tasks"] == 7 and report["trials"] == 7
    assert report["avg_reward"] == 1.0 and report["pass_hat"] == {"1": 1.0}
    shown = cli("score", str(runs["gold"]))
    assert shown.returncode == 0 and "pass^1" in shown.stdout and "100.00%" in shown.stdout

    # expected: each trajectory judged by τ²'s own evaluate_simulation, pass^k by τ²'s own formula
    from tools.envs.tau2 import packs as tau2

    pack = tau2.pack("mock")
    rows = load_tasks(tmp_path / "env" / "tau2-mock" / "train.parquet")
    successes: dict[str, int] = {}
    rewards: list[float] = []
    for row in rows:
        task = pack.task(row.extra_info["task"])
        said = ["Done. " + " ".join(task.gold.communicate)]
        for policy in policies.values():
            calls = [Call(c.name, c.arguments) for c in policy(row.index, task)]
            reward, _ = tau2_reward("mock", task.id, Trajectory("scripted", calls, said))
            rewards.append(reward)
            successes[task.id] = successes.get(task.id, 0) + (reward == 1.0)
    agent_metrics = import_tau2("tau2.metrics.agent_metrics")  # τ²'s own pass^k (it needs pandas)
    expected = {
        k: sum(agent_metrics.pass_hat_k(3, s, k) for s in successes.values()) / len(successes)
        for k in (1, 2, 3)
    }
    assert 0 < expected[3] < expected[1] < 1  # the policies make pass^k fall with k

    scored = cli("score", *(str(p) for p in runs.values()), "--json")
    assert scored.returncode == 0, scored.stderr
    (report,) = json.loads(scored.stdout)["tau2"]
    assert report["tasks"] == 7 and report["trials"] == 21
    assert math.isclose(report["avg_reward"], sum(rewards) / len(rewards))
    assert {int(k): v for k, v in report["pass_hat"].items()} == pytest.approx(expected)
    only = cli("score", str(runs["gold"]), "--pack", "tau2-retail")
    assert only.returncode == 2 and "no trajectories of tau2-retail" in only.stderr


def test_env_score_names_what_it_cannot_score(tmp_path: Path) -> None:
    def write(name: str, records: list[dict[str, Any]]) -> str:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return str(path)

    truth = {"pack": "tau2-mock", "task": "create_task_1"}
    trained = write("train.jsonl", [{"ground_truth": truth, "reward": 0.4, "reward_components": {"f1": 0.4}}])
    refused = cli("score", trained)
    assert refused.returncode == 2 and "not a benchmark's verdict" in refused.stderr
    assert '--verifier-args \'{"mode": "eval"}\'' in refused.stderr
    no_task = cli("score", write("qa.jsonl", [{"ground_truth": "42", "reward": 1.0}]))
    assert no_task.returncode == 2 and "names no environment task" in no_task.stderr
    # a failed verification is a failed sample: 0, and said so
    mixed = [
        {"ground_truth": truth, "reward": 1.0, "reward_components": {"benchmark": 1.0}},
        {"ground_truth": truth, "reward": None, "error": "verify failed"},
    ]
    scored = cli("score", write("mixed.jsonl", mixed))
    assert scored.returncode == 0, scored.stderr
    assert (
        "pass^2" in scored.stdout
        and "0.00%" in scored.stdout
        and "1 trajectories were not verified" in scored.stdout
    )
    missing = cli("score", str(tmp_path / "absent.jsonl"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_env_score_prints_bfcls_accuracy_per_category(tmp_path: Path) -> None:
    require("bfcl_eval", reason="bfcl-eval is installed by `make setup` (pip install --no-deps)")
    records = [
        {"ground_truth": {"pack": pack, "task": task}, "reward": r, "reward_components": {"benchmark": r}}
        for pack, task, r in [
            ("bfcl_multi_turn_base", "multi_turn_base_0", 1.0),
            ("bfcl_multi_turn_base", "multi_turn_base_1", 0.0),
            ("bfcl_multi_turn_miss_func", "multi_turn_miss_func_0", 1.0),
        ]
    ]
    path = tmp_path / "bfcl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    scored = cli("score", str(path))
    assert scored.returncode == 0, scored.stderr
    assert (
        "Multi Turn Overall Acc" in scored.stdout and "50.00%" in scored.stdout and "100.00%" in scored.stdout
    )
    as_json = json.loads(cli("score", str(path), "--json").stdout)
    assert as_json["bfcl"]["categories"]["multi_turn_base"]["accuracy"] == 0.5
    unknown = tmp_path / "other.jsonl"
    unknown.write_text(json.dumps({**records[0], "ground_truth": {"pack": "shop", "task": "look"}}) + "\n")
    refused = cli("score", str(unknown))
    assert refused.returncode == 2 and "knows τ²-bench (tau2-*) and BFCL (bfcl_*) packs" in refused.stderr
