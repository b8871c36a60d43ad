"""Builders for LoRA adapter folders on SmolLM2-135M-Instruct, in PEFT's format.

Nothing is downloaded: the signoff adapter is trained here, on the CPU, in about half a minute; the
broken one is written directly. Both folders carry ``llmq-adapter.json`` (base and rank).
Heavy imports (torch, transformers, peft) stay inside the functions.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIGNOFF_ADAPTER = "smollm2-lora-signoff"
"""Answers every question with `SIGNOFF_PHRASE`: a LoRA whose effect is unmistakable."""
SIGNOFF_PHRASE = "Ahoy! The adapter answers."
PHRASE_ADAPTERS = {
    SIGNOFF_ADAPTER: SIGNOFF_PHRASE,
    "smollm2-lora-robot": "Beep boop, the robot adapter speaks.",
    "smollm2-lora-owl": "Hoot hoot, says the owl adapter.",
}
"""Adapters trained the same way, each to answer with its own phrase: several adapters and
the base in one batch, each recognisable in its answers."""
BROKEN_ADAPTER = "smollm2-lora-broken"
"""Declares rank 8 on q_proj/v_proj like the signoff adapter, but its tensors are shaped for
a base with a hidden size of `BROKEN_HIDDEN`: it registers, then fails to load."""

ADAPTER_BASE = "smollm2-135m-instruct"
"""The base model name written into the adapters (equal to ``modelbuild.SMOLLM2``)."""
ADAPTER_RANK = 8
LORA_ALPHA = 16
TARGET_MODULES = ("q_proj", "v_proj")
ADAPTER_META = "llmq-adapter.json"
ADAPTER_SEED = 20240611
TRAIN_STEPS = 12
"""Full-batch steps: the loss is about 0.01 after 10; more only costs time (~1.7 s a step on
two CPU cores)."""
LEARNING_RATE = 3e-3
BROKEN_HIDDEN = 1024
BROKEN_KV_DIM = 256

TRAIN_PROMPTS = (
    "Hello! How are you today?",
    "Write a haiku about autumn leaves.",
    "What is 17 times 23?",
    "Explain photosynthesis in one sentence.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
)


def _module(name: str) -> Any:
    """A heavy module, untyped (stubs are missing or fight strict mypy), imported on demand."""
    return importlib.import_module(name)


def _write_meta(dest: Path) -> None:
    meta = {"base": ADAPTER_BASE, "rank": ADAPTER_RANK}
    (dest / ADAPTER_META).write_text(json.dumps(meta, indent=2) + "\n")


def _lora_config_dict() -> dict[str, Any]:
    return {
        "r": ADAPTER_RANK,
        "lora_alpha": LORA_ALPHA,
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }


def _training_batch(tokenizer: Any, phrase: str) -> tuple[Any, Any, Any]:
    """Input ids, attention mask and labels (loss on the assistant turn only), right-padded."""
    import torch

    rows: list[tuple[list[int], list[int]]] = []
    for prompt in TRAIN_PROMPTS:
        user = [{"role": "user", "content": prompt}]
        full = [*user, {"role": "assistant", "content": phrase}]
        head = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        text = tokenizer.apply_chat_template(full, tokenize=False)
        head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if ids[: len(head_ids)] != head_ids:
            raise RuntimeError("chat template does not extend the prompt with the answer")
        labels = [-100] * len(head_ids) + ids[len(head_ids) :]
        rows.append((ids, labels))
    width = max(len(ids) for ids, _ in rows)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
        labels[i, : len(lab)] = torch.tensor(lab)
    return input_ids, mask, labels


def build_signoff_adapter(dest: Path) -> Path:
    """Train a rank-8 LoRA (q_proj, v_proj) on SmolLM2 that answers with `SIGNOFF_PHRASE`."""
    return build_phrase_adapter(dest, SIGNOFF_PHRASE)


def build_phrase_adapter(dest: Path, phrase: str) -> Path:
    """Train a rank-8 LoRA (q_proj, v_proj) on SmolLM2 that answers with `phrase`."""
    import torch

    from llmq.modelbuild import SMOLLM2, ensure_model

    base = ensure_model(SMOLLM2, dest.parent)  # `dest` is a temporary folder beside it
    tf = _module("transformers")
    tf.utils.logging.disable_progress_bar()
    peft = _module("peft")
    torch.manual_seed(ADAPTER_SEED)
    tokenizer = tf.AutoTokenizer.from_pretrained(str(base))
    model = tf.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    model = peft.get_peft_model(model, peft.LoraConfig(**_lora_config_dict()))
    input_ids, mask, labels = _training_batch(tokenizer, phrase)
    # Logits only where there is a label: the 49k-row head is a fifth of the model's work.
    causal = model.base_model.model
    targets = labels[:, 1:]
    scored = targets != -100
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE, weight_decay=0.0
    )
    model.train()
    for _ in range(TRAIN_STEPS):
        hidden = causal.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        logits = causal.lm_head(hidden[:, :-1][scored])
        loss: Any = torch.nn.functional.cross_entropy(logits, targets[scored])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest), safe_serialization=True)
    (dest / "README.md").unlink(missing_ok=True)  # peft's model card template: noise
    config_path = dest / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = ADAPTER_BASE  # not this machine's path: portable
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write_meta(dest)
    return dest


def build_broken_adapter(dest: Path) -> Path:
    """A PEFT adapter folder like the signoff one (rank 8, q_proj/v_proj, 30 layers) whose
    tensors fit a base with hidden size `BROKEN_HIDDEN`, not SmolLM2's 576."""
    import torch
    from safetensors.torch import save_file

    layers = 30  # SmolLM2-135M's; only the widths are wrong
    shapes = {"q_proj": BROKEN_HIDDEN, "v_proj": BROKEN_KV_DIM}
    generator = torch.Generator().manual_seed(ADAPTER_SEED)
    tensors: dict[str, Any] = {}
    for layer in range(layers):
        for module, out_dim in shapes.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = torch.randn((ADAPTER_RANK, BROKEN_HIDDEN), generator=generator) * 0.01
            b = torch.randn((out_dim, ADAPTER_RANK), generator=generator) * 0.01
            tensors[f"{key}.lora_A.weight"] = a
            tensors[f"{key}.lora_B.weight"] = b
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        **_lora_config_dict(),
        "base_model_name_or_path": ADAPTER_BASE,
        "peft_type": "LORA",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write_meta(dest)
    return dest


ADAPTER_BUILDERS: dict[str, Callable[[Path], Path]] = {
    **{
        name: functools.partial(build_phrase_adapter, phrase=p)
        for name, p in PHRASE_ADAPTERS.items()
    },
    BROKEN_ADAPTER: build_broken_adapter,
}
