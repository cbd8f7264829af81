"""TTLStore: the idempotency store and the result cache."""

from __future__ import annotations

import time

import pytest

from tool_server.stores import TTLStore


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def test_get_returns_what_was_put_until_it_expires(clock: list[float]) -> None:
    store: TTLStore[str, int] = TTLStore(max_entries=10, ttl_s=5)
    store.put("a", 1)
    assert store.get("a") == 1 and store.get("b") is None
    clock[0] += 4.9
    assert store.get("a") == 1
    clock[0] += 0.2
    assert store.get("a") is None and len(store) == 0


def test_oldest_entries_go_first_when_full(clock: list[float]) -> None:
    store: TTLStore[int, int] = TTLStore(max_entries=3, ttl_s=60)
    for i in range(5):
        store.put(i, i * 10)
        clock[0] += 1
    assert [store.get(i) for i in range(5)] == [None, None, 20, 30, 40]
    assert len(store) == 3


def test_put_again_refreshes_the_expiry_and_keeps_the_entry(clock: list[float]) -> None:
    store: TTLStore[str, str] = TTLStore(max_entries=10, ttl_s=5)
    store.put("a", "old")
    clock[0] += 4
    store.put("a", "new")
    clock[0] += 3  # the first put has expired, the second has not
    store.put("b", "x")  # a put evicts expired records: only the stale one of "a" goes
    assert store.get("a") == "new" and store.get("b") == "x"


def test_expired_entries_are_dropped_by_later_puts(clock: list[float]) -> None:
    store: TTLStore[int, int] = TTLStore(max_entries=1000, ttl_s=1)
    for i in range(100):
        store.put(i, i)
    clock[0] += 2
    store.put(-1, -1)
    assert len(store) == 1  # memory does not wait for a get of each expired key


def test_total_size_is_bounded_and_the_oldest_go_first(clock: list[float]) -> None:
    store: TTLStore[int, str] = TTLStore(max_entries=1000, ttl_s=60, max_bytes=1000)
    for i in range(10):
        store.put(i, "x", size=300)
        clock[0] += 1
    assert store.bytes <= 1000 and len(store) == 3
    assert [store.get(i) for i in (6, 7, 8, 9)] == [None, "x", "x", "x"]
    store.put(7, "y", size=100)  # put again: its old size no longer counts
    assert store.bytes == 700
    clock[0] += 120
    assert store.get(8) is None and store.bytes == 400  # expired entries give their size back


def test_an_entry_larger_than_the_whole_budget_is_not_kept_and_evicts_nothing(clock: list[float]) -> None:
    store: TTLStore[str, str] = TTLStore(max_entries=1000, ttl_s=60, max_bytes=1000)
    store.put("a", "x", size=300)
    store.put("b", "x", size=300)
    store.put("huge", "x" * 10, size=5000)  # could never fit: the others stay
    assert (store.get("a"), store.get("b"), store.get("huge")) == ("x", "x", None)
    assert store.bytes == 600 and len(store) == 2
    store.put("a", "y" * 10, size=5000)  # a value too large for its key: the old one is stale
    assert store.get("a") is None and store.bytes == 300


def test_sweep_drops_what_expired_without_a_put_or_a_get(clock: list[float]) -> None:
    store: TTLStore[str, bytes] = TTLStore(max_entries=10, ttl_s=5)
    store.put("a", b"x", 100)
    clock[0] += 2
    store.put("b", b"y", 100)
    assert store.sweep() == 0 and len(store) == 2
    clock[0] += 3.5  # "a" expired, "b" not yet
    assert store.sweep() == 1 and len(store) == 1 and store.bytes == 100
    clock[0] += 5
    assert store.sweep() == 1 and len(store) == 0 and store.bytes == 0
