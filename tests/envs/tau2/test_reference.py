"""The parity checks' τ² environments (reference.py) are τ²'s ``get_environment``'s, each over its own DB."""

from __future__ import annotations

import pytest

from tests.envs.tau2 import reference
from tools.envs.tau2.domain import DOMAINS, load_domain


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_is_tau2s_own_environment_over_a_db_no_other_holds(domain: str) -> None:
    theirs = load_domain(domain).environment.get_environment()  # the DBs read from the package
    ours, other = reference.environment(domain), reference.environment(domain)
    assert type(ours) is type(theirs) and type(ours.tools) is type(theirs.tools)
    assert ours.get_policy() == theirs.get_policy() and not ours.solo_mode
    # pydantic's ==: the same model class and the same field values, records included
    assert ours.tools.db == theirs.tools.db and ours.tools.db is not other.tools.db
    db = ours.tools.db
    table = getattr(db, next(iter(type(db).model_fields)))
    table.popitem() if isinstance(table, dict) else table.pop()  # a record gone from this one only
    assert ours.tools.db != theirs.tools.db and other.tools.db == theirs.tools.db
    if theirs.user_tools is not None:  # telecom's phone
        assert ours.user_tools.db == theirs.user_tools.db
        for name in type(ours.user_tools.db).model_fields:
            assert getattr(ours.user_tools.db, name) is not getattr(other.user_tools.db, name)


def test_solo_environments_are_tau2s_solo_mode() -> None:
    theirs = load_domain("telecom").environment.get_environment(solo_mode=True)
    for ours in (reference.environment("telecom", solo_mode=True) for _ in range(2)):  # checked, then not
        assert ours.solo_mode and ours.get_policy() == theirs.get_policy()
        assert ours.tools.db == theirs.tools.db and ours.user_tools.db == theirs.user_tools.db
    with pytest.raises(ValueError, match="does not support solo mode"):
        reference.environment("retail", solo_mode=True)
