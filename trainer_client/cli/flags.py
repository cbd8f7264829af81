"""Command-line flags derived from a config dataclass: one place for names, types, defaults and help.

Each field becomes ``--field-name``; its help is the string literal written under the
field in the class body (its "field doc") plus the default. Booleans get
``--x/--no-x``, ``dict`` fields take JSON, ``list`` fields repeat, fixed-size tuples take
that many values. Every flag defaults to None, so ``given_values`` returns only what the
command line set and a config file (or the dataclass) supplies the rest.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import textwrap
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

__all__ = ["add_dataclass_flags", "config_values", "field_docs", "given_values"]


def field_docs(cls: type) -> dict[str, str]:
    """The string literal under each field of ``cls``'s body, whitespace collapsed; fields of a
    dataclass base keep the base's doc unless ``cls`` writes another."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
        for node, following in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}); e.g. '{{\"normalize\": true}}'") from None


def _without_none(kind: Any) -> Any:
    """``int | None`` -> ``int`` (flags cannot say None; leaving a flag out keeps the default)."""
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def _default_text(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if value is None or value == {} or value == []:
        return "default: unset"
    if isinstance(value, tuple | list):
        value = " ".join(map(str, value))
    return f"default: {value}"


def add_dataclass_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    skip: Iterable[str] = (),
    aliases: Mapping[str, Iterable[str]] | None = None,
) -> None:
    """Add one flag per field of ``cls`` (except ``skip``); ``aliases`` maps a field to extra flag names."""
    hints = get_type_hints(cls)
    docs = field_docs(cls)
    skipped = set(skip)
    for field in dataclasses.fields(cls):
        if field.name in skipped or field.name.startswith("_"):
            continue
        names = [_flag(field.name), *(aliases or {}).get(field.name, ())]
        text = f"{docs.get(field.name, field.name.replace('_', ' '))} ({_default_text(field)})"
        kind = _without_none(hints[field.name])
        origin = get_origin(kind) or kind
        options: dict[str, Any] = {"dest": field.name, "default": None, "help": text}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif origin is dict:
            options.update(type=_json_object, metavar="JSON")
        elif origin is list:
            options.update(action="append", type=get_args(kind)[0] if get_args(kind) else str)
        elif origin is tuple:
            options.update(nargs=len(get_args(kind)), type=get_args(kind)[0])
        elif kind in (int, float, str):
            options["type"] = kind
        else:
            raise TypeError(f"{cls.__name__}.{field.name}: no flag for type {kind!r}")
        parser.add_argument(*names, **options)


def given_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` that the command line set (flags left out are absent)."""
    return {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(cls)
        if getattr(args, field.name, None) is not None
    }


def config_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` from ``--config`` (a YAML mapping), the flags given over it, and a
    ``server`` field from the tool-server URL variable when neither set it."""
    import os

    import yaml

    from trainer_client.shared import URL_ENV

    values: dict[str, Any] = {}
    if args.config:
        path = Path(args.config).expanduser()
        if not path.is_file():
            raise ValueError(f"config file {path} not found")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold a mapping of {cls.__name__} fields")
        values.update(loaded)
    values.update(given_values(args, cls))
    has_server = any(field.name == "server" for field in dataclasses.fields(cls))
    if has_server and "server" not in values and os.environ.get(URL_ENV):
        values["server"] = [u for u in os.environ[URL_ENV].split(",") if u]
    return values
