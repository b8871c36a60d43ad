"""Folders llmq owns on this machine: model cache, run state, engine caches.

Everything lives under ``$LLMQ_HOME`` (default ``./.llmq``, next to where the command runs),
so a checkout's state never leaks into the home directory.
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("LLMQ_HOME", Path.cwd() / ".llmq")).resolve()


def models_dir() -> Path:
    return home() / "models"


def run_dir() -> Path:
    """PID files and logs of the local stack."""
    return home() / "run"


def cache_dir() -> Path:
    """Engine caches (vLLM, torch inductor) and temporary files."""
    return home() / "cache"
