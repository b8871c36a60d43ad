"""Failed authentications are throttled per client address, on a fake clock."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from gateway.auth import ApiKeyAuthenticator, FailedAuthThrottle, Team, hash_key
from gateway.errors import ApiError

GOOD, BAD = "sk-good-key", "sk-wrong-key"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_under_the_limit_passes_then_locked_out_until_the_window_ends(clock: FakeClock) -> None:
    throttle = FailedAuthThrottle(3, 60.0, now=clock)
    assert throttle.retry_after("10.0.0.1") is None
    assert [throttle.record_failure("10.0.0.1") for _ in range(2)] == [1, 2]
    assert throttle.retry_after("10.0.0.1") is None  # 2 of 3 allowed failures

    clock.t += 10.0
    assert throttle.record_failure("10.0.0.1") == 3
    # The window opened at the first failure: 50 s of it are left.
    assert throttle.retry_after("10.0.0.1") == 50
    clock.t += 49.5
    assert throttle.retry_after("10.0.0.1") == 1  # rounded up, never 0
    assert throttle.retry_after("10.0.0.2") is None  # other addresses are not affected

    clock.t += 0.5
    assert throttle.retry_after("10.0.0.1") is None  # the window passed
    assert throttle.record_failure("10.0.0.1") == 1  # and the count starts again
    assert len(throttle) == 1


def test_zero_allowed_locks_out_at_the_first_failure(clock: FakeClock) -> None:
    throttle = FailedAuthThrottle(0, 5.0, now=clock)
    assert throttle.retry_after("a") is None
    throttle.record_failure("a")
    assert throttle.retry_after("a") == 5


def test_memory_is_bounded_and_the_least_recent_address_goes_first(clock: FakeClock) -> None:
    throttle = FailedAuthThrottle(1, 60.0, max_clients=3, now=clock)
    for client in ["a", "b", "c"]:
        throttle.record_failure(client)
    throttle.record_failure("a")  # "a" failed most recently now; "b" least recently
    throttle.record_failure("d")
    assert len(throttle) == 3
    assert throttle.retry_after("b") is None  # forgotten
    assert all(throttle.retry_after(c) is not None for c in ["a", "c", "d"])


def _auth(clock: FakeClock, allowed: int = 2) -> ApiKeyAuthenticator:
    return ApiKeyAuthenticator(
        {GOOD: "alpha"}, throttle=FailedAuthThrottle(allowed, 60.0, now=clock)
    )


def test_a_locked_out_address_is_refused_even_with_a_good_key(clock: FakeClock) -> None:
    auth = _auth(clock)
    for header in [f"Bearer {BAD}", None]:  # a wrong key and a missing one both count
        with pytest.raises(ApiError) as info:
            auth.team_for(header, client="10.0.0.1")
        assert info.value.status == 401

    with pytest.raises(ApiError) as info:
        auth.team_for(f"Bearer {GOOD}", client="10.0.0.1")
    err = info.value
    assert (err.status, err.type, err.code) == (
        429,
        "rate_limit_error",
        "too_many_failed_authentications",
    )
    assert err.headers == {"Retry-After": "60"}
    assert err.body()["error"] == {
        "message": "Too many failed authentications from your address; retry after 60 seconds.",
        "type": "rate_limit_error",
        "param": None,
        "code": "too_many_failed_authentications",
    }

    # Another address with the good key passes; so does the first once its window passed.
    assert auth.team_for(f"Bearer {GOOD}", client="10.0.0.2") == Team("alpha")
    clock.t += 60.0
    assert auth.team_for(f"Bearer {GOOD}", client="10.0.0.1") == Team("alpha")


def test_a_success_does_not_reset_the_count(clock: FakeClock) -> None:
    auth = _auth(clock)
    with pytest.raises(ApiError):
        auth.team_for(f"Bearer {BAD}", client="c")
    auth.team_for(f"Bearer {GOOD}", client="c")
    with pytest.raises(ApiError):
        auth.team_for(f"Bearer {BAD}", client="c")
    with pytest.raises(ApiError) as info:
        auth.team_for(f"Bearer {GOOD}", client="c")
    assert info.value.status == 429


def test_without_a_throttle_or_an_address_nothing_is_throttled(clock: FakeClock) -> None:
    plain = ApiKeyAuthenticator({GOOD: "alpha"})
    throttled = _auth(clock, allowed=0)
    for auth in [plain, throttled]:
        for _ in range(3):
            with pytest.raises(ApiError) as info:
                auth.team_for(f"Bearer {BAD}")
            assert info.value.status == 401
        assert auth.team_for(f"Bearer {GOOD}") == Team("alpha")
    with pytest.raises(ApiError) as info:  # the plain one counts nothing, per address either
        plain.team_for(f"Bearer {BAD}", client="c")
    assert plain.team_for(f"Bearer {GOOD}", client="c") == Team("alpha")


def test_failures_are_logged_with_address_and_count_never_the_key(clock: FakeClock) -> None:
    auth = _auth(clock)
    with capture_logs() as logs:
        for _ in range(2):
            with pytest.raises(ApiError):
                auth.team_for(f"Bearer {BAD}", client="10.0.0.9")
        with pytest.raises(ApiError):
            auth.team_for(f"Bearer {GOOD}", client="10.0.0.9")  # refused, not a failure
    failed = [entry for entry in logs if entry["event"] == "auth_failed"]
    assert [(e["client"], e["failures"], e["reason"]) for e in failed] == [
        ("10.0.0.9", 1, "unknown_key"),
        ("10.0.0.9", 2, "unknown_key"),
    ]
    text = repr(logs)
    for secret in [BAD, GOOD, hash_key(BAD), hash_key(GOOD)]:
        assert secret not in text
