"""Sessions are leases: the trainer client keeps the sessions of live trajectories open.

A real tool server whose sessions expire after 3 s idle (swept every 0.2 s), and a scripted
policy that takes two TTLs to generate each later turn: every trajectory still finds its notebook as
it left it and ends with its answer, because the client renews the sessions of its live
trajectories. A client that is gone (SIGKILL) renews nothing, and its session is closed.

A lease ends only when the server says its session was *closed*: a session whose calls were
all refused before they opened it (an unknown tool, invalid arguments) or answered from the
cache does not exist on the server yet, and its trajectory's next call opens it. (Leases used
to end there: the client logged "expired before a renewal reached it" for sessions of live
trajectories on slow CPU rollouts, and stopped renewing them.) A replica that stops answering
does not delay the renewals of the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
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


async def test_a_session_first_refused_keeps_its_lease_under_a_slow_policy(smol_tokenizer: Any) -> None:
    """The policy's first call names a tool that does not exist: the server refuses it before
    opening the session, so a renewal finds no such session. The lease must stay: the next
    call opens the session, and the turns after it, two TTLs apart, find its notebook."""
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task

    eos = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")

    def turn(text: str, delay_s: float) -> ScriptedTurn:
        ids = smol_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        return ScriptedTurn([*ids, eos], delay_s=delay_s)

    def call(name: str, k: int) -> str:
        return f'<tool_call>{{"name": "{name}", "arguments": {{"put": "t{k}"}}}}</tool_call>'

    # Generous: a renewal round has a whole TTL's idle time to find the refused session.
    script = [turn(call("notebok", 0), 0.0), turn(call("notebook", 1), SLOW_TURN_S)]
    script += [turn(call("notebook", 2), SLOW_TURN_S), turn("<answer>done</answer>", SLOW_TURN_S)]
    model = ScriptedGenerator(script, tokenizer=smol_tokenizer, eos_token_ids=[eos])
    config = RolloutConfig(format="hermes", max_turns=len(script))

    with running_server(CONFIG) as server:
        async with ToolClient(server.url, timeout_s=60, health_interval_s=0) as client:
            core = RolloutCore(smol_tokenizer, model, client, config)
            task = Task([{"role": "user", "content": "keep notes"}])
            trajectory = await asyncio.wait_for(core.run(task, session_id=f"typo-{new_session_id()}"), 240)
            metrics = client.metrics()

    observations = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert trajectory.stop_reason == StopReason.ANSWER, (trajectory.stop_reason, trajectory.error)
    assert [lines_of(o) for o in observations[1:]] == [["t1"], ["t1", "t2"]], observations
    assert metrics["leases_expired"] == 0 and metrics["sessions_lost"] == 0, metrics


class Renewals:
    """What each renewal round sent and what the server answered (an httpx response hook)."""

    def __init__(self) -> None:
        self.rounds: list[tuple[list[str], dict[str, Any]]] = []

    async def record(self, response: httpx.Response) -> None:
        if response.request.url.path == "/v1/sessions/renew":
            await response.aread()
            sent = json.loads(response.request.content)["sessions"]
            if sent:  # not the first round's empty one, which only learns the TTL
                self.rounds.append((sent, response.json()))


async def test_only_a_closed_session_ends_a_lease(caplog: pytest.LogCaptureFixture) -> None:
    """Three trajectories whose calls never opened their session (an unknown tool, invalid
    arguments, an answer from the cache) and one whose call did: a renewal round keeps all four
    leases and warns of none (no renewal is missing: the server has nothing to renew yet). Once
    a call opens them, the next round renews all four. A session released behind the client's
    back is ``closed``: that one lease ends, with a warning that says so."""
    long_lived = server_config(tools=[*BASE_TOOLS, NOTEBOOK], sessions={"ttl_s": 600})
    renewals = Renewals()
    names = ("refused", "invalid", "cached", "opened")
    sessions = {name: f"{name}-{new_session_id()}" for name in names}
    with running_server(long_lived) as server:
        http = httpx.AsyncClient(timeout=60, event_hooks={"response": [renewals.record]})
        async with http, ToolClient(server.url, http=http, timeout_s=60, health_interval_s=0) as client:
            leases = client._leases  # rounds are driven here, one by one, instead of every ttl_s / 3
            for session in sessions.values():
                client.lease_session(session)
            assert not (await client.call("calculator", {"expression": "6*7"})).is_error  # now cached
            first = await client.call_tools(
                [
                    Call(new_call_id(), "no_such_tool", {}, sessions["refused"]),
                    Call(new_call_id(), "calculator", {"expression": 42}, sessions["invalid"]),
                    Call(new_call_id(), "calculator", {"expression": "6*7"}, sessions["cached"]),
                    Call(new_call_id(), "notebook", {"put": "a"}, sessions["opened"]),
                ]
            )
            kinds = [r.error.kind if r.error else None for r in first]
            assert kinds == [ErrorKind.UNKNOWN_TOOL, ErrorKind.INVALID_ARGUMENTS, None, None], first
            assert first[2].cached, first[2]
            assert sessions_open(server.url) == 1  # only the notebook call opened its session

            with caplog.at_level(logging.WARNING, logger="trainer_client.client"):
                await leases.renew()
            sent, answer = renewals.rounds[-1]
            assert sorted(sent) == sorted(sessions.values())
            assert answer["renewed"] == 1 and answer["closed"] == [], answer
            assert client.metrics()["leases_expired"] == 0 and len(leases) == 4, client.metrics()
            assert not [r for r in caplog.records if "closed" in r.getMessage()], caplog.text

            for name in names:  # each trajectory's next call opens its session
                assert not (await client.call("notebook", {"put": "b"}, session=sessions[name])).is_error
            await leases.renew()
            sent, answer = renewals.rounds[-1]
            assert len(sent) == 4 and answer["renewed"] == 4 and answer["unknown"] == [], answer

            async with ToolClient(server.url, timeout_s=60, health_interval_s=0) as other:  # same token
                await other.release_session(sessions["opened"])
            with caplog.at_level(logging.WARNING, logger="trainer_client.client"):
                await leases.renew()
            sent, answer = renewals.rounds[-1]
            assert answer["closed"] == [sessions["opened"]], answer
            assert client.metrics()["leases_expired"] == 1 and len(leases) == 3
            assert f"session {sessions['opened']} was closed" in caplog.text
            await leases.renew()
            assert (
                sessions["opened"] not in renewals.rounds[-1][0]
            )  # a closed session is not asked about again


async def test_a_first_call_longer_than_the_ttl_keeps_its_session() -> None:
    """A trajectory's first call runs for two TTLs (a slow API): the server opened its session
    when the call started, and the client renews it while the call runs (no answer has named
    its replica yet), so the sweeper does not close it under the call: the next call finds it
    open, not ``unknown_session``."""
    with running_server(CONFIG) as server:
        async with ToolClient(server.url, timeout_s=60, health_interval_s=0) as client:
            session = f"slow-call-{new_session_id()}"
            client.lease_session(session)
            slow = await client.call("sleep", {"seconds": SLOW_TURN_S}, session=session)
            assert not slow.is_error, slow
            result = await client.call("notebook", {"put": "b"}, session=session)
    assert not result.is_error and lines_of(result.text) == ["b"], result


async def test_a_replica_that_stops_answering_does_not_delay_the_others_renewals() -> None:
    """Two replicas, a session on each; one replica's process is stopped (SIGSTOP: it accepts
    connections and answers nothing). Renewals still reach the other every third of its TTL:
    its session outlives three TTLs without a call and keeps its notebook. (A round used to wait
    for every replica's answer, up to its timeout, before the next one was scheduled: one
    stalled replica made every session expire on the healthy ones.)"""
    with running_server(CONFIG) as healthy, running_server(CONFIG) as stalled:
        async with ToolClient([healthy.url, stalled.url], timeout_s=60, health_interval_s=0) as client:
            on = {}
            while len(on) < 2:  # a session homed on each replica
                session = f"home-{new_session_id()}"
                on.setdefault(client._router.hash_replica(session).url, session)
            for session in on.values():
                client.lease_session(session)
                (result,) = await client.call_tools([Call(new_call_id(), "notebook", {"put": "a"}, session)])
                assert not result.is_error, result
            stalled.proc.send_signal(signal.SIGSTOP)
            try:
                held_until = time.monotonic() + 3 * TTL_S
                while time.monotonic() < held_until:  # 3 TTLs without a call: held by renewals alone
                    assert sessions_open(healthy.url) == 1, client.metrics()
                    await asyncio.sleep(0.2)
                (result,) = await client.call_tools(
                    [Call(new_call_id(), "notebook", {"put": "b"}, on[healthy.url])]
                )
            finally:
                stalled.proc.send_signal(signal.SIGCONT)
    assert lines_of(result.text) == ["a", "b"], result


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
            assert body == {"renewed": 1, "unknown": [released, never], "closed": [released], "ttl_s": 600}
            assert answer.headers["x-toolfactory-instance"]
            assert sessions_open(server.url) == 1  # the renewal opened nothing
            bad = await http.post("/v1/sessions/renew", json={"sessions": "kept"})
            assert bad.status_code == 400 and "sessions" in bad.json()["error"]["message"]


async def test_a_renewal_names_only_the_callers_own_closed_sessions() -> None:
    """``closed`` tells a token which of its own sessions are gone for good; another token's
    released id is only ``unknown`` to it, as an id nobody ever opened."""
    tokens = {"a": "token-a-" + new_session_id(), "b": "token-b-" + new_session_id()}
    env = {"TOOLFACTORY_TOKENS": ",".join(tokens.values())}
    with running_server(
        server_config(tools=[*BASE_TOOLS, NOTEBOOK], sessions={"ttl_s": 600}), env=env
    ) as server:
        a, b = (
            httpx.AsyncClient(
                base_url=server.url, timeout=30, headers={"authorization": f"Bearer {tokens[k]}"}
            )
            for k in ("a", "b")
        )
        async with a, b:
            session = f"a-only-{new_session_id()}"
            assert (await a.post("/v1/sessions", json={"session": session})).status_code == 201
            assert (await a.delete(f"/v1/sessions/{session}")).status_code == 200
            by_b = (await b.post("/v1/sessions/renew", json={"sessions": [session]})).json()
            by_a = (await a.post("/v1/sessions/renew", json={"sessions": [session]})).json()
    assert by_b["unknown"] == [session] and by_b["closed"] == [], by_b
    assert by_a["unknown"] == [session] and by_a["closed"] == [session], by_a
