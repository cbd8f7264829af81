"""The built-in verifiers by name: filled in by ``tools.verifiers`` when it is imported.

It lives apart so that ``weighted`` can look up the verifiers it combines without importing
the package that imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["BUILTIN_VERIFIERS"]

BUILTIN_VERIFIERS: dict[str, Callable[..., Any]] = {}
