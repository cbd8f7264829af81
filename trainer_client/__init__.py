"""Trainer client: talks to the tool server over HTTP and drives multi-turn rollouts.

Submodules, imported on demand so that ``import trainer_client`` stays cheap (no torch):
``models`` (offline model loading), ``parsers`` (tool-call formats), ``templates``
(observation rendering as token deltas), ``rollout`` (the engine-agnostic rollout core),
``backends`` (generators: scripted, HF transformers, veRL server manager).
It imports ``protocol`` only, never ``tool_server`` or ``tools``.
"""
