"""``trainer-client serve-model``: a local vLLM OpenAI-compatible server for the packaged model.

    trainer-client serve-model                    # SmolLM2-135M-Instruct on http://127.0.0.1:8001
    trainer-client rollout --engine vllm --engine-url http://127.0.0.1:8001 ...
    tool-server serve  # with TOOLFACTORY_LLM_BASE_URL=http://127.0.0.1:8001/v1 for the llm tool

Converts the packaged GGUF once (as every other command does), then runs vLLM from its own
environment (``make vllm``: ``.venv-vllm``) in the foreground until Ctrl-C. Arguments after
``--`` go to vLLM as they are.
"""

from __future__ import annotations

import argparse
import sys

from trainer_client.cli.subcommands import CliError, Subcommand, register_subcommand

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="smollm2",
        help="'smollm2' (packaged SmolLM2-135M-Instruct) or a local HF model dir",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8001, help="port (default 8001)")
    parser.add_argument(
        "--dtype",
        default=None,
        help="weights and activations (default: bfloat16 where the CPU computes it natively, "
        "AVX512-BF16 or AMX, else float32: emulated bf16 decodes 3-4x slower)",
    )
    parser.add_argument("--max-model-len", type=int, default=2048, help="context length (default 2048)")
    parser.add_argument(
        "--kv-cache-gib",
        type=float,
        default=1.0,
        help="KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE, default 1)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model: 2-3x faster decoding, but minutes to start the first time (default: eager)",
    )
    parser.add_argument(
        "--weight-sync",
        action="store_true",
        help="enable vLLM's development endpoints (/collective_rpc, /reset_prefix_cache) so a trainer can "
        "reload weights; they let any caller make the server read any path: keep it on loopback",
    )
    parser.add_argument("--python", default=None, help="python of the vLLM environment (default .venv-vllm)")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then arguments for vLLM itself")


def run(args: argparse.Namespace) -> int:
    from trainer_client.backends.models import DEFAULT_MODEL, SMOLLM2_DIRNAME, resolve_model_path
    from trainer_client.backends.vllm_server import VLLMServerSettings, cpu_dtype, local_vllm_server

    if args.weight_sync and args.host not in ("127.0.0.1", "localhost", "::1"):
        raise CliError("--weight-sync exposes endpoints that read any path: bind it to 127.0.0.1 only")
    try:
        model_dir = resolve_model_path(args.model)
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    extra = [a for a in args.vllm_args if a != "--"]
    settings = VLLMServerSettings(
        model_dir,
        served_model_name=DEFAULT_MODEL if model_dir.name == SMOLLM2_DIRNAME else model_dir.name,
        host=args.host,
        port=args.port,
        dtype=args.dtype or cpu_dtype(),
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        enforce_eager=not args.compile,
        weight_sync=args.weight_sync,
        python=args.python,
        extra_args=extra,
    )
    print(f"serve-model: starting vLLM for {model_dir} in {settings.dtype}", file=sys.stderr, flush=True)
    try:
        with local_vllm_server(settings, startup_timeout_s=1800.0, echo=True) as server:
            print(
                f"serve-model: ready after {server.started_s:.0f} s: {server.url}/v1 (model {server.model!r}); "
                "Ctrl-C stops it",
                file=sys.stderr,
                flush=True,
            )
            return server.proc.wait()
    except (FileNotFoundError, RuntimeError) as exc:
        raise CliError(str(exc)) from None


register_subcommand(
    Subcommand(
        "serve-model",
        "serve the packaged model (or a local HF dir) with vLLM's OpenAI-compatible server",
        configure,
        run,
        description="Serve the packaged SmolLM2-135M-Instruct (or a local HF model dir) with vLLM's "
        "OpenAI-compatible server, run from its own environment (make vllm: .venv-vllm), in the foreground "
        "until Ctrl-C. Arguments after -- go to vLLM.",
    )
)
