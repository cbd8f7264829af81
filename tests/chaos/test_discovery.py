"""Replicas found in DNS: one name in /etc/hosts, replicas on 127.0.0.x, changed under load.

Real tool-server processes on distinct loopback addresses and one port, a real name
lookup (glibc reading /etc/hosts), the real rollout core with a scripted model, and a
stateful tool (``notebook``: each call appends a line to the session's notebook and
returns every line so far), so a session that silently lost its state would show it.
The tests add their own lines to /etc/hosts (root only) and remove them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import Call, ErrorKind, new_call_id, new_session_id
from tests.support.require import require
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config
from trainer_client.client.discovery import DnsName, dns_name, resolve
from trainer_client.client.tool_client import ToolClient

pytestmark = pytest.mark.timeout(240)

HOSTS = Path("/etc/hosts")
NOTEBOOK = {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]}
CONFIG = server_config(tools=[*BASE_TOOLS, NOTEBOOK])
TURNS = 6  # notebook calls per trajectory
FAST = {"health_interval_s": 0.2, "timeout_s": 30}


class HostsEntries:
    """This test's lines for one name in /etc/hosts, tagged; ``clear`` removes exactly those.

    Written in place (the file may be a bind mount that cannot be replaced by a rename).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._tag = f"# toolfactory test {name}"

    def _rewrite(self, keep: Any, extra: str = "") -> None:
        with HOSTS.open("r+") as f:
            lines = [line for line in f.read().splitlines(keepends=True) if keep(line)]
            text = "".join(lines)
            if text and not text.endswith("\n"):
                text += "\n"
            f.seek(0)
            f.write(text + extra)
            f.truncate()

    def add(self, address: str) -> None:
        self._rewrite(lambda line: True, f"{address} {self.name} {self._tag}\n")

    def remove(self, address: str) -> None:
        self._rewrite(lambda line: not (line.startswith(address + " ") and self._tag in line))

    def clear(self) -> None:
        self._rewrite(lambda line: self._tag not in line)


@pytest.fixture
def hosts() -> Iterator[HostsEntries]:
    entries = HostsEntries(f"tf-{uuid.uuid4().hex[:10]}.replicas.test")
    try:
        entries.add("127.0.0.2")
    except OSError as exc:
        pytest.skip(
            f"cannot write {HOSTS} ({exc}): these tests put a name with several addresses there (root only)"
        )
    try:
        entries.add("127.0.0.3")
        found = resolve(DnsName(entries.name, 80))
        if found != ["http://127.0.0.2:80", "http://127.0.0.3:80"]:
            pytest.skip(f"a name on two {HOSTS} lines resolves to {found} here, not to both addresses")
        entries.clear()
        yield entries
    finally:
        entries.clear()


@pytest.fixture(scope="module")
def smol_tokenizer() -> Any:
    require("transformers", "the rollout test renders turns with the SmolLM2 tokenizer (trainer extra)")
    from trainer_client.backends.models import load_tokenizer

    return load_tokenizer("smollm2")


