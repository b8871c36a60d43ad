"""The direct vLLM server of `llmq bench overhead` binds its engine away from the worker's."""

from __future__ import annotations

from typing import Literal

import pytest

from llmq.bench import overhead


@pytest.mark.parametrize(
    ("cores", "expected"),
    [({0, 1}, "1"), ({0, 1, 2, 3}, "2,3"), ({4, 5, 6}, "5,6"), ({0}, "auto")],
)
def test_the_direct_engine_takes_the_upper_half_of_the_cores(
    monkeypatch: pytest.MonkeyPatch, cores: set[int], expected: str
) -> None:
    monkeypatch.setattr(overhead.os, "sched_getaffinity", lambda pid: cores)
    assert overhead.direct_omp_cores() == expected


@pytest.mark.parametrize(
    ("layout", "stack_pinned", "expected"),
    [("mirror", [1], [0]), ("floating", [1], []), ("mirror", [], [])],
)
def test_the_direct_front_end_mirrors_a_pinned_stack_unless_asked_to_float(
    monkeypatch: pytest.MonkeyPatch,
    layout: Literal["mirror", "floating"],
    stack_pinned: list[int],
    expected: list[int],
) -> None:
    monkeypatch.setattr(overhead.os, "sched_getaffinity", lambda pid: {0, 1})
    assert overhead.direct_pinned_cores(layout, "1", stack_pinned) == expected
