"""Agent tools run real tools in-process through a context that behaves like the executor's:
``research`` over a small corpus with semantic search and SmolLM2 behind a real HTTP
endpoint, its extractive fallback, and the ``Plan``/``Step``/``Tracer`` helpers."""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
import pytest

from protocol import ErrorKind, Result, ToolError, ToolOutput, get_tool_meta, new_call_id
from tests.support.openai_server import Faults, create_app, dead_url, serve_in_thread, shared_chat_model
from tools.agents import Plan, Step, Tracer, first_sentences, research
from tools.calculator import calculator
from tools.llm import LlmTool
from tools.search.dense import DenseSearchTool
from tools.testing import echo, fail

PAGES = [
    ("paris", "Paris", "Paris is the capital and largest city of France. It lies on the river Seine."),
    ("lyon", "Lyon", "Lyon is the third-largest city of France. It is known for its cuisine."),
    ("berlin", "Berlin", "Berlin is the capital of Germany. It has about 3.8 million inhabitants."),
    ("nile", "Nile", "The Nile is a river in northeastern Africa. It flows into the Mediterranean Sea."),
    ("jazz", "Jazz", "Jazz is a music genre that began in New Orleans. It features improvisation."),
]


class InProcessContext:
    """A ToolContext whose ``call`` runs tool objects directly, shaping outputs as the executor does."""

    def __init__(self, tools: dict[str, Callable[..., Any]]) -> None:
        self.tools = tools
        self.session = None
        self.call_id = "outer"

    async def call(self, name: str, arguments: dict[str, Any]) -> Result:
        call_id = new_call_id()
        fn = self.tools.get(name)
        if fn is None:
            return Result.failure(call_id, ErrorKind.UNKNOWN_TOOL, f"no tool named {name!r}")
        try:
            out = fn(**arguments)
            if inspect.isawaitable(out):
                out = await out
        except ToolError as exc:
            return Result.failure(call_id, exc.kind, exc.message)
        except Exception as exc:
            return Result.failure(call_id, ErrorKind.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
        if isinstance(out, ToolOutput):
            return Result(call_id, out.content, out.structured, out.is_error)
        if isinstance(out, str):
            return Result(call_id, [{"type": "text", "text": out}])
        return Result(call_id, [{"type": "text", "text": orjson.dumps(out).decode()}], out)


@pytest.fixture(scope="module")
def llm_endpoint() -> Iterator[tuple[str, Faults]]:
    faults = Faults()
    with serve_in_thread(create_app(shared_chat_model(), faults)) as url:
        yield url + "/v1", faults


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> DenseSearchTool:
    root = tmp_path_factory.mktemp("corpus")
    corpus = root / "pages.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": i, "title": t, "contents": c}) for i, t, c in PAGES))
    tool = DenseSearchTool(corpus=str(corpus), cache_dir=str(root / "cache"), progress=False)
    tool.load()
    return tool


@pytest.fixture
async def llm(llm_endpoint: tuple[str, Faults]) -> AsyncIterator[LlmTool]:
    llm_endpoint[1].reset()
    tool = LlmTool(base_url=llm_endpoint[0], model="smollm2", max_tokens=40)
    yield tool
    await tool.shutdown()


# ---------------------------------------------------------------------- research


def test_research_is_an_agent_tool_with_an_injected_context() -> None:
    from tool_server.schema import derive_signature

    assert get_tool_meta(research).kind == "agent"
    sig = derive_signature(research, "research", None)
    assert sig.context_param == "ctx"
    assert set(sig.input_schema["properties"]) == {"question", "max_pages"}


async def test_research_searches_reads_and_summarises_with_citations(
    search: DenseSearchTool, llm: LlmTool, llm_endpoint: tuple[str, Faults]
) -> None:
    ctx = InProcessContext({"search": search, "llm": llm})
    out = await research(question="What is the capital of France?", ctx=ctx, max_pages=2)
    data = out.structured
    assert data["mode"] == "llm" and data["fallback_reason"] is None
    assert data["sources"][0] == {"n": 1, "id": "paris", "title": "Paris"}
    assert len(data["sources"]) == 2
    assert data["notes"].strip()  # the model's own words

    trace = data["trace"]
    assert [t["name"] for t in trace] == ["search", "llm"]
    assert trace[0]["arguments"] == {"query": "What is the capital of France?", "topk": 2}
    assert not any(t["is_error"] for t in trace) and all(t["elapsed_ms"] > 0 for t in trace)

    prompt = llm_endpoint[1].bodies[-1]["messages"][-1]["content"]  # what the model was shown
    assert "[1] Paris\nParis is the capital and largest city of France." in prompt
    text = out.content[0]["text"]
    assert text.startswith(data["notes"])
    second = data["sources"][1]
    assert text.endswith(f"Sources:\n[1] Paris (id: paris)\n[2] {second['title']} (id: {second['id']})")


