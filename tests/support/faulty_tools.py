"""Tools that fail in every way a tool can: each must end as an error result, never a 500."""

from __future__ import annotations

from typing import Annotated

from protocol import tool

FAULTS = {
    "system_exit": SystemExit(3),
    "keyboard_interrupt": KeyboardInterrupt(),
    "generator_exit": GeneratorExit(),
    "base_exception": BaseException("odd"),
    "recursion": RecursionError("deep"),
    "memory": MemoryError(),
}


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")

    __repr__ = __str__


def _fail(fault: str) -> object:
    if fault == "unprintable":
        return Unprintable()
    raise FAULTS[fault]


@tool(name="faulty_async")
async def faulty_async(fault: Annotated[str, "Which fault."]) -> object:
    """Fail from a coroutine."""
    return _fail(fault)


@tool(name="faulty_thread")
def faulty_thread(fault: Annotated[str, "Which fault."]) -> object:
    """Fail from a worker thread."""
    return _fail(fault)


@tool(name="faulty_inline", blocking=False)
def faulty_inline(fault: Annotated[str, "Which fault."]) -> object:
    """Fail on the event loop."""
    return _fail(fault)
