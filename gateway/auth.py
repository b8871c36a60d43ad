"""Bearer API keys -> teams. Keys are held only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from fastapi import Request

from gateway.errors import ApiError
from gateway.services.quota import TeamPolicy


@dataclass(frozen=True)
class Team:
    name: str
    policy: TeamPolicy = field(default_factory=TeamPolicy)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeyAuthenticator:
    """Plain development keys plus each team's configured key hashes."""

    def __init__(self, keys: dict[str, str], policies: dict[str, TeamPolicy] | None = None) -> None:
        policies = policies or {}

        def team(name: str) -> Team:
            return Team(name, policies.get(name, TeamPolicy()))

        self._teams_by_hash = {hash_key(key): team(name) for key, name in keys.items()}
        for name, policy in policies.items():
            for digest in policy.key_sha256:
                self._teams_by_hash[digest] = team(name)

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
