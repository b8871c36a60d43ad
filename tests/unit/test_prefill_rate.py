"""The vLLM adapter's prefill throughput: steps after an idle spell start at the submission."""

from __future__ import annotations

import pytest

from workers.engine.prefill_rate import PrefillRate


def test_a_step_after_an_idle_spell_is_timed_from_the_submission() -> None:
    rate = PrefillRate()
    rate.stepped(10.0, 0)  # the last step of earlier work
    rate.submitted(14.95, idle=True)  # five idle seconds later, a request arrives
    rate.stepped(15.0, 46)  # its prefill took 50 ms
    assert rate.tokens_per_s() == pytest.approx(46 / 0.05)


def test_a_step_while_busy_is_timed_from_the_step_before() -> None:
    rate = PrefillRate()
    rate.submitted(1.0, idle=True)
    rate.stepped(1.5, 100)
    rate.submitted(1.6, idle=False)  # arrives mid-step: prefilled in the next step
    rate.stepped(1.8, 0)
    rate.stepped(2.2, 60)
    assert rate.steps == ((100, 0.5), (60, pytest.approx(0.4)))
    assert rate.tokens_per_s() == pytest.approx(160 / 0.9)


def test_a_long_prefill_is_not_capped() -> None:
    """A slow machine's 13 s prefill of 500 tokens is 38 tokens/s, not 500."""
    rate = PrefillRate()
    rate.submitted(100.0, idle=True)
    rate.stepped(113.0, 500)
    assert rate.tokens_per_s() == pytest.approx(500 / 13)


def test_nothing_timed_reads_zero() -> None:
    rate = PrefillRate()
    rate.stepped(1.0, 50)  # no start known: the first record ever
    assert rate.tokens_per_s() == 0.0
    rate.stepped(2.0, 0)
    assert rate.tokens_per_s() == 0.0


def test_the_window_forgets_old_steps() -> None:
    rate = PrefillRate(window=2)
    rate.submitted(0.0, idle=True)
    for i in range(1, 4):
        rate.stepped(float(i), 10 * i)
    assert rate.steps == ((20, 1.0), (30, 1.0))
