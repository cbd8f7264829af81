"""The executor: every call, from any endpoint, runs here under the server's limits.

A call goes executor → admission → records → runner → output:

* ``executor``: ``Executor``, the entry point (batches, verify requests, sessions' order);
* ``admission``: which calls are taken on, counted in all and per tenant (``fair_slots``);
* ``records``: results kept for retries (idempotency), calls in flight, the cache (in ``tool_server.stores``);
* ``gc_pacing``: young-generation collections paced by the objects kept results and MCP requests leave;
* ``order``: a session's stateful calls one at a time, in arrival order;
* ``runner``: one call's tool, its timeout, and every failure as a ``Result``;
* ``output``: whatever a tool returns, as a ``Result`` within the output limits.
"""

from tool_server.executor.executor import (
    ANONYMOUS,
    Caller,
    Executor,
    Overloaded,
    to_verify_result,
    unknown_tool_message,
)

__all__ = ["ANONYMOUS", "Caller", "Executor", "Overloaded", "to_verify_result", "unknown_tool_message"]
