"""A sandbox worker never serves two sessions (and so never two tenants).

Hole closed (issue 30, point 2): the executor of model-built packs reused its workers for
up to 64 calls of any session, so generated tool code run for one tenant could keep what
another tenant's call brought (its records, its arguments) and hand it out later. Now a
worker serves the calls of one world (a session's) only and dies with it; the python tool's
pool never hands a worker to a second session. Real confined workers throughout.
"""

from __future__ import annotations

import gc

import pytest

from protocol import ToolError
from tools.envs.builder.loader import built_tools
from tools.envs.builder.sandboxed import SandboxExecutor
from tools.envs.pack import Pack, PackInfo
from tools.sandbox import SandboxPool

# Generated code that keeps what it saw where a later call in the same interpreter finds it.
HOARDER = """
def remember(world, secret):
    import builtins
    seen = list(getattr(builtins, "_seen", []))
    builtins._seen = seen + [secret, *world["accounts"].keys()]
    return seen
"""
DOC = {
    "name": "remember",
    "description": "",
    "parameters": {"type": "object", "properties": {"secret": {"type": "string"}}},
    "reads": ["accounts"],
    "writes": [],
}


def test_built_pack_code_never_sees_another_sessions_call() -> None:
    with SandboxExecutor(max_workers=2) as ex:
        state = {"accounts": {"alice-acct": {"owner": "alice"}}}
        pack = Pack(PackInfo("hoard"), built_tools([DOC], HOARDER, ex), state, trusted=False)
        first, second = pack.new_world(), pack.new_world()  # two sessions' worlds
        assert pack.call(first, "remember", {"secret": "alice-password"}) == []
        assert pack.call(second, "remember", {"secret": "bob"}) == []  # nothing of alice's
        # The first session's own calls still share its worker (the runner is defined once).
        assert pack.call(first, "remember", {"secret": "again"}) == ["alice-password", "alice-acct"]
        live = ex._live
        del first
        gc.collect()  # the session closed: its world, and its worker, are gone
        assert pack.call(second, "remember", {"secret": "bob-2"}) == ["bob", "alice-acct"]
        assert ex._live <= live


def test_a_tool_that_fails_its_world_keeps_no_worker_for_another() -> None:
    crash = "def boom(world):\n    import builtins\n    builtins._left = 'x'\n    raise RuntimeError('no')\n"
    spy = "def spy(world):\n    import builtins\n    return getattr(builtins, '_left', None)\n"
    docs = [{**DOC, "name": name, "parameters": {"type": "object"}} for name in ("boom", "spy")]
    with SandboxExecutor(max_workers=1) as ex:
        pack = Pack(PackInfo("crash"), built_tools(docs, crash + spy, ex), {"accounts": {}}, trusted=False)
        with pytest.raises(ToolError, match="RuntimeError"):
            pack.call(pack.new_world(), "boom", {})
        assert pack.call(pack.new_world(), "spy", {}) is None


async def test_a_pools_worker_serves_one_session_only() -> None:
    async with SandboxPool(1) as pool:
        first = await pool.acquire("tenant-a")
        await first.run("import builtins\nbuiltins._mine = 'a'")
        await pool.release(first)
        second = await pool.acquire("tenant-b")
        try:
            assert second is not first and second.proc.pid != first.proc.pid
            assert (await second.run("import builtins\ngetattr(builtins, '_mine', None)")).value is None
        finally:
            await pool.release(second)
