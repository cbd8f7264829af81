"""The GPU check: the HF backend and GRPO steps on one device, rollouts through a real tool server.

    bench/engines/gpu_check.sh [--device cuda|cpu] [--tiny] [--out FILE] [--steps 2] [--prompts 4] [--group 8]

For the day a GPU machine is lent: ``bench/engines/gpu_wheels.sh`` fetches here what its image lacks,
``bench/engines/gpu_check.sh`` installs that there and runs this. On a CPU with ``--tiny`` it takes
minutes, so CI keeps it working (tests/test_gpu_check.py). No weights travel: the model is
random, of Qwen2.5-0.5B's shape (``--tiny``: two narrow layers), with SmolLM2's tokenizer
and vocabulary. In this process, beside a tool server subprocess on loopback (calculator
tool, exact_match verifier), on the demo's arithmetic tasks (few-shot prompts):

1. demonstrations: scripted turns (call the calculator, then answer) played through the rollout
   core and the server, which checks the server's answers and its verifier on the way;
2. the random model, imprinted by supervised steps on those demonstrations, since a random
   model never writes a tool call. Half of them answer "unknown" after the tool's result, so
   that sampled answers, and a group's rewards, differ: GRPO learns only from groups whose
   rewards differ;
3. HF-backend decoding (``HFGenerator``) before the imprint: rows of 128 sampled tokens;
4. rollouts with the trainer's own HF generator (temperature 0.7, the demo's), through the
   server, twice (the first warms up): model tokens/s, trajectories/min, and the generate /
   tools / verify split;
5. seeded sampling: one seed gives the same tokens twice on this device;
6. GRPO steps (``GRPOTrainer.train_step``): step time split into rollout and update, and what
   the step did to the weights (``update_kept``: how much of AdamW's update the weights'
   dtype held).

Prints a summary, writes the JSON (``--out``) and exits 1 with the reasons when a stage
fails, a figure is missing or a GRPO step's weights kept under half of the update: it never
prints a figure it did not measure. A watchdog ends
the run at ``--deadline-s`` with what it has.
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import contextlib
import importlib.machinery
import importlib.util
import json
import math
import os
import platform
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
import traceback
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

# Qwen2.5-0.5B's shape (its config.json), with the vocabulary of the tokenizer that travels.
QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY = {
    **QWEN25_05B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
ROPE_THETA = 1_000_000.0
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)
DECODE_TOKENS = 128
# A group's answers after the tool's result: the result, or this (reward 0).
UNSURE = "unknown"


class CheckFailed(RuntimeError):
    """A stage did not do what the check needs; the message says what and where to look."""


# --------------------------------------------------------------------------- bookkeeping


class Report:
    """What the run measured, phase by phase; written as JSON however the run ends."""

    def __init__(self, path: Path, device: str) -> None:
        self.path = path
        self.device = device
        self.data: dict[str, Any] = {"ok": False, "phases": {}, "problems": [], "notes": []}
        self.current: str | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict[str, Any]]:
        """Times a phase (and its peak GPU memory); a failure names the phase it happened in."""
        self.current = name
        entry: dict[str, Any] = {}
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            yield entry
        finally:
            if self.device == "cuda":
                with contextlib.suppress(RuntimeError):  # after a CUDA error: keep that one
                    torch.cuda.synchronize()
                    entry["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
            entry["s"] = time.perf_counter() - t0
            self.data["phases"][name] = entry
            print(f"[gpu_check] {name}: {entry['s']:.1f} s", flush=True)

    def problem(self, message: str) -> None:
        self.data["problems"].append(message)
        print(f"[gpu_check] PROBLEM: {message}", file=sys.stderr, flush=True)

    def write(self) -> None:
        with self._lock:
            self.data["ok"] = not self.data["problems"]
            self.data["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            gpu = [p["peak_gpu_mib"] for p in self.data["phases"].values() if "peak_gpu_mib" in p]
            if gpu:
                self.data["peak_gpu_mib"] = max(gpu)
            total = time.perf_counter() - STARTED
            self.data["wall_s"] = total + float(os.environ.get("GPU_CHECK_INSTALL_S", 0) or 0)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.data, indent=2, default=str))
            os.replace(tmp, self.path)


def watchdog(report: Report, deadline_s: float) -> None:
    """Past the deadline: interrupt the main thread (its cleanup stops the server); if it
    is stuck in native code, write what was measured and exit."""

    def fire() -> None:
        report.problem(
            f"the check did not finish within --deadline-s {deadline_s:.0f} (in '{report.current}')"
        )
        _thread.interrupt_main()
        time.sleep(30)
        report.write()
        os._exit(1)

    timer = threading.Timer(deadline_s, fire)
    timer.daemon = True
    timer.start()


# --------------------------------------------------------------------------- environment


@contextlib.contextmanager
def ray_stand_in() -> Iterator[bool]:
    """An empty ``ray`` while veRL's loss modules are imported, if ray is not installed.

    veRL's modules import ray at the top (``verl.protocol``, its worker base) though the
    losses the trainer calls never use it, and ray's wheel (79 MB) is over what the GPU
    machine can be sent (64 MiB with the tree). Any use of the stand-in raises; it leaves
    ``sys.modules`` afterwards, so other libraries still see that ray is not installed.
    """
    if importlib.util.find_spec("ray") is not None:
        yield False
        return
    ray = types.ModuleType("ray", "stand-in from bench/engines/gpu_check.py: ray is not installed here")
    ray.__spec__ = importlib.machinery.ModuleSpec("ray", None)

    class ObjectRef:  # only named in annotations and isinstance checks at import
        pass

    def __getattr__(name: str) -> Any:
        raise AttributeError(f"ray.{name}: ray is not installed here (bench/engines/gpu_check.py's stand-in)")

    ray.ObjectRef = ObjectRef  # type: ignore[attr-defined]
    ray.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules["ray"] = ray
    try:
        yield True
    finally:
        if sys.modules.get("ray") is ray:
            del sys.modules["ray"]


def import_verl_losses() -> bool:
    """Import the veRL modules ``trainer_client.training`` uses; True if ray was stood in for."""
    with ray_stand_in() as stood_in:
        import verl.trainer.ppo.core_algos  # noqa: F401
        import verl.utils.torch_functional  # noqa: F401
        import verl.workers.config  # noqa: F401
    return stood_in


def versions() -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "carried_wheels": [
            p for p in sys.path if p.startswith(os.environ.get("GPU_CHECK_SITE", "/tmp/site"))
        ],
    }
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return info


def tokenizer_dir(given: str | None) -> Path:
    """``--tokenizer``, else the one gpu_wheels.sh carried, else the local SmolLM2's."""
    if given:
        return Path(given)
    carried = REPO / ".gpu_assets" / "tokenizer"
    if (carried / "tokenizer.json").is_file():
        return carried
    from trainer_client.backends.models import resolve_model_path

    return resolve_model_path("smollm2")


