"""What generates the ``rollout`` command's turns: a local HF model, a vLLM server, or a replayed script.

Each backend returns ``(tokenizer, generator, renderer, session_for)``; ``session_for``
is None for a model, and for a script gives each trajectory a session id its turns are
assigned to (``load_script`` reads them from a JSONL file). ``engine_server`` starts the
local vLLM server ``--engine vllm`` needs when no ``--engine-url`` is given.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trainer_client.cli.subcommands import CliError
from trainer_client.rollout.dataset import TaskRow
from trainer_client.rollout.records import read_records
from trainer_client.rollout.runner import SessionFor

__all__ = [
    "ENGINES",
    "add_engine_arguments",
    "engine_server",
    "hf_backend",
    "load_script",
    "scripted_backend",
    "vllm_backend",
    "vllm_generator",
]

ENGINES = ("hf", "vllm")


def add_engine_arguments(group: Any, *, auto: bool = False) -> None:
    """``--engine`` and ``--engine-url``: the same two flags on ``rollout`` and the demo (whose
    default, ``auto``, is vLLM when .venv-vllm is installed: ``trainer_client.demo_engine``)."""
    group.add_argument(
        "--engine",
        choices=(*ENGINES, "auto") if auto else ENGINES,
        default="auto" if auto else "hf",
        help=(
            "'auto' (default): vLLM when .venv-vllm is installed or --engine-url is given, else 'hf'; "
            if auto
            else ""
        )
        + "'hf': transformers in this process"
        + ("" if auto else " (default)")
        + "; 'vllm': a vLLM OpenAI server, token ids in and out; without --engine-url one is started from "
        ".venv-vllm for --model (`make vllm`)",
    )
    group.add_argument(
        "--engine-url",
        default=None,
        metavar="URL",
        help="a running vLLM server for --engine vllm, e.g. http://127.0.0.1:8001 (trainer-client serve-model); "
        "it must serve --model (its tokenizer is checked)",
    )


@contextlib.contextmanager
def engine_server(args: argparse.Namespace) -> Iterator[None]:
    """For ``--engine vllm`` without ``--engine-url``: a local vLLM server for ``args.model``
    while the block runs (``args.engine_url`` set to it), always stopped afterwards."""
    if getattr(args, "engine", "hf") != "vllm" or args.engine_url:
        yield
        return
    from trainer_client.backends.models import DEFAULT_MODEL, SMOLLM2_DIRNAME, resolve_model_path
    from trainer_client.backends.vllm_server import VLLMServerSettings, cpu_dtype, local_vllm_server

    try:
        model_dir = resolve_model_path(args.model)
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    name = DEFAULT_MODEL if model_dir.name == SMOLLM2_DIRNAME else model_dir.name
    dtype = cpu_dtype()
    print(
        f"starting a vLLM server for {model_dir} in {dtype} (about a minute; longer on a busy machine)",
        file=sys.stderr,
    )
    with contextlib.ExitStack() as stack:
        try:  # only the start-up's failures are ours to explain; the block's own pass through
            server = stack.enter_context(
                local_vllm_server(
                    VLLMServerSettings(model_dir, served_model_name=name, dtype=dtype),
                    waiting=lambda s: print(
                        f"  vLLM still starting ({s:.0f} s)", file=sys.stderr, flush=True
                    ),
                )
            )
        except (FileNotFoundError, RuntimeError) as exc:
            raise CliError(str(exc)) from None
        print(f"vLLM ready at {server.url} after {server.started_s:.0f} s", file=sys.stderr)
        args.engine_url = server.url
        try:
            yield
        finally:
            args.engine_url = None


def hf_backend(args: argparse.Namespace, config: Any) -> tuple[Any, Any, Any, None]:
    """SmolLM2 or a local HF model on the CPU: (tokenizer, generator, renderer, None)."""
    import torch

    from trainer_client.backends.hf import HFGenerator
    from trainer_client.backends.models import load_model
    from trainer_client.templates.factory import make_renderer

    torch.manual_seed(args.seed)
    tokenizer, model = load_model(args.model)
    generator = HFGenerator(
        model, tokenizer, max_batch_size=args.batch_size, default_max_tokens=args.max_tokens
    )
    renderer = make_renderer(
        tokenizer, config.tool_result_template, chat_template_kwargs=config.chat_template_kwargs
    )
    return tokenizer, generator, renderer, None


async def vllm_generator(args: argparse.Namespace) -> tuple[Any, Any]:
    """(tokenizer, generator) for the vLLM server at ``args.engine_url``, checked to tokenize
    as ``args.model`` does (token ids only mean the same thing with one vocabulary)."""
    from trainer_client.backends.models import load_tokenizer
    from trainer_client.backends.vllm import VLLMError, VLLMGenerator

    if not args.engine_url:
        raise CliError("--engine vllm needs a server: pass --engine-url URL (or leave it out to start one)")
    tokenizer = load_tokenizer(args.model)
    generator = VLLMGenerator(
        args.engine_url, max_concurrency=args.concurrency, default_max_tokens=args.max_tokens
    )
    try:
        await generator.check_tokenizer(tokenizer)
    except VLLMError as exc:
        await generator.aclose()
        raise CliError(str(exc)) from None
    return tokenizer, generator


async def vllm_backend(args: argparse.Namespace, config: Any) -> tuple[Any, Any, Any, None]:
    """A vLLM server at ``args.engine_url``: (tokenizer, generator, renderer, None)."""
    from trainer_client.templates.factory import make_renderer

    tokenizer, generator = await vllm_generator(args)
    renderer = make_renderer(
        tokenizer, config.tool_result_template, chat_template_kwargs=config.chat_template_kwargs
    )
    return tokenizer, generator, renderer, None


def load_script(path: str | Path, rows: Sequence[TaskRow]) -> dict[int, list[str]]:
    """Scripted assistant turns per dataset row index, from a JSONL file.

    Each line is a JSON list of turn texts (line N is row N), or an object
    ``{"index": N, "turns": [...]}``; ``{"turns": [...]}`` without an index is the
    default for every row without its own turns. Every selected row must get turns.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise CliError(f"script {path} not found")
    by_index: dict[int, list[str]] = {}
    default: list[str] | None = None
    for line_number, entry in enumerate(read_records(path)):
        index, turns = _script_entry(entry, line_number, path)
        if index is None:
            default = turns
        else:
            by_index[index] = turns
    missing = [row.index for row in rows if row.index not in by_index and default is None]
    if missing:
        raise CliError(
            f'{path} has no turns for dataset row(s) {missing[:10]} and no default {{"turns": ...}}'
        )
    return {row.index: by_index.get(row.index, default or []) for row in rows}


