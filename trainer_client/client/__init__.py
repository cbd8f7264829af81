"""Clients of the tool server: the batched HTTP client the rollouts use, a blocking wrapper,
and a plain MCP client for servers without a batch API.

* ``tool_client``: ``ToolClient``, coalescing, retries, replicas, the delivery rules;
* ``policies``: its tunables (``BatchPolicy``, ``RetryPolicy``, ``HealthPolicy``);
* ``batching``, ``dispatch``, ``splits``: calls into POSTs, POSTs sent and settled, split
  POSTs for a batch one slow call holds back; ``deadlines``: the calls not settled yet, by deadline;
* ``transport``: the batches' own keep-alive HTTP/1.1 connections (httptools), or httpx's;
* ``routing``, ``health``, ``discovery``: which replica, which are up, replicas from DNS;
* ``idempotency``: which tools may run twice; ``records``: what the client keeps;
* ``leases``: the sessions of live trajectories renewed on the server (``lease_session``);
* ``sync``: ``SyncToolClient``; ``mcp``: ``McpToolClient``;
* ``stream``: ``StreamClient``, calls one at a time over the server's ``/v1/stream`` WebSocket
  (an agent framework, an environment's step loop).
"""

from trainer_client.client.policies import BatchPolicy, HealthPolicy, RetryPolicy
from trainer_client.client.stream import StreamClient
from trainer_client.client.tool_client import ToolClient, ToolServerError

__all__ = ["BatchPolicy", "HealthPolicy", "RetryPolicy", "StreamClient", "ToolClient", "ToolServerError"]