async def test_research_falls_back_to_extractive_notes_when_the_model_is_down(
    search: DenseSearchTool,
) -> None:
    dead = LlmTool(base_url=dead_url() + "/v1", model="m", max_retries=0)
    ctx = InProcessContext({"search": search, "llm": dead})
    try:
        out = await research(question="Which river flows into the Mediterranean?", ctx=ctx, max_pages=1)
    finally:
        await dead.shutdown()
    data = out.structured
    assert data["mode"] == "extractive"
    assert "unavailable" in data["fallback_reason"] and "/chat/completions" in data["fallback_reason"]
    assert (
        data["notes"]
        == "- The Nile is a river in northeastern Africa. It flows into the Mediterranean Sea. [1]"
    )
    assert data["trace"][1] == {
        **data["trace"][1],
        "name": "llm",
        "is_error": True,
        "error_kind": "unavailable",
    }
    assert out.content[0]["text"].startswith("(Extractive notes: the llm tool was unavailable:")


async def test_research_without_an_llm_tool_still_answers(search: DenseSearchTool) -> None:
    out = await research(
        question="Where did jazz begin?", ctx=InProcessContext({"search": search}), max_pages=1
    )
    assert out.structured["mode"] == "extractive"
    assert out.structured["sources"][0]["id"] == "jazz"
    assert "no tool named 'llm'" in out.structured["fallback_reason"]


async def test_research_reports_a_failed_search() -> None:
    with pytest.raises(ToolError) as err:
        await research(question="anything", ctx=InProcessContext({}))
    assert err.value.kind == ErrorKind.UNKNOWN_TOOL
    assert "research could not search" in err.value.message


@pytest.mark.parametrize(
    ("kwargs", "needle"), [({"question": "  "}, "non-empty"), ({"max_pages": 0}, "between 1 and 10")]
)
async def test_research_rejects_bad_arguments(kwargs: dict[str, Any], needle: str) -> None:
    arguments = {"question": "q", **kwargs}
    with pytest.raises(ToolError) as err:
        await research(ctx=InProcessContext({}), **arguments)
    assert err.value.kind == ErrorKind.INVALID_ARGUMENTS and needle in err.value.message


def test_first_sentences() -> None:
    assert first_sentences("One. Two! Three? Four.", count=2) == "One. Two!"
    assert first_sentences("Dr. no split here because lower case follows. Next.").startswith("Dr. no split")
    assert first_sentences("x" * 1000, limit=10) == "x" * 9 + "…"


# ------------------------------------------------------------------ plan helpers


async def test_plan_threads_inputs_and_results_through_real_tools() -> None:
    plan = Plan(
        Step("calculator", {"expression": "{a} * {b}"}, save_as="product"),
        Step("calculator", lambda s: {"expression": f"{s.results['product'].structured['result']} + 1"}),
        Step("echo", lambda s: {"text": f"answer={s.results['calculator'].text}"}),
    )
    state = await plan.run(InProcessContext({"calculator": calculator, "echo": echo}), a=6, b=7)
    assert state.ok
    assert state.results["product"].structured["result"] == 42
    assert state.results["calculator"].text == "43"
    assert state.results["echo"].structured["text"] == "answer=43"
    assert [t["arguments"] for t in state.trace][:2] == [{"expression": "6 * 7"}, {"expression": "42 + 1"}]


async def test_plan_stops_at_a_failing_required_step_but_not_an_optional_one() -> None:
    ctx = InProcessContext({"echo": echo, "fail": fail})
    state = await Plan(
        Step("fail", {"message": "soft"}, optional=True),
        Step("echo", {"text": "still here"}),
        Step("fail", {"message": "hard"}, save_as="hard"),
        Step("echo", {"text": "never"}, save_as="after"),
    ).run(ctx)
    assert not state.ok and state.failed == "hard"
    assert state.results["echo"].structured["text"] == "still here"
    assert "after" not in state.results
    assert [t["is_error"] for t in state.trace] == [True, False, True]
    assert state.trace[2]["error_kind"] == "tool_error"


def test_plan_rejects_ambiguous_steps() -> None:
    with pytest.raises(ValueError, match="save their result as 'echo'"):
        Plan(Step("echo"), Step("echo"))
    with pytest.raises(ValueError, match="at least one step"):
        Plan()


async def test_tracer_clips_long_arguments_in_the_trace_only() -> None:
    tracer = Tracer(InProcessContext({"echo": echo}), max_argument_chars=10)
    result = await tracer.call("echo", {"text": "y" * 50})
    assert result.structured["text"] == "y" * 50
    assert tracer.trace[0]["arguments"] == {"text": "y" * 10 + "…"}
    assert tracer.call_id == "outer" and tracer.session is None


async def test_tracer_turns_a_raising_context_into_an_error_result() -> None:
    class Broken:
        session = None
        call_id = "x"

        async def call(self, name: str, arguments: dict[str, Any]) -> Result:
            raise ConnectionError("executor gone")

    result = await Tracer(Broken()).call("echo", {})
    assert result.is_error and "executor gone" in result.error.message


async def test_tracer_clips_nested_strings() -> None:
    tracer = Tracer(InProcessContext({"echo": echo}), max_argument_chars=4)
    await tracer.call("echo", {"text": "ok", "data": {"messages": [{"role": "user", "content": "z" * 9}]}})
    assert tracer.trace[0]["arguments"]["data"] == {"messages": [{"role": "user", "content": "zzzz…"}]}
