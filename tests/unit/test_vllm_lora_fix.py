"""The vLLM plugin that keeps adapter-less tokens free of LoRA on the CPU: vLLM 0.32's torch
ops index the stacked adapter weights with -1 (no adapter), which is the last slot."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch

from workers.engine.vllm_lora_fix import register


def _shrink_rows(indices: list[int]) -> torch.Tensor:
    from vllm.lora.ops.torch_ops import lora_ops

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(len(indices), 6, generator=generator)
    weights = torch.randn(2, 1, 4, 6, generator=generator)  # 2 slots, rank 4, hidden 6
    output = torch.full((len(indices), 4), 7.0)
    n = len(indices)
    starts, one_token_each = torch.arange(n), torch.ones(n, dtype=torch.long)
    lora_ops.sgmv_shrink(
        inputs, weights, output, starts, one_token_each, torch.tensor(indices), n, 1, n, 1.0
    )
    return output


def test_tokens_without_an_adapter_get_no_lora_and_the_others_are_untouched() -> None:
    from vllm.lora.ops.torch_ops import lora_ops

    register()
    register()  # vLLM may load a plugin more than once per process
    assert getattr(lora_ops.bgmv_shrink, "llmq_fixed", False)
    assert not getattr(lora_ops.bgmv_shrink.__wrapped__, "llmq_fixed", False)  # wrapped once
    rows = _shrink_rows([-1, 0, 1, -1])
    assert torch.equal(rows[0], torch.zeros(4)) and torch.equal(rows[3], torch.zeros(4))
    with_adapters = _shrink_rows([1, 0, 1, 1])
    assert torch.equal(rows[1], with_adapters[1]) and torch.equal(rows[2], with_adapters[2])
    assert not torch.equal(with_adapters[0], torch.zeros(4))  # what -1 used to pick: slot 1


def test_the_plugin_is_registered_with_vllm() -> None:
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("llmq_cpu_lora_fix") == "workers.engine.vllm_lora_fix:register"
