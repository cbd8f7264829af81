"""``build``: the five stages from a scenario to a checked, sandboxed environment pack.

decomposition -> documents -> functions -> tasks (complexity scaling) -> gate and
deployment. Each of the first four stages saves its accepted output under
``<out>/stages/`` as soon as it has it (functions and tasks item by item), so a rerun
with the same scenario and out dir skips what is done; the gate and the deployment are
deterministic and cheap, so they always run. ``<out>/report.json`` and ``report.txt``
say what every stage produced, accepted and rejected, and why.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tools.envs.builder.gate import run_gate
from tools.envs.builder.llm import BuildError, ChatModel, StageLog
from tools.envs.builder.loader import assemble_source, built_tools, load_built_pack, write_built_pack
from tools.envs.builder.report import Report
from tools.envs.builder.sandboxed import SandboxExecutor
from tools.envs.builder.stages import decompose, document, extend_toolset, integrate, scale
from tools.envs.pack import Complexity, EnvTask, Gold, GoldCall, Pack, PackInfo, call_depths
from tools.sandbox import SandboxError

__all__ = ["STAGES", "BuildConfig", "build"]

STAGES = ("decomposition", "documents", "functions", "tasks", "deployment")


@dataclass
class BuildConfig:
    scenario: str
    out: Path
    model: ChatModel
    attempts: int = 3  # answers asked per stage item before giving up on it
    tasks_per_level: int = 3
    levels: Sequence[int] = (1, 2, 3, 4)
    pack_id: str | None = None
    extend_toolset: bool = True  # add a distractor variant of each task without distractors
    parallel: int = 4  # model requests at once (tools of stage 3, levels of stage 4)
    small_model: bool = False  # guides shaped for a very small model (schemas: ``small``)
    progress: bool = True
    executor: SandboxExecutor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.scenario.strip():
            raise ValueError("the scenario is empty")
        if min(self.attempts, self.tasks_per_level, self.parallel) < 1:
            raise ValueError("attempts, tasks_per_level and parallel must be >= 1")
        bad = sorted(set(self.levels) - {1, 2, 3, 4})
        if bad or not self.levels:
            raise ValueError(f"levels must be among 1-4, got {list(self.levels)}")
        self.out = Path(self.out).expanduser()


class _StageFailed(Exception):
    """A stage ended without an acceptable output (the report says why)."""


class _Store:
    """Accepted stage outputs under ``<out>/stages``, tied to one scenario."""

    def __init__(self, out: Path, scenario: str) -> None:
        self.root = out / "stages"
        self.root.mkdir(parents=True, exist_ok=True)
        marker = self.root / "scenario.txt"
        if marker.is_file() and marker.read_text() != scenario:
            raise ValueError(f"{out} holds a build of another scenario: use another --out (or delete it)")
        marker.write_text(scenario)

    def load(self, name: str) -> dict[str, Any] | None:
        path = self.root / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def save(self, name: str, output: Any, log: StageLog, *, complete: bool = True) -> None:
        blob = {"complete": complete, "output": output, "log": log.to_dict()}
        (self.root / f"{name}.json").write_text(json.dumps(blob, indent=1))


def _resume(store: _Store, name: str, report: Report) -> tuple[Any, bool]:
    """(saved output or None, complete) — and the saved counts go into the report."""
    saved = store.load(name)
    if saved is None:
        return None, False
    report.stages[name] = StageLog.from_dict(saved["log"])
    return saved["output"], bool(saved["complete"])


def build(config: BuildConfig) -> Report:
    """Run the pipeline; never raises for what the model produced (see the report's status)."""
    report = Report(config.scenario, str(config.out))
    store = _Store(config.out, config.scenario)
    executor = config.executor or SandboxExecutor()
    bar = tqdm(total=len(STAGES), desc="build", unit="stage", disable=not config.progress)
    stage = STAGES[0]
    try:
        stage = "decomposition"
        decomposition = _once(
            store,
            report,
            stage,
            lambda log: decompose(
                config.model, config.scenario, log, config.attempts, small=config.small_model
            ),
        )
        bar.update()
        stage = "documents"
        documents = _once(
            store, report, stage,
            lambda log: document(
                config.model, config.scenario, decomposition, log, config.attempts, small=config.small_model
            ),
        )  # fmt: skip
        bar.update()
        stage = "functions"
        sources = _functions(config, store, report, decomposition, documents, executor)
        bar.update()
        stage = "tasks"
        raw_tasks = _tasks(config, store, report, documents, list(sources))
        bar.update()
        stage = "deployment"
        _deploy(config, report, decomposition, documents, sources, raw_tasks, executor)
        bar.update()
        report.status = "built"
    except (_StageFailed, BuildError) as exc:
        report.fail(stage, str(exc))
    except SandboxError as exc:  # generated code cannot be checked without the sandbox: stop, say why
        report.fail(stage, f"the sandbox cannot run generated code here: {exc}")
    finally:
        bar.close()
        if config.executor is None:
            executor.close()
        report.json_mode = str(config.model.json_mode)
        report.write(config.out)
    return report


def _once(
    store: _Store, report: Report, name: str, run: Callable[[StageLog], dict[str, Any] | None]
) -> dict[str, Any]:
    """A one-answer stage (decomposition, documents): its saved output, or the model's."""
    saved, complete = _resume(store, name, report)
    if complete:
        return saved
    log = report.stages[name] = StageLog()
    output = run(log)
    if output is None:
        raise _StageFailed(f"no acceptable {name} after the allowed attempts")
    store.save(name, output, log)
    return output


def _fan_out(
    config: BuildConfig, items: list[Any], job: Callable[[Any, StageLog], Any], desc: str, unit: str
) -> Iterator[tuple[Any, Any, StageLog]]:
    """``job(item, log)`` for each item, ``config.parallel`` at a time; (item, result, its log) as they finish.

    Each job logs into a StageLog of its own (merged by the caller, in one thread). When a
    job raises (the endpoint is down), jobs not started yet are cancelled, those running
    still hand in their results (so they are saved), and then the first error is raised.
    """
    failure: BaseException | None = None
    bar = tqdm(total=len(items), desc=desc, unit=unit, disable=not config.progress, leave=False)
    with ThreadPoolExecutor(max_workers=config.parallel) as pool:
        futures = {}
        for item in items:
            log = StageLog()
            futures[pool.submit(job, item, log)] = (item, log)
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                bar.update()
                if future.exception() is not None:
                    failure = failure or future.exception()
                    # cancel what has not started; a cancelled future never completes, so drop it
                    pending = {f for f in pending if not f.cancel()}
                    continue
                item, log = futures[future]
                yield item, future.result(), log
    bar.close()
    if failure is not None:
        raise failure


def _functions(
    config: BuildConfig,
    store: _Store,
    report: Report,
    decomposition: dict[str, Any],
    documents: dict[str, Any],
    executor: SandboxExecutor,
) -> dict[str, str]:
    saved, complete = _resume(store, "functions", report)
    output: dict[str, Any] = saved or {"sources": {}, "failed": []}
    if complete:
        return output["sources"]
    log = report.stages.setdefault("functions", StageLog())
    log.resumed = False
    done = set(output["sources"]) | set(output["failed"])
    todo = [t for t in documents["tools"] if t["name"] not in done]

    def job(tool: dict[str, Any], tool_log: StageLog) -> str | None:
        state = documents["initial_state"]
        return integrate(
            config.model,
            tool,
            decomposition,
            state,
            executor,
            tool_log,
            config.attempts,
            small=config.small_model,
        )

    for tool, source, tool_log in _fan_out(config, todo, job, "functions", "tool"):
        log.merge(tool_log)
        if source is None:
            output["failed"].append(tool["name"])
        else:
            output["sources"][tool["name"]] = source
        store.save("functions", output, log, complete=False)
    if not output["sources"]:
        raise _StageFailed("no tool got an acceptable implementation")
    store.save("functions", output, log)
    return output["sources"]


def _tasks(
    config: BuildConfig, store: _Store, report: Report, documents: dict[str, Any], tools: list[str]
) -> list[dict[str, Any]]:
    """Tasks of the configured levels; levels composed before are reused (a rerun may add levels)."""
    saved, _ = _resume(store, "tasks", report)
    output: dict[str, Any] = saved or {"levels": {}}
    todo = [lv for lv in config.levels if str(lv) not in output["levels"]]
    if todo:
        log = report.stages.setdefault("tasks", StageLog())
        log.resumed = False

        def job(level: int, level_log: StageLog) -> list[dict[str, Any]]:
            count = config.tasks_per_level
            return scale(
                config.model,
                level,
                count,
                documents,
                tools,
                level_log,
                config.attempts,
                small=config.small_model,
            )

        for level, composed, level_log in _fan_out(config, todo, job, "tasks", "level"):
            log.merge(level_log)
            output["levels"][str(level)] = composed
            store.save("tasks", output, log, complete=False)
        store.save("tasks", output, log)
    tasks = [task for level in sorted(config.levels) for task in output["levels"][str(level)]]
    if not tasks:
        raise _StageFailed("no level produced a valid task")
    return tasks


def _env_task(raw: dict[str, Any], task_id: str) -> EnvTask:
    calls = [
        GoldCall(c["name"], c["arguments"], c["id"], list(c.get("depends_on", [])), c.get("compare"))
        for c in raw["calls"]
    ]
    used = sorted({c.name for c in calls})
    answer = raw.get("answer") or None
    return EnvTask(
        id=task_id,
        prompt=[{"role": "user", "content": raw["prompt"]}],
        gold=Gold(calls, answer, list(raw.get("communicate", []))),
        complexity=Complexity.from_calls(calls, distractors=len(raw["distractors"]), scaling=raw["scaling"]),
        tools=used + list(raw["distractors"]),
        distractors=list(raw["distractors"]),
        # state even on a question: a write it did not ask for fails it
        reward_basis=["calls", "state"] + (["answer"] if answer else []),
        metadata={"origin": "built", "level_asked": raw["level"]},
    )


def _pack_id(config: BuildConfig, domain: str) -> str:
    if config.pack_id:
        return config.pack_id
    digest = hashlib.sha256(config.scenario.encode()).hexdigest()[:8]
    return f"built-{re.sub('[^a-z0-9]+', '-', domain.lower()).strip('-')}-{digest}"


def _deploy(
    config: BuildConfig,
    report: Report,
    decomposition: dict[str, Any],
    documents: dict[str, Any],
    sources: dict[str, str],
    raw_tasks: list[dict[str, Any]],
    executor: SandboxExecutor,
) -> None:
    docs = [t for t in documents["tools"] if t["name"] in sources]
    source = assemble_source({t["name"]: sources[t["name"]] for t in docs})
    counters: dict[int, int] = {}
    tasks = []
    for raw in raw_tasks:
        counters[raw["level"]] = counters.get(raw["level"], 0) + 1
        tasks.append(_env_task(raw, f"l{raw['level']}-{counters[raw['level']]}"))
    if config.extend_toolset:
        tasks += extend_toolset(tasks, list(sources), report.log("toolset extension"))
    info = PackInfo(
        _pack_id(config, decomposition["domain"]), origin="built", domain=decomposition["domain"],
        description=decomposition["description"],
    )  # fmt: skip
    draft = Pack(info, built_tools(docs, source, executor), documents["initial_state"], tasks, trusted=False)
    gate = run_gate(draft, source, executor, progress=config.progress)
    report.stages["gate: tools"], report.stages["gate: tasks"] = gate.tools, gate.tasks
    if not gate.accepted:
        raise _StageFailed("the gate accepted no task")
    kept = [t for t in docs if t["name"] not in gate.rejected_tools]
    kept_source = assemble_source({t["name"]: sources[t["name"]] for t in kept})
    root = write_built_pack(
        config.out / "pack", info, kept, kept_source, documents["initial_state"], gate.accepted,
        documents.get("policy", ""),
    )  # fmt: skip
    _check_deployed(root, executor, report)


def _check_deployed(root: Path, executor: SandboxExecutor, report: Report) -> None:
    """Load the written pack as a server would and replay every task: no error, the stored outputs."""
    log = report.stages["deployment"] = StageLog()
    pack = load_built_pack(root, executor)
    for task in pack.tasks:
        world = pack.replay(task)
        depths = call_depths(task.gold.calls)
        gold = sorted(task.gold.calls, key=lambda c: depths[c.id])  # replay's order
        errors = [c for c in world.calls if c.error]
        if errors:
            log.reject(task.id, f"after loading, gold call {errors[0].name} fails: {errors[0].error}")
        elif [c.output for c in world.calls] != [c.output for c in gold]:
            log.reject(task.id, "after loading, the replay's outputs differ from the stored ones")
        else:
            log.accept()
            report.levels[task.complexity.level] = report.levels.get(task.complexity.level, 0) + 1
    report.pack = str(root)
    if log.rejected:
        raise _StageFailed(f"{len(log.rejected)} task(s) do not replay after loading the written pack")
