"""The worker process entry point: settings, verified weights, the vLLM engine, signals."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import structlog
import uvloop

from topics.kafka_connection import configure_kafka
from workers.engine.port import EngineClient
from workers.exit_codes import UNHEALTHY_EXIT_CODE, WEIGHTS_EXIT_CODE
from workers.settings import WorkerSettings
from workers.weights import WeightsCache, WeightsError, verify_folder
from workers.worker import Worker, WorkerUnhealthy

log = structlog.get_logger()


def build_engine(settings: WorkerSettings) -> EngineClient:
    if settings.engine == "simulated":
        return build_simulated_engine(settings)
    from workers.adapter_folders import AdapterFolders, S3AdapterSource
    from workers.engine.vllm_engine import LoraSettings, VllmEngine

    lora = None
    if settings.max_lora_rank > 0:
        lora = LoraSettings(settings.max_lora_rank, settings.max_loras, settings.max_cpu_loras)
    engine: EngineClient = VllmEngine(
        settings.model_path,
        settings.model,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        dtype=settings.dtype,
        kv_cache_bytes=round(settings.kv_cache_gib * 2**30),
        lora=lora,
        adapter_folders=AdapterFolders(
            Path(settings.weights_cache_dir) / "adapters",
            S3AdapterSource(settings.s3_endpoint_url),
        ),
    )
    return engine


def build_simulated_engine(settings: WorkerSettings) -> EngineClient:
    """SIMULATION: a modelled GPU replica with the worker's slot and context limits."""
    from workers.engine.sim_model import H100_SXM, H200, LLAMA_8B, LLAMA_70B, ReplicaProfile
    from workers.engine.simulated import SimulatedGpuEngine

    gpus = {"h100": H100_SXM, "h200": H200}
    models = {"llama-3-8b": LLAMA_8B, "llama-3-70b": LLAMA_70B}
    profile = ReplicaProfile(
        gpu=gpus[settings.sim_gpu],
        model=models[settings.sim_model],
        tensor_parallel=settings.sim_tensor_parallel,
    )
    return SimulatedGpuEngine(
        profile,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        time_scale=settings.sim_time_scale,
        name=settings.replica_id,
        max_loras=settings.max_loras if settings.max_lora_rank > 0 else 0,
        max_cpu_loras=settings.max_cpu_loras,
    )


async def serve(settings: WorkerSettings, engine: EngineClient) -> None:
    """Serve until SIGTERM or SIGINT, then drain: no stream is cut by a scale-in."""
    worker = Worker(settings, engine)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.drain)
    await worker.run()


async def weights_folder(settings: WorkerSettings) -> str:
    """The folder the engine loads: the node's verified copy of `weights_uri`, else
    `model_path` (checked against `weights_sha256` when set). Raises `WeightsError`."""
    sha256 = settings.weights_sha256
    if settings.weights_uri is None:
        if sha256 is not None:
            await asyncio.to_thread(verify_folder, Path(settings.model_path), sha256)
        return settings.model_path
    if sha256 is None:
        raise WeightsError("LLMQ_WEIGHTS_URI is set without LLMQ_WEIGHTS_SHA256")
    from workers.s3_weights import S3WeightsSource

    async with S3WeightsSource(endpoint_url=settings.s3_endpoint_url) as source:
        cache = WeightsCache(Path(settings.weights_cache_dir), source)
        return str(await cache.ensure(settings.weights_uri, sha256))


def run_worker(settings: WorkerSettings) -> None:
    """Serve; an unhealthy engine exits with code 3 for the supervisor to restart, weights
    that do not verify with code 4 before any engine is built on them."""
    configure_kafka(settings.kafka_connection)
    if settings.engine == "vllm":  # a simulated engine loads no weights
        try:
            path = uvloop.run(weights_folder(settings))
        except WeightsError as exc:
            log.error("weights_refused", error=str(exc))
            raise SystemExit(WEIGHTS_EXIT_CODE) from None
        settings = settings.model_copy(update={"model_path": path})
    try:
        uvloop.run(serve(settings, build_engine(settings)))  # as vLLM's own server runs
    except WorkerUnhealthy:
        raise SystemExit(UNHEALTHY_EXIT_CODE) from None
