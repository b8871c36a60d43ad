"""The benchmark statistics: percentiles interpolate linearly between ranks, like numpy."""

from __future__ import annotations

import math

import pytest

from llmq.bench.stats import mean, percentile, ratio


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([], 99, None),
        ([7.0], 0, 7.0),
        ([7.0], 50, 7.0),
        ([7.0], 100, 7.0),
        ([1.0, 2.0], 50, 1.5),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 25, 1.75),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.5),  # order does not matter
        ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0),
        ([float(i) for i in range(1, 101)], 99, 99.01),
        ([float(i) for i in range(1, 101)], 90, 90.1),
        ([0.0, 10.0], 99, 9.9),
        ([5.0, 5.0, 5.0], 99, 5.0),
        ([-3.0, -1.0], 50, -2.0),
    ],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    result = percentile(values, q)
    if expected is None:
        assert result is None
    else:
        assert result is not None
        assert math.isclose(result, expected, rel_tol=1e-12, abs_tol=1e-12)


def test_percentile_accepts_any_iterable_and_leaves_input_alone() -> None:
    values = [3.0, 1.0, 2.0]
    assert percentile(iter(values), 50) == 2.0
    assert percentile((x for x in values), 100) == 3.0
    assert values == [3.0, 1.0, 2.0]


@pytest.mark.parametrize("q", [-0.1, 100.1, float("nan")])
def test_percentile_rejects_out_of_range_q(q: float) -> None:
    with pytest.raises(ValueError):
        percentile([1.0, 2.0], q)


def test_percentile_rejects_nan_values() -> None:
    with pytest.raises(ValueError):
        percentile([1.0, float("nan")], 50)


@pytest.mark.parametrize(("values", "expected"), [([], None), ([2.0], 2.0), ([1.0, 2.0, 6.0], 3.0)])
def test_mean(values: list[float], expected: float | None) -> None:
    assert mean(values) == expected


@pytest.mark.parametrize(
    ("num", "den", "expected"),
    [(2.0, 4.0, 0.5), (None, 4.0, None), (2.0, None, None), (2.0, 0.0, None), (0.0, 2.0, 0.0)],
)
def test_ratio(num: float | None, den: float | None, expected: float | None) -> None:
    assert ratio(num, den) == expected