# --------------------------------------------------------------------------- model and data


def model_config(tokenizer: Any, shape: dict[str, Any]) -> Any:
    from transformers import Qwen2Config

    eos = int(tokenizer.eos_token_id)
    return Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        **shape,
    )


def prepare_model_dir(model_dir: Path, tokenizer_from: Path) -> Any:
    """The tokenizer's files in the model folder (the trainer's loader reads both from there)."""
    from transformers import AutoTokenizer

    model_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, model_dir / name)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tokenizer, "chat_template", None) or tokenizer.eos_token_id is None:
        raise CheckFailed(f"the tokenizer in {tokenizer_from} has no chat template or EOS token")
    return tokenizer


def random_model(config: Any, device: str, seed: int) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: seconds instead of a minute on CPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def write_tasks(path: Path, prompts: int, few_shot: int, seed: int) -> list[dict[str, Any]]:
    """The demo's arithmetic rows (veRL format): few-shot prompts, one calculator call each."""
    from tools.data import write_parquet
    from tools.data.arithmetic import build_rows

    rows = build_rows(n_train=prompts, n_test=0, seed=seed, few_shot=few_shot)["train"]
    write_parquet(rows, path)
    return rows


def server_config(path: Path) -> Path:
    config = {
        "tools": [{"target": "tools.calculator:calculator"}],
        "verifiers": [{"target": "tools.verifiers.match:exact_match"}],
        "server": {"shutdown_grace_s": 2},
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"({exc})"


def server_calls(url: str) -> dict[str, float]:
    """Calculator calls the server counted (its Prometheus text), by outcome, and cache hits."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(
            r'toolfactory_calls_total\{(?=[^}]*tool="calculator")[^}]*outcome="(\w+)"[^}]*\} (\S+)', line
        )
        if match:
            counts[match.group(1)] = counts.get(match.group(1), 0.0) + float(match.group(2))
        elif line.startswith("toolfactory_cache_hits_total "):
            counts["cache_hits"] = float(line.split()[1])
    return counts


# --------------------------------------------------------------------------- stages


async def demonstrations(
    url: str, tokenizer: Any, rollout_config: Any, tasks: list[Any], rows: list[dict[str, Any]]
) -> list[Any]:
    """Per task, two scripted trajectories through the server: the call, then the answer or
    ``UNSURE``. They must get the calculator's result and rewards 1 and 0."""
    from protocol import new_session_id
    from tools.data.arithmetic import tool_call_text
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.client.tool_client import ToolClient
    from trainer_client.rollout.core import RolloutCore

    def turn(text: str) -> ScriptedTurn:
        return ScriptedTurn(list(tokenizer.encode(text, add_special_tokens=False)))

    scripted = ScriptedGenerator([], tokenizer=tokenizer, eos_token_ids=[tokenizer.eos_token_id])
    async with ToolClient(url) as client:
        core = RolloutCore(tokenizer, scripted, client, rollout_config, verifier=client)
        runs = []
        for task, row in zip(tasks, rows, strict=True):
            call = turn(tool_call_text(row["extra_info"]["expression"]))
            for answer in (str(row["reward_model"]["ground_truth"]), UNSURE):
                session = new_session_id()
                scripted.assign(session, [call, turn(f"<answer>{answer}</answer>")])
                runs.append((answer != UNSURE, core.run(task, session_id=session)))
        trajectories = await asyncio.gather(*(run for _, run in runs))
    for (correct, _), t in zip(runs, trajectories, strict=True):
        answered = [c for c in t.calls if c["error"] is None]
        expected = 1.0 if correct else 0.0
        if t.error or len(answered) != 1 or t.reward_score != expected:
            raise CheckFailed(
                "a scripted trajectory did not get the calculator's answer and its reward through the "
                f"server (error {t.error!r}, calls {t.calls}, reward {t.reward_score} where {expected} was "
                f"due, stop {t.stop_reason}); the server log says more"
            )
    return list(trajectories)


def imprint(
    model: Any, demos: list[Any], *, steps: int, lr: float, target: float, pad_token_id: int, device: str
) -> dict[str, Any]:
    """Supervised steps on the demonstrations' model tokens (mask 1) until the mean loss is
    below ``target``; float32 weights, bfloat16 autocast on CUDA. A run whose loss turns
    non-finite or climbs above its start is restarted from the initial weights at a third of
    the learning rate (twice at most): the GPU's shape cannot be tried out here."""
    from trainer_client.backends.hf_prefix import prompt_prefix
    from trainer_client.training.logprobs import response_logprobs, shared_prefix

    prompts = [t.prompt_ids for t in demos]
    responses = [t.response_ids for t in demos]
    width = max(len(r) for r in responses)
    mask = torch.zeros((len(demos), width), device=device)
    for i, t in enumerate(demos):
        mask[i, : len(t.response_mask)] = torch.tensor(t.response_mask, dtype=torch.float32, device=device)
    shared = prompt_prefix(prompts)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    restarts: list[dict[str, Any]] = []
    model.train()
    while True:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        losses: list[float] = []
        for _ in range(steps):
            with autocast:  # the few-shot prefix all rows share runs once a step, as in the GRPO update
                prefix = shared_prefix(model, shared, detach=True) if shared else None
                log_prob, _ = response_logprobs(
                    model, prompts, responses, pad_token_id=pad_token_id, prefix=prefix
                )
            loss = -(log_prob * mask).sum() / mask.sum()
            loss.backward()
            if prefix is not None:
                prefix.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if losses[-1] < target or not math.isfinite(losses[-1]) or losses[-1] > losses[0]:
                break
        del optimizer
        if math.isfinite(losses[-1]) and losses[-1] <= losses[0]:
            break
        restarts.append({"lr": lr, "steps": len(losses), "loss_last": losses[-1]})
        if len(restarts) > 2:
            raise CheckFailed(f"the imprint diverged at every learning rate tried: {restarts}")
        model.load_state_dict(initial)
        lr /= 3
    model.eval()
    return {
        "steps": len(losses),
        "lr": lr,
        "restarts": restarts,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": [round(x, 3) for x in losses],
        "target": target,
        "tokens_per_step": int(mask.sum().item()),
        "rows": len(demos),
    }


async def decode(model: Any, tokenizer: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """``HFGenerator`` (the HF backend) samples ``DECODE_TOKENS`` tokens for every prompt in one batch."""
    from trainer_client.backends.hf import HFGenerator

    generator = HFGenerator(model, tokenizer, max_batch_size=len(prompts), default_max_tokens=DECODE_TOKENS)
    params = {"temperature": 1.0, "max_tokens": DECODE_TOKENS, "logprobs": True}
    try:
        await generator.generate(
            "warm-up", prompt_ids=prompts[0], sampling_params={**params, "max_tokens": 4}
        )
        t0 = time.perf_counter()
        outputs = await asyncio.gather(
            *(generator.generate(str(i), prompt_ids=p, sampling_params=params) for i, p in enumerate(prompts))
        )
        wall = time.perf_counter() - t0
    finally:
        await generator.aclose()
    tokens = sum(len(o.token_ids) for o in outputs)
    if any(len(o.log_probs or ()) != len(o.token_ids) for o in outputs):
        raise CheckFailed("the HF backend returned a log-prob count that differs from its token count")
    return {
        "rows": len(prompts),
        "batches": generator.batches[1:],
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "prompt_tokens": sum(len(p) for p in prompts),
    }


def rollout_figures(trajectories: list[Any], wall: float) -> dict[str, Any]:
    parts = {
        k: sum(float(t.metrics.get(k, 0.0)) for t in trajectories)
        for k in ("generate_s", "tool_s", "verify_s", "client_s")
    }
    calls = [c for t in trajectories for c in t.calls]
    tokens = sum(sum(t.response_mask) for t in trajectories)
    rewards = [t.reward_score for t in trajectories if t.reward_score is not None]
    return {
        "trajectories": len(trajectories),
        "wall_s": wall,
        "model_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "trajectories_per_min": 60.0 * len(trajectories) / wall,
        **{f"sum_{k}": v for k, v in parts.items()},
        "tool_share": (parts["tool_s"] + parts["verify_s"]) / max(sum(parts.values()), 1e-9),
        "calls": len(calls),
        "calls_answered": sum(1 for c in calls if c["error"] is None),
        "call_errors": dict(Counter(c["error"] for c in calls if c["error"] is not None)),
        "parse_errors": sum(int(t.metrics.get("parse_errors", 0)) for t in trajectories),
        "rewarded": len(rewards),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "stop_reasons": dict(Counter(str(t.stop_reason) for t in trajectories)),
        "errors": [t.error for t in trajectories if t.error][:3],
    }


async def seeded_twice(generator: Any, prompt: list[int]) -> dict[str, Any]:
    """One seed, two requests in one batch: the same tokens (the sampler's generator lives on
    the model's device)."""
    params = {"temperature": 1.0, "max_tokens": 16, "seed": 1234, "logprobs": True}
    a, b = await asyncio.gather(
        generator.generate("seeded-a", prompt_ids=prompt, sampling_params=params),
        generator.generate("seeded-b", prompt_ids=prompt, sampling_params=params),
    )
    return {"same_tokens": a.token_ids == b.token_ids, "tokens": len(a.token_ids)}


def weights_of(model: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def weight_change(
    before: list[torch.Tensor], model: Any, optimizer: torch.optim.Optimizer
) -> dict[str, float]:
    """How the step moved the weights: the fraction of elements changed, the change's norm
    relative to the weights', and ``update_kept``: the change projected on the AdamW update the
    optimizer meant (rebuilt from its moments), over that update's squared norm: 1.0 when the
    weights hold the update, less when their dtype rounds it away (bfloat16 at small lr)."""
    changed = total = 0
    delta_sq = norm_sq = meant_sq = along = 0.0
    for old, param in zip(before, model.parameters(), strict=True):
        diff = param.detach().float() - old.float()
        changed += int((diff != 0).sum())
        total += diff.numel()
        delta_sq += float(diff.pow(2).sum())
        norm_sq += float(old.float().pow(2).sum())
        state = optimizer.state.get(param)
        if state and "exp_avg" in state:
            group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
            step, (beta1, beta2) = float(state["step"]), group["betas"]
            denom = (state["exp_avg_sq"].float() / (1 - beta2**step)).sqrt() + group["eps"]
            meant = group["lr"] * (state["exp_avg"].float() / (1 - beta1**step) / denom)
            meant += group["lr"] * group["weight_decay"] * old.float()  # AdamW's decoupled decay
            meant_sq += float(meant.pow(2).sum())
            along -= float((diff * meant).sum())  # the step subtracts ``meant``
    return {
        "changed_fraction": changed / total,
        "relative_change": math.sqrt(delta_sq / norm_sq) if norm_sq else 0.0,
        "update_kept": along / meant_sq if meant_sq else 0.0,
    }


# --------------------------------------------------------------------------- the run


async def run_trainer(args: argparse.Namespace, report: Report, config: Any, url: str) -> None:
    """Steps 4-6 on one event loop: the trainer's rollouts, seeded sampling, GRPO steps."""
    from trainer_client.training.grpo import GRPOTrainer

    data = report.data
    with report.phase("trainer_load"):
        trainer = GRPOTrainer(config)
    try:
        tasks = [t for t in trainer.train_tasks[: args.prompts] for _ in range(args.group)]
        data["rollouts"] = []
        for name in ("rollout_warmup", "rollout"):
            with report.phase(name) as entry:
                trainer.generator.clear_prefix_cache()
                t0 = time.perf_counter()
                trajectories = await trainer.train_core.run_batch(
                    tasks, max_concurrency=config.max_concurrency
                )
                entry.update(rollout_figures(trajectories, time.perf_counter() - t0))
                entry["generation_batches"] = Counter(trainer.generator.batches).most_common(4)
                trainer.generator.batches.clear()
            data["rollouts"].append(name)
        with report.phase("seeded_sampling") as entry:
            try:
                entry.update(await seeded_twice(trainer.generator, trajectories[0].prompt_ids))
            except Exception as exc:  # reported; the GRPO steps still run
                report.problem(f"seeded sampling failed: {type(exc).__name__}: {exc}")
        data["grpo"] = []
        for _ in range(args.steps):
            before = weights_of(trainer.model)
            with report.phase(f"grpo_step_{trainer.step + 1}") as entry:
                record = await trainer.train_step()
                entry.update(
                    {
                        k: record[k]
                        for k in record
                        if k.startswith("time/")
                        or k
                        in (
                            "reward",
                            "success",
                            "pg_loss",
                            "grad_norm",
                            "trained_rows",
                            "groups_with_signal",
                            "rollout_tokens_per_s",
                            "tool_calls_per_s",
                            "tool_calls",
                            "parse_errors",
                        )
                    }
                )
                entry.update(weight_change(before, trainer.model, trainer.optimizer))
            del before
            data["grpo"].append(f"grpo_step_{trainer.step}")
    finally:
        await trainer.close()


def check(report: Report) -> None:
    """The figures a working run must have; each miss is a problem with what to look at."""
    phases = report.data["phases"]
    decode = phases.get("decode", {})
    if not decode.get("tokens_per_s", 0) > 0:
        report.problem("the HF backend decoded no tokens")
    for name in report.data.get("rollouts", []):
        r = phases[name]
        if r["errors"]:
            report.problem(f"{name}: trajectories failed: {r['errors']}")
        if not r["model_tokens"] > 0 or not r["tokens_per_s"] > 0:
            report.problem(f"{name}: no model tokens generated")
        if not r["calls_answered"] > 0:
            report.problem(
                f"{name}: no tool call was answered by the server ({r['calls']} calls, {r['parse_errors']} "
                f"parse errors): the imprint did not take (imprint loss {phases['imprint'].get('loss_last')})"
            )
        if r["rewarded"] != r["trajectories"]:
            report.problem(
                f"{name}: {r['trajectories'] - r['rewarded']} trajectories got no reward from the server"
            )
    if phases.get("seeded_sampling", {}).get("same_tokens") is False:
        report.problem(
            "one seed gave different tokens twice (seeded sampling is not reproducible on this device)"
        )
    steps = report.data.get("grpo", [])
    if not steps:
        report.problem("no GRPO step ran")
    for name in steps:
        s = phases[name]
        if not s.get("trained_rows", 0) > 0 or not s.get("groups_with_signal", 0) > 0:
            report.problem(f"{name}: no group had differing rewards, so the step trained nothing")
        elif not s["changed_fraction"] > 0:
            report.problem(f"{name}: the optimizer step left every weight as it was")
        elif (lost := update_lost(name, s, report.data["model"])) is not None:
            report.problem(lost)


# A step whose weights hold less of the optimizer's update than this did not train: the rest
# was rounded away by the weights' dtype (bfloat16 at the trainer's small lr, on CUDA).
MIN_UPDATE_KEPT = 0.5


def update_lost(name: str, step: dict[str, Any], model: dict[str, Any]) -> str | None:
    """Why ``step`` failed to train if its weights kept under ``MIN_UPDATE_KEPT`` of AdamW's
    update (a problem, not a note: a run that loses most of each update learns next to nothing);
    None when they kept enough."""
    if step["update_kept"] >= MIN_UPDATE_KEPT:
        return None
    return (
        f"{name}: the {model['dtype']} weights kept {100 * step['update_kept']:.0f} % of AdamW's update at lr "
        f"{model['lr']} (under {100 * MIN_UPDATE_KEPT:.0f} %; {100 * step['changed_fraction']:.1f} % of them "
        "changed, the rest of the update was rounded away): the step did not train; keep float32 weights "
        "(float32 keeps it all) or raise --lr"
    )


def summary(report: Report) -> str:
    d, p = report.data, report.data["phases"]
    lines = [f"gpu_check on {d.get('versions', {}).get('gpu', d['device'])}: {'OK' if d['ok'] else 'FAILED'}"]
    if "model" in d:
        m = d["model"]
        lines.append(
            f"model: {m['shape']} ({m['params'] / 1e6:.0f} M parameters, {m['dtype']}), vocab {m['vocab']}"
        )
    if "decode" in p:
        x = p["decode"]
        lines.append(
            f"HF decode: {x['rows']} rows x {DECODE_TOKENS} tokens: {x['tokens_per_s']:.0f} tokens/s"
        )
    for name in d.get("rollouts", []):
        r = p[name]
        lines.append(
            f"{name}: {r['trajectories']} trajectories in {r['wall_s']:.1f} s: {r['tokens_per_s']:.0f} model tokens/s, "
            f"{r['trajectories_per_min']:.0f} trajectories/min; {r['calls_answered']}/{r['calls']} calls answered; "
            f"reward {r['reward_mean'] if r['reward_mean'] is None else round(r['reward_mean'], 3)}; "
            f"time in generate {r['sum_generate_s']:.1f} s, tools {r['sum_tool_s']:.2f} s, verify "
            f"{r['sum_verify_s']:.2f} s (summed over trajectories)"
        )
    for name in d.get("grpo", []):
        s = p[name]
        lines.append(
            f"{name}: {s.get('time/step_s', 0):.1f} s (rollout {s.get('time/rollout_s', 0):.1f}, update "
            f"{s.get('time/update_s', 0):.1f}); {s.get('rollout_tokens_per_s', 0):.0f} rollout tokens/s; "
            f"trained rows {s.get('trained_rows')}, weights changed {100 * s.get('changed_fraction', 0):.1f} %, "
            f"update kept {100 * s.get('update_kept', 0):.0f} %"
        )
    if "peak_gpu_mib" in d:
        lines.append(f"peak GPU memory: {d['peak_gpu_mib']:.0f} MiB")
    lines.append(
        f"wall: {d['wall_s']:.0f} s; phases: " + ", ".join(f"{k} {v['s']:.1f}" for k, v in p.items())
    )
    lines += [f"note: {n}" for n in d["notes"]] + [f"PROBLEM: {x}" for x in d["problems"]]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--tiny", action="store_true", help="two narrow layers instead of Qwen2.5-0.5B's shape"
    )
    parser.add_argument(
        "--out", help="the JSON summary (default: $OUT/gpu_check.json, else ./gpu_check.json)"
    )
    parser.add_argument(
        "--tokenizer", help="a tokenizer folder (default: .gpu_assets/tokenizer, else SmolLM2's)"
    )
    parser.add_argument("--prompts", type=int, default=4, help="prompts per rollout batch and GRPO step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (the GRPO group)")
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps")
    parser.add_argument(
        "--few-shot", type=int, default=3, help="worked examples in each prompt (the demo's 3)"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.7, help="rollout sampling temperature (the demo's)"
    )
    parser.add_argument("--lr", type=float, default=1e-5, help="GRPO learning rate (the trainer's default)")
    parser.add_argument(
        "--imprint-steps", type=int, default=None, help="most imprint steps (150 tiny, 300 else)"
    )
    parser.add_argument(
        "--imprint-lr", type=float, default=None, help="imprint learning rate (3e-3 tiny, 5e-4 else)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--deadline-s", type=float, default=450.0, help="end the run after this long")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json")
    report = Report(out, args.device)
    report.data["device"] = args.device
    watchdog(report, args.deadline_s)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise CheckFailed(
                "--device cuda but torch sees no GPU (torch.cuda.is_available() is False); "
                "use --device cpu --tiny on a machine without one"
            )
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            run(args, report, Path(tmp))
        check(report)
    except CheckFailed as exc:
        report.problem(str(exc))
    except KeyboardInterrupt:  # the watchdog's (it said why), or Ctrl-C
        if not report.data["problems"]:
            report.problem(f"interrupted in '{report.current}'")
    except Exception as exc:
        traceback.print_exc()
        report.problem(f"{type(exc).__name__} in '{report.current}': {exc}")
    report.write()
    print(summary(report), flush=True)
    print(f"[gpu_check] wrote {out}", flush=True)
    return 0 if report.data["ok"] else 1


def run_dtype(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float32"


def grpo_config(args: argparse.Namespace, work: Path, url: str) -> Any:
    """The trainer's config: the demo's arithmetic rows, one rollout batch per step, a
    short response budget (a call, its result, an answer)."""
    from trainer_client.training.config import GRPOConfig

    cuda = args.device == "cuda"
    return GRPOConfig(
        train_data=str(work / "train.parquet"),
        server=[url],
        out_dir=str(work / "run"),
        model=str(work / "model"),
        device=args.device,
        dtype=run_dtype(args.device),
        threads=args.threads,
        seed=args.seed,
        steps=args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group,
        micro_batch_size=32 if cuda else 8,
        micro_batch_tokens=32768 if cuda else 2048,
        lr=args.lr,
        format="hermes",
        tool_schemas="none",  # the prompt describes the calculator
        max_turns=3,
        max_calls_per_turn=2,
        max_obs_tokens=64,
        response_length=192,
        max_tokens_per_turn=64,
        temperature=args.temperature,
        verifier="exact_match",
        max_concurrency=args.prompts * args.group,
        generation_batch_size=args.prompts * args.group,
        eval_at_start=False,
        save_every=0,
        resume=False,
        tensorboard=False,
        plot=False,
    )


def run(args: argparse.Namespace, report: Report, work: Path) -> None:
    from trainer_client.demo import tool_server
    from trainer_client.rollout.dataset import TaskRow

    data, cuda = report.data, args.device == "cuda"
    with report.phase("imports"):
        if import_verl_losses():
            data["notes"].append("ray is not installed: veRL's modules were imported with a stand-in")
        data["versions"] = versions()
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    shape = TINY if args.tiny else QWEN25_05B
    dtype = run_dtype(args.device)
    log = work / "server.log"
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: data.__setitem__("server_log_tail", tail(log)))  # after the server stopped
        with report.phase("server_start"):
            url = stack.enter_context(tool_server(log, config=str(server_config(work / "server.yaml"))))
        with report.phase("tasks"):
            tokenizer = prepare_model_dir(work / "model", tokenizer_dir(args.tokenizer))
            rows = write_tasks(work / "train.parquet", args.prompts * args.steps, args.few_shot, args.seed)
            config = grpo_config(args, work, url)
            tasks = [TaskRow.from_row(row, i).task() for i, row in enumerate(rows)]
        with report.phase("demonstrations") as entry:
            demos = asyncio.run(demonstrations(url, tokenizer, config.rollout_config(), tasks, rows))
            entry["trajectories"] = len(demos)
            entry["model_tokens_each"] = sorted({sum(t.response_mask) for t in demos})
        with report.phase("model_build"):
            model = random_model(model_config(tokenizer, shape), args.device, args.seed)
            params = sum(p.numel() for p in model.parameters())
            data["model"] = {
                "shape": "tiny" if args.tiny else "Qwen2.5-0.5B",
                "layers": shape["num_hidden_layers"],
                "hidden": shape["hidden_size"],
                "params": params,
                "vocab": len(tokenizer),
                "dtype": dtype,
                "lr": args.lr,
            }
        with report.phase("decode") as entry:
            model.to(getattr(torch, dtype))
            prompts = [demos[i % len(demos)].prompt_ids for i in range(args.prompts * args.group)]
            entry.update(asyncio.run(decode(model, tokenizer, prompts)))
            model.to(torch.float32)
        with report.phase("imprint") as entry:
            entry.update(
                imprint(
                    model,
                    demos,
                    steps=args.imprint_steps or (150 if args.tiny else 300),
                    lr=args.imprint_lr or (3e-3 if args.tiny else 5e-4),
                    target=0.05,
                    pad_token_id=int(model.config.pad_token_id),
                    device=args.device,
                )
            )
        with report.phase("model_save"):
            model.to(getattr(torch, dtype)).save_pretrained(work / "model")
            del model
            if cuda:
                torch.cuda.empty_cache()
        asyncio.run(run_trainer(args, report, config, url))
        data["server_calls"] = server_calls(url)


if __name__ == "__main__":
    sys.exit(main())
