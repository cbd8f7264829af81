"""BFCL v4 multi-turn categories as environment packs, read from the installed ``bfcl-eval``.

``pack(category="multi_turn_base")`` (also ``multi_turn_miss_func``,
``multi_turn_miss_param``, ``multi_turn_long_context``) gives one pack per category:

* **World**: one table, ``instances``, one record per BFCL API class a task involves
  (``state``). A task's ``state_patch`` holds its classes' scenarios.
* **Tools**: BFCL's function docs as descriptors; a call runs the method of that name on
  the session's instance with keyword arguments (nothing is ``eval``-ed). A method that
  answers ``{"error": ...}`` refused the request: that becomes a ``ToolError``, as does an
  exception (BFCL's "Error during execution"); the instance keeps whatever the method
  did before failing, as in BFCL.
* **Tasks**: one per BFCL entry. The prompt is the first user turn; the later turns are in
  ``metadata["turns"]`` for a driver that plays them as the user, ``metadata["turn_calls"]``
  lists each turn's gold call ids and ``metadata["tools_added"]`` the functions a
  miss_func entry reveals at a turn (in ``task.tools``, which the server enforces and the
  reward checks calls against, but for a driver to hide until then). ``gold.calls``
  is the whole ground truth, each call depending on the one before: BFCL runs them in
  order on stateful objects (``cd`` before ``mv``), checks the state after every turn
  and never lets a later turn's calls run early, so no order is safe to claim but this
  one. One task per entry (not per turn prefix) keeps BFCL's unit: the agent lives with
  the consequences of its earlier turns, and no gold output leaks into a prompt.
* **Verdict**: ``Pack.judge`` is BFCL's own checker (``verdict``), which the ``tool_use``
  reward reports as its score in eval mode. Schemas are BFCL's, except ``WIDENED``
  parameters, where BFCL's own data passes another type (its checker enforces none).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import mpmath
import orjson
from bfcl_eval.constants.default_prompts import (
    DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
    PROMPT_STYLE_TEMPLATES,
)

from protocol import ErrorKind, ToolError
from tools.envs.bfcl.calls import contained
from tools.envs.bfcl.data import CLASSES, Entry, entries, function_docs, parse_call, to_json_schema
from tools.envs.bfcl.state import TABLE, StateOf, api_class, copy_record, scenario
from tools.envs.bfcl.verdict import judge
from tools.envs.pack import Complexity, EnvTask, EnvTool, Gold, GoldCall, Pack, PackInfo
from tools.envs.world import World

__all__ = ["READ_ONLY", "TABLE", "WIDENED", "pack"]

# Functions that change nothing a later call or BFCL's state check reads (tests check the
# latter against every ground-truth call); all others are ``writes``, which the server never
# retries. So ``cd`` (a private cursor) and the vehicle's speed and weather readings (a
# private random stream) are writes, and every MathAPI function is a reader.
_READERS = {
    "GorillaFileSystem": ("cat", "diff", "du", "find", "grep", "ls", "pwd", "sort", "tail", "wc"),
    "MessageAPI": (
        "get_message_stats", "get_user_id", "list_users", "message_get_login_status", "search_messages",
        "view_messages_sent",
    ),
    "TwitterAPI": (
        "get_tweet", "get_tweet_comments", "get_user_stats", "get_user_tweets", "list_all_following",
        "posting_get_login_status", "search_tweets",
    ),
    "TicketAPI": ("get_ticket", "get_user_tickets", "ticket_get_login_status"),
    "TradingBot": (
        "filter_stocks_by_price", "get_account_info", "get_available_stocks", "get_current_time",
        "get_order_details", "get_order_history", "get_stock_info", "get_symbol_by_name",
        "get_transaction_history", "get_watchlist", "notify_price_change", "trading_get_login_status",
    ),
    "TravelAPI": (
        "compute_exchange_rate", "contact_customer_support", "get_all_credit_cards", "get_booking_history",
        "get_budget_fiscal_year", "get_credit_card_balance", "get_flight_cost", "get_nearest_airport_by_city",
        "list_all_airports", "retrieve_invoice", "travel_get_login_status", "verify_traveler_information",
    ),
    "VehicleControlAPI": (
        "check_tire_pressure", "displayCarStatus", "display_log", "estimate_distance",
        "estimate_drive_feasibility_by_mileage", "find_nearest_tire_shop", "gallon_to_liter",
        "get_outside_temperature_from_weather_com", "get_zipcode_based_on_city", "liter_to_gallon",
    ),
}  # fmt: skip
READ_ONLY = frozenset(name for names in _READERS.values() for name in names)


def pack(category: str = "multi_turn_base") -> Pack:
    """The BFCL multi-turn ``category`` as a pack (one task per entry)."""
    docs = function_docs()
    owner = {doc["name"]: name for name, class_docs in docs.items() for doc in class_docs}
    order = {
        method: list(inspect.signature(getattr(api_class(name), method)).parameters)[1:]  # without self
        for method, name in owner.items()
    }
    tools = [_tool(name, doc) for name, class_docs in docs.items() for doc in class_docs]
    by_class = {name: [doc["name"] for doc in class_docs] for name, class_docs in docs.items()}
    long_context = "long_context" in category
    tasks = [
        _task(entry, category, by_class, order, long_context=long_context) for entry in entries(category)
    ]
    info = PackInfo(
        id=f"bfcl_{category}",
        version=version("bfcl-eval"),
        origin="bfcl",
        domain="multi_turn",
        description=f"BFCL v4 {category}: {len(tasks)} multi-turn entries over {', '.join(CLASSES)}",
    )
    return Pack(
        info,
        tools,
        {TABLE: {}},
        tasks,
        policy=PROMPT_STYLE_TEMPLATES["classic"]["multiturn_behavior"],
        copier=copy_record,
        record_state=StateOf(),
        judge=judge,
    )


# --------------------------------------------------------------------------- tools


# Parameters whose served schema is wider than BFCL's doc, because BFCL's own data passes
# other types and BFCL checks none: entry 173 of every category keeps ticket 'ticket_001'
# (a string id where the doc says integer) and its gold closes it by that id. The methods
# find a ticket by equality, so any id type works as in BFCL; the description is BFCL's.
WIDENED: dict[tuple[str, str], list[str]] = {
    ("TicketAPI", "ticket_id"): ["integer", "string"],
}


def _tool(class_name: str, doc: dict[str, Any]) -> EnvTool:
    name = doc["name"]
    schema = to_json_schema(doc["parameters"])
    for parameter, spec in schema["properties"].items():
        if (class_name, parameter) in WIDENED:
            spec["type"] = WIDENED[class_name, parameter]
    return EnvTool(
        name=name,
        description=doc["description"],
        input_schema=schema,
        func=_method_call(class_name, name),
        writes=class_name != "MathAPI" and name not in READ_ONLY,
    )


def _method_call(class_name: str, method_name: str) -> Callable[..., Any]:
    """The tool function: ``method_name`` of the session's ``class_name`` instance, by keyword."""

    def run(world: World, **arguments: Any) -> Any:
        table = world[TABLE]
        if class_name not in table:
            raise ToolError(
                f"{method_name} is not available here: this task does not involve {class_name}",
                ErrorKind.UNKNOWN_TOOL,
            )
        method = getattr(table[class_name], method_name)
        try:
            bound = inspect.signature(method).bind(**arguments)
        except TypeError as exc:
            raise ToolError(f"{method_name}: {exc}", ErrorKind.INVALID_ARGUMENTS) from None
        # Copies, defaults included: methods keep what they are given (post_tweet stores its
        # mentions list, which mention later extends), and that must be neither the caller's
        # list (a gold call's) nor post_tweet's default [], which every session shares.
        bound.apply_defaults()
        with contained():
            try:
                result = method(**copy.deepcopy(bound.arguments))
            except Exception as exc:  # BFCL reports these as "Error during execution"
                raise ToolError(f"{method_name}: {type(exc).__name__}: {exc}", ErrorKind.TOOL_ERROR) from None
            refusal = _refusal(result)
            if refusal is not None:
                raise ToolError(refusal, ErrorKind.TOOL_ERROR)
            return _jsonable(result)  # in here: an mpf shows the digits of the call's precision

    run.__name__ = method_name
    return run


