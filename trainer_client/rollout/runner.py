"""Rolling out dataset rows with a ``RolloutCore``, each record written as it finishes.

``run_and_write`` runs ``n`` samples of every row concurrently and appends each
trajectory's record (``records``) to a JSONL file; ``tool_chooser`` picks the
tool schemas each row's prompt shows; ``interrupt_at_once`` lets Ctrl-C stop a blocking
step (loading a model) inside ``asyncio.run``. The ``rollout`` command and the demo share them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from trainer_client.rollout.dataset import TaskRow
from trainer_client.rollout.records import trajectory_record

__all__ = ["SessionFor", "ToolsFor", "interrupt_at_once", "rollout_rows", "run_and_write", "tool_chooser"]

ToolsFor = Callable[[TaskRow], list[dict[str, Any]] | None]
SessionFor = Callable[[TaskRow, int], str]


async def rollout_rows(
    core: Any,
    rows: Sequence[TaskRow],
    n: int,
    *,
    verifier: str | None,
    concurrency: int,
    on_record: Callable[[dict[str, Any]], None],
    tools_for: ToolsFor | None = None,
    session_for: SessionFor | None = None,
) -> list[dict[str, Any]]:
    """Run ``n`` samples of every row concurrently (at most ``concurrency`` at once).

    ``tools_for`` gives a row's tool schemas for the chat template (``tool_chooser``);
    ``session_for`` its trajectory id (a scripted backend keys its turns by it).
    """
    gate = asyncio.Semaphore(max(1, concurrency))
    decode = core.codec.decode

    async def one(row: TaskRow, sample: int) -> dict[str, Any]:
        task = row.task()  # with the row's later user turns and simulated user, as the trainers read it
        task.tools = tools_for(row) if tools_for else None
        task.verifier = verifier
        session_id = session_for(row, sample) if session_for else None
        async with gate:
            trajectory = await core.run(task, session_id=session_id)
        record = trajectory_record(trajectory, row, sample, decode)
        on_record(record)
        return record

    return list(await asyncio.gather(*(one(row, s) for row in rows for s in range(n))))


async def run_and_write(
    core: Any,
    rows: Sequence[TaskRow],
    n: int,
    out: Path,
    *,
    verifier: str | None,
    concurrency: int,
    progress: bool = True,
    description: str = "trajectories",
    tools_for: ToolsFor | None = None,
    session_for: SessionFor | None = None,
    finished: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Roll out and append each record to ``out`` as it finishes; returns (records, wall s).

    ``finished`` gets each record too, as it is written: what an interrupted run (Ctrl-C
    cancels it) still has to summarize.
    """
    from tqdm import tqdm

    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(rows) * n, desc=description, unit="traj", disable=not progress, file=sys.stderr)
    rewards: list[float] = []
    with open(out, "wb") as handle:

        def on_record(record: dict[str, Any]) -> None:
            handle.write(orjson.dumps(record) + b"\n")
            handle.flush()
            if finished is not None:
                finished.append(record)
            if record.get("reward") is not None:
                rewards.append(record["reward"])
                bar.set_postfix(reward=f"{sum(rewards) / len(rewards):.3f}", refresh=False)
            bar.update(1)

        started = time.perf_counter()
        try:
            records = await rollout_rows(
                core,
                rows,
                n,
                verifier=verifier,
                concurrency=concurrency,
                on_record=on_record,
                tools_for=tools_for,
                session_for=session_for,
            )
        finally:
            bar.close()
    return records, time.perf_counter() - started


async def tool_chooser(client: Any, core: Any, mode: str, toolset: str | None) -> ToolsFor:
    """The tool schemas each row shows the model (``templates.prompt_tools``); the
    server's descriptors are fetched once, from ``/v1/tools``."""
    from trainer_client.templates.render import openai_tool_schemas, prompt_tools

    server_tools = openai_tool_schemas(await client.list_tools(toolset)) if mode != "none" else None
    renders_tools = core.renderer.renders_tools

    def choose(row: TaskRow) -> list[dict[str, Any]] | None:
        dataset_tools = row.extra_info.get("tools")
        return prompt_tools(
            mode,
            messages=row.messages,
            dataset_tools=dataset_tools if isinstance(dataset_tools, list) else None,
            server_tools=server_tools,
            renders_tools=renders_tools,
            format=core.config.format,
        )

    return choose


@contextlib.contextmanager
def interrupt_at_once() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt inside this block, also under ``asyncio.run``.

    ``asyncio.run``'s own handler only cancels the main task, which a blocking call on the
    event loop (loading a model: half a minute) would see only once it returns. Around such
    a call nothing else runs, so raising right there is safe. SIGINT stays ignored where it is.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (
        signal.SIG_IGN,
        None,
    ):
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
