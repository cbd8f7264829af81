"""Built packs on disk: written by the deployment stage, loaded without importing their code.

A built pack is the ``dump_pack`` directory format plus two files, and ``trusted: false``::

    <pack>/pack.yaml         id, version, origin: built, domain, description, trusted: false,
                             tools: "<sandboxed>", tool_documents, tool_source (, policy)
    <pack>/state.json        the initial state
    <pack>/tasks.jsonl       the tasks (gold outputs filled in by replay)
    <pack>/tools.json        the tool documents: name, description, parameters, output, reads, writes
    <pack>/tools_source.py   the generated functions, one per tool

``tools: "<sandboxed>"`` names no importable module, so ``load_pack`` (which imports a
trusted pack's tools) refuses such a directory instead of running its code.
``load_built_pack`` reads it instead: every ``EnvTool.func`` sends the call to the
sandbox (``sandboxed.SandboxExecutor``); the source is only parsed here, never run.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tools.envs.builder.sandboxed import SandboxExecutor, ToolSpec, pack_executor
from tools.envs.pack import EnvTask, EnvTool, Pack, PackInfo, dump_pack, read_tasks

__all__ = ["SANDBOXED", "assemble_source", "built_tools", "load_built_pack", "write_built_pack"]

SANDBOXED = "<sandboxed>"
TOOL_DOCUMENTS = "tools.json"
TOOL_SOURCE = "tools_source.py"


def assemble_source(sources: Mapping[str, str]) -> str:
    """One module of the tools' sources (each defines only its own function, so none clash)."""
    head = '"""Generated tool functions of a built environment pack: untrusted, run only in the sandbox."""\n'
    return head + "".join(f"\n\n# --- {name}\n{source.strip()}\n" for name, source in sources.items())


def built_tools(
    documents: Sequence[Mapping[str, Any]], source: str, executor: SandboxExecutor
) -> list[EnvTool]:
    """``EnvTool``s whose functions run ``source`` in the sandbox."""
    tools = []
    for doc in documents:
        spec = ToolSpec(doc["name"], doc.get("reads", []), doc.get("writes", []))
        description = doc["description"]
        if doc.get("output"):
            description = f"{description} Returns: {doc['output']}"
        tools.append(
            EnvTool(
                doc["name"],
                description,
                dict(doc["parameters"]),
                executor.tool_func(source, spec),
                writes=bool(spec.writes),
            )  # fmt: skip
        )
    return tools


def write_built_pack(
    root: Path,
    info: PackInfo,
    documents: Sequence[Mapping[str, Any]],
    source: str,
    state: dict[str, dict[str, Any]],
    tasks: Sequence[EnvTask],
    policy: str = "",
) -> Path:
    """Write a built pack directory (``dump_pack``'s files, then the sandboxed tools and metadata)."""
    shell = Pack(info, [], state, list(tasks), policy=policy, trusted=False)
    dump_pack(shell, root, tools_module=SANDBOXED)
    (root / TOOL_DOCUMENTS).write_text(json.dumps(list(documents), indent=1))
    (root / TOOL_SOURCE).write_text(source)
    meta = yaml.safe_load((root / "pack.yaml").read_text())
    meta.update(trusted=False, tool_documents=TOOL_DOCUMENTS, tool_source=TOOL_SOURCE)
    (root / "pack.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return root


def load_built_pack(path: str | Path, executor: SandboxExecutor | None = None) -> Pack:
    """A built (untrusted) pack whose tools run in the sandbox. ValueError names what is wrong.

    Without ``executor`` the pack gets sandbox workers of its own (no other pack's code
    ever runs in them), closed at exit.
    """
    root = Path(path).expanduser()
    meta_path = root / "pack.yaml"
    if not meta_path.is_file():
        raise ValueError(f"{root} is not an environment pack: no pack.yaml")
    meta = yaml.safe_load(meta_path.read_text()) or {}
    if not isinstance(meta, dict) or meta.get("trusted") is not False or meta.get("tools") != SANDBOXED:
        raise ValueError(f"{meta_path}: not a built pack (needs trusted: false and tools: {SANDBOXED!r})")
    try:
        documents = json.loads((root / str(meta.get("tool_documents", TOOL_DOCUMENTS))).read_text())
        source = (root / str(meta.get("tool_source", TOOL_SOURCE))).read_text()
        state = json.loads((root / "state.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{root}: cannot read the built pack: {exc}") from None
    try:
        ast.parse(source)  # syntax only: the code itself runs in the sandbox
    except SyntaxError as exc:
        raise ValueError(f"{root / TOOL_SOURCE}: syntax error line {exc.lineno}: {exc.msg}") from None
    tasks = read_tasks(root / "tasks.jsonl")
    info = PackInfo(
        **{k: str(meta[k]) for k in ("id", "version", "origin", "domain", "description") if k in meta}
    )
    policy = (root / str(meta["policy"])).read_text() if meta.get("policy") else ""
    tools = built_tools(documents, source, executor or pack_executor())
    return Pack(info, tools, state, tasks, policy=policy, trusted=False)
