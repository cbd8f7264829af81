"""Agent tools: tools that run other tools, in a fixed plan or in a loop.

An agent tool is an ordinary tool that takes a ``ToolContext``; ``ctx.call(name,
arguments)`` runs another tool through the server's executor (same limits, timeouts,
metrics) and returns a ``protocol.Result``. Two helpers keep such tools short:

* ``Tracer`` wraps the context and records every inner call (name, arguments,
  elapsed_ms, is_error, error kind), so the agent's structured output can show its
  work — useful for debugging and for rewards that look at the process.
* ``Plan`` / ``Step`` run a fixed sequence of calls whose arguments may depend on the
  inputs and on earlier results.

``research`` is the shipped example: search → read the top pages → summarise with the
``llm`` tool, with citations; without a working ``llm`` it falls back to extractive
notes and says so.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from protocol import ErrorKind, Result, ToolContext, ToolError, ToolOutput, tool

# ------------------------------------------------------------------------ tracing


class Tracer:
    """A ToolContext wrapper that records each inner call; use it wherever the context goes."""

    def __init__(self, ctx: ToolContext, *, max_argument_chars: int = 500) -> None:
        self.ctx = ctx
        self.trace: list[dict[str, Any]] = []
        self._max_argument_chars = max_argument_chars

    @property
    def session(self) -> Any:
        return self.ctx.session

    @property
    def call_id(self) -> str:
        return self.ctx.call_id

    async def call(self, name: str, arguments: dict[str, Any]) -> Result:
        started = time.perf_counter()
        try:
            result = await self.ctx.call(name, arguments)
        except Exception as exc:  # a context should return failures, but never let one escape
            result = Result.failure("", ErrorKind.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
        self.trace.append(
            {
                "name": name,
                "arguments": _clip(arguments, self._max_argument_chars),
                "elapsed_ms": round((time.perf_counter() - started) * 1000, 3),
                "is_error": result.is_error,
                "error_kind": result.error.kind.value if result.error else None,
            }
        )
        return result


def _clip(value: Any, limit: int) -> Any:
    """Long strings (a whole prompt, nested in messages too) are shortened in the trace, not in the call."""
    if isinstance(value, str):
        return value[:limit] + "…" if len(value) > limit else value
    if isinstance(value, dict):
        return {k: _clip(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clip(v, limit) for v in value]
    return value


# ------------------------------------------------------------------------- plans

Arguments = Mapping[str, Any] | Callable[["PlanState"], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Step:
    """One call of a plan.

    ``arguments`` is a mapping (string values may use ``{input_name}`` placeholders,
    filled from the plan's inputs) or a function of the ``PlanState`` so far.
    ``save_as`` names the result for later steps (default: the tool name).
    ``optional`` steps may fail without stopping the plan.
    """

    tool: str
    arguments: Arguments = field(default_factory=dict)
    save_as: str | None = None
    optional: bool = False

    @property
    def key(self) -> str:
        return self.save_as or self.tool


@dataclass(slots=True)
class PlanState:
    inputs: dict[str, Any]
    results: dict[str, Result] = field(default_factory=dict)
    trace: list[dict[str, Any]] = field(default_factory=list)
    failed: str | None = None  # key of the required step that failed, if any

    @property
    def ok(self) -> bool:
        return self.failed is None


class Plan:
    """A fixed sequence of tool calls, run through a ToolContext."""

    def __init__(self, *steps: Step) -> None:
        if not steps:
            raise ValueError("a plan needs at least one step")
        keys = [s.key for s in steps]
        duplicate = next((k for k in keys if keys.count(k) > 1), None)
        if duplicate:
            raise ValueError(f"two steps save their result as {duplicate!r}; give one a different save_as")
        self.steps = steps

    async def run(self, ctx: ToolContext, **inputs: Any) -> PlanState:
        """Run the steps in order; stop at the first failing required step."""
        tracer = ctx if isinstance(ctx, Tracer) else Tracer(ctx)
        state = PlanState(inputs=dict(inputs), trace=tracer.trace)
        for step in self.steps:
            arguments = self._arguments(step, state)
            result = await tracer.call(step.tool, arguments)
            state.results[step.key] = result
            if result.is_error and not step.optional:
                state.failed = step.key
                break
        return state

    @staticmethod
    def _arguments(step: Step, state: PlanState) -> dict[str, Any]:
        if callable(step.arguments):
            return dict(step.arguments(state))
        return {
            k: v.format_map(state.inputs) if isinstance(v, str) and "{" in v else v
            for k, v in step.arguments.items()
        }


# ---------------------------------------------------------------------- research

SEARCH_TOOL = "search"
LLM_TOOL = "llm"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_PAGE_CHARS = 1500  # how much of each page goes into the summary prompt


def search_hits(result: Result) -> list[dict[str, Any]]:
    """The hits of the first query from a search-shaped result ``{"results": [[hit, ...]]}``."""
    structured = result.structured if isinstance(result.structured, dict) else {}
    groups = structured.get("results") or []
    hits = groups[0] if groups and isinstance(groups[0], list) else groups
    return [h for h in hits if isinstance(h, dict)]


def first_sentences(text: str, count: int = 2, limit: int = 400) -> str:
    """The opening sentences of a page: the extractive fallback when no model is available."""
    sentences = _SENTENCE_END.split(" ".join(text.split()))
    summary = " ".join(sentences[:count])
    return summary if len(summary) <= limit else summary[: limit - 1] + "…"


def _summary_prompt(question: str, pages: list[dict[str, Any]]) -> list[dict[str, str]]:
    sources = "\n\n".join(f"[{p['n']}] {p['title']}\n{p['contents'][:_PAGE_CHARS]}" for p in pages)
    return [
        {
            "role": "system",
            "content": "You write short research notes. Use only the sources given. "
            "Cite each fact with its source number in brackets, like [1].",
        },
        {"role": "user", "content": f"Question: {question}\n\nSources:\n{sources}\n\nNotes:"},
    ]


@tool(name="research", kind="agent", timeout_s=300.0)
async def research(
    question: Annotated[str, "The question to research."],
    ctx: ToolContext,
    max_pages: Annotated[int, "How many of the top search results to read (1 to 10)."] = 3,
) -> ToolOutput:
    """Research a question: search, read the top pages, and write notes with citations."""
    question = question.strip() if isinstance(question, str) else ""
    if not question:
        raise ToolError("'question' must be a non-empty string", ErrorKind.INVALID_ARGUMENTS)
    if not 1 <= max_pages <= 10:
        raise ToolError(f"max_pages must be between 1 and 10, got {max_pages}", ErrorKind.INVALID_ARGUMENTS)
    tracer = Tracer(ctx)

    found = await tracer.call(SEARCH_TOOL, {"query": question, "topk": max_pages})
    if found.is_error:
        message = found.error.message if found.error else found.text
        raise ToolError(
            f"research could not search: {message}", found.error.kind if found.error else "tool_error"
        )
    pages = [
        {
            "n": n,
            "id": str(hit.get("id", "")),
            "title": str(hit.get("title") or hit.get("id") or f"result {n}"),
            "contents": str(hit.get("contents") or hit.get("text") or ""),
        }
        for n, hit in enumerate(search_hits(found)[:max_pages], 1)
    ]
    sources = [{"n": p["n"], "id": p["id"], "title": p["title"]} for p in pages]
    if not pages:
        structured = _research_output(question, "No pages found.", sources, "none", None, tracer.trace)
        return ToolOutput.text(f"No pages found for: {question}", structured)

    mode, fallback_reason = "llm", None
    summary = await tracer.call(LLM_TOOL, {"messages": _summary_prompt(question, pages), "temperature": 0.0})
    notes = summary.text.strip() if not summary.is_error else ""
    if summary.is_error or not notes:
        mode = "extractive"
        fallback_reason = (
            summary.error.message if summary.error else summary.text
        ) or "the model returned no text"
        notes = "\n".join(f"- {first_sentences(p['contents'])} [{p['n']}]" for p in pages)

    citation_lines = "\n".join(f"[{s['n']}] {s['title']} (id: {s['id']})" for s in sources)
    header = (
        ""
        if mode == "llm"
        else f"(Extractive notes: the {LLM_TOOL} tool was unavailable: {fallback_reason})\n"
    )
    text = f"{header}{notes}\n\nSources:\n{citation_lines}"
    return ToolOutput.text(
        text, _research_output(question, notes, sources, mode, fallback_reason, tracer.trace)
    )


def _research_output(
    question: str,
    notes: str,
    sources: list[dict[str, Any]],
    mode: str,
    fallback_reason: str | None,
    trace: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "question": question,
        "notes": notes,
        "sources": sources,
        "mode": mode,
        "fallback_reason": fallback_reason,
        "trace": trace,
    }
