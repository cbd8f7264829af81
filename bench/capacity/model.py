"""Capacity model: how many tool-server replicas for N concurrent trajectories.

Pure functions over measured per-replica figures (``bench/capacity/plan.py`` measures them,
``docs/scaling.md`` explains the plan). A replica is one ``tool-server serve`` process with
``cores`` and ``ram_mb``; six resources can bind, and the plan takes the largest need:

* **cpu**: calls/s x server CPU per call must stay under ``cores x utilisation``. A call
  costs its kind's CPU, plus its share of the requests that carry it: the batch POST
  (``post_cpu_us / calls_per_post``), the split POSTs the client adds when one slow call
  holds a batch back (``split_share``), and the session release at the trajectory's end, plus the session's
  start spread over the trajectory's calls;
* **memory**: the replica's own footprint plus every live session's memory under
  ``ram_mb x utilisation``;
* **sandbox**: a trajectory that uses the python tool holds one interpreter for its whole
  life, and a replica has at most ``max_workers`` of them (past it idle sessions are
  evicted and lose their variables, so this is a hard cap, not a slowdown);
* **sessions**: every stateful session counts against ``max_sessions``;
* **slots**: calls running at once (Little's law: rate x wall time) under ``max_concurrency``;
* **connections**: each client process keeps up to ``client_pool`` connections spread over
  the replicas; the sum must stay under ``max_connections``.

The trainer's side has a cost too (``ClientCost``: the client's CPU per POST and per call),
which matters where trainer processes share nodes (or, in the loopback simulation, cores)
with replicas; ``calls_per_post`` predicts how many calls the client's batcher puts in one
POST at a given rate.

Nothing here reads a clock or a file: the bench and the docs call these functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ClientCost",
    "Plan",
    "ReplicaSpec",
    "ToolKind",
    "Workload",
    "calls_per_post",
    "calls_per_s_per_trajectory",
    "plan",
]

RESOURCES = ("cpu", "memory", "sandbox", "sessions", "slots", "connections")


@dataclass(frozen=True)
class ToolKind:
    """What one kind of tool costs a replica.

    Attributes:
        cpu_us: server CPU per call (µs; for the python tool, server plus its worker).
        session_mb: memory one live session of this kind holds (0: stateless).
        session_start_cpu_us: CPU to open a session (a world, a forked interpreter),
            spread over the trajectory's calls of this kind.
        wall_s: how long a call holds a concurrency slot (its latency at the server).
        sandbox: each session holds one sandbox interpreter (counts against ``max_workers``).
    """

    cpu_us: float
    session_mb: float = 0.0
    session_start_cpu_us: float = 0.0
    wall_s: float = 0.0
    sandbox: bool = False

    def __post_init__(self) -> None:
        for name in ("cpu_us", "session_mb", "session_start_cpu_us", "wall_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"ToolKind.{name} must be >= 0, got {getattr(self, name)}")

    @property
    def stateful(self) -> bool:
        return self.session_mb > 0 or self.sandbox or self.session_start_cpu_us > 0


@dataclass(frozen=True)
class Workload:
    """The trainer's side: how many trajectories, how often they call, which tools.

    Attributes:
        trajectories: N, trajectories in flight at once.
        calls_per_s: tool calls per second of one trajectory (``calls_per_s_per_trajectory``).
        mix: share of calls by tool kind (names of ``kinds``); normalised to sum 1.
        calls_per_trajectory: calls one trajectory makes in all (spreads session starts).
        client_processes: trainer processes, each with its own ``ToolClient``.
        calls_per_post: calls the client coalesces into one POST (1 = no coalescing;
            ``calls_per_post()`` estimates it from the rate).
        split_share: extra single-call POSTs per call: the client re-sends each call of a
            small batch still unanswered after ``split_after_ms`` (50 ms) on its own POST
            (the server joins the running call), only where one slow call holds a batch back
            (``trainer_client.client.splits``). 0 while batches come back fast and on a
            replica slow as a whole (overloaded, or every call slow); about the share of
            calls that share a batch with a slow one otherwise.
    """

    trajectories: int
    calls_per_s: float
    mix: Mapping[str, float]
    calls_per_trajectory: float = 10.0
    client_processes: int = 1
    calls_per_post: float = 16.0
    split_share: float = 0.0

    def __post_init__(self) -> None:
        if self.trajectories < 0 or self.calls_per_s < 0 or self.split_share < 0:
            raise ValueError("trajectories, calls_per_s and split_share must be >= 0")
        if not self.mix or any(v < 0 for v in self.mix.values()) or sum(self.mix.values()) <= 0:
            raise ValueError(f"mix must give each tool kind a share >= 0, summing above 0: {dict(self.mix)}")
        if self.calls_per_trajectory < 1 or self.calls_per_post < 1 or self.client_processes < 1:
            raise ValueError("calls_per_trajectory, calls_per_post and client_processes must be >= 1")

    def shares(self) -> dict[str, float]:
        total = sum(self.mix.values())
        return {name: value / total for name, value in self.mix.items()}

    @property
    def offered_calls_per_s(self) -> float:
        return self.trajectories * self.calls_per_s


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica's resources and the server's limits (defaults: the shipped config)."""

    cores: float = 2.0
    ram_mb: float = 4096.0
    base_mb: float = 200.0  # the server's own RSS with its tools loaded (indexes, packs)
    store_mb: float = 384.0  # idempotency store + result cache budgets (256 + 128 MiB)
    post_cpu_us: float = 40.0  # server CPU per POST beyond its calls (HTTP, JSON framing)
    release_cpu_us: float = 40.0  # server CPU of one session release (DELETE) request
    # extra CPU of a request that finds the replica idle (its event loop, and the worker
    # thread of a blocking tool, wake up for it); fades out as the replica gets busy
    wake_cpu_us: float = 0.0
    max_workers: int = 64  # python tool's sandbox fleet
    max_sessions: int = 10_000
    max_concurrency: int = 512
    max_connections: int = 8192
    client_pool: int = 256  # ToolClient's max_connections, shared by all replicas
    utilisation: float = 0.7  # headroom target for CPU, memory and every cap

    def __post_init__(self) -> None:
        if self.cores <= 0 or self.ram_mb <= 0:
            raise ValueError("cores and ram_mb must be > 0")
        if not 0 < self.utilisation <= 1:
            raise ValueError(f"utilisation must be in (0, 1], got {self.utilisation}")
        if self.base_mb + self.store_mb >= self.ram_mb * self.utilisation:
            raise ValueError(
                f"base_mb + store_mb ({self.base_mb + self.store_mb:.0f}) leave no room in "
                f"{self.utilisation:.0%} of ram_mb ({self.ram_mb:.0f})"
            )
        if min(self.post_cpu_us, self.release_cpu_us, self.wake_cpu_us) < 0:
            raise ValueError("post_cpu_us, release_cpu_us and wake_cpu_us must be >= 0")
        for name in ("max_workers", "max_sessions", "max_concurrency", "max_connections", "client_pool"):
            if getattr(self, name) < 1:
                raise ValueError(f"ReplicaSpec.{name} must be >= 1")


