"""Generation backends behind veRL's ``server_manager.generate`` interface.

``base`` (the interface: ``Generator``, ``TokenOutput``), ``scripted`` (replays token
sequences; tests and benchmarks), ``hf`` (HF transformers on CPU, batched; imports torch,
so it is not imported here). veRL 0.9.1's server manager (``LLMServerClient``, formerly
``AsyncLLMServerManager``) is a ``Generator`` as it is.
"""

from trainer_client.backends.base import Generator, TokenOutput
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn

__all__ = ["Generator", "ScriptedGenerator", "ScriptedTurn", "TokenOutput"]
