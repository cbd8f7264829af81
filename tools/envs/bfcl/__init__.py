"""BFCL v4 multi-turn categories as environment packs, read from the installed ``bfcl-eval``.

* ``packs``: ``pack(category)``, BFCL's API classes as tools and its entries as tasks;
* ``data``: the entries, gold answers and function docs, read from the package;
* ``state``: BFCL's API instances as the records of a ``World``;
* ``calls``: BFCL's methods run by keyword, one at a time, and their results as BFCL writes them;
* ``verdict``: ``judge``, BFCL's own multi-turn checker over a trajectory (eval mode's reward);
* ``leaderboard``: BFCL's accuracy per category, from verdicts (what its leaderboard shows).
"""

from tools.envs.bfcl.packs import READ_ONLY, TABLE, pack

__all__ = ["READ_ONLY", "TABLE", "pack"]
