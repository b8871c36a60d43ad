"""A vLLM plugin (entry point `vllm.general_plugins`, loaded in every engine process) that
fixes LoRA on the CPU in vLLM 0.32: there, a request without an adapter gets the adapter in
the engine's last LoRA slot once every slot is taken.

vLLM marks such tokens with the slot index -1. The GPU kernels skip -1; the CPU's torch ops
(`vllm.lora.ops.torch_ops`) index the stacked adapter weights with it, and -1 is the last
slot. Reproduced offline: SmolLM2 with `max_loras=2`, a batch mixing the base and two
adapters, and base prompts answer with the second adapter's trained phrase (with a slot to
spare they do not).

The fix zeroes the LoRA "shrink" output (x @ A) of those tokens, so the "expand" that follows
(@ B, added to the base layer's output) adds nothing to them. Every LoRA computation on the
CPU is a shrink then an expand, and the shrink only ever assigns its output.
"""

from __future__ import annotations

import functools
from typing import Any

import structlog

log = structlog.get_logger()


def _masked_shrink(shrink: Any) -> Any:
    @functools.wraps(shrink)
    def bgmv_shrink(
        inputs: Any,
        lora_weights: Any,
        output_tensor: Any,
        lora_indices_tensor: Any,
        scaling: float = 1.0,
    ) -> None:
        shrink(inputs, lora_weights, output_tensor, lora_indices_tensor, scaling)
        without_adapter = lora_indices_tensor < 0
        if bool(without_adapter.any()):
            output_tensor[without_adapter] = 0

    bgmv_shrink.llmq_fixed = True  # type: ignore[attr-defined]
    return bgmv_shrink


def register() -> None:
    """Patch the CPU LoRA ops once per process (vLLM may call this several times)."""
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops

    if getattr(lora_ops.bgmv_shrink, "llmq_fixed", False):
        return
    fixed = _masked_shrink(lora_ops.bgmv_shrink)
    lora_ops.bgmv_shrink = fixed  # `sgmv_shrink` calls it through the module
    torch_ops.bgmv_shrink = fixed
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:  # a build without the CPU wrapper: nothing imported it by name
        return
    punica_cpu.bgmv_shrink = fixed  # type: ignore[attr-defined]