def _script_entry(entry: Any, line_number: int, path: Path) -> tuple[int | None, list[str]]:
    where = f"{path} entry {line_number}"
    if isinstance(entry, list):
        index: Any = line_number
        turns = entry
    elif isinstance(entry, dict) and "turns" in entry:
        index, turns = entry.get("index"), entry["turns"]
    else:
        raise CliError(f'{where}: expected a list of turn texts or {{"index": N, "turns": [...]}}')
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        raise CliError(f"{where}: index must be an integer, got {index!r}")
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise CliError(f"{where}: turns must be a list of strings (the assistant's texts)")
    return index, turns


def scripted_backend(
    args: argparse.Namespace, config: Any, script: dict[int, list[str]]
) -> tuple[Any, Any, Any, SessionFor]:
    """A ``ScriptedGenerator`` replaying each row's turns: (tokenizer, generator, renderer,
    session_for). Every turn ends with the end-of-turn token, as a model's would, unless a
    stop string (``</tool_call>``, ``</answer>``) ends it first."""
    from protocol import new_session_id
    from trainer_client.backends.models import load_tokenizer
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.templates.factory import make_renderer

    tokenizer = load_tokenizer(args.model)
    renderer = make_renderer(
        tokenizer, config.tool_result_template, chat_template_kwargs=config.chat_template_kwargs
    )
    end = _end_of_turn_id(renderer, tokenizer)
    generator = ScriptedGenerator([], tokenizer=tokenizer, eos_token_ids=[end])
    turns = {
        index: [ScriptedTurn(renderer.codec.encode(text) + [end]) for text in texts]
        for index, texts in script.items()
    }

    def session_for(row: TaskRow, sample: int) -> str:
        session = new_session_id()
        generator.assign(session, turns[row.index])
        return session

    return tokenizer, generator, renderer, session_for


def _end_of_turn_id(renderer: Any, tokenizer: Any) -> int:
    """The token a chat model ends its turn with (ChatML: ``<|im_end|>``)."""
    if renderer.turn_end_ids and renderer.turn_end_ids[0] in renderer.eos_token_ids:
        return int(renderer.turn_end_ids[0])
    if renderer.eos_token_ids:
        return min(renderer.eos_token_ids)
    raise CliError("the tokenizer has no end-of-turn token; a scripted rollout needs one")