def common_port(addresses: list[str]) -> int:
    """A port free on every one of ``addresses`` (the replicas of one DNS name share a port)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            port = int(probe.getsockname()[1])
        with contextlib.ExitStack() as stack:
            try:
                for address in addresses:
                    stack.enter_context(socket.socket()).bind((address, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no port free on all of {addresses}")


async def start(stack: contextlib.ExitStack, addresses: list[str], port: int) -> list[ServerProcess]:
    """Replicas on ``addresses`` (all on ``port``), started side by side."""

    def one(address: str) -> ServerProcess:
        return stack.enter_context(running_server(CONFIG, host=address, extra_args=["--port", str(port)]))

    return list(await asyncio.gather(*(asyncio.to_thread(one, a) for a in addresses)))


def kill_hard(server: ServerProcess) -> None:
    server.proc.kill()
    server.proc.wait(10)


async def until(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def notebook(session: str, line: str) -> Call:
    return Call(new_call_id(), "notebook", {"put": line}, session)


def lines_of(text: str) -> list[str] | None:
    """The notebook lines an observation shows; None for an error observation."""
    try:
        return list(json.loads(text)["lines"])
    except (ValueError, KeyError, TypeError):
        return None


# --------------------------------------------------------------------------- the URL


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("dns://tools", "dns://NAME:PORT"),
        ("dns://tools:notaport", "dns://NAME:PORT"),
        ("dns://tools:8000/v1", "only a name, a port"),
        ("dns://tools:8000?refresh_s=0", "refresh_s must be"),
        ("dns://tools:8000?refresh_s=soon", "refresh_s must be"),
        ("dns://tools:8000?every=2", "unknown option 'every'"),
        ("srv://tools:8000", "starts with dns://"),
    ],
)
def test_a_bad_discovery_url_is_refused_with_the_reason(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("?", r"\?")):
        DnsName.parse(url)


def test_a_discovery_url_stands_alone_and_needs_a_name_that_resolves() -> None:
    assert dns_name(["http://a:1", "http://b:2"]) is None
    name = dns_name(["dns+https://tools.ns.svc:8443?refresh_s=0.5"])
    assert name == DnsName("tools.ns.svc", 8443, "https", 0.5)
    with pytest.raises(ValueError, match="give it alone"):
        dns_name(["dns://tools:8000", "http://other:8000"])
    with pytest.raises(ValueError, match="does not resolve"):
        ToolClient("dns://no-such-replica.invalid:8000")


def test_every_address_is_a_replica_url_ipv6_in_brackets() -> None:
    name = DnsName("tools", 8000)
    infos = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 8000)),
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::7", 8000, 0, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 8000)),  # A record seen twice
    ]
    assert name.urls(infos) == ["http://10.0.0.7:8000", "http://[fd00::7]:8000"]


# --------------------------------------------------------------------------- under load


async def test_a_replica_killed_and_one_added_during_a_rollout(
    hosts: HostsEntries, smol_tokenizer: Any
) -> None:
    """Three replicas behind one name; mid-rollout one is killed (and leaves DNS, as a pod
    does) and a fourth joins. Sessions on the dead replica end with a clear error and never
    continue elsewhere from an empty notebook; every other session keeps its whole state;
    trajectories started after the fourth joined use it too."""
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task

    addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    port = common_port(addresses)
    eos = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")

    def turn(text: str) -> ScriptedTurn:
        ids = smol_tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        return ScriptedTurn([*ids, eos], delay_s=0.15)  # a model that takes a while per turn

    def call(k: int) -> str:
        return f'<tool_call>{{"name": "notebook", "arguments": {{"put": "t{k}"}}}}</tool_call>'

    script = [turn(call(k)) for k in range(1, TURNS + 1)] + [turn("<answer>done</answer>")]
    generator = ScriptedGenerator(script, tokenizer=smol_tokenizer, eos_token_ids=[eos])
    config = RolloutConfig(format="hermes", max_turns=TURNS + 1)
    first = [f"first-{i}-{new_session_id()}" for i in range(24)]
    second = [f"second-{i}-{new_session_id()}" for i in range(12)]

    with contextlib.ExitStack() as stack:
        victim, *others = await start(stack, addresses[:3], port)
        for address in addresses[:3]:
            hosts.add(address)
        async with ToolClient(f"dns://{hosts.name}:{port}?refresh_s=0.2", **FAST) as client:
            assert sorted(r.url for r in client.replicas) == [f"http://{a}:{port}" for a in addresses[:3]]
            core = RolloutCore(smol_tokenizer, generator, client, config)

            def roll(session: str) -> asyncio.Task[Any]:
                task = Task([{"role": "user", "content": f"keep notes ({session})"}])
                return asyncio.create_task(core.run(task, session_id=session))

            wave = [roll(s) for s in first]
            await until(lambda: client.metrics()["calls"] >= 2 * len(first), "two turns per trajectory")
            homes = {s: client.session_replica(s) for s in first}
            on_victim = {s for s, url in homes.items() if url == victim.url}
            assert on_victim and len(on_victim) < len(first), homes

            await asyncio.to_thread(kill_hard, victim)  # a pod killed: it leaves DNS too
            hosts.remove(addresses[0])
            newcomer = (await start(stack, addresses[3:], port))[0]
            hosts.add(addresses[3])
            await until(lambda: newcomer.url in [r.url for r in client.replicas], "the new replica in DNS")
            await until(lambda: victim.url not in [r.url for r in client.replicas], "the dead one dropped")
            late = [roll(s) for s in second]
            await until(lambda: all(client.session_replica(s) for s in second), "the late sessions' homes")
            late_homes = {s: client.session_replica(s) for s in second}
            trajectories = await asyncio.wait_for(asyncio.gather(*wave, *late), 120)
            metrics = client.metrics()

    assert newcomer.url in late_homes.values(), late_homes  # new sessions use the new replica
    assert victim.url not in late_homes.values()
    assert 0 < metrics["sessions_lost"] <= len(on_victim)
    for session, trajectory in zip(first + second, trajectories, strict=True):
        observations = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
        notebooks = [lines_of(text) for text in observations]
        if session in on_victim:  # state gone with its replica: the trajectory ends, unscored
            assert trajectory.stop_reason == StopReason.SESSION_LOST, (trajectory.stop_reason, observations)
            assert f"lived on replica {victim.url}" in trajectory.error, trajectory.error
            broke = notebooks.index(None) if None in notebooks else len(notebooks)
            assert notebooks[:broke] == [[f"t{k}" for k in range(1, j + 1)] for j in range(1, broke + 1)]
            # Only a call in flight when the replica died is spliced as an error; never a fresh notebook.
            assert all("may or may not have run" in text for text in observations[broke:]), observations
        else:  # every call of the session ran on its replica, with all its earlier lines
            assert trajectory.stop_reason == StopReason.ANSWER, (trajectory.stop_reason, observations)
            assert notebooks == [[f"t{k}" for k in range(1, j + 1)] for j in range(1, TURNS + 1)]


async def test_a_replica_that_leaves_dns_is_drained_then_dropped(hosts: HostsEntries) -> None:
    """A live replica whose address leaves DNS keeps its sessions until they end, takes no
    new session and no stateless call, and is dropped once its sessions are released; when
    the address comes back, so does the replica."""
    addresses = ["127.0.0.2", "127.0.0.3"]
    port = common_port(addresses)
    with contextlib.ExitStack() as stack:
        stay, leave = await start(stack, addresses, port)
        for address in addresses:
            hosts.add(address)
        async with ToolClient(f"dns://{hosts.name}:{port}?refresh_s=0.1", **FAST) as client:
            sessions = [new_session_id() for _ in range(24)]
            for result in await client.call_tools([notebook(s, "1") for s in sessions]):
                assert not result.is_error, result.error
            on_leave = [s for s in sessions if client.session_replica(s) == leave.url]
            assert 0 < len(on_leave) < len(sessions)

            hosts.remove(addresses[1])
            await until(lambda: any(r["draining"] for r in client.metrics()["replicas"]), "draining")
            before = {r["url"]: r["calls"] for r in client.metrics()["replicas"]}
            newer = [new_session_id() for _ in range(24)]
            results = await client.call_tools(
                [notebook(s, "2") for s in sessions]
                + [notebook(s, "1") for s in newer]
                + [Call(new_call_id(), "echo", {"text": str(i)}) for i in range(50)]
            )
            assert not [r.error for r in results if r.is_error]
            assert [r.structured["lines"] for r in results[: len(sessions)]] == [["1", "2"]] * len(sessions)
            assert {client.session_replica(s) for s in newer} == {stay.url}
            after = {r["url"]: r["calls"] for r in client.metrics()["replicas"]}
            assert after[leave.url] - before[leave.url] == len(on_leave)  # only its own sessions' calls

            await asyncio.sleep(0.5)
            assert leave.url in [r.url for r in client.replicas]  # its sessions are still open
            for session in on_leave:
                await client.release_session(session)
            await until(
                lambda: leave.url not in [r.url for r in client.replicas], "the drained replica dropped"
            )
            assert (await client.call("echo", {"text": "still"})).structured["text"] == "still"

            hosts.add(addresses[1])
            await until(lambda: leave.url in [r.url for r in client.replicas], "the address back in DNS")
            back = [new_session_id() for _ in range(24)]
            assert not any(r.is_error for r in await client.call_tools([notebook(s, "1") for s in back]))
            assert leave.url in {client.session_replica(s) for s in back}
            assert client.metrics()["sessions_lost"] == 0


async def test_a_failed_lookup_keeps_the_replicas(hosts: HostsEntries) -> None:
    """The name vanishing from DNS (a resolver outage) must not drain the fleet."""
    port = common_port(["127.0.0.2"])
    with contextlib.ExitStack() as stack:
        (server,) = await start(stack, ["127.0.0.2"], port)
        hosts.add("127.0.0.2")
        async with ToolClient(f"dns://{hosts.name}:{port}?refresh_s=0.05", **FAST) as client:
            session = new_session_id()
            assert not (await client.call_tools([notebook(session, "1")]))[0].is_error
            hosts.clear()
            assert client.discovery is not None
            failed = client.discovery.failed_lookups
            await until(lambda: client.discovery.failed_lookups >= failed + 3, "failed lookups")
            (result,) = await client.call_tools([notebook(session, "2")])
            assert result.structured["lines"] == ["1", "2"]
            assert [r.url for r in client.replicas] == [server.url]
            assert not client.metrics()["replicas"][0]["draining"]


async def test_a_static_replica_list_never_moves_a_session_off_a_dead_replica() -> None:
    """Without DNS too: a session whose replica died ends with a clear error instead of
    quietly starting over on another replica; a session with no state yet may still move."""
    with running_server(CONFIG) as survivor, running_server(CONFIG) as victim:
        async with ToolClient([victim.url, survivor.url], **FAST) as client:
            sessions = [new_session_id() for _ in range(16)]
            await client.call_tools([notebook(s, "1") for s in sessions])
            on_victim = {s for s in sessions if client.session_replica(s) == victim.url}
            assert on_victim
            await asyncio.to_thread(kill_hard, victim)
            results = await client.call_tools([notebook(s, "2") for s in sessions])
            fresh = new_session_id()
            (first_call,) = await client.call_tools([notebook(fresh, "1")])
            for session, result in zip(sessions, results, strict=True):
                if session in on_victim:
                    assert result.is_error and result.error.kind == ErrorKind.UNKNOWN_SESSION
                    assert f"lived on replica {victim.url}" in result.error.message
                else:
                    assert result.structured["lines"] == ["1", "2"]
            assert first_call.structured["lines"] == ["1"]
            assert client.session_replica(fresh) == survivor.url
