"""The workbench: a web UI at ``/ui`` for tools, environments, trajectories, live load and
training runs, served by the tool server with the same auth.

* ``routes``: ``Workbench``, the page and its JSON routes;
* ``envs``: environment packs' tasks by level, gold calls, a replay of the gold;
* ``files``: rollout JSONL files (where they may be) and a line index to page through them;
* ``runs`` and ``tensorboard``: training runs' curves from ``metrics.jsonl`` or event files;
* ``live``: the server's Prometheus text as JSON; ``tokens``: each token's text;
* ``static/``: the page itself, plain HTML, CSS and JavaScript modules (no build step).
"""

from tool_server.workbench.routes import Workbench

__all__ = ["Workbench"]
