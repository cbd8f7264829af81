"""JSON schemas and argument validators derived from a tool's typed signature.

Pydantic does the heavy lifting: one model per tool, built once at registration,
yields the MCP ``inputSchema``; a TypedDict of the same fields validates arguments
in well under a microsecond.
Descriptions come from ``Annotated[T, "text"]`` or the docstring's ``Args:`` section.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired, Required, get_args, get_origin, get_type_hints

import pydantic
from pydantic import ConfigDict, Field, TypeAdapter
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from protocol import ToolContext, ToolOutput, VerifyRequest, VerifyResult

# Unknown arguments are errors (a model's typo should not pass silently).
_ARGUMENTS_CONFIG = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


@dataclass(slots=True)
class Signature:
    """What the server needs to call a tool: validator, schemas, injected parameter."""

    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    validate: Callable[[dict[str, Any]], dict[str, Any]]  # raises pydantic.ValidationError
    context_param: str | None  # parameter that receives the ToolContext
    request_param: str | None  # verifiers: parameter that receives the VerifyRequest
    description: str


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary paragraph and per-argument text."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    arg_docs: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in lines:
        if _ARGS_HEADER.match(line):
            in_args, current = True, None
            continue
        if in_args:
            if line.strip() and not line.startswith((" ", "\t")):
                in_args = False  # next section
            else:
                match = _ARG_LINE.match(line)
                if match and (current is None or len(line) - len(line.lstrip()) <= 4):
                    current = match.group(1).lstrip("*")
                    arg_docs[current] = match.group(3).strip()
                elif current and line.strip():
                    arg_docs[current] += " " + line.strip()
                continue
        if not in_args and not arg_docs:
            summary.append(line)
    text = "\n".join(summary).strip()
    return text.split("\n\n")[0].strip() if text else "", arg_docs


def _is_context(annotation: Any) -> bool:
    if get_origin(annotation) is not None:
        return any(_is_context(a) for a in get_args(annotation) if a is not type(None))
    return annotation is ToolContext


def _output_schema(annotation: Any) -> dict[str, Any] | None:
    if annotation in (inspect.Signature.empty, None, str, ToolOutput, Any, VerifyResult):
        return None
    if get_origin(annotation) is not None and ToolOutput in get_args(annotation):
        return None
    try:
        schema = TypeAdapter(annotation).json_schema()
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError):
        return None
    # MCP requires an object schema for structured content.
    return schema if schema.get("type") == "object" else None


def derive_signature(fn: Callable[..., Any], name: str, description: str | None) -> Signature:
    """Inspect ``fn`` (a function or a callable instance) once, at registration."""
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(target, include_extras=True)
    except Exception as exc:  # unresolved forward references: say which tool
        raise TypeError(f"tool {name!r}: cannot resolve type hints: {exc}") from exc
    summary, arg_docs = parse_docstring(inspect.getdoc(fn if inspect.isroutine(fn) else type(fn)))
    if not summary and not inspect.isroutine(fn):
        summary, more = parse_docstring(inspect.getdoc(type(fn).__call__))
        arg_docs = {**more, **arg_docs}

    fields: dict[str, Any] = {}
    context_param = request_param = None
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if pname not in hints:  # its type is its schema: without one the model could send anything
            raise TypeError(
                f"parameter {pname!r} of tool {name!r} has no type annotation; annotate it "
                f"(e.g. '{pname}: str', or 'Any' to accept any JSON value): the annotation is its JSON schema"
            )
        annotation = hints[pname]
        if _is_context(annotation):
            context_param = pname
            continue
        if annotation is VerifyRequest:
            request_param = pname
            continue
        doc = arg_docs.get(pname)
        if get_origin(annotation) is Annotated:
            base, *extras = get_args(annotation)
            text = next((e for e in extras if isinstance(e, str)), None)
            extras = [e for e in extras if not isinstance(e, str)]
            doc = text or doc
            annotation = Annotated[(base, *extras)] if extras else base
        default = ... if param.default is param.empty else param.default
        fields[pname] = (annotation, Field(default, description=doc))

    model_name = re.sub(r"\W", "_", name) + "_arguments"
    model = pydantic.create_model(  # type: ignore[call-overload]
        model_name,
        __config__=_ARGUMENTS_CONFIG,
        **fields,
    )
    input_schema = model.model_json_schema()
    input_schema.pop("title", None)

    return Signature(
        input_schema=input_schema,
        output_schema=_output_schema(hints.get("return", inspect.Signature.empty)),
        validate=_dict_validator(model_name, fields),
        context_param=context_param,
        request_param=request_param,
        description=description or summary or f"The {name} tool.",
    )


def _dict_validator(name: str, fields: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Validate arguments straight into a fresh dict (ours to hand out and to add to).

    The same fields, defaults and rules as the tool's model, as a TypedDict: pydantic
    then builds no model instance per call, which was most of what validation cost
    (bench/README.md).
    """
    annotations = {
        pname: (Required if info.is_required() else NotRequired)[Annotated[annotation, info]]
        for pname, (annotation, info) in fields.items()
    }
    arguments_type = TypedDict(name, annotations)  # type: ignore[misc, operator]
    arguments_type.__pydantic_config__ = _ARGUMENTS_CONFIG  # type: ignore[attr-defined]
    return TypeAdapter(arguments_type).validator.validate_python  # type: ignore[return-value]


def format_validation_error(exc: pydantic.ValidationError) -> str:
    """One line per problem, naming the argument: what the model (or user) must fix."""
    problems = []
    for err in exc.errors(include_url=False)[:10]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        if err.get("type") == "extra_forbidden":
            problems.append(f"unexpected argument '{where}'")
        elif err.get("type") == "missing":
            problems.append(f"missing required argument '{where}'")
        else:
            problems.append(f"'{where}': {err.get('msg')}")
    return "; ".join(problems)
