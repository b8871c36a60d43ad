"""Bearer API keys -> teams. Keys are held only as SHA-256 hashes.

Guessing keys is slowed per client address: after `allowed` failed authentications within a
window, an address gets 429 until the window passes, before its key is even looked at (so a
locked-out address cannot keep testing keys, good ones included). Logs name the address and
the count, never a key or its hash.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from fastapi import Request

from gateway.errors import ApiError
from gateway.services.quota import TeamPolicy

log = structlog.get_logger()


@dataclass(frozen=True)
class Team:
    name: str
    policy: TeamPolicy = field(default_factory=TeamPolicy)


@dataclass(frozen=True)
class Caller:
    """Who sent a request to an API that both teams and admins use."""

    team: Team | None
    """The key's team; None for an admin key."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class _Window:
    started: float
    failures: int


class FailedAuthThrottle:
    """Failed authentications per client address, in memory (per gateway process).

    A fixed window opens at an address's first failure and lasts `window_s`: up to `allowed`
    failures pass (each a 401), then the address is locked out (429) until the window ends,
    when its count starts again from zero. Refused requests are not counted, so a lockout
    never outlasts its window; a successful authentication does not reset the count either
    (a client holding one good key gains nothing by interleaving guesses). `allowed=0` locks
    an address out at its first failure.

    Memory is bounded: at most `max_clients` addresses are tracked, and the one that failed
    least recently is forgotten first.
    """

    def __init__(
        self,
        allowed: int,
        window_s: float,
        *,
        max_clients: int = 100_000,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._allowed = allowed
        self._window_s = window_s
        self._max_clients = max_clients
        self._now = now
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def __len__(self) -> int:
        """Addresses tracked now."""
        return len(self._windows)

    def _current(self, client: str) -> _Window | None:
        window = self._windows.get(client)
        if window is not None and self._now() - window.started >= self._window_s:
            del self._windows[client]
            return None
        return window

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until `client` may authenticate again; None when it may now."""
        window = self._current(client)
        if window is None or window.failures < self._allowed:
            return None
        return max(1, math.ceil(window.started + self._window_s - self._now()))

    def record_failure(self, client: str) -> int:
        """Count a failed authentication of `client`; returns its failures in this window."""
        window = self._current(client)
        if window is None:
            window = self._windows[client] = _Window(self._now(), 0)
        window.failures += 1
        self._windows.move_to_end(client)
        while len(self._windows) > self._max_clients:
            self._windows.popitem(last=False)
        return window.failures


class ApiKeyAuthenticator:
    """Plain development keys plus each team's configured key hashes; with a throttle,
    failed authentications are counted per client address."""

    def __init__(
        self,
        keys: dict[str, str],
        policies: dict[str, TeamPolicy] | None = None,
        *,
        throttle: FailedAuthThrottle | None = None,
    ) -> None:
        policies = policies or {}

        def team(name: str) -> Team:
            return Team(name, policies.get(name, TeamPolicy()))

        self._teams_by_hash = {hash_key(key): team(name) for key, name in keys.items()}
        for name, policy in policies.items():
            for digest in policy.key_sha256:
                self._teams_by_hash[digest] = team(name)
        self._throttle = throttle
        self._admin_hashes: set[str] = set()

    def allow_admins(self, keys: list[str], hashes: list[str]) -> None:
        """Accept these admin keys (plain, development) and key hashes on the admin API."""
        self._admin_hashes = {hash_key(k) for k in keys} | {h.lower() for h in hashes}
        clash = self._admin_hashes & self._teams_by_hash.keys()
        if clash:
            raise ValueError(f"{len(clash)} key(s) are both a team key and an admin key")

    def admin_for(self, authorization: str | None, *, client: str | None = None) -> None:
        """Pass an admin key; 403 `permission_denied` for a team key, 401 for anything else."""
        self._check_throttle(client)
        digest = self._digest(authorization, client)
        if digest in self._admin_hashes:
            return
        if digest in self._teams_by_hash:
            raise ApiError(
                403,
                "This endpoint needs an admin key; team keys cannot manage deployments.",
                type_="permission_error",
                code="permission_denied",
            )
        self._failed(client, "unknown_key")
        raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    def team_for(self, authorization: str | None, *, client: str | None = None) -> Team:
        """The team of the Bearer key in `authorization` (401 otherwise). `client` is the
        caller's address; without one (or without a throttle) nothing is throttled."""
        self._check_throttle(client)
        digest = self._digest(authorization, client)
        team = self._teams_by_hash.get(digest)
        if team is not None:
            return team
        if digest in self._admin_hashes:
            raise ApiError(
                403,
                "This is an admin key: it manages deployments and cannot send requests; "
                "use a team's key.",
                type_="permission_error",
                code="permission_denied",
            )
        self._failed(client, "unknown_key")
        raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    def caller_for(self, authorization: str | None, *, client: str | None = None) -> Caller:
        """A team key's team, or an admin (`Caller.team` None); 401 for anything else."""
        self._check_throttle(client)
        digest = self._digest(authorization, client)
        team = self._teams_by_hash.get(digest)
        if team is not None:
            return Caller(team=team)
        if digest in self._admin_hashes:
            return Caller(team=None)
        self._failed(client, "unknown_key")
        raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    def knows_team(self, name: str) -> bool:
        """Whether `name` is a configured team."""
        return any(team.name == name for team in self._teams_by_hash.values())

    def _check_throttle(self, client: str | None) -> None:
        if self._throttle is not None and client is not None:
            wait = self._throttle.retry_after(client)
            if wait is not None:
                raise ApiError(
                    429,
                    "Too many failed authentications from your address; "
                    f"retry after {wait} seconds.",
                    type_="rate_limit_error",
                    code="too_many_failed_authentications",
                    headers={"Retry-After": str(wait)},
                )

    def _digest(self, authorization: str | None, client: str | None) -> str:
        """The SHA-256 of the Bearer key in `authorization` (401 when there is none)."""
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            self._failed(client, "missing_key")
            raise ApiError(
                401,
                "You didn't provide an API key. Provide it as a Bearer token in the "
                "Authorization header.",
                code="invalid_api_key",
            )
        return hash_key(key.strip())

    def _failed(self, client: str | None, reason: str) -> None:
        failures = None
        if self._throttle is not None and client is not None:
            failures = self._throttle.record_failure(client)
        log.info("auth_failed", client=client, reason=reason, failures=failures)


async def current_team(request: Request) -> Team:
    """FastAPI dependency: the team that owns the request's API key (401 otherwise; 429 while
    the caller's address is locked out after failed authentications).

    The gateway's dependencies are all `async def`, though none awaits: FastAPI runs a plain
    `def` dependency in its thread pool, two thread hops per request for dictionary lookups
    (6% of the gateway's event loop under a flood of 30 requests a second)."""
    authenticator: ApiKeyAuthenticator = request.app.state.authenticator
    client = request.client.host if request.client else None
    return authenticator.team_for(request.headers.get("authorization"), client=client)


async def current_admin(request: Request) -> None:
    """FastAPI dependency: the request carries an admin key (403 for a team key, else 401)."""
    authenticator: ApiKeyAuthenticator = request.app.state.authenticator
    client = request.client.host if request.client else None
    authenticator.admin_for(request.headers.get("authorization"), client=client)


async def current_caller(request: Request) -> Caller:
    """FastAPI dependency: a team key's team or an admin key (401 otherwise)."""
    authenticator: ApiKeyAuthenticator = request.app.state.authenticator
    client = request.client.host if request.client else None
    return authenticator.caller_for(request.headers.get("authorization"), client=client)
