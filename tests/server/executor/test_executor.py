"""Executor semantics in-process: cancellation, threads, limits, sessions, caching, config."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated

import pytest

from protocol import Call, SessionState, ToolContext, ToolError, new_call_id, tool
from tool_server.app import build_registry
from tool_server.config import ConfigError, config_from_dict, load_config
from tool_server.executor.executor import Executor, Overloaded

EVENTS: dict[str, list[str]] = {"cancelled": [], "closed": [], "threads": []}
_concurrent = {"now": 0, "peak": 0}


@tool(name="slow_async", timeout_s=0.2)
async def slow_async(tag: str) -> str:
    """Sleeps long; records its own cancellation."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        EVENTS["cancelled"].append(tag)
        raise
    return "never"


@tool(name="blocking_sync")
def blocking_sync(seconds: float) -> dict:
    """A blocking function: must run in a worker thread, not on the event loop."""
    EVENTS["threads"].append(threading.current_thread().name)
    time.sleep(seconds)
    return {"thread": threading.current_thread() is not threading.main_thread()}


@tool(name="limited", max_concurrency=2)
async def limited() -> int:
    _concurrent["now"] += 1
    _concurrent["peak"] = max(_concurrent["peak"], _concurrent["now"])
    await asyncio.sleep(0.05)
    _concurrent["now"] -= 1
    return _concurrent["peak"]


@tool(name="notebook", stateful=True)
async def notebook(ctx: ToolContext, put: Annotated[str | None, "value to store"] = None) -> dict:
    """Stores values in the session; reports what the session holds."""
    session: SessionState = ctx.session
    if "items" not in session.data:
        session.data["items"] = []
        session.on_close(lambda: EVENTS["closed"].append(session.id))
    if put is not None:
        session.data["items"].append(put)
    return {"session": session.id, "items": list(session.data["items"])}


@tool(name="agent")
async def agent(ctx: ToolContext, n: int = 2) -> dict:
    """Calls another tool through the executor n times."""
    results = [await ctx.call("notebook", {"put": f"inner-{i}"}) for i in range(n)]
    return {"items": results[-1].structured["items"], "errors": [r.is_error for r in results]}


@tool(name="picky")
def picky(x: int) -> str:
    raise ToolError("x is not acceptable", "invalid_arguments")


@tool(name="peek", stateful=True, blocking=False)
def peek(ctx: ToolContext) -> dict:
    """A non-blocking sync stateful tool: what session does it get?"""
    return {"has_session": ctx.session is not None}


@tool(name="stateful_agent", stateful=True)
async def stateful_agent(ctx: ToolContext) -> dict:
    """Holds its session's turn while calling a stateful tool in the same session."""
    inner = await ctx.call("notebook", {"put": "from-agent"})
    return {"items": inner.structured["items"]}


@tool(name="quick_limited", blocking=False, max_concurrency=1)
def quick_limited() -> str:
    return "ok"


@tool(name="overrunning", blocking=False)
def overrunning() -> str:
    """Wrongly marked non-blocking: sleeps on the event loop."""
    time.sleep(0.3)
    return "late"


