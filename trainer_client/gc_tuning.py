"""Keep the garbage collector off what the trainer process built at start-up.

A trainer process holds torch, transformers, the tokenizer and the model: ~360k objects the
collector tracks. CPython's full collections walk all of them (~190 ms each on this project's
machine), on the event loop that also sends the rollouts' tool calls and renews their sessions.
Once the model and the clients are loaded, those objects live as long as the process:
``gc.freeze`` moves them out of every later collection. The tool server does the same after
its tools load (``tool_server/cli.py``, ``tune_gc``).
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]


def freeze_startup_heap() -> int:
    """Collect once, then freeze every object alive now; returns how many are frozen.

    Call it after the model and clients are loaded, before the rollouts start. Objects that
    later become garbage in reference cycles stay allocated, so only what lives as long as
    the process should be alive at that point (the collection before the freeze sees to the
    rest). Does nothing while the collector is disabled.
    """
    if not gc.isenabled():
        return gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
