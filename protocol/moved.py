"""Module paths that moved: still importable under their old names, with a warning.

Users' configs name tools by ``module:attribute`` (``target: tools.dense_search:DenseSearchTool``)
and veRL configs name our agent loop by module. When a module moves into a sub-package, its
package registers ``{old: new}`` here; importing the old name then warns (``DeprecationWarning``)
and returns the new module itself, so both names share one module object and one state.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Mapping
from types import ModuleType

__all__ = ["current_name", "redirect"]

_MOVED: dict[str, str] = {}


class _Redirect(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds old module names and loads them as the module they became."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _MOVED[spec.name]
        warnings.warn(
            f"module {spec.name} moved to {new}; import {new} instead (the old path will be removed)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran when it was imported."""


_FINDER = _Redirect()


def redirect(moves: Mapping[str, str]) -> None:
    """Make each old dotted module name in ``moves`` import its new module."""
    _MOVED.update(moves)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def current_name(module: str) -> str:
    """``module``'s name now: the new name of a moved module, else ``module`` itself."""
    return _MOVED.get(module, module)