@tool(name="nap")
async def nap(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "rested"


def make_executor(**config) -> Executor:
    here = "tests.server.executor.test_executor"
    tools = [
        {"target": f"{here}:{name}"}
        for name in (
            "slow_async",
            "blocking_sync",
            "limited",
            "notebook",
            "agent",
            "picky",
            "peek",
            "stateful_agent",
            "quick_limited",
            "overrunning",
            "nap",
        )
    ]
    cfg = config_from_dict({"tools": tools, **config}, environ={})
    return Executor(build_registry(cfg), cfg)


async def test_timeout_really_cancels_the_coroutine():
    executor = make_executor()
    await executor.start()
    result = await executor.run_one(Call("t1", "slow_async", {"tag": "t1"}))
    assert result.error.kind == "timeout"
    assert EVENTS["cancelled"] == ["t1"]
    assert executor.admitted == 0


async def test_sync_tools_run_in_worker_threads_and_do_not_block_the_loop():
    executor = make_executor()
    await executor.start()
    ticks = 0

    async def ticker():
        nonlocal ticks
        for _ in range(10):
            await asyncio.sleep(0.01)
            ticks += 1

    results, _ = await asyncio.gather(
        executor.run_batch([Call(new_call_id(), "blocking_sync", {"seconds": 0.3}) for _ in range(3)]),
        ticker(),
    )
    assert all(r.structured["thread"] for r in results)
    assert ticks == 10  # the loop kept running while three threads slept


async def test_per_tool_concurrency_limit():
    executor = make_executor()
    await executor.start()
    results = await executor.run_batch([Call(new_call_id(), "limited", {}) for _ in range(8)])
    assert not any(r.is_error for r in results)
    assert _concurrent["peak"] == 2


async def test_admission_control_raises_overloaded():
    executor = make_executor(limits={"max_concurrency": 1, "max_queue": 1})
    await executor.start()
    with pytest.raises(Overloaded, match="never admitted at once here: one token may hold at most 2"):
        await executor.run_batch([Call(new_call_id(), "limited", {}) for _ in range(3)])
    running = asyncio.create_task(executor.run_batch([Call(new_call_id(), "limited", {}) for _ in range(2)]))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="capacity 2"):  # full now: retry later
        await executor.run_batch([Call(new_call_id(), "limited", {})])
    assert not any(r.is_error for r in await running)
    single = executor.run_one(Call(new_call_id(), "limited", {}))
    assert not (await single).is_error


async def test_sessions_hold_state_and_close_on_release_and_expiry():
    executor = make_executor(sessions={"ttl_s": 0.1, "sweep_interval_s": 60})
    await executor.start()
    r1 = await executor.run_one(Call(new_call_id(), "notebook", {"put": "a"}, session="s1"))
    r2 = await executor.run_one(Call(new_call_id(), "notebook", {"put": "b"}, session="s1"))
    other = await executor.run_one(Call(new_call_id(), "notebook", {"put": "z"}, session="s2"))
    assert r2.structured["items"] == ["a", "b"] and r1.structured["session"] == "s1"
    assert other.structured["items"] == ["z"]  # sessions are isolated
    assert await executor.sessions.release("anonymous", "s1")
    assert "s1" in EVENTS["closed"]
    late = await executor.run_one(Call(new_call_id(), "notebook", {"put": "c"}, session="s1"))
    assert late.error.kind == "unknown_session"  # a released session is never revived
    await asyncio.sleep(0.2)
    assert await executor.sessions.sweep() == 1  # s2 expired
    assert "s2" in EVENTS["closed"]
    # A stateful tool called without a session gets a fresh, ephemeral one.
    lone = await executor.run_one(Call(new_call_id(), "notebook", {"put": "q"}))
    assert lone.structured["items"] == ["q"]


async def test_agent_tool_inner_calls_go_through_the_executor_in_its_session():
    executor = make_executor()
    await executor.start()
    result = await executor.run_one(Call(new_call_id(), "agent", {"n": 3}, session="traj"))
    assert result.structured == {"items": ["inner-0", "inner-1", "inner-2"], "errors": [False, False, False]}
    assert executor.metrics.tool_stats.tools["notebook"].outcomes["ok"] == 3


async def test_tool_error_kind_is_preserved():
    executor = make_executor()
    await executor.start()
    result = await executor.run_one(Call(new_call_id(), "picky", {"x": 1}))
    assert result.error.kind == "invalid_arguments" and result.error.message == "x is not acceptable"


