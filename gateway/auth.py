"""Bearer API keys -> teams. Keys are held only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fastapi import Request

from gateway.errors import ApiError


@dataclass(frozen=True)
class Team:
    name: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeyAuthenticator:
    def __init__(self, keys: dict[str, str]) -> None:
        self._teams_by_hash = {hash_key(key): Team(team) for key, team in keys.items()}

    def team_for(self, authorization: str | None) -> Team:
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "You didn't provide an API key. Provide it as a Bearer token in the "
                "Authorization header.",
                code="invalid_api_key",
            )
        team = self._teams_by_hash.get(hash_key(key.strip()))
        if team is None:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return team


def current_team(request: Request) -> Team:
    """FastAPI dependency: the team that owns the request's API key (401 otherwise)."""
    authenticator: ApiKeyAuthenticator = request.app.state.authenticator
    return authenticator.team_for(request.headers.get("authorization"))