@dataclass(frozen=True)
class Plan:
    """The answer: replicas needed, which resource binds, and each resource's need."""

    replicas: int
    binding: str
    needs: dict[str, float] = field(default_factory=dict)  # resource -> replicas it alone needs
    cpu_us_per_call: float = 0.0  # mix-weighted, with POST overhead and session starts
    session_mb_per_trajectory: float = 0.0
    capacity_calls_per_s: float = 0.0  # per replica, CPU only, at the utilisation target
    client_cores: float = 0.0  # the trainer processes' CPU for their clients (with a ClientCost)

    def per_replica(self, workload: Workload) -> dict[str, float]:
        """What each replica carries at this plan (calls/s, trajectories)."""
        r = max(1, self.replicas)
        return {"calls_per_s": workload.offered_calls_per_s / r, "trajectories": workload.trajectories / r}


@dataclass(frozen=True)
class ClientCost:
    """The trainer's ``ToolClient`` CPU: per POST it sends (httpx, JSON) and per call."""

    post_cpu_us: float
    call_cpu_us: float

    def __post_init__(self) -> None:
        if self.post_cpu_us < 0 or self.call_cpu_us < 0:
            raise ValueError("ClientCost figures must be >= 0")

    def per_call_us(self, workload: Workload) -> float:
        """Client CPU per call at the workload's batch size and split share."""
        return self.call_cpu_us + self.post_cpu_us * (1 / workload.calls_per_post + workload.split_share)


