"""The local stack's layout: two models in two pools by default, one when asked."""

from __future__ import annotations

import json
from pathlib import Path

from llmq.devstack import _gateway_env
from llmq.devstack_settings import DevStackSettings
from schemas.deployment import Deployment


def _deployments(settings: DevStackSettings) -> list[Deployment]:
    env = _gateway_env(settings, Path("/models/smollm2"), "127.0.0.1:9092")
    return [Deployment(**d) for d in json.loads(env["LLMQ_DEPLOYMENTS"])]


def test_the_stack_serves_two_models_in_two_pools_by_default() -> None:
    settings = DevStackSettings()
    first, second = _deployments(settings)
    assert (first.name, first.pool) == ("smollm2-135m-instruct", "smollm2")
    assert (second.name, second.pool) == ("smollm2-135m-fast", "smollm2-fast")
    assert second.path == first.path  # the same weights under another name
    assert second.ttft_slo_s < first.ttft_slo_s and second.max_model_len < first.max_model_len
    assert second.engine_args == {"max_num_seqs": 8}
    assert settings.pools == ["smollm2", "smollm2-fast"] and settings.expected_workers == 2


def test_an_empty_second_model_leaves_one() -> None:
    settings = DevStackSettings(second_model="", workers=2)
    assert [d.name for d in _deployments(settings)] == ["smollm2-135m-instruct"]
    assert settings.pools == ["smollm2"] and settings.expected_workers == 2
