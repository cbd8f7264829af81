"""A session's world: copy-on-write over a shared base vs a deep copy of the database.

A synthetic airline database shaped like τ²-bench's (users with payment methods and
saved passengers, flights with per-date seat counts and prices, reservations with
passengers and flight legs; ~7 MB as JSON) is served to many sessions two ways:

(a) ``Pack.new_world()``: a copy-on-write ``World`` (a session copies what it touches);
(b) ``copy.deepcopy`` of the whole database per session (what an environment without
    copy-on-write does).

Each session is a typical trajectory: look a user up, read one of their reservations
and its two flights, add a bag to the reservation, record a payment. Measured side by
side in one run: microseconds per session (creation + calls), and the memory each live
session holds (tracemalloc, with ``--sessions`` live CoW sessions; the deep copies are
measured on ``--copies`` live ones, since 1,000 of them would need ~70 GB). Target: a
CoW session costs at most 5 % of a full copy, in time and in memory. Figures in
bench/README.md.

    .venv/bin/python bench/environments/world_copy.py [--sessions 1000] [--copies 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import random
import time
import tracemalloc
from typing import Any

from tools.envs.pack import EnvTool, Pack, PackInfo

CABINS = ("basic_economy", "economy", "business")
AIRPORTS = ("JFK", "LAX", "SFO", "ORD", "ATL", "SEA", "BOS", "MIA", "DEN", "PHX", "IAH", "DFW")


def airline_db(
    seed: int, users: int = 1000, flights: int = 650, days: int = 30, reservations: int = 4400
) -> dict:
    """Tables of plain dicts, τ²-airline-like, about 7 MB as JSON with the defaults."""
    rng = random.Random(seed)
    flight_ids = [f"HAT{n:03d}" for n in range(flights)]
    flight_table = {
        fid: {
            "flight_number": fid,
            "origin": rng.choice(AIRPORTS),
            "destination": rng.choice(AIRPORTS),
            "scheduled_departure_time_est": f"{rng.randrange(24):02d}:00:00",
            "scheduled_arrival_time_est": f"{rng.randrange(24):02d}:30:00",
            "dates": {
                f"2024-05-{day + 1:02d}": {
                    "status": "available",
                    "available_seats": {c: rng.randrange(0, 30) for c in CABINS},
                    "prices": {c: rng.randrange(50, 2000) for c in CABINS},
                }
                for day in range(days)
            },
        }
        for fid in flight_ids
    }
    user_ids = [f"user_{n:05d}" for n in range(users)]
    reservation_table: dict[str, Any] = {}
    owned: dict[str, list[str]] = {uid: [] for uid in user_ids}
    for n in range(reservations):
        rid = f"R{n:06d}"
        uid = rng.choice(user_ids)
        owned[uid].append(rid)
        legs = rng.sample(flight_ids, 2)
        reservation_table[rid] = {
            "reservation_id": rid,
            "user_id": uid,
            "origin": flight_table[legs[0]]["origin"],
            "destination": flight_table[legs[1]]["destination"],
            "flight_type": "round_trip",
            "cabin": rng.choice(CABINS),
            "flights": [
                {
                    "flight_number": f,
                    "date": f"2024-05-{rng.randrange(1, days + 1):02d}",
                    "price": rng.randrange(50, 900),
                }
                for f in legs
            ],
            "passengers": [
                {
                    "first_name": f"First{rng.randrange(999)}",
                    "last_name": f"Last{rng.randrange(999)}",
                    "dob": "1990-01-01",
                }
                for _ in range(rng.randrange(1, 4))
            ],
            "payment_history": [
                {"payment_id": f"credit_card_{rng.randrange(10**6)}", "amount": rng.randrange(100, 3000)}
            ],
            "created_at": "2024-05-01T10:00:00",
            "total_baggages": rng.randrange(0, 3),
            "nonfree_baggages": 0,
            "insurance": rng.choice(("yes", "no")),
        }
    user_table = {
        uid: {
            "user_id": uid,
            "name": {"first_name": f"First{n}", "last_name": f"Last{n}"},
            "address": {
                "address1": f"{n} Main St",
                "city": "Austin",
                "country": "USA",
                "state": "TX",
                "zip": "78701",
            },
            "email": f"{uid}@example.com",
            "dob": "1985-03-03",
            "payment_methods": {
                f"credit_card_{n}": {
                    "source": "credit_card",
                    "brand": "visa",
                    "last_four": f"{n % 10000:04d}",
                },
                f"gift_card_{n}": {"source": "gift_card", "amount": rng.randrange(0, 500)},
            },
            "saved_passengers": [{"first_name": f"Kid{n}", "last_name": f"Last{n}", "dob": "2015-01-01"}],
            "membership": rng.choice(("regular", "silver", "gold")),
            "reservations": owned[uid],
        }
        for n, uid in enumerate(user_ids)
    }
    return {"users": user_table, "flights": flight_table, "reservations": reservation_table}


# The tools of a typical trajectory (they only index, read and assign: a plain dict works too).
def get_user(world: Any, user_id: str) -> dict:
    return world["users"][user_id]


def get_reservation(world: Any, reservation_id: str) -> dict:
    return world["reservations"][reservation_id]


def get_flight(world: Any, flight_number: str) -> dict:
    return world["flights"][flight_number]


def add_bag(world: Any, reservation_id: str, payment_id: str) -> dict:
    reservation = world["reservations"][reservation_id]
    reservation["total_baggages"] += 1
    reservation["nonfree_baggages"] += 1
    reservation["payment_history"].append({"payment_id": payment_id, "amount": 50})
    return reservation


def session(world: Any, user_id: str) -> None:
    user = get_user(world, user_id)
    reservation_id = user["reservations"][0]
    reservation = get_reservation(world, reservation_id)
    for leg in reservation["flights"]:
        get_flight(world, leg["flight_number"])
    add_bag(world, reservation_id, next(iter(user["payment_methods"])))


def _tools() -> list[EnvTool]:
    schema = {"type": "object"}
    return [
        EnvTool(f.__name__, f.__name__, schema, f) for f in (get_user, get_reservation, get_flight, add_bag)
    ]


def _users(db: dict, count: int, seed: int) -> list[str]:
    with_reservations = [uid for uid, u in db["users"].items() if u["reservations"]]
    rng = random.Random(seed)
    return [rng.choice(with_reservations) for _ in range(count)]


def _timed(make: Any, users: list[str]) -> tuple[float, list[Any]]:
    """µs per session (creation + the trajectory) and the live worlds."""
    gc.collect()
    start = time.perf_counter()
    worlds = []
    for user_id in users:
        world = make()
        session(world, user_id)
        worlds.append(world)
    return (time.perf_counter() - start) / len(users) * 1e6, worlds


def _held(make: Any, users: list[str]) -> float:
    """Bytes each live session holds (tracemalloc: what stays allocated while they live)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    worlds = []
    for user_id in users:
        world = make()
        session(world, user_id)
        worlds.append(world)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del worlds
    return held / len(users)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sessions", type=int, default=1000, help="live copy-on-write sessions (default 1000)"
    )
    parser.add_argument("--copies", type=int, default=8, help="live deep-copied sessions (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    db = airline_db(args.seed)
    records = sum(len(t) for t in db.values())
    size_mb = len(json.dumps(db)) / 1e6
    pack = Pack(PackInfo("airline_synthetic"), _tools(), db)
    cow_users = _users(db, args.sessions, args.seed)
    copy_users = cow_users[: args.copies]

    cow_us, cow_worlds = _timed(pack.new_world, cow_users)
    touched = sum(len(w.touched()) for w in cow_worlds) / len(cow_worlds)
    del cow_worlds
    copy_us, copies = _timed(lambda: copy.deepcopy(db), copy_users)
    del copies
    cow_bytes = _held(pack.new_world, cow_users)
    copy_bytes = _held(lambda: copy.deepcopy(db), copy_users)

    start = time.perf_counter()
    for _ in range(10_000):
        pack.new_world()
    creation_us = (time.perf_counter() - start) / 10_000 * 1e6

    print(
        f"database: {records:,} records, {size_mb:.1f} MB as JSON; typical session touches {touched:.0f} records"
    )
    print()
    print("| per session | (a) copy-on-write | (b) deep copy | a/b |")
    print("|---|---:|---:|---:|")
    print(f"| time: create + trajectory (µs) | {cow_us:,.0f} | {copy_us:,.0f} | {cow_us / copy_us:.3%} |")
    print(
        f"| memory held while live (KiB) | {cow_bytes / 1024:,.1f} | {copy_bytes / 1024:,.0f} | {cow_bytes / copy_bytes:.3%} |"
    )
    print(f"| create an empty world (µs) | {creation_us:.1f} | — | — |")
    print()
    total_cow = cow_bytes * args.sessions / 2**20
    total_copy = copy_bytes * args.sessions / 2**30
    print(
        f"{args.sessions:,} live sessions: (a) {total_cow:,.1f} MiB measured; (b) would hold {total_copy:,.1f} GiB "
        f"({args.copies} measured)"
    )
    ok = cow_us / copy_us <= 0.05 and cow_bytes / copy_bytes <= 0.05
    print(f"target (a) ≤ 5 % of (b) per session, time and memory: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
