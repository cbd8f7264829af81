"""What the demo prints at the end: a summary per task, one tool call per task that worked, and what
the numbers mean for a 135M model that was never trained on tools."""

from __future__ import annotations

from typing import Any

from trainer_client.rollout.summary import format_summary, summarize

__all__ = ["MEANING", "report", "tool_example"]

# One sentence per task: a newcomer reading "success rate 0.083" should know whether that is broken.
MEANING = {
    "search_qa": "SmolLM2-135M was never trained to search: it copies the <search> of the prompt's two "
    "worked examples, and an exact-match answer to a FanOutQA sub-question is hard (Search-R1's 3B models "
    "reach ~0.42 after RL training), so a few percent is what an untrained 135M model scores.",
    "arithmetic": "the calculator gets the right number whenever the model copies the operands; success "
    "needs that number inside <answer> too: ~0.2-0.3 at this temperature, which GRPO takes to ~0.73 "
    "(examples/learn_arithmetic.py).",
    "bank": "all or nothing (the right calls with the right arguments, the world's final state, the "
    "answer): copying the prompt's two worked examples, the untrained model solves some one-call tasks "
    "and few two-call ones; examples/learn_multistep.py trains it.",
}
_CLIP = 160


def tool_example(records: list[dict[str, Any]]) -> str | None:
    """One call that came back without an error, as ``tool: <what the model wrote> -> <what came back>``."""
    for record in records:
        messages = record.get("messages") or []
        for call in record.get("calls") or []:
            index = call.get("message", -1)
            if call.get("error") is not None or not 0 < index < len(messages):
                continue
            asked = _call_text(messages, index)
            answer = _clip(str(messages[index].get("content") or ""))
            return f"{call.get('name')}: {asked} -> {answer}"
    return None


def _call_text(messages: list[dict[str, Any]], result_index: int) -> str:
    """The model's turn that made the call (the assistant message before its result)."""
    for message in reversed(messages[:result_index]):
        if message.get("role") == "assistant":
            tool_calls = message.get("tool_calls")
            if tool_calls:
                function = tool_calls[0].get("function") or {}
                return _clip(f"{function.get('name')}({function.get('arguments')})")
            return _clip(str(message.get("content") or "").split("<information>")[0])
    return "?"


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _CLIP else text[: _CLIP - 3].rsplit(" ", 1)[0] + " ..."


def report(results: dict[str, Any], *, interrupted: bool = False) -> dict[str, Any]:
    """Print one summary per task (with a call that worked and what its numbers mean) and an
    overall one; returns the overall summary."""
    everything: list[dict[str, Any]] = []
    for name, result in results.items():
        if name.startswith("_"):
            continue
        everything += result["records"]
        summary = summarize(result["records"], wall_s=result["wall_s"])
        print(format_summary(summary, title=f"\n== {name}  ({result['out']})"))
        example = tool_example(result["records"])
        print(
            f"a tool call that worked:  {example}" if example else "no tool call came back without an error"
        )
        if name in MEANING:
            print(f"what this means: {MEANING[name]}")
    overall = summarize(everything, wall_s=results.get("_wall_s"), client_metrics=results.get("_client"))
    title = "\n== all tasks" + (": interrupted, only the trajectories that finished" if interrupted else "")
    print(format_summary(overall, title=title))
    first = next((r["out"] for n, r in results.items() if not n.startswith("_")), None)
    if first is not None:
        print(f"\ninspect a trajectory:  trainer-client show {first} --index 0")
    return overall
