"""``trainer-client``: show, summary, help, and a tiny real rollout with SmolLM2."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.server import running_server, server_config
from trainer_client.cli.command import SUBCOMMANDS, build_parser, main
from trainer_client.rollout.dataset import load_tasks
from trainer_client.rollout.records import segments
from trainer_client.rollout.summary import format_summary, summarize

RECORD = {
    "id": "s-abc",
    "index": 3,
    "sample": 1,
    "data_source": "toolfactory/arithmetic",
    "ground_truth": "42",
    "reward": 1.0,
    "reward_components": {},
    "final_answer": "42",
    "stop_reason": "answer",
    "num_turns": 4,
    "error": None,
    "metrics": {"calls": 1, "tool_errors": 0, "parse_errors": 0, "assistant_turns": 2},
    "messages": [{"role": "user", "content": "What is 6*7?"}, {"role": "assistant", "content": "x"}],
    "num_prompt_messages": 1,
    "segments": [
        {"model": True, "text": "<tool_call>6*7</tool_call>"},
        {"model": False, "text": "<|im_start|>tool\n42<|im_end|>\n"},
        {"model": True, "text": "<answer>42</answer>"},
    ],
    "prompt_ids": [1, 2],
    "response_ids": [5, 6, 7, 8, 9],
    "response_mask": [1, 1, 0, 0, 1],
    "response_logprobs": [-0.1, -0.2, 0.0, 0.0, -0.3],
}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def test_show_marks_observation_tokens_without_colour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [dict(RECORD, id="first"), RECORD])
    assert main(["show", str(path), "--index", "1", "--color", "never", "--prompt"]) == 0
    out = capsys.readouterr().out
    assert "<tool_call>6*7</tool_call>[obs]<|im_start|>tool\n42<|im_end|>\n[/obs]<answer>42</answer>" in out
    assert "trajectory s-abc" in out and "reward 1.0" in out
    assert "tokens: 3 model, 2 observation" in out
    assert "[user] What is 6*7?" in out
    assert "\033[" not in out


def test_show_colours_model_and_observation_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [RECORD])
    assert main(["show", str(path), "--id", "s-abc", "--color", "always"]) == 0
    out = capsys.readouterr().out
    assert "\033[32m<tool_call>6*7</tool_call>\033[0m" in out
    assert "\033[36m\033[2m<|im_start|>tool" in out
    assert "[obs]" not in out


def test_show_reports_a_missing_trajectory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [RECORD])
    assert main(["show", str(path), "--index", "7"]) == 2
    assert "no trajectory with index 7 (1 trajectories read)" in capsys.readouterr().err
    assert main(["show", str(tmp_path / "missing.jsonl")]) == 2


def test_segments_split_at_mask_changes() -> None:
    decode = lambda ids: ",".join(map(str, ids))  # noqa: E731
    assert segments([1, 2, 3, 4, 5], [1, 1, 0, 0, 1], decode) == [
        {"model": True, "text": "1,2"},
        {"model": False, "text": "3,4"},
        {"model": True, "text": "5"},
    ]
    assert segments([], [], decode) == []


def test_summary_figures() -> None:
    records = [
        dict(RECORD, reward=1.0, index=0, sample=0),
        dict(
            RECORD, reward=0.0, index=0, sample=1, stop_reason="eos", metrics={"calls": 3, "tool_errors": 1}
        ),
        dict(RECORD, reward=0.5, index=1, sample=0, data_source="toolfactory/search_qa"),
        dict(RECORD, reward=None, index=2, sample=0, error="RuntimeError: boom", stop_reason="error"),
    ]
    summary = summarize(
        records, wall_s=2.0, client_metrics={"batches": 2, "calls": 5, "result_errors": {"timeout": 1}}
    )
    assert summary["trajectories"] == 4 and summary["prompts"] == 3 and summary["scored"] == 3
    assert summary["reward_mean"] == pytest.approx(0.5)
    assert summary["success_rate"] == pytest.approx(0.25)
    assert summary["prompt_success_rate"] == pytest.approx(1 / 3)
    assert summary["tool_calls"] == 6 and summary["tool_errors"] == 1
    assert summary["model_tokens"] == 12 and summary["observation_tokens"] == 8
    assert summary["model_tokens_per_s"] == pytest.approx(6.0)
    assert summary["stop_reasons"] == {"answer": 2, "eos": 1, "error": 1}
    assert summary["by_data_source"]["toolfactory/search_qa"]["reward_mean"] == 0.5
    table = format_summary(summary)
    assert "success rate" in table and "0.250" in table
    assert "error: RuntimeError: boom" in table and "timeout=1" in table


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    build_parser()  # imports the plugin subcommands (train, verl-config)
    assert {"rollout", "show", "summary"} <= set(SUBCOMMANDS)
    for name in list(SUBCOMMANDS):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([name, "--help"])
        assert exit_info.value.code == 0
        assert f"trainer-client {name}" in capsys.readouterr().out


def test_console_script_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainer_client.cli.command", "rollout", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "--verifier-args" in done.stdout and "--n N" in done.stdout


def test_module_run_lists_every_subcommand() -> None:
    # python -m runs cli.py as __main__: the plug-in subcommands used to register on the
    # other copy of the module (trainer_client.cli.command), and only ``rollout`` was listed.
    done = subprocess.run(
        [sys.executable, "-m", "trainer_client.cli.command", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("    ")}
    assert {"rollout", "show", "summary", "train", "verl-config"} <= listed, done.stdout


def test_bad_arguments_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["rollout", "--data", "x.parquet", "--verifier-args", "[1, 2]"])
    assert "must be a JSON object" in capsys.readouterr().err
    assert main(["rollout", "--server", "http://127.0.0.1:9", "--data", str(tmp_path / "none.parquet")]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.fixture(scope="module")
def arithmetic_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    subprocess.run(
        [sys.executable, "-m", "tools.data", "build", "--out", str(out), "--tasks", "arithmetic"]
        + ["--arith-train", "4", "--arith-test", "4"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out / "arithmetic" / "test.parquet"


def test_load_tasks_reads_verl_parquet(arithmetic_data: Path) -> None:
    rows = load_tasks(arithmetic_data, limit=2, offset=1)
    assert [r.index for r in rows] == [1, 2]
    assert rows[0].data_source == "toolfactory/arithmetic"
    assert rows[0].messages[-1]["role"] == "user"
    assert isinstance(rows[0].ground_truth, str | int)


def test_bad_server_offset_and_user_tool_are_explained(
    arithmetic_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ["rollout", "--data", str(arithmetic_data)]
    # commas only: no URL at all (ToolClient raised a bare ValueError past main)
    assert main([*data, "--server", " , "]) == 2
    assert "no tool server given" in capsys.readouterr().err
    for flag, value, why in [
        ("--offset", "-1", "non-negative"),
        ("--user-tool", "", "must name a server tool"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([*data, "--server", "http://127.0.0.1:9", flag, value])
        assert exit_info.value.code == 2
        assert f"argument {flag}: " in (err := capsys.readouterr().err) and why in err, err


def test_rollout_with_smollm2_on_two_tasks(arithmetic_data: Path, tmp_path: Path) -> None:
    config = server_config(verifiers=[{"target": "tools.verifiers.math:math_equal"}])
    out = tmp_path / "runs" / "arith.jsonl"
    with running_server(config) as server:
        code = main(
            ["rollout", "--server", server.url, "--data", str(arithmetic_data), "--limit", "2"]
            + ["--format", "hermes", "--verifier", "math_equal", "--max-tokens", "32", "--max-turns", "2"]
            + ["--temperature", "0", "--out", str(out), "--no-progress"]
        )
    assert code == 0
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["index"] for r in records) == [0, 1]
    for record in records:
        assert len(record["response_ids"]) == len(record["response_mask"]) == len(record["response_logprobs"])
        assert record["reward"] is not None, record.get("metrics")  # scored by the server's verifier
        assert record["error"] is None
        first_turn = record["messages"][record["num_prompt_messages"]]["content"]
        assert record["segments"][0]["model"] and record["segments"][0]["text"].startswith(first_turn)
    summary = orjson.loads(out.with_suffix(".summary.json").read_bytes())
    assert summary["trajectories"] == 2 and summary["scored"] == 2


# --------------------------------------------------------------------------- scripted rollouts


def write_script(path: Path, entries: list) -> Path:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
    return path


def calculator_call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


@pytest.fixture(scope="module")
def calculator_server() -> Iterator[str]:
    config = server_config(verifiers=[{"target": "tools.verifiers.math:math_equal"}])
    with running_server(config) as server:
        yield server.url


def test_scripted_rollout_tests_a_toolset_and_its_verifier_without_a_model(
    arithmetic_data: Path, calculator_server: str, tmp_path: Path
) -> None:
    import pandas as pd

    frame = pd.read_parquet(arithmetic_data)
    expression = frame.iloc[0]["extra_info"]["expression"]
    answer = str(frame.iloc[0]["reward_model"]["ground_truth"])
    script = write_script(
        tmp_path / "turns.jsonl",
        [
            [calculator_call(expression), f"<answer>{answer}</answer>"],  # line 0: row 0
            {"index": 2, "turns": ["I guess <answer>7</answer>"]},
            {"turns": [calculator_call("1/0"), "no idea"]},  # every other row
        ],
    )
    out = tmp_path / "scripted.jsonl"
    code = main(
        ["rollout", "--server", calculator_server, "--data", str(arithmetic_data), "--limit", "3", "--n", "2"]
        + ["--script", str(script), "--verifier", "math_equal", "--out", str(out), "--no-progress"]
    )
    assert code == 0
    records = {(r["index"], r["sample"]): r for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert sorted(records) == [(i, s) for i in range(3) for s in range(2)]
    assert len({r["id"] for r in records.values()}) == 6  # one session per trajectory

    def tool_texts(record: dict) -> list[str]:  # the rollout's own, not the prompt's worked examples
        rollout = record["messages"][record["num_prompt_messages"] :]
        return [m["content"] for m in rollout if m["role"] == "tool"]

    for sample in range(2):
        solved, errored, guessed = records[0, sample], records[1, sample], records[2, sample]
        assert tool_texts(solved) == [answer]
        assert (solved["final_answer"], solved["reward"], solved["stop_reason"]) == (answer, 1.0, "answer")
        assert len(tool_texts(errored)) == 1 and tool_texts(errored)[0].startswith(
            "Error (invalid_arguments)"
        )
        assert (errored["reward"], errored["stop_reason"]) == (0.0, "eos")
        assert (guessed["final_answer"], guessed["reward"], tool_texts(guessed)) == ("7", 0.0, [])
    summary = orjson.loads(out.with_suffix(".summary.json").read_bytes())
    assert summary["trajectories"] == 6 and summary["success_rate"] == pytest.approx(1 / 3)


def test_a_rollout_freezes_what_start_up_built_so_no_collection_walks_it(
    arithmetic_data: Path, calculator_server: str, tmp_path: Path
) -> None:
    """A full collection of a trainer's heap (torch, transformers, the model: ~360k objects)
    stalls the event loop that sends the tool calls for ~0.2 s: the rollout freezes that heap
    once the model and clients are loaded (trainer_client/gc_tuning.py)."""
    import gc

    gc.unfreeze()  # whatever an earlier test froze: this one counts its own
    script = write_script(tmp_path / "turns.jsonl", [{"turns": ["<answer>1</answer>"]}])
    try:
        code = main(
            ["rollout", "--server", calculator_server, "--data", str(arithmetic_data), "--limit", "1"]
            + ["--script", str(script), "--out", str(tmp_path / "o.jsonl"), "--no-progress"]
        )
        assert code == 0
        assert gc.get_freeze_count() > 10_000  # pytest, the client, the tokenizer, ...
    finally:
        gc.unfreeze()


def test_freezing_does_nothing_while_the_collector_is_off() -> None:
    import gc

    from trainer_client.gc_tuning import freeze_startup_heap

    gc.unfreeze()
    gc.disable()
    try:
        assert freeze_startup_heap() == 0 and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_a_script_must_cover_every_row(
    arithmetic_data: Path, calculator_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_script(tmp_path / "turns.jsonl", [["<answer>1</answer>"]])
    args = ["rollout", "--server", calculator_server, "--data", str(arithmetic_data), "--limit", "2"]
    assert main([*args, "--script", str(script), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "has no turns for dataset row(s) [1]" in capsys.readouterr().err
    bad = write_script(tmp_path / "bad.jsonl", [{"index": "one", "turns": []}])
    assert main([*args, "--script", str(bad), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "index must be an integer" in capsys.readouterr().err


def test_rollout_shows_the_servers_tool_schemas_through_the_template(
    smol_tokenizer: Any, calculator_server: str, tmp_path: Path
) -> None:
    import pandas as pd

    from tests.trainer.templates.test_tool_schemas import qwen_style_model_dir

    model = qwen_style_model_dir(smol_tokenizer, tmp_path / "qwen-style")
    data = tmp_path / "plain.parquet"
    pd.DataFrame(
        [
            {
                "data_source": "plain",
                "prompt": [{"role": "user", "content": "What is 2+3?"}],
                "reward_model": {"ground_truth": "5"},
                "extra_info": {"index": 0},
            }
        ]
    ).to_parquet(data)
    script = write_script(
        tmp_path / "turns.jsonl", [{"turns": [calculator_call("2+3"), "<answer>5</answer>"]}]
    )
    prompts = {}
    for mode in ("auto", "none"):
        out = tmp_path / f"{mode}.jsonl"
        code = main(
            ["rollout", "--server", calculator_server, "--data", str(data), "--model", str(model)]
            + ["--script", str(script), "--tool-schemas", mode, "--verifier", "math_equal"]
            + ["--out", str(out), "--no-progress"]
        )
        assert code == 0
        (record,) = map(orjson.loads, out.read_bytes().splitlines())
        assert record["reward"] == 1.0
        prompts[mode] = smol_tokenizer.decode(record["prompt_ids"])
    assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in prompts["auto"]
    assert "<tools>" not in prompts["none"]
