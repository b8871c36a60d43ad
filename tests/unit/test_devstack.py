"""The local stack's layout: two models in two pools by default, one when asked; what a
simulated stack records for benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control.k8s_manifests import version_env
from llmq.bench.goodput import simulated_engine_description
from llmq.bench.sim_server import modelled_settings
from llmq.devstack import _gateway_env, _worker_env, _write_state, stack_simulated_env
from llmq.devstack_settings import DevStackSettings
from schemas.deployment import Deployment
from schemas.registry import DeploymentVersion
from workers.settings import WorkerSettings


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


def test_benchmarks_model_the_gpu_the_running_simulated_stack_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMQ_HOME", str(tmp_path))
    monkeypatch.setenv("LLMQ_SIM_MODEL", "llama-3-70b")
    monkeypatch.setenv("LLMQ_SIM_TENSOR_PARALLEL", "4")
    _write_state([], DevStackSettings(engine="simulated"))
    # The benchmark's shell lacks the stack's settings, or says otherwise: the stack's win.
    monkeypatch.delenv("LLMQ_SIM_MODEL")
    monkeypatch.setenv("LLMQ_SIM_TENSOR_PARALLEL", "2")
    monkeypatch.setenv("LLMQ_SIM_GPU", "h200")
    assert stack_simulated_env() == {
        "LLMQ_SIM_MODEL": "llama-3-70b",
        "LLMQ_SIM_TENSOR_PARALLEL": "4",
    }
    sim = modelled_settings()
    assert (sim.sim_model, sim.sim_tensor_parallel, sim.sim_gpu) == ("llama-3-70b", 4, "h200")
    assert simulated_engine_description().startswith("SIMULATED llama-3-70b on 4x h200")
    _write_state([], DevStackSettings(engine="vllm"))  # a vLLM stack models nothing
    assert stack_simulated_env() == {}


def test_the_stack_s_workers_probe_an_idle_engine_every_30_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each probe keeps vLLM's worker spinning for a second; the 5 s default cost an idle CPU
    worker a fifth of a core."""
    env = _worker_env(DevStackSettings(), "127.0.0.1:9092")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert WorkerSettings().health_probe_interval_s == 30.0
    assert WorkerSettings.model_fields["health_probe_interval_s"].default == 5.0


def test_the_stack_s_slo_is_the_first_model_s_and_the_second_gets_half() -> None:
    first, second = _deployments(DevStackSettings(ttft_slo_s=4.0))
    assert (first.ttft_slo_s, second.ttft_slo_s) == (4.0, 2.0)
    first, second = _deployments(DevStackSettings())
    assert (first.ttft_slo_s, second.ttft_slo_s) == (1.0, 0.5)
    assert first.tpot_slo_s is None


def test_a_tpot_slo_reaches_the_workers_as_their_running_sequence_cap() -> None:
    first, second = _deployments(DevStackSettings(tpot_slo_s=0.4))
    assert (first.tpot_slo_s, second.tpot_slo_s) == (0.4, 0.4)
    version = DeploymentVersion(**first.model_dump(exclude={"name"}), created_at=0)
    env = version_env(first.name, version, {})
    assert env["LLMQ_TPOT_SLO_S"] == "0.4"
