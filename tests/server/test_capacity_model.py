"""The capacity model (bench/capacity/model.py): each resource binds where it should."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from bench.capacity.model import (
    ClientCost,
    Plan,
    ReplicaSpec,
    ToolKind,
    Workload,
    calls_per_post,
    calls_per_s_per_trajectory,
    plan,
)
from bench.capacity.plan import calc_call, cpu_per_request, fit_request_cost
from tests.support.server import running_server, server_config

KINDS = {
    "calc": ToolKind(cpu_us=10.0),
    "env": ToolKind(cpu_us=50.0, session_mb=0.04, session_start_cpu_us=30.0),
    "python": ToolKind(cpu_us=300.0, session_mb=2.5, session_start_cpu_us=5000.0, sandbox=True),
    "slow": ToolKind(cpu_us=5.0, wall_s=2.0),
}
REPLICA = ReplicaSpec(
    cores=8,
    ram_mb=32_768,
    base_mb=300,
    store_mb=384,
    max_workers=16_384,
    max_sessions=100_000,
    utilisation=0.7,
)


def test_cpu_binds_for_a_busy_stateless_mix_and_matches_the_hand_computed_figure() -> None:
    work = Workload(trajectories=100_000, calls_per_s=1.0, mix={"calc": 1.0}, calls_per_post=40)
    result = plan(work, KINDS, REPLICA)
    per_call = 10.0 + REPLICA.post_cpu_us / 40  # 11 µs
    need = 100_000 * per_call / 1e6 / (8 * 0.7)
    assert result.binding == "cpu"
    assert result.cpu_us_per_call == pytest.approx(per_call)
    assert result.needs["cpu"] == pytest.approx(need)
    assert result.replicas == math.ceil(need)
    assert result.capacity_calls_per_s == pytest.approx(8 * 0.7 * 1e6 / per_call)


def test_memory_binds_for_sandbox_sessions_and_the_sandbox_cap_binds_when_it_is_small() -> None:
    work = Workload(trajectories=65_536, calls_per_s=0.1, mix={"python": 1.0})
    roomy = plan(work, KINDS, REPLICA)
    room_mb = 32_768 * 0.7 - 300 - 384
    assert roomy.binding == "memory"
    assert roomy.needs["memory"] == pytest.approx(65_536 * 2.5 / room_mb)
    capped = plan(work, KINDS, ReplicaSpec(cores=8, ram_mb=32_768, max_workers=64))
    assert capped.binding == "sandbox"
    assert capped.replicas == math.ceil(65_536 / (64 * 0.7))


def test_a_trajectory_holds_one_session_per_stateful_kind_and_stateless_kinds_hold_none() -> None:
    mixed = plan(Workload(1000, 0.1, {"env": 0.5, "python": 0.5}), KINDS, REPLICA)
    assert mixed.session_mb_per_trajectory == pytest.approx(2.54)
    stateless = plan(Workload(1000, 0.1, {"calc": 1.0}), KINDS, REPLICA)
    assert stateless.session_mb_per_trajectory == 0
    assert stateless.needs["memory"] == 0 and stateless.needs["sessions"] == 0


def test_session_starts_are_spread_over_the_trajectory_calls() -> None:
    short = plan(
        Workload(1000, 1.0, {"python": 1.0}, calls_per_trajectory=1, calls_per_post=1e9), KINDS, REPLICA
    )
    long = plan(
        Workload(1000, 1.0, {"python": 1.0}, calls_per_trajectory=100, calls_per_post=1e9), KINDS, REPLICA
    )
    release = REPLICA.release_cpu_us  # one DELETE at the trajectory's end, spread the same way
    assert short.cpu_us_per_call == pytest.approx(300 + 5000 + release, rel=1e-6)
    assert long.cpu_us_per_call == pytest.approx(300 + 50 + release / 100, rel=1e-6)


def test_every_request_a_call_rides_on_is_counted_batch_split_and_release() -> None:
    spec = ReplicaSpec(cores=8, ram_mb=32_768, post_cpu_us=200.0, release_cpu_us=150.0)
    batched = plan(Workload(1000, 1.0, {"env": 1.0}, calls_per_post=8), KINDS, spec)
    alone = plan(Workload(1000, 1.0, {"env": 1.0}, calls_per_post=1), KINDS, spec)
    split = plan(Workload(1000, 1.0, {"env": 1.0}, calls_per_post=8, split_share=1.0), KINDS, spec)
    stateless = plan(Workload(1000, 1.0, {"calc": 1.0}, calls_per_post=8), KINDS, spec)
    env_call = 50.0 + 30.0 / 10 + 150.0 / 10  # its work, its session's start and release over 10 calls
    assert batched.cpu_us_per_call == pytest.approx(env_call + 200 / 8)
    assert alone.cpu_us_per_call == pytest.approx(env_call + 200)
    assert split.cpu_us_per_call == pytest.approx(env_call + 200 / 8 + 200)  # a second POST per call
    assert stateless.cpu_us_per_call == pytest.approx(10.0 + 200 / 8)  # no session, no release


def test_requests_to_an_idle_replica_pay_the_wake_up_and_a_busy_one_does_not() -> None:
    spec = ReplicaSpec(cores=8, ram_mb=32_768, post_cpu_us=100.0, wake_cpu_us=300.0, utilisation=0.7)
    work = Workload(1000, 1.0, {"calc": 1.0}, calls_per_post=2)
    assert plan(work, KINDS, spec, busy=0.0).cpu_us_per_call == pytest.approx(10 + (100 + 300) / 2)
    assert plan(work, KINDS, spec, busy=1.0).cpu_us_per_call == pytest.approx(10 + 100 / 2)
    at_target = plan(work, KINDS, spec).cpu_us_per_call  # the default: busy at the utilisation target
    assert at_target == pytest.approx(10 + (100 + 300 * 0.3) / 2)


def test_client_cost_counts_posts_and_calls_and_scales_with_the_rate() -> None:
    client = ClientCost(post_cpu_us=300.0, call_cpu_us=20.0)
    work = Workload(10_000, 0.5, {"calc": 1.0}, calls_per_post=4, split_share=0.5)
    assert client.per_call_us(work) == pytest.approx(20 + 300 * (1 / 4 + 0.5))
    result = plan(work, KINDS, REPLICA, client)
    assert result.client_cores == pytest.approx(5000 * client.per_call_us(work) / 1e6)
    assert plan(work, KINDS, REPLICA).client_cores == 0


def test_calls_per_post_grows_with_the_rate_and_stops_at_max_batch() -> None:
    assert calls_per_post(0) == 1.0  # an idle client sends each call at once
    assert calls_per_post(500, window_s=0.002) == pytest.approx(2.0)
    assert calls_per_post(500, window_s=0.012) == pytest.approx(7.0)  # a lagging loop batches more
    assert calls_per_post(1e9, max_batch=256) == 256


def test_slots_bind_for_slow_calls_by_littles_law() -> None:
    result = plan(Workload(10_000, 1.0, {"slow": 1.0}), KINDS, REPLICA)  # 20,000 calls running
    assert result.binding == "slots"
    assert result.needs["slots"] == pytest.approx(20_000 / (512 * 0.7))


def test_connections_follow_client_processes_not_trajectories() -> None:
    few = plan(Workload(65_536, 0.01, {"calc": 1.0}, client_processes=8), KINDS, REPLICA)
    many = plan(Workload(65_536, 0.01, {"calc": 1.0}, client_processes=256), KINDS, REPLICA)
    assert few.needs["connections"] == pytest.approx(8 * 256 / (8192 * 0.7))
    assert many.binding == "connections" and many.replicas == math.ceil(256 * 256 / (8192 * 0.7))


def test_at_least_one_replica_and_mix_is_normalised() -> None:
    idle = plan(Workload(0, 0.0, {"calc": 2.0}), KINDS, REPLICA)
    assert idle.replicas == 1
    halves = plan(Workload(100, 1.0, {"calc": 3.0, "env": 3.0}), KINDS, REPLICA)
    quarter = plan(Workload(100, 1.0, {"calc": 0.5, "env": 0.5}), KINDS, REPLICA)
    assert halves.cpu_us_per_call == pytest.approx(quarter.cpu_us_per_call)
    assert isinstance(halves.per_replica(Workload(100, 1.0, {"calc": 1.0})), dict)
    assert Plan(3, "cpu").per_replica(Workload(300, 2.0, {"calc": 1.0})) == {
        "calls_per_s": 200.0,
        "trajectories": 100.0,
    }


def test_call_rate_from_generation_figures() -> None:
    # 300 tokens at 30 tokens/s per sequence = 10 s, plus a 0.5 s tool: one call per 10.5 s
    assert calls_per_s_per_trajectory(300, 30, 1, 0.5) == pytest.approx(1 / 10.5)
    assert calls_per_s_per_trajectory(300, 30, 2) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: plan(Workload(10, 1.0, {"nope": 1.0}), KINDS, REPLICA), "no figures: nope"),
        (lambda: Workload(10, 1.0, {}), "mix must"),
        (lambda: Workload(10, 1.0, {"calc": -1.0}), "mix must"),
        (lambda: Workload(-1, 1.0, {"calc": 1.0}), "must be >= 0"),
        (lambda: ToolKind(cpu_us=-1), "cpu_us must be >= 0"),
        (lambda: ReplicaSpec(utilisation=1.5), "utilisation"),
        (lambda: ReplicaSpec(ram_mb=512), "leave no room"),
        (lambda: ReplicaSpec(max_workers=0), "max_workers"),
        (lambda: calls_per_s_per_trajectory(0, 30), "tokens_per_turn"),
        (lambda: Workload(10, 1.0, {"calc": 1.0}, split_share=-0.5), "split_share"),
        (lambda: ReplicaSpec(release_cpu_us=-1), "release_cpu_us"),
        (lambda: ReplicaSpec(wake_cpu_us=-1), "wake_cpu_us"),
        (lambda: ClientCost(-1, 0), "ClientCost"),
        (lambda: calls_per_post(-1), "calls_per_s"),
    ],
)
def test_bad_inputs_say_what_is_wrong(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def _counter(metrics: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name))


def test_the_bench_measures_new_calls_never_a_replay_or_a_cache_hit() -> None:
    # An earlier bench re-sent the same call_ids in every repeat and kept the best: it
    # measured the idempotency store (~6 µs a call), not the tools, and the model was 17-23x
    # too optimistic. Every call it sends must run.
    with running_server(server_config()) as server:
        for _ in range(2):
            asyncio.run(cpu_per_request(server.url, server.proc.pid, calc_call, 6, 8))
        metrics = httpx.get(server.url + "/metrics").text
    assert "toolfactory_idempotent_replays_total " in metrics  # the counter exists (a replay adds 1)
    assert _counter(metrics, "toolfactory_idempotent_replays_total") == 0
    assert _counter(metrics, "toolfactory_cache_hits_total") == 0
    assert _counter(metrics, 'toolfactory_calls_total{outcome="ok",tool="calculator"}') == 2 * 6 * 8


def test_request_cost_fit_recovers_a_fixed_part_and_a_per_call_part() -> None:
    fixed, per_call = fit_request_cost({1: 150.0, 8: 360.0, 64: 2040.0})  # 120 + 30 x batch
    assert fixed == pytest.approx(120.0)
    assert per_call == pytest.approx(30.0)