def test_config_env_overrides_and_errors(tmp_path):
    config = load_config(
        None, environ={"TOOLFACTORY__LIMITS__MAX_CONCURRENCY": "7", "TOOLFACTORY__SERVER__PORT": "9"}
    )
    assert config.limits.max_concurrency == 7 and config.server.port == 9
    with pytest.raises(ConfigError, match="unknown key"):
        config_from_dict({"limits": {"max_concurency": 3}}, environ={})
    with pytest.raises(ConfigError, match="expected int"):
        config_from_dict({"limits": {"max_concurrency": "many"}}, environ={})
    with pytest.raises(ConfigError, match="cannot import module"):
        build_registry(config_from_dict({"tools": [{"target": "no.such.module:x"}]}, environ={}))
    with pytest.raises(ConfigError, match="package.module:function_or_class"):
        build_registry(config_from_dict({"tools": [{"target": "nocolon"}]}, environ={}))
    with pytest.raises(ConfigError, match="not a configured tool"):
        build_registry(config_from_dict({"toolsets": {"x": ["ghost"]}}, environ={}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, environ={})
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml", environ={})


def test_default_config_is_valid():
    config = load_config(None, environ={})
    names = [spec.target for spec in config.tools]
    assert "tools.calculator:calculator" in names


def test_default_server_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tool_server.app import build_registry\n"
        "from tool_server.config import load_config\n"
        "registry = build_registry(load_config(None, environ={}))\n"
        "assert 'search' in registry and 'python' in registry and 'verify_exact_match' in registry\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


async def test_one_call_path_stateful_tools_get_a_session_whatever_their_kind():
    executor = make_executor()
    await executor.start()
    # A non-blocking sync stateful tool goes the same way as an async one: a per-call
    # session when the call names none (it used to get None on the inline path).
    lone = await executor.run_one(Call(new_call_id(), "peek", {}))
    assert lone.structured == {"has_session": True}
    assert not executor.registry.entries["peek"].inline
    assert not executor.registry.entries["quick_limited"].inline  # a per-tool limit needs a task
    assert executor.registry.entries["quick_limited"].meta.max_concurrency == 1


async def test_a_stateful_tools_inner_call_in_its_own_session_does_not_wait_for_itself():
    executor = make_executor()
    await executor.start()
    result = await asyncio.wait_for(
        executor.run_one(Call(new_call_id(), "stateful_agent", {}, session="s-agent")), timeout=10
    )
    assert result.structured == {"items": ["from-agent"]}


async def test_a_non_blocking_tool_that_overruns_is_reported(caplog):
    executor = make_executor()
    await executor.start()
    with caplog.at_level("WARNING"):
        result = await executor.run_one(Call(new_call_id(), "overrunning", {}))
    assert result.text == "late"
    assert "overrunning is marked blocking=False but took" in caplog.text


async def test_a_failing_session_cleanup_does_not_skip_the_others():
    ran: list[str] = []
    session = SessionState("s")

    async def kill_interpreter() -> None:
        ran.append("interpreter")

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("cleanup bug")

    session.on_close(kill_interpreter)
    session.on_close(broken)
    session.on_close(lambda: ran.append("newest"))
    with pytest.raises(RuntimeError, match="cleanup bug"):
        await session.close()
    assert ran == ["newest", "broken", "interpreter"]  # before: the interpreter was never killed
    await session.close()  # each callback runs once
    assert ran == ["newest", "broken", "interpreter"]


async def test_every_result_of_a_batch_carries_its_run_time():
    # The calls end together; _run_batch then awaits tasks that are already done. Before: a
    # done task's bookkeeping (a done-callback) had not run yet, so its result went out with
    # elapsed_ms 0 — and ToolClient, which reads a batch's slowest and fastest elapsed_ms to
    # decide whether one call held it back, split POSTs to a replica slow as a whole.
    executor = make_executor()
    await executor.start()
    for _ in range(3):
        results = await executor.run_batch([Call(new_call_id(), "nap", {"seconds": 0.05}) for _ in range(8)])
        assert not any(r.is_error for r in results)
        assert min(r.elapsed_ms for r in results) >= 50, [r.elapsed_ms for r in results]


async def test_a_finished_batch_has_given_its_admission_back():
    # Capacity 8: a batch of 8 that ends together, then at once another batch of 8. Before:
    # run_batch returned while the bookkeeping of its tasks that ended together was still
    # queued, so the next batch found the capacity taken and was refused.
    executor = make_executor(limits={"max_concurrency": 4, "max_queue": 4})
    await executor.start()
    for _ in range(3):
        results = await executor.run_batch([Call(new_call_id(), "nap", {"seconds": 0.01}) for _ in range(8)])
        assert not any(r.is_error for r in results)
        assert executor.admitted == 0
