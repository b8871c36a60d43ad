"""S3 adapter of `AdapterFilesInspector`: fetch an adapter folder into a temporary cache
with the workers' own weights code (the same digest and checks a worker applies before it
loads the adapter), then read its adapter_config.json.

Adapters are small (a 70B's rank-16 LoRA is about 131 MB), and registration is an admin's or
a team's one-off call, so fetching the whole folder once here is what makes a hash mismatch a
400 at registration instead of failed requests later.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from gateway.services.adapters import AdapterFiles, AdapterFilesError
from workers.s3_weights import S3WeightsSource
from workers.weights import WeightsCache, WeightsError, WeightsMismatch

_CONFIG = "adapter_config.json"


def read_adapter_config(folder: Path) -> AdapterFiles:
    """The rank and target modules of the PEFT LoRA adapter in `folder`."""
    path = folder / _CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterFilesError(
            "invalid_adapter", f"the folder holds no readable {_CONFIG}: {exc}"
        ) from exc
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterFilesError("invalid_adapter", f"{_CONFIG} is not a PEFT LoRA adapter's")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterFilesError("invalid_adapter", f"{_CONFIG} has no positive rank `r`")
    modules = config.get("target_modules") or []
    if isinstance(modules, str):
        modules = [modules]
    return AdapterFiles(rank=rank, target_modules=tuple(str(m) for m in modules))


class S3AdapterFiles:
    """Inspects adapter folders on S3 (`endpoint_url`: another S3 API, such as moto's)."""

    def __init__(self, endpoint_url: str | None = None) -> None:
        self._endpoint_url = endpoint_url

    async def inspect(self, uri: str, sha256: str) -> AdapterFiles:
        with tempfile.TemporaryDirectory(prefix="llmq-adapter-") as root:
            try:
                async with S3WeightsSource(endpoint_url=self._endpoint_url) as source:
                    folder = await WeightsCache(Path(root), source).ensure(uri, sha256)
            except WeightsMismatch as exc:
                raise AdapterFilesError("sha256_mismatch", str(exc)) from exc
            except WeightsError as exc:
                raise AdapterFilesError("weights_unreachable", str(exc)) from exc
            except Exception as exc:  # S3 refused: no bucket, no access, no endpoint
                raise AdapterFilesError(
                    "weights_unreachable", f"could not read {uri}: {type(exc).__name__}: {exc}"
                ) from exc
            return read_adapter_config(folder)
