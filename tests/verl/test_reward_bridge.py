"""``reward_bridge.compute_score``: veRL's custom-reward signature, scored by a real tool
server's ``/v1/verify``, also when loaded the way veRL loads it (from the file path)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from tests.support.require import require
from tests.support.server import running_server, server_config
from trainer_client.verl import reward_bridge as reward_bridge
from trainer_client.verl.reward_bridge import compute_score

VERIFIERS = [{"target": "tools.verifiers.match:exact_match"}, {"target": "tools.verifiers.math:math_equal"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server(server_config(verifiers=VERIFIERS)) as server:
        yield server.url


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    await reward_bridge.aclose_clients()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_scores_right_and_wrong_answers(url: str) -> None:
    right = await compute_score(
        "toolfactory/search_qa",
        "<think>it is in France</think><answer> Paris </answer>",
        {"target": ["Paris", "Paris, France"]},
        {"index": 3},
        server_urls=[url],
        verifier="exact_match",
    )
    wrong = await compute_score(
        "toolfactory/search_qa", "<answer>Lyon</answer>", {"target": ["Paris"]}, None, server_urls=url
    )
    assert right == {"score": 1.0, "verify_ok": 1.0}
    assert wrong == {"score": 0.0, "verify_ok": 1.0}


async def test_verifier_arguments_reach_the_verifier(url: str) -> None:
    untagged = "Paris"
    loose = await compute_score(None, untagged, "Paris", None, server_urls=[url])
    strict = await compute_score(
        None, untagged, "Paris", None, server_urls=[url], verifier_arguments={"require_answer_tag": True}
    )
    assert (loose["score"], strict["score"]) == (1.0, 0.0)


async def test_numpy_values_from_verl_batches_are_accepted(url: str) -> None:
    """veRL hands ground truth and extra_info as numpy objects; they must serialise."""
    extra: dict[str, Any] = {"index": np.int64(7), "operands": np.array([12, 34])}
    result = await compute_score(
        "toolfactory/arithmetic", "<answer>408</answer>", np.int64(408), extra, server_urls=[url]
    )
    assert result["score"] == 1.0


async def test_extra_info_chooses_the_verifier_per_sample(url: str) -> None:
    text = "<answer>1,234.0</answer>"
    by_default = await compute_score(None, text, 1234, {}, server_urls=[url], verifier="exact_match")
    per_sample = await compute_score(None, text, 1234, {"verifier": "math_equal"}, server_urls=[url])
    assert by_default["score"] == 0.0
    assert per_sample == {"score": 1.0, "verify_ok": 1.0}


async def test_failures_score_the_fallback_instead_of_raising(url: str) -> None:
    unknown = await compute_score(None, "x", "x", {}, server_urls=[url], verifier="no_such_verifier")
    assert unknown == {"score": 0.0, "verify_ok": 0.0}
    down = await compute_score(
        None,
        "<answer>x</answer>",
        "x",
        {},
        server_urls=[closed_port_url()],
        score_on_error=-1.0,
        timeout_s=2.0,
    )
    assert down == {"score": -1.0, "verify_ok": 0.0}


async def test_missing_server_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLFACTORY_URL", raising=False)
    with pytest.raises(ValueError, match="server_urls"):
        await compute_score(None, "x", "x", {})


async def test_loaded_by_verl_from_its_file(url: str) -> None:
    """veRL imports ``custom_reward_function.path`` as a file and merges ``reward_kwargs``."""
    require("verl")
    from pathlib import Path

    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(
            "ppo_trainer",
            overrides=[
                f"reward.custom_reward_function.path={reward_bridge.__file__}",
                "reward.custom_reward_function.name=compute_score",
                f"+reward.custom_reward_function.reward_kwargs.server_urls=[{url}]",
                "+reward.custom_reward_function.reward_kwargs.verifier=math_equal",
            ],
        )
    fn = get_custom_reward_fn(config)
    assert fn is not None
    # the keyword arguments veRL's naive reward manager passes
    result = await fn(
        data_source="toolfactory/arithmetic",
        solution_str="<tool_call>...</tool_call>\n408\n<answer>408</answer>",
        ground_truth=408,
        extra_info={"num_turns": 4, "rollout_reward_scores": {}},
    )
    assert result == {"score": 1.0, "verify_ok": 1.0}
    await fn.args[0].__globals__["aclose_clients"]()  # veRL loaded its own copy of the module
