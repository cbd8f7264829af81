"""The copy-on-write World: what a session sees, what it costs, how two worlds compare."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.support import env_pack
from tools.envs import World


def base() -> dict[str, dict[str, Any]]:
    return {
        "users": {"u1": {"name": "Ada", "tags": ["a"]}, "u2": {"name": "Bo", "tags": []}},
        "orders": {"o1": {"status": "pending"}},
    }


def test_writes_stay_in_the_world_and_the_base_is_never_touched() -> None:
    shared = base()
    a, b = World(shared), World(shared)
    a["users"]["u1"]["tags"].append("vip")  # a read hands out a's own copy: mutating it is a write
    a["users"]["u3"] = {"name": "Cy", "tags": []}
    assert a["users"]["u1"]["tags"] == ["a", "vip"]
    assert b["users"]["u1"]["tags"] == ["a"] and "u3" not in b["users"]
    assert shared == base()  # nothing leaked into the shared base
    assert a.touched() == {("users", "u1"), ("users", "u3")}
    assert b.touched() == {("users", "u1")}  # b's read copied its record too


def test_a_read_copy_is_isolated_but_peek_is_not_copied() -> None:
    shared = base()
    world = World(shared)
    assert world["orders"].peek("o1") is shared["orders"]["o1"]  # no copy, no overlay entry
    assert world.touched() == set()
    copy = world["orders"]["o1"]
    assert copy == shared["orders"]["o1"] and copy is not shared["orders"]["o1"]
    assert world["orders"]["o1"] is copy  # the same copy on every later read
    assert world["orders"].peek("o1") is copy
    assert world.changed() == set()  # read but unchanged: not a change


def test_deletes_hide_base_records_and_iteration_follows() -> None:
    world = World(base())
    del world["users"]["u2"]
    world["users"]["u9"] = {"name": "Ny", "tags": []}
    assert "u2" not in world["users"] and world["users"].peek("u2") is None
    with pytest.raises(KeyError):
        world["users"]["u2"]
    with pytest.raises(KeyError):
        del world["users"]["u2"]  # already gone
    assert list(world["users"]) == ["u1", "u9"] and len(world["users"]) == 2
    del world["users"]["u9"]  # a record only this world had
    assert list(world["users"]) == ["u1"]
    world["users"]["u2"] = {"name": "Bo again", "tags": []}  # re-created after a delete
    assert world["users"]["u2"]["name"] == "Bo again"
    assert world.changed() == {("users", "u2")}  # u9 came and went: no change
    with pytest.raises(KeyError, match="no table 'payments'"):
        world["payments"]


def test_differences_matching_fraction_and_digest() -> None:
    shared = base()
    a, b, c = World(shared), World(shared), World(shared)
    assert a.digest() == b.digest() and a.differences(b) == []
    assert a.matching_fraction(b) == 1.0
    for world in (a, b):
        world["orders"]["o1"]["status"] = "cancelled"
    a["users"]["u1"]["name"] = "Ada L."
    del b["users"]["u2"]
    assert a.differences(b) == [("users", "u1"), ("users", "u2")]
    assert a.matching_fraction(b) == pytest.approx(1 / 3)  # o1 agrees; u1 and u2 do not
    b["users"]["u1"]["name"] = "Ada L."
    c["users"]["u2"]  # a read is not a change
    assert c.digest() == World(shared).digest()
    b["users"]["u2"] = {"name": "Bo", "tags": []}  # put back as it was: equal to the base again
    assert a.digest() == b.digest() and a.differences(b) == []
    with pytest.raises(ValueError, match="different base states"):
        a.differences(World(base()))


def test_record_state_compares_records_that_are_objects() -> None:
    class User:
        def __init__(self, name: str) -> None:
            self.name = name

    shared = {"users": {"u1": User("Ada")}}
    a, b = World(shared, record_state=vars), World(shared, record_state=vars)
    a["users"]["u1"].name = "Ada"  # copied, same state
    assert a.changed() == set() and a.digest() == b.digest()
    a["users"]["u1"].name = "Eve"
    assert a.changed() == {("users", "u1")} and a.differences(b) == [("users", "u1")]


def test_a_tasks_worlds_share_one_base_even_when_built_at_once() -> None:
    pack = env_pack.pack()
    task = pack.task("cancel_patched")
    worlds: list[World] = []
    start = threading.Barrier(8)

    def make() -> None:
        start.wait()
        worlds.append(pack.new_world(task))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(w.base is pack.base_state(task) for w in worlds)
    assert worlds[0].differences(pack.replay(task)) == [("orders", "o9")]  # comparable: one base
    assert "o3" not in worlds[0]["orders"] and pack.initial_state["orders"]["o3"]["status"] == "pending"


def test_a_tool_that_crashes_is_a_failed_call_in_the_log() -> None:
    """A bug in a tool (not a ToolError) must still be logged as a failure: a reward that
    reads the call log would otherwise count the call as a success with output None."""
    from protocol import ToolError
    from tools.envs.pack import EnvTask, EnvTool, Gold, Pack, PackInfo

    def broken(world: World, key: str) -> dict:
        return world["items"][key]["missing_field"]

    pack = Pack(
        PackInfo("crashy"),
        [EnvTool("broken", "", {"type": "object"}, broken)],
        {"items": {"a": {"stock": 1}}},
        [EnvTask("t", [{"role": "user", "content": "x"}], Gold())],
    )
    world = pack.new_world()
    with pytest.raises(ToolError, match="KeyError"):
        pack.call(world, "broken", {"key": "a"})
    assert world.calls[-1].error is not None and "KeyError" in world.calls[-1].error
