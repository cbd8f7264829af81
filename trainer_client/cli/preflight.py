"""Checks a command makes before any work: a typo costs one line, not a model load and a traceback.

Each raises ``CliError`` with what was wrong and the valid choices: the model (``smolm2``), the
server's verifier (``--verifier math_equl`` used to score every trajectory 0 and exit 0), and a
vLLM server the trainer must push weights into (``--engine-url`` of a server without weight sync
died at step 1, after the model was loaded).
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Sequence
from pathlib import Path

import httpx

from trainer_client.shared import CliError

__all__ = ["check_model", "check_verifier", "check_weight_sync", "server_verifiers", "unknown_choice"]

VERIFIER_PREFIX = "verify_"  # the server serves verifier NAME as tool verify_NAME (tool_server.registry)
_PACKAGED = ("smollm2",)


def unknown_choice(what: str, given: str, choices: Sequence[str]) -> str:
    """``unknown verifier 'math_equl' (did you mean 'math_equal'?); choose from: a, b, c``."""
    close = difflib.get_close_matches(given, choices, n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {what} {given!r}{guess}; choose from: {', '.join(sorted(choices)) or 'none'}"


def check_model(name_or_path: str) -> None:
    """The packaged SmolLM2 (by any of its names) or a local HF directory; nothing is loaded."""
    from trainer_client.backends.models import _SMOLLM2_ALIASES

    if name_or_path.lower() in _SMOLLM2_ALIASES:
        return
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return
    looks_like_a_name = "/" not in name_or_path and not path.exists()
    if looks_like_a_name:
        raise CliError(
            unknown_choice("model", name_or_path, _PACKAGED)
            + ", or a local Hugging Face model directory (no model hub is reachable)"
        )
    raise CliError(f"model {name_or_path!r}: not a Hugging Face model directory (no config.json in it)")


async def server_verifiers(urls: Sequence[str], token: str | None = None) -> list[str] | None:
    """The verifier names the server at ``urls`` serves this caller; None when it cannot be asked."""
    from trainer_client.client.tool_client import ToolClient

    try:
        async with ToolClient(list(urls), token=token) as client:
            tools = await client.list_tools("*")
    except Exception:  # unreachable, refused, DNS: the command's own health check says so next
        return None
    return [
        t["name"][len(VERIFIER_PREFIX) :] for t in tools if str(t.get("name", "")).startswith(VERIFIER_PREFIX)
    ]


def check_verifier(verifier: str | None, urls: Sequence[str], token: str | None = None) -> None:
    """``verifier`` is one the server serves (checked against its list when it answers)."""
    if not verifier:
        return
    names = asyncio.run(server_verifiers(urls, token))
    if names is None or verifier in names:
        return
    raise CliError(unknown_choice("verifier", verifier.removeprefix(VERIFIER_PREFIX), names))


def check_weight_sync(engine_url: str) -> None:
    """The vLLM server at ``engine_url`` answers and has the endpoint the trainer reloads weights through."""
    url = engine_url.rstrip("/")
    try:
        status = httpx.get(f"{url}/collective_rpc", timeout=10).status_code
    except httpx.HTTPError as exc:
        raise CliError(
            f"cannot reach the vLLM server at {url} ({type(exc).__name__}): is it running?"
        ) from None
    if status == 404:  # the route exists (POST only: 405 to a GET) only in vLLM's dev mode
        raise CliError(
            f"the vLLM server at {url} cannot take the trainer's weights: start it with "
            "`trainer-client serve-model --weight-sync` (or leave out --engine-url and the trainer starts one)"
        )
