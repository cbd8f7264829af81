"""The build report: per stage (and for the gate) the candidates produced, accepted, rejected and why."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.envs.builder.llm import StageLog

__all__ = ["Report"]


@dataclass
class Report:
    scenario: str
    out: str
    status: str = "running"  # built | failed
    failed_stage: str | None = None
    message: str = ""
    stages: dict[str, StageLog] = field(default_factory=dict)
    pack: str | None = None
    levels: dict[int, int] = field(default_factory=dict)
    json_mode: str = ""  # how answers were asked for, after any fallback (llm.ChatModel.json_mode)

    def log(self, name: str) -> StageLog:
        return self.stages.setdefault(name, StageLog())

    def fail(self, stage: str, message: str) -> None:
        self.status, self.failed_stage, self.message = "failed", stage, message

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "out": self.out,
            "status": self.status,
            "failed_stage": self.failed_stage,
            "message": self.message,
            "pack": self.pack,
            "json_mode": self.json_mode,
            "tasks_per_level": {str(k): v for k, v in sorted(self.levels.items())},
            "stages": {name: log.to_dict() for name, log in self.stages.items()},
        }

    def table(self, reasons: int = 3) -> str:
        """A text table, one row per stage, then a few rejection reasons of each."""
        rows = [f"{'stage':<18}{'candidates':>11}{'accepted':>10}{'rejected':>10}  note"]
        for name, log in self.stages.items():
            note = "resumed" if log.resumed else ""
            rows.append(f"{name:<18}{log.candidates:>11}{log.accepted:>10}{len(log.rejected):>10}  {note}")
        for name, log in self.stages.items():
            for item in log.rejected[:reasons]:
                rows.append(f"  {name}: {item['candidate']}: {item['reason'][:160]}")
            if len(log.rejected) > reasons:
                rows.append(f"  {name}: ... {len(log.rejected) - reasons} more in report.json")
        if self.json_mode:
            rows.append(f"JSON mode: {self.json_mode}")
        verdict = f"status: {self.status}"
        if self.failed_stage:
            verdict += f" at {self.failed_stage}: {self.message}"
        if self.pack:
            levels = ", ".join(f"level {k}: {v}" for k, v in sorted(self.levels.items()))
            verdict += f"\npack: {self.pack} ({levels or 'no tasks'})"
        return "\n".join([*rows, verdict])

    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(self.to_dict(), indent=1))
        (out / "report.txt").write_text(self.table(reasons=1000) + "\n")
