"""Every imported τ² task's gold, played through a real server: schemas enforced, τ²'s verdict 1.0.

The in-process replays of test_packs.py call the tools directly; here each task's gold calls
go through ``/v1/calls`` in a session bound to the task, so every argument meets the tool's
input schema as the server checks it (no τ² gold call is refused: τ²'s evaluator does not
check schemas, so a gold against its own schema would be a benchmark inconsistency, as BFCL
entry 173 is), each result is what the in-process replay returns, and ``/v1/verify`` in eval
mode (τ²'s own verdict) scores every gold trajectory 1.0. All tasks of all four domains:
telecom's 2,285 too, in τ²'s solo mode and in its dual control (``telecom-dual``: the phone's
actions made by the simulated customer, with user call ids, as the rollout makes them).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from protocol import decode_results
from protocol.messages import is_user_call, new_user_call_id
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs.pack import EnvTask, Pack
from tools.envs.tau2 import packs as tau2
from tools.envs.tau2.domain import DOMAINS
from tools.envs.tau2.verdict import DONE

pytestmark = pytest.mark.timeout(1800)
# τ²'s domains share tool names; "telecom-dual" is telecom in τ²'s dual control
PREFIXES = {"mock": "", "retail": "r_", "airline": "a_", "telecom": "t_", "telecom-dual": "d_"}
LABELS = (*DOMAINS, "telecom-dual")
CHUNK = 100  # tasks per request
# every τ² task of the package but mock's two without expected actions (no gold to play)
IMPORTED = {"retail": 114, "airline": 50, "mock": 7, "telecom": 2285, "telecom-dual": 2285}


def _arguments(label: str) -> dict[str, str]:
    domain, _, mode = label.partition("-")
    return {"domain": domain, **({"mode": mode} if mode else {})}


@pytest.fixture(scope="module")
def packs() -> dict[str, Pack]:
    return {label: tau2.pack(**_arguments(label)) for label in LABELS}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    environments = [
        {"source": "tools.envs.tau2:pack", "prefix": PREFIXES[label], "arguments": _arguments(label)}
        for label in LABELS
    ]
    with running_server(server_config(environments=environments), startup_timeout_s=900) as srv:
        yield srv


def _gold(pack: Pack, task: EnvTask) -> list[tuple[str, dict[str, Any], bool]]:
    """The gold calls (name, arguments, whether the simulated customer makes it)."""
    users = set(task.metadata.get("user_tools") or ())
    calls = [(c.name, c.arguments, c.name in users) for c in task.gold.calls]
    return [*calls, (DONE, {}, False)] if task.metadata.get("tau2_solo") else calls


def _play(url: str, pack: Pack, tasks: list[EnvTask], prefix: str) -> list[dict[str, Any]]:
    """Each task's gold in its own session, the calls of all in one batch; then one verify batch."""
    sessions = [f"gold-{uuid.uuid4().hex}" for _ in tasks]
    with httpx.Client(base_url=url, timeout=600) as http:
        for session, task in zip(sessions, tasks, strict=True):
            opened = http.post(
                "/v1/sessions", json={"session": session, "environment": {"pack": pack.id, "task": task.id}}
            )
            assert opened.status_code == 201, opened.text
        calls = [
            (
                i,
                name,
                {
                    "call_id": new_user_call_id() if user else uuid.uuid4().hex,
                    "name": prefix + name,
                    "arguments": arguments,
                    "session": s,
                },
            )
            for i, (s, task) in enumerate(zip(sessions, tasks, strict=True))
            for name, arguments, user in _gold(pack, task)
        ]
        response = http.post("/v1/calls", json={"calls": [c for _, _, c in calls]})
        assert response.status_code == 200, response.text
        results = decode_results(response.content)
        chats: list[list[dict[str, Any]]] = [[] for _ in tasks]
        played: list[list[Any]] = [[] for _ in tasks]
        for (i, name, call), result in zip(calls, results, strict=True):
            if is_user_call(call["call_id"]):  # as the rollout records the customer's calls
                function = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
                chats[i] += [
                    {
                        "role": "user",
                        "content": "",
                        "tool_calls": [{"id": "u", "type": "function", "function": function}],
                    },
                    {
                        "role": "tool",
                        "name": call["name"],
                        "content": result.text,
                        "requestor": "user",
                        "tool_call_id": "u",
                    },
                ]
            else:
                text = json.dumps({"name": call["name"], "arguments": call["arguments"]})
                chats[i] += [
                    {"role": "assistant", "content": f"<tool_call>{text}</tool_call>"},
                    {"role": "tool", "name": call["name"], "content": result.text},
                ]
            played[i].append((name, result))
        requests = [
            {
                "verifier": "tool_use",
                "ground_truth": {"pack": pack.id, "task": task.id},
                "messages": [
                    *task.prompt,
                    *chat,
                    {"role": "assistant", "content": "Done. " + " ".join(task.gold.communicate)},
                ],
                "response_start": len(task.prompt),
                "session": session,
                "arguments": {"mode": "eval"},
            }
            for session, task, chat in zip(sessions, tasks, chats, strict=True)
        ]
        verified = http.post("/v1/verify", json={"requests": requests})
        assert verified.status_code == 200, verified.text
        for session in sessions:
            http.delete(f"/v1/sessions/{session}")
    return [
        {"task": task.id, "played": p, "verdict": v}
        for task, p, v in zip(tasks, played, verified.json()["results"], strict=True)
    ]


@pytest.mark.parametrize("domain", LABELS)
def test_every_gold_plays_through_the_server_to_tau2s_full_reward(
    server: ServerProcess, packs: dict[str, Pack], domain: str
) -> None:
    pack = packs[domain]
    assert len(pack.tasks) == IMPORTED[domain]
    refused, differ, scored = [], [], []
    for start in range(0, len(pack.tasks), CHUNK):
        tasks = pack.tasks[start : start + CHUNK]
        for task, entry in zip(tasks, _play(server.url, pack, tasks, PREFIXES[domain]), strict=True):
            expected = pack.replay(task).calls
            for (name, result), record in zip(entry["played"], [*expected, None], strict=False):
                if result.is_error and result.error.kind.value == "invalid_arguments":
                    refused.append((task.id, name, result.text))
                elif record is not None and (record.error is not None) != result.is_error:
                    differ.append((task.id, name, record.error, result.text))
            verdict = entry["verdict"]
            if verdict["score"] != 1.0:
                scored.append(
                    (task.id, verdict["score"], verdict["details"].get("benchmark"), verdict.get("error"))
                )
    print(f"{domain}: {len(pack.tasks)} gold trajectories through the server")
    assert refused == []  # no gold call against its tool's schema (τ² has no entry-173 case)
    assert differ == []
    assert scored == []
