"""The demo's choices on a small or busy machine, its progress line, and what it shows at the end.

``make demo`` never finished on a 2-core machine at load 10-17 (torch's two threads on two busy
cores: 0.074 model tokens/s), said nothing for minutes, and showed search with 0 tool calls.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trainer_client.backends.base import TokenOutput
from trainer_client.demo import build_parser
from trainer_client.demo_engine import choose_engine, torch_threads, vllm_installed
from trainer_client.demo_report import MEANING, tool_example
from trainer_client.rollout.token_progress import GenerationProgress, format_duration


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [(2, 0.1, 1), (1, None, 1), (2, 12.0, 1), (8, 9.0, 1), (8, 0.5, 0), (None, None, 1)],
)
def test_one_torch_thread_on_two_cores_or_a_busy_machine(
    cores: int | None, load: float | None, threads: int
) -> None:
    assert torch_threads(cores, load) == threads


def test_auto_uses_vllm_when_it_is_installed_and_says_which_engine_runs() -> None:
    chosen = choose_engine("auto", None, installed=True)
    assert chosen.engine == "vllm" and chosen.automatic and "vLLM" in chosen.why
    plain = choose_engine("auto", None, installed=False)
    assert plain.engine == "hf" and "make vllm" in plain.why  # how to get the faster one
    assert choose_engine("auto", "http://127.0.0.1:8001", installed=False).engine == "vllm"
    asked = choose_engine("vllm", None, installed=True)
    assert asked.engine == "vllm" and not asked.automatic  # asked for: a failed start is an error
    assert choose_engine("hf", None, installed=True).engine == "hf"


def test_the_demo_defaults_to_auto_and_finds_a_made_vllm_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert build_parser().parse_args([]).engine == "auto"
    monkeypatch.delenv("TOOLFACTORY_VLLM_PYTHON", raising=False)
    (tmp_path / "venv").mkdir()
    assert not vllm_installed(tmp_path / "venv")  # half made: `make vllm` writes .installed last
    (tmp_path / "venv" / ".installed").touch()
    assert vllm_installed(tmp_path / "venv")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(model_tokens: int) -> dict:
    return {"response_mask": [1] * model_tokens + [0] * 5}


def test_progress_speaks_before_any_token_then_gives_an_eta() -> None:
    clock, finished = FakeClock(), []
    progress = GenerationProgress(10, 200, lambda: finished, clock=clock)
    assert (
        progress.line()
        == "0 s: 0/10 trajectories, generating the first turns (up to 200 tokens per trajectory)"
    )
    clock.now += 20
    progress.add_tokens(400)  # 20 tokens/s; no trajectory done: the budget bounds the ETA
    assert progress.line() == "20 s: 0/10 trajectories, 400 model tokens (20.0/s), ETA <= 1 min 20 s"
    finished += [_record(100), _record(60)]  # mean 80 a trajectory: 800 expected in all
    clock.now += 10
    progress.add_tokens(200)
    assert progress.line() == "30 s: 2/10 trajectories, 600 model tokens (20.0/s), ETA ~10 s"


def test_progress_counts_the_tokens_a_backend_returns() -> None:
    class Backend:
        name = "backend"

        async def generate(self, request_id: str, **kwargs: object) -> TokenOutput:
            return TokenOutput([1, 2, 3])

    progress = GenerationProgress(1, 10, list)
    wrapped = progress.wrap(Backend())
    asyncio.run(wrapped.generate("r", prompt_ids=[1], sampling_params={}))
    assert progress.tokens == 3 and wrapped.name == "backend"


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.4, 59, 61, 3725)] == ["0 s", "59 s", "1 min 01 s", "1 h 02 min"]


def test_a_call_that_worked_is_shown_with_what_came_back() -> None:
    record = {
        "messages": [
            {"role": "user", "content": "Question: who?"},
            {"role": "assistant", "content": "<search> Pride and Prejudice </search>"},
            {"role": "tool", "content": "Doc 1 (Title: Pride and Prejudice) a novel by Jane Austen"},
        ],
        "calls": [{"name": "search", "message": 2, "error": None}],
    }
    failed = {"messages": record["messages"], "calls": [{"name": "search", "message": 2, "error": "timeout"}]}
    assert tool_example([failed]) is None
    assert tool_example([failed, record]) == (
        "search: <search> Pride and Prejudice </search> -> Doc 1 (Title: Pride and Prejudice) a novel by Jane Austen"
    )
    assert set(MEANING) == {"search_qa", "arithmetic", "bank"}
