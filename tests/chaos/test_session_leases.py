"""Sessions are leases: the trainer client keeps the sessions of live trajectories open.

A real tool server whose sessions expire after 3 s idle (swept every 0.2 s), and a scripted
policy that takes two TTLs to generate each later turn: every trajectory still finds its notebook as
it left it and ends with its answer, because the client renews the sessions of its live
trajectories. A client that is gone (SIGKILL) renews nothing, and its session is closed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

import httpx
import pytest

from protocol import Call, ErrorKind, new_call_id, new_session_id
from tests.support.processes import started
from tests.support.require import require
from tests.support.server import BASE_TOOLS, REPO, running_server, server_config
from trainer_client.client.tool_client import ToolClient

pytestmark = pytest.mark.timeout(300)

TTL_S = 3.0
NOTEBOOK = {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]}
CONFIG = server_config(tools=[*BASE_TOOLS, NOTEBOOK], sessions={"ttl_s": TTL_S, "sweep_interval_s": 0.2})
SLOW_TURN_S = 2 * TTL_S  # the policy "generates" this long before each later turn
TURNS = 3  # notebook calls per trajectory


def sessions_open(url: str) -> float:
    """The server's own count of open sessions (its /metrics gauge)."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("toolfactory_sessions "):
            return float(line.split()[1])
    raise AssertionError("no toolfactory_sessions gauge in /metrics")


def lines_of(text: str) -> list[str] | None:
    try:
        return list(json.loads(text)["lines"])
    except (ValueError, KeyError, TypeError):
        return None


@pytest.fixture(scope="module")
def smol_tokenizer() -> Any:
    require("transformers", "the rollout renders turns with the SmolLM2 tokenizer (trainer extra)")
    from trainer_client.backends.models import load_tokenizer

    return load_tokenizer("smollm2")


async def test_a_policy_slower_than_the_ttl_keeps_its_world(smol_tokenizer: Any) -> None:
    """Each later turn takes two TTLs to generate, with no call meanwhile; without renewal the
    server closes the session in between and the next call ends the trajectory
    ``session_lost``. With it, every notebook holds every line, and every trajectory ends
    with its answer; the released sessions are closed on the server."""
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task

    eos = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")

    def turn(text: str, delay_s: float) -> ScriptedTurn:
        ids = smol_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        return ScriptedTurn([*ids, eos], delay_s=delay_s)

    def call(k: int) -> str:
        return f'<tool_call>{{"name": "notebook", "arguments": {{"put": "t{k}"}}}}</tool_call>'

    script = [turn(call(1), 0.0)] + [turn(call(k), SLOW_TURN_S) for k in range(2, TURNS + 1)]
    script.append(turn("<answer>done</answer>", SLOW_TURN_S))
    model = ScriptedGenerator(script, tokenizer=smol_tokenizer, eos_token_ids=[eos])
    config = RolloutConfig(format="hermes", max_turns=TURNS + 1)
    sessions = [f"slow-{i}-{new_session_id()}" for i in range(4)]

    with running_server(CONFIG) as server:
        async with ToolClient(server.url, timeout_s=60, health_interval_s=0) as client:
            core = RolloutCore(smol_tokenizer, model, client, config)
            tasks = [Task([{"role": "user", "content": f"keep notes ({s})"}]) for s in sessions]
            trajectories = await asyncio.wait_for(
                asyncio.gather(*(core.run(t, session_id=s) for t, s in zip(tasks, sessions, strict=True))),
                240,
            )
            metrics = client.metrics()
        assert sessions_open(server.url) == 0  # every trajectory released its session at its end

    for trajectory in trajectories:
        observations = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
        assert trajectory.stop_reason == StopReason.ANSWER, (trajectory.stop_reason, trajectory.error)
        assert [lines_of(o) for o in observations] == [
            [f"t{k}" for k in range(1, j + 1)] for j in range(1, TURNS + 1)
        ]
    assert metrics["sessions_renewed"] >= len(sessions) and metrics["leases_expired"] == 0, metrics
    assert metrics["sessions_lost"] == 0


LEASING_CLIENT = """
import asyncio, sys
from protocol import Call, new_call_id
from trainer_client.client.tool_client import ToolClient

async def main(url: str, session: str) -> None:
    async with ToolClient(url, timeout_s=60, health_interval_s=0) as client:
        client.lease_session(session)
        (result,) = await client.call_tools([Call(new_call_id(), "notebook", {"put": "a"}, session)])
        assert not result.is_error, result
        print("leased", flush=True)
        await asyncio.Event().wait()  # a live trajectory that generates for ever

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_the_server_still_closes_a_session_whose_client_is_gone() -> None:
    """A client holds a lease and makes no call: its session outlives several TTLs. The
    client is killed (SIGKILL: no release, no goodbye): the server closes the session one
    TTL later, and a late call with its id gets ``unknown_session``, never an empty notebook."""
    session = f"gone-{new_session_id()}"
    with running_server(CONFIG) as server:
        cmd = [sys.executable, "-c", LEASING_CLIENT, server.url, session]
        with started(cmd, ready_line=r"^leased", timeout_s=120, cwd=REPO) as client:
            held_until = time.monotonic() + 3 * TTL_S
            while time.monotonic() < held_until:  # 3 TTLs without a call: held by renewals alone
                assert sessions_open(server.url) == 1, client.output
                await asyncio.sleep(0.2)
            client.proc.send_signal(signal.SIGKILL)
            client.wait(60)
            deadline = time.monotonic() + 120
            while sessions_open(server.url) != 0:  # the sweeper's doing: nothing else touches it
                assert time.monotonic() < deadline, "the gone client's session was never closed"
                await asyncio.sleep(0.2)
        async with ToolClient(server.url, timeout_s=60, health_interval_s=0) as late:
            (result,) = await late.call_tools([Call(new_call_id(), "notebook", {"put": "b"}, session)])
    assert result.is_error and result.error is not None, result
    assert result.error.kind == ErrorKind.UNKNOWN_SESSION and "released or expired" in result.error.message


async def test_renewal_keeps_only_the_callers_own_open_sessions() -> None:
    """The wire contract: a renewal restarts the TTL of the caller's open sessions, lists the
    others as unknown and never opens one (a released id stays dead)."""
    long_lived = server_config(tools=[*BASE_TOOLS, NOTEBOOK], sessions={"ttl_s": 600})
    with running_server(long_lived) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            kept, released = f"kept-{new_session_id()}", f"released-{new_session_id()}"
            for session in (kept, released):
                assert (await http.post("/v1/sessions", json={"session": session})).status_code == 201
            assert (await http.delete(f"/v1/sessions/{released}")).status_code == 200
            never = f"never-{new_session_id()}"
            answer = await http.post("/v1/sessions/renew", json={"sessions": [kept, released, never]})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body == {"renewed": 1, "unknown": [released, never], "ttl_s": 600}
            assert answer.headers["x-toolfactory-instance"]
            assert sessions_open(server.url) == 1  # the renewal opened nothing
            bad = await http.post("/v1/sessions/renew", json={"sessions": "kept"})
            assert bad.status_code == 400 and "sessions" in bad.json()["error"]["message"]
