"""The evaluation suite's scores and verdict, and shadow sampling from job topics (fakes of
the gateway and the topic reader)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import pytest

from llmq.eval_cli import DEFAULT_SUITE, format_scores, parse_since
from llmq.evaluation import (
    EvalPrompt,
    is_json,
    is_refusal,
    load_suite,
    run_suite,
    score,
    verdict,
    word_f1,
)
from llmq.shadow import sample_prompts
from schemas.messages import InferenceJob, SamplingSettings


def test_word_f1_json_and_refusal_checks() -> None:
    assert word_f1("the cat sat", "the cat sat") == 1.0
    assert word_f1("the cat", "a dog") == 0.0
    assert word_f1("the cat sat", "the cat") == pytest.approx(0.8)
    assert is_json('{"a": 1}') and is_json("```json\n[1, 2]\n```")
    assert not is_json('"just a string"') and not is_json("{a: 1}")
    assert is_refusal("I'm sorry, but I can't help with that.")
    assert not is_refusal("Paris is the capital of France.")


def test_scores_compare_the_candidate_with_the_reference() -> None:
    prompts = [
        EvalPrompt("answer", "q1"),
        EvalPrompt("answer", "q2"),
        EvalPrompt("json", "j"),
        EvalPrompt("refusal", "r"),
    ]
    reference = ["Paris", "four legs", '{"ok": true}', "I cannot help with that."]
    same = score(prompts, reference, reference)
    assert same["exact_match"] == 1.0 and same["token_overlap"] == 1.0
    assert same["json_valid_vs_reference"] == 0.0 and same["refusal_rate_vs_reference"] == 0.0
    broken = score(prompts, ["Lyon", "four legs", "{ok", "Sure, here is how."], reference)
    assert broken["exact_match"] == 0.25
    assert broken["json_valid_vs_reference"] == -1.0
    assert broken["refusal_rate_vs_reference"] == -1.0
    thresholds = {"exact_match": 0.5, "json_valid_vs_reference": -0.2}
    assert verdict(same, thresholds) and not verdict(broken, thresholds)
    assert not verdict(same, {"unknown_score": 0.0})  # a threshold nothing scores fails


def test_the_default_suite_thresholds_only_known_scores() -> None:
    suite = load_suite(DEFAULT_SUITE)
    assert suite.label == "default@1" and len(suite.sha256) == 64
    kinds = {p.kind for p in suite.prompts}
    assert kinds == {"answer", "json", "refusal"}
    known = score(suite.prompts, ["x"] * len(suite.prompts), ["x"] * len(suite.prompts))
    assert set(suite.thresholds) <= set(known)


async def test_run_suite_passes_identical_answers_and_fails_a_degraded_version() -> None:
    suite = load_suite(DEFAULT_SUITE)
    asked: list[str] = []

    def answerer(degraded: str) -> Callable[[str, EvalPrompt], object]:
        async def answer(model: str, prompt: EvalPrompt) -> str:
            asked.append(model)
            if model == degraded:
                return "lorem ipsum"
            return f"answer to {prompt.text}"

        return answer

    same = await run_suite(suite, answerer("none"), "m", "2", "1")  # type: ignore[arg-type]
    assert same.passed and same.scores["exact_match"] == 1.0 and same.reference == "1"
    assert set(asked) == {"m@2", "m@1"}
    worse = await run_suite(suite, answerer("m@2"), "m", "2", "1")  # type: ignore[arg-type]
    assert not worse.passed and worse.scores["exact_match"] == 0.0
    assert format_scores(worse)[-1] == "FAILED: suite default@1, 24 prompts, against version 1"
    assert any(line.endswith("FAIL") for line in format_scores(worse))


def test_parse_since() -> None:
    assert parse_since("30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_since("2026-01-01T00:00:00+00:00") == 1767225600.0
    with pytest.raises(Exception, match="30m"):
        parse_since("yesterday")


def _job(request_id: str, model: str, tokens: tuple[int, ...]) -> bytes:
    job = InferenceJob(
        request_id=request_id, team="t", model=model, pool="p", tier="interactive",
        prompt_token_ids=tokens, sampling=SamplingSettings(max_tokens=500),
        created_at=1.0, deadline=100.0, reply_to="g",
    )  # fmt: skip
    return job.to_bytes()


Record = tuple[str, int, int, int, bytes]


class FakeReader:
    def __init__(self, values: list[bytes]) -> None:
        self.values = values
        self.opened: list[tuple[str, float | None]] = []

    async def __aenter__(self) -> FakeReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def partitions(self, topic: str) -> list[int] | None:
        return [0] if topic == "jobs" else None

    async def open(
        self, topic: str, partitions: Sequence[int] | None = None, *, since: float | None = None
    ) -> Mapping[int, tuple[int, int]]:
        self.opened.append((topic, since))
        return {0: (0, len(self.values))}

    async def records(self, on_read: object = None) -> AsyncIterator[Record]:
        for offset, value in enumerate(self.values):
            yield ("jobs", 0, offset, 0, value)


async def test_shadow_samples_one_deployments_prompts_once_each_within_the_limit() -> None:
    values = [_job("a", "m", (1, 2)), _job("a", "m", (1, 2)), _job("b", "other", (3,)), b"junk"]
    values += [_job(f"r{i}", "m", (i,)) for i in range(20)]
    reader = FakeReader(values)
    prompts, matched = await sample_prompts(
        lambda: reader,
        ["jobs", "missing"],
        "m",
        5.0,
        limit=8,
        max_tokens=16,  # type: ignore[arg-type,return-value]
    )
    assert matched == 21  # "a" once, none of "other", no junk
    assert len(prompts) == 8 and all(p.max_tokens == 16 for p in prompts)
    assert reader.opened == [("jobs", 5.0)]
