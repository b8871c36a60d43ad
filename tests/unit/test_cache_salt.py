"""Prefix-cache salts: one per team, shared only by a deployment's named sets, never widened."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.deployment import Deployment


def _deployment(**extra: object) -> Deployment:
    return Deployment.model_validate({"name": "m", "path": "/none", "pool": "p", **extra})


def test_each_team_has_its_own_salt() -> None:
    d = _deployment()
    assert d.cache_salt("a") == d.cache_salt("a")
    assert len({d.cache_salt(t) for t in ("a", "b", "c", "shared")}) == 4


def test_a_shared_set_gives_its_teams_one_salt_and_no_one_else() -> None:
    d = _deployment(shared_cache_teams={"company": ["a", "b"]})
    assert d.cache_salt("a") == d.cache_salt("b")
    assert d.cache_salt("c") != d.cache_salt("a")
    # a team named like the set does not join it: set and team salts are kept apart
    assert d.cache_salt("company") != d.cache_salt("a")


def test_a_callers_salt_narrows_but_never_reaches_another_team() -> None:
    d = _deployment()
    mine = d.cache_salt("a", "secret")
    assert mine not in (d.cache_salt("a"), d.cache_salt("b"))
    assert mine != d.cache_salt("b", "secret")  # same caller salt, other team: still apart
    assert mine == d.cache_salt("a", "secret")
    # a caller cannot name another team's salt to join its cache
    assert d.cache_salt("a", d.cache_salt("b")) != d.cache_salt("b")


def test_a_team_in_two_shared_sets_is_a_configuration_error() -> None:
    with pytest.raises(ValidationError, match="two shared cache sets"):
        _deployment(shared_cache_teams={"x": ["a"], "y": ["a", "b"]})


def test_the_salt_never_contains_the_team_name() -> None:
    assert "support" not in _deployment().cache_salt("support")
