"""Build an environment pack from a scenario with a model: the five stages of FTRL's pipeline.

Scenario decomposition, document generation, function integration, complexity scaling
and localized deployment (Ye et al. 2025, "Feedback-Driven Tool-Use Improvements in Large
Language Models via Automated Build Environments"), each an OpenAI-compatible chat call
whose JSON answer is validated and retried (``stages``), then a deterministic gate
(``gate``) and a pack on disk whose generated code only ever runs in the sandbox
(``loader``, ``sandboxed``). Entry points: ``build`` and the ``env build`` command (``cli``).
"""

from tools.envs.builder.llm import ChatModel
from tools.envs.builder.loader import load_built_pack
from tools.envs.builder.pipeline import BuildConfig, build
from tools.envs.builder.sandboxed import SandboxExecutor

__all__ = ["BuildConfig", "ChatModel", "SandboxExecutor", "build", "load_built_pack"]