def _refusal(result: Any) -> str | None:
    """The message of an ``{"error": ...}`` answer (also ``[{"error": ...}]``), else None."""
    if isinstance(result, list) and len(result) == 1:
        result = result[0]
    if isinstance(result, dict) and set(result) == {"error"}:
        return str(result["error"])
    return None


def _jsonable(result: Any) -> Any:
    """A detached JSON copy of ``result``.

    Detached because methods hand out their live records (``get_ticket`` returns the
    ticket itself): a later call must not rewrite an output already logged. MathAPI's
    ``mpf`` numbers become floats, anything else JSON lacks its ``str``.
    """
    return orjson.loads(orjson.dumps(result, default=_json_default, option=orjson.OPT_NON_STR_KEYS))


def _json_default(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, mpmath.mpf):  # the digits BFCL shows: repr at the precision the method set
        return float(repr(value).removeprefix("mpf('").removesuffix("')"))
    return float(value) if hasattr(value, "__float__") else str(value)


# --------------------------------------------------------------------------- tasks


def _task(
    entry: Entry,
    category: str,
    by_class: dict[str, list[str]],
    order: dict[str, list[str]],
    *,
    long_context: bool,
) -> EnvTask:
    calls: list[GoldCall] = []
    turn_calls: list[list[str]] = []
    for turn, sources in enumerate(entry.ground_truth):
        ids = []
        for index, source in enumerate(sources):
            name, arguments = parse_call(source, order)
            call_id = f"t{turn}c{index}"
            calls.append(GoldCall(name, arguments, id=call_id, depends_on=[calls[-1].id] if calls else []))
            ids.append(call_id)
        turn_calls.append(ids)
    # Every function of the involved classes: what BFCL's executor runs. Its prompt holds
    # miss_func's functions back until their turn (metadata "tools_added": a driver hides
    # them until then); an entry's ``excluded_function`` BFCL never reads (metadata only).
    offered = [name for class_name in entry.involved_classes for name in by_class[class_name]]
    used = {call.name for call in calls}
    distractors = [name for name in offered if name not in used]
    # a miss_func turn has no user message: BFCL says this when it reveals the functions
    later_turns = [
        messages or [{"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]
        for messages in entry.turns[1:]
    ]
    return EnvTask(
        id=entry.id,
        prompt=entry.turns[0],
        gold=Gold(calls=calls),
        complexity=Complexity.from_calls(calls, distractors=len(distractors)),
        tools=offered,
        distractors=distractors,
        state_patch={
            TABLE: {
                name: scenario(name, entry.initial_config.get(name, {}), long_context=long_context)
                for name in entry.involved_classes
            }
        },
        reward_basis=["calls", "state"],
        metadata={
            "source": "bfcl",
            "category": category,
            "turns": later_turns,
            "turn_calls": turn_calls,
            "tools_added": {str(turn): names for turn, names in entry.missed.items()},
            "involved_classes": entry.involved_classes,
            "excluded_function": entry.excluded,
        },
    )