def calls_per_post(calls_per_s: float, window_s: float = 0.002, max_batch: int = 256) -> float:
    """Calls per POST the client's batcher makes for one replica at ``calls_per_s``.

    ``calls_per_s`` is what one client process sends to one replica. Under load the first
    call of a batch waits ``window_s`` for company (``BatchPolicy.window_ms``), so a POST
    carries that call and those arriving in the window; an idle client sends at once
    (about one call). A busy client's event loop stretches the window (its lag adds to
    ``window_s``): pass the lag in when the client is CPU-bound.
    """
    if calls_per_s < 0 or window_s < 0 or max_batch < 1:
        raise ValueError("calls_per_s and window_s must be >= 0, max_batch >= 1")
    return min(float(max_batch), 1.0 + calls_per_s * window_s)


def calls_per_s_per_trajectory(
    tokens_per_turn: float, decode_tokens_per_s: float, calls_per_turn: float = 1.0, tool_s: float = 0.0
) -> float:
    """A trajectory's call rate from the trainer's figures.

    One turn is the model generating ``tokens_per_turn`` at ``decode_tokens_per_s`` (per
    sequence, at the engine's batch size: vLLM's throughput divided by running sequences),
    then ``calls_per_turn`` tool calls taking ``tool_s``.
    """
    if tokens_per_turn <= 0 or decode_tokens_per_s <= 0 or calls_per_turn < 0 or tool_s < 0:
        raise ValueError("tokens_per_turn and decode_tokens_per_s must be > 0; the rest >= 0")
    return calls_per_turn / (tokens_per_turn / decode_tokens_per_s + tool_s)


def plan(
    workload: Workload,
    kinds: Mapping[str, ToolKind],
    replica: ReplicaSpec,
    client: ClientCost | None = None,
    busy: float | None = None,
) -> Plan:
    """Replicas needed for ``workload`` with tool costs ``kinds`` on replicas like ``replica``.

    A trajectory holds one session of every stateful kind in its mix for its whole life
    (a world, an interpreter) and releases them at its end (one request). Each resource's
    need is computed alone; the plan is the largest, rounded up, and at least one replica.
    With ``client``, the plan also says how many cores the trainers' clients spend.
    ``busy`` is the share of time a replica's event loop is busy, which decides how many
    requests pay ``wake_cpu_us``; default: the utilisation target (the plan's operating point).
    """
    shares = workload.shares()
    unknown = sorted(set(shares) - set(kinds))
    if unknown:
        raise ValueError(f"mix names tool kinds with no figures: {', '.join(unknown)}")
    used = {name: kinds[name] for name, share in shares.items() if share > 0}
    u = replica.utilisation
    rate = workload.offered_calls_per_s
    n = workload.trajectories

    cpu_us = sum(
        shares[name] * (kind.cpu_us + kind.session_start_cpu_us / workload.calls_per_trajectory)
        for name, kind in used.items()
    )
    # every call's share of the requests that carry it: its batch POST, a split POST, and
    # (for a trajectory with sessions) the release at its end
    stateful = sum(1 for kind in used.values() if kind.stateful)
    releases = min(1, stateful) / workload.calls_per_trajectory
    posts = 1 / workload.calls_per_post + workload.split_share
    cpu_us += replica.post_cpu_us * posts + replica.release_cpu_us * releases
    idle = 1 - min(1.0, max(0.0, u if busy is None else busy))
    cpu_us += replica.wake_cpu_us * idle * (posts + releases)
    session_mb = sum(kind.session_mb for kind in used.values())
    sandboxes = sum(1 for kind in used.values() if kind.sandbox)
    running = rate * sum(shares[name] * kind.wall_s for name, kind in used.items())

    room_mb = replica.ram_mb * u - replica.base_mb - replica.store_mb
    needs = {
        "cpu": rate * cpu_us / 1e6 / (replica.cores * u),
        "memory": n * session_mb / room_mb,
        "sandbox": n * sandboxes / (replica.max_workers * u),
        "sessions": n * stateful / (replica.max_sessions * u),
        "slots": running / (replica.max_concurrency * u),
        "connections": workload.client_processes * replica.client_pool / (replica.max_connections * u),
    }
    # Each client spreads its pool over the replicas, so the fleet holds at most
    # client_processes x client_pool connections whatever N is: coalescing decouples
    # connections from trajectories.
    binding = max(RESOURCES, key=lambda r: needs[r])
    replicas = max(1, math.ceil(needs[binding] - 1e-9))
    capacity = replica.cores * u * 1e6 / cpu_us if cpu_us > 0 else math.inf
    client_cores = rate * client.per_call_us(workload) / 1e6 if client is not None else 0.0
    return Plan(replicas, binding, needs, cpu_us, session_mb, capacity, client_cores)
