"""OpenAI error bodies and statuses for bad keys and bad parameters."""

from __future__ import annotations

import pytest

from gateway.auth import ApiKeyAuthenticator, Team
from gateway.errors import ApiError, _param_of


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("body", "temperature"), "temperature"),
        (("body", "messages", 0, "role"), "messages[0].role"),
        (("body",), None),
    ],
)
def test_param_paths(loc: tuple[int | str, ...], param: str | None) -> None:
    assert _param_of(loc) == param


def test_api_error_body_has_openai_shape() -> None:
    body = ApiError(400, "bad", param="n", code="x").body()
    assert body == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": "x"}
    }


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic sk-llmq-dev", "Bearer wrong"])
def test_bad_keys_are_401(header: str | None) -> None:
    auth = ApiKeyAuthenticator({"sk-llmq-dev": "dev"})
    with pytest.raises(ApiError) as info:
        auth.team_for(header)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


def test_good_key_maps_to_its_team() -> None:
    auth = ApiKeyAuthenticator({"sk-a": "alpha", "sk-b": "beta"})
    assert auth.team_for("Bearer sk-b") == Team("beta")
    assert auth.team_for("bearer  sk-a ") == Team("alpha")
