"""The eval-mode reward of a τ² task is τ²'s own verdict, on imperfect trajectories too.

A real server serves the four τ² packs (telecom: its "small" split). Each sampled task's gold
is perturbed into trajectories of many kinds (a write dropped, repeated or moved first, a
read dropped or added, calls swapped or reversed, an argument changed in value or case, an
integer sent as a float and back, a failing call, ten of them, no calls, the run cut off or
ended by the customer; the facts told upper-cased, split, inside a longer number, with
commas, in other words, only inside a tool call or a thought, or not at all; telecom's solo
runs without ``done``, with a text turn, with a write after ``done``). Each plays in a session
through ``/v1/calls`` and is scored by ``/v1/verify`` (``tool_use``, eval mode), and by τ²'s own
``evaluate_simulation`` on the trajectory as τ²'s orchestrator records it. They must agree on
every one. ``bench/environments/reward_parity_tau2.py`` runs ≥100 tasks per domain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from tests.envs.tau2.parity import Outcome, outcome, perturbations
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs.pack import Pack
from tools.envs.tau2 import packs as tau2

pytestmark = pytest.mark.timeout(1800)
SPLITS = {"mock": None, "retail": None, "airline": None, "telecom": "small"}
PREFIXES = {"mock": "", "retail": "r_", "airline": "a_", "telecom": "t_"}  # τ²'s domains share tool names
# The sample: every mock task; retail tasks with facts to tell (one number, two amounts); an
# airline task whose write stores an integer as given (update_reservation_baggages: a float
# stays a float); telecom tasks of its "small" split, one judged on actions too.
SAMPLE = {
    "mock": None,
    "retail": ["3", "19"],
    "airline": ["21"],
    "telecom": [
        "[mobile_data_issue]data_mode_off[PERSONA:None]",
        "[service_issue]lock_sim_card_pin[PERSONA:Hard]",
    ],
}


@pytest.fixture(scope="module")
def packs() -> dict[str, Pack]:
    return {domain: tau2.pack(domain, split=split) for domain, split in SPLITS.items()}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    environments = [
        {
            "source": "tools.envs.tau2:pack",
            "prefix": PREFIXES[domain],
            "arguments": {"domain": domain, **({"split": split} if split else {})},
        }
        for domain, split in SPLITS.items()
    ]
    with running_server(server_config(environments=environments), startup_timeout_s=600) as srv:
        yield srv


@pytest.fixture(scope="module")
def outcomes(server: ServerProcess, packs: dict[str, Pack]) -> list[Outcome]:
    out = []
    for domain, pack in packs.items():
        wanted = SAMPLE[domain]
        tasks = pack.tasks if wanted is None else [pack.task(t) for t in wanted]
        for task in tasks:
            for trajectory in perturbations(domain, task):
                out.append(outcome(server.url, pack, domain, task, trajectory, PREFIXES[domain]))
    return out


def test_every_trajectory_gets_tau2s_own_reward(outcomes: list[Outcome]) -> None:
    per_domain = Counter((o.domain, o.agree) for o in outcomes)
    print({d: {"agree": per_domain[d, True], "disagree": per_domain[d, False]} for d in SPLITS})
    disagree = [(o.domain, o.task, o.kind, o.tau2, o.ours, o.reason) for o in outcomes if not o.agree]
    assert disagree == []
    # not vacuous: every domain has passing and failing non-gold trajectories
    for domain in SPLITS:
        rewards = Counter(o.tau2 for o in outcomes if o.domain == domain and o.kind != "gold")
        assert rewards[1.0] >= 2 and rewards[0.0] >= 5, (domain, rewards)
    assert all(o.tau2 == 1.0 for o in outcomes if o.kind == "gold")


def test_the_kinds_cover_the_ways_tau2_differs_from_the_finer_components(outcomes: list[Outcome]) -> None:
    """The sample holds the cases the issue names, each scored as τ² scores it."""
    kinds = {o.kind for o in outcomes}
    assert kinds >= {
        "dropped_write",
        "repeated_write",
        "write_moved_first",
        "swapped",
        "value_changed",
        "case_changed",
        "int_as_float",
        "failed_call_added",
        "too_many_errors",
        "cut_off",
        "user_stop",
        "facts_inside_longer",
        "facts_with_commas",
        "facts_other_words",
        "facts_split",
        "no_done",
        "text_before_done",
        "write_after_done",
    }

    def rewards(kind: str, domain: str | None = None) -> set[float]:
        return {o.tau2 for o in outcomes if o.kind == kind and domain in (None, o.domain)}

    assert rewards("facts_inside_longer") == {1.0}  # τ²: "10" is found in "1100"
    assert rewards("facts_with_commas") == {1.0}  # τ² drops commas before matching
    assert rewards("facts_other_words") == {0.0}
    assert 0.0 in rewards("int_as_float", "airline")  # τ²'s DB hash: 2.0 is not 2
    assert rewards("too_many_errors") == {0.0} and rewards("cut_off") == {0.0}
    assert rewards("no_done") == {0.0} and rewards("text_before_done") == {0.0}
