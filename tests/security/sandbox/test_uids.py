"""Replicas on one node never hand two sessions the same sandbox uid.

Every worker runs as a uid of its own (as root), drawn from one range. Two replicas drawing
from the same range could give two sessions one uid, which could then signal or ptrace each
other and read each other's files. Each replica now takes its slice of the range (config
``sandbox``: ``replica_index`` of ``replicas``, or its own ``uid_range``), and with
``claims_dir`` a replica whose range overlaps a live replica's claim refuses to start. Real
server processes (``configure_sandbox`` as ``create_app`` calls it) and real confined workers.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tool_server.app import configure_sandbox
from tool_server.config import ConfigError, load_config
from tools.sandbox.uids import UidClaim

REPO = Path(__file__).resolve().parents[3]

# One replica: its config from the environment, as a deployment sets it; then N python sessions.
REPLICA = r"""
import anyio, os, sys
from tool_server.app import configure_sandbox
from tool_server.config import load_config
from tools.sandbox import SandboxLimits, SandboxWorker

configure_sandbox(load_config())
print("claimed", flush=True)

async def main():
    workers = [await anyio.to_thread.run_sync(SandboxWorker.spawn, SandboxLimits(timeout_s=30)) for _ in range(N)]
    seen = []
    for worker in workers:
        result = await worker.run("import os\nos.getuid()")
        seen.append((worker.uid, int(result.value)))
    print(seen, flush=True)
    sys.stdin.readline()  # hold the claim and the sessions until the test is done
    for worker in workers:
        await worker.aclose()

anyio.run(main)
"""


def replica(env: dict[str, str], sessions: int = 4) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", REPLICA.replace("N)", f"{sessions})")],
        cwd=REPO,
        env={**os.environ, **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def settings(tmp_path: Path, **keys: object) -> dict[str, str]:
    env = {f"TOOLFACTORY__SANDBOX__{k.upper()}": str(v) for k, v in keys.items()}
    return {**env, "TOOLFACTORY__SANDBOX__CLAIMS_DIR": str(tmp_path / "claims")}


@pytest.mark.skipif(os.geteuid() != 0, reason="workers get uids of their own only as root")
def test_two_replicas_of_one_node_hand_out_disjoint_uids(tmp_path: Path) -> None:
    first = replica(settings(tmp_path, uid_range="300000-300009", replicas=2, replica_index=0))
    second = replica(settings(tmp_path, uid_range="300000-300009", replicas=2, replica_index=1))
    uids = []
    try:
        for proc in (first, second):
            assert proc.stdout is not None
            assert proc.stdout.readline() == "claimed\n", proc.communicate(timeout=60)
            line = proc.stdout.readline()
            assert line.startswith("["), proc.communicate(timeout=60)
            uids.append(ast.literal_eval(line))
    finally:
        for proc in (first, second):
            proc.communicate("\n", timeout=60)
    for seen in uids:
        assert all(given == inside for given, inside in seen), seen  # the uid the worker really runs as
    first_uids, second_uids = ({given for given, _ in seen} for seen in uids)
    # Four sessions each, in slices of five uids that do not meet.
    assert len(first_uids) == len(second_uids) == 4
    assert first_uids <= set(range(300000, 300005)) and second_uids <= set(range(300005, 300010))


@pytest.mark.skipif(os.geteuid() != 0, reason="workers get uids of their own only as root")
def test_replicas_started_at_once_pick_free_slices_of_their_own(tmp_path: Path) -> None:
    """Pods of a Deployment have no index: each takes the first slice no live server has claimed
    (``replica_index: null``); started at the same moment, they still end up apart."""
    env = settings(tmp_path, uid_range="300100-300129", replicas=3, replica_index="")
    procs = [replica(env, sessions=2) for _ in range(3)]
    uids = []
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "claimed\n", proc.communicate(timeout=60)
            uids.append({given for given, _ in ast.literal_eval(proc.stdout.readline())})
        slices = sorted(min(seen) // 10 for seen in uids)
        assert slices == [30010, 30011, 30012], uids  # one slice of ten uids each
        assert all(len({uid // 10 for uid in seen}) == 1 for seen in uids), uids
        fourth = replica(env, sessions=0)
        _, err = fourth.communicate(timeout=60)
        assert "all 3 sandbox uid slices of 300100-300129 are claimed" in err, err
    finally:
        for proc in procs:
            proc.communicate("\n", timeout=60)


def test_a_range_overlapping_a_live_replicas_claim_is_refused(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    holder = replica(settings(tmp_path, uid_range="400000-400999"), sessions=0)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "claimed\n", holder.communicate()
        overlapping = load_config(environ=settings(tmp_path, uid_range="400500-401499"))
        with pytest.raises(
            ConfigError, match=r"400500-401499 overlaps 400000-400999, claimed by another server"
        ):
            configure_sandbox(overlapping)
        beside = UidClaim(range(401000, 402000), str(claims))  # the next range is free
        beside.release()
    finally:
        holder.communicate("\n", timeout=60)


def test_the_claim_of_a_dead_replica_is_taken_over(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    dead = replica(settings(tmp_path, uid_range="500000-500999"), sessions=0)
    assert dead.stdout is not None and dead.stdout.readline() == "claimed\n", dead.communicate()
    os.kill(dead.pid, signal.SIGKILL)
    dead.communicate(timeout=60)
    [stale] = os.listdir(claims)
    claim = UidClaim(range(500000, 501000), str(claims))  # SIGKILLed: no cleanup ran, its lock went
    try:
        assert os.listdir(claims) == [os.path.basename(claim.path)] and stale != os.path.basename(claim.path)
    finally:
        claim.release()
    assert os.listdir(claims) == []


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"uid_range": "1000-2000"}, "must lie within 65536-"),
        ({"uid_range": "300000-abc"}, "expected FIRST-LAST"),
        ({"uid_range": "300010-300000"}, "empty"),
        ({"replicas": 2, "replica_index": 2}, "expected 0 <= index < replicas"),
        ({"uid_range": "300000-300002", "replicas": 4}, "too small for 4 replicas"),
        ({"replica_index": ""}, "needs sandbox.claims_dir"),
    ],
)
def test_an_invalid_uid_range_is_a_clear_config_error(keys: dict[str, object], message: str) -> None:
    env = {f"TOOLFACTORY__SANDBOX__{k.upper()}": str(v) for k, v in keys.items()}
    with pytest.raises(ConfigError, match=message):
        load_config(environ=env)
