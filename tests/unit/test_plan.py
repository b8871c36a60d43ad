"""`llmq plan` against seed 000's own arithmetic: the presets reproduce its figures within 5%."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmq.cli import app
from llmq.plan import PRESETS, plan

runner = CliRunner()


def test_the_70b_preset_reproduces_the_seed() -> None:
    figures = plan(PRESETS["seed-70b"])
    assert figures.value("kv_bytes_per_token") == 327_680  # 320 KiB
    assert figures.value("kv_room_bytes_per_replica") == pytest.approx(138e9, rel=0.01)
    assert figures.value("kv_tokens_per_replica") == pytest.approx(420_000, rel=0.01)
    assert figures.value("decode_floor_s") == pytest.approx(0.013, rel=0.03)
    assert figures.value("prefill_s") == pytest.approx(0.130, rel=0.03)
    assert figures.value("demand_flops") == pytest.approx(50.4e15)
    assert figures.value("replicas") == pytest.approx(49, rel=0.05)
    assert figures.value("gpus") == pytest.approx(196, rel=0.05)
    assert figures.value("nodes") == pytest.approx(25, rel=0.05)
    assert figures.value("usd_per_million_output_tokens") == pytest.approx(1.51, rel=0.05)
    assert figures.value("sequences_per_replica") == pytest.approx(57, rel=0.05)
    assert figures.value("kv_use_at_peak") == pytest.approx(0.25, abs=0.03)  # "a quarter full"


def test_without_the_prefix_cache_the_70b_needs_the_seeds_73_replicas() -> None:
    uncached = PRESETS["seed-70b"].model_copy(deep=True)
    uncached.traffic.prefix_cache_share = 0.0
    figures = plan(uncached)
    assert figures.value("busy_replicas") == pytest.approx(47, rel=0.03)
    assert figures.value("replicas") == pytest.approx(73, rel=0.05)


def test_the_8b_preset_gives_46_gpus_and_the_fleet_is_about_242() -> None:
    small, large = plan(PRESETS["seed-8b"]), plan(PRESETS["seed-70b"])
    assert small.value("kv_bytes_per_token") == 131_072  # 128 KiB
    assert small.value("gpus") == 46
    assert small.value("gpus") + large.value("gpus") == pytest.approx(242, rel=0.05)


def test_memory_decides_when_sequences_outgrow_the_kv_room() -> None:
    long_context = PRESETS["seed-70b"].model_copy(deep=True)
    long_context.traffic.prompt_tokens = 100_000
    long_context.traffic.peak_rps = 2
    long_context.traffic.prefix_cache_share = 0.9
    figures = plan(long_context)
    assert figures.value("replicas_by_memory") > figures.value("replicas_by_compute")
    assert figures.value("replicas") == figures.value("replicas_by_memory")
    assert figures.value("kv_use_at_peak") <= 1.0


def test_the_cli_prints_json_with_stable_keys_and_writes_tfvars(tmp_path: Path) -> None:
    tfvars = tmp_path / "fleet.auto.tfvars.json"
    result = runner.invoke(
        app, ["plan", "--preset", "seed-70b", "--preset", "seed-8b", "--json", "--tfvars",
              str(tfvars)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    for key in ("kv_bytes_per_token", "replicas", "gpus", "usd_per_million_output_tokens"):
        assert key in figures["llama-70b"] and key in figures["llama-8b"]
    groups = json.loads(tfvars.read_text())["gpu_node_groups"]
    assert groups["llama-70b"] == {
        "instance_type": "p5.48xlarge", "gpus_per_node": 8, "tensor_parallel": 4,
        "min_size": 10, "desired_size": 25, "max_size": 33,
    }  # fmt: skip
    assert groups["llama-8b"]["desired_size"] == 6  # 46 one-GPU replicas, 8 per node


def test_the_cli_takes_your_own_pool_and_refuses_bad_input(tmp_path: Path) -> None:
    mine = PRESETS["seed-8b"].model_copy(update={"pool": "mine"})
    path = tmp_path / "mine.json"
    path.write_text(mine.model_dump_json())
    result = runner.invoke(app, ["plan", "--input", str(path), "--peak-rps", "70"])
    assert result.exit_code == 0, result.output
    assert "pool mine" in result.output and "70 req/s" in result.output
    assert runner.invoke(app, ["plan", "--preset", "seed-405b"]).exit_code == 2
    bad = runner.invoke(app, ["plan", "--preset", "seed-8b", "--prefix-cache-share", "1.5"])
    assert bad.exit_code == 1 and "prefix_cache_share" in bad.output


def test_a_model_that_does_not_fit_is_refused() -> None:
    cramped = PRESETS["seed-70b"].model_copy(update={"tensor_parallel": 2})
    with pytest.raises(ValueError, match="no room"):
        plan(cramped)


def test_the_committed_prod_tfvars_are_what_llmq_plan_writes(tmp_path: Path) -> None:
    committed = Path(__file__).parents[2] / "infra/terraform/envs/prod/fleet.auto.tfvars.json"
    fresh = tmp_path / "fleet.auto.tfvars.json"
    args = ["plan", "--preset", "seed-70b", "--preset", "seed-8b", "--tfvars", str(fresh)]
    assert runner.invoke(app, args).exit_code == 0
    assert json.loads(committed.read_text()) == json.loads(fresh.read_text()), (
        "regenerate: llmq plan --preset seed-70b --preset seed-8b --tfvars " + str(committed)
    )
