"""The local stack: broker, Valkey, moto, one worker and the gateway on this machine.

``up`` starts every part as a child process in its own session and records them in
``run_dir()/stack.json``; ``down`` stops what that file names; ``status`` reports on it. Logs
of every part go to ``run_dir()/logs/<part>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from llmq import paths
from llmq.affinity import pinned
from llmq.devstack_settings import DevStackSettings
from llmq.engine_env import engine_environment
from llmq.services import (
    LOCALHOST,
    ManagedProcess,
    ServiceStartError,
    http_status,
    is_alive,
    stop,
    tcp_open,
    wait_ready,
)
from llmq.starters import start_llmq, start_moto, start_tansu, start_valkey
from schemas.heartbeat import ReplicaHeartbeat
from topics import catalog

__all__ = ["DevStackSettings", "down", "read_state", "status", "up"]

log = structlog.get_logger()

STATE_VERSION = 1
_STOP_TIMEOUT_S = {"gateway": 30.0, "worker": 60.0, "controller": 120.0}
"""Seconds a part gets to exit after SIGTERM (the worker drains in-flight work); default 10."""


SIM_ENV = "LLMQ_SIM_"
"""The prefix of the settings that choose a simulated worker's modelled GPU and model."""


def state_path() -> Path:
    """Where the running stack is recorded."""
    return paths.run_dir() / "stack.json"


def logs_dir() -> Path:
    return paths.run_dir() / "logs"


def _read_state_file() -> dict[str, Any] | None:
    """The state file's contents: None when there is none, {} when it cannot be read."""
    path = state_path()
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("state_file_unreadable", path=str(path), error=str(exc))
        return {}
    return data


def read_state() -> list[ManagedProcess] | None:
    """The parts recorded in the state file, in start order (None when there is none)."""
    data = _read_state_file()
    if data is None:
        return None
    return [ManagedProcess.from_dict(part) for part in data.get("parts", [])]


def stack_simulated_env() -> dict[str, str]:
    """The ``LLMQ_SIM_*`` settings the running local stack's simulated workers were started
    with ({} when no stack runs, or its workers run vLLM)."""
    data = _read_state_file() or {}
    return {str(k): str(v) for k, v in data.get("simulated_env", {}).items()}


def stack_platform_cores() -> list[int]:
    """The cores the running local stack's own processes were pinned to (`platform_cores`;
    [] when no stack runs or they float)."""
    data = _read_state_file() or {}
    return [int(core) for core in data.get("platform_cores", [])]


def _write_state(parts: list[ManagedProcess], settings: DevStackSettings) -> None:
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "version": STATE_VERSION,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "gateway_url": settings.gateway_url,
        "parts": [p.to_dict() for p in parts],
    }
    if settings.platform_cores:  # a benchmark's direct server mirrors the layout
        data["platform_cores"] = settings.platform_cores
    if settings.engine == "simulated":  # what benchmarks' direct servers must model too
        data["simulated_env"] = {k: v for k, v in os.environ.items() if k.startswith(SIM_ENV)}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _remove_state() -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path().unlink()


def _stop_all(parts: list[ManagedProcess]) -> None:
    """Stop parts in reverse start order, by pid."""
    for part in reversed(parts):
        if stop(part, timeout=_STOP_TIMEOUT_S.get(part.name, 10.0)):
            print(f"stopped {part.name} (pid {part.pid})")


def _worker_env(settings: DevStackSettings, bootstrap: str) -> dict[str, str]:
    """What every worker of the stack gets; the pool controller adds each version's model,
    path, pool, context, precision and replica id."""
    env = {
        "LLMQ_KAFKA_BOOTSTRAP": bootstrap,
        "LLMQ_REDIS_URL": f"redis://{LOCALHOST}:{settings.redis_port}/0",
        "LLMQ_MAX_NUM_SEQS": str(settings.max_num_seqs),
        "LLMQ_KV_CACHE_GIB": str(settings.kv_cache_gib),
        "LLMQ_BATCH_MAX_IN_FLIGHT": str(settings.batch_max_in_flight),
        "LLMQ_HEALTH_PROBE_TIMEOUT_S": str(settings.health_probe_timeout_s),
        "LLMQ_HEALTH_PROBE_INTERVAL_S": str(settings.health_probe_interval_s),
        "LLMQ_LOG_JSON": str(settings.log_json).lower(),
        "LLMQ_ENGINE": settings.engine,
        # Versions with a `weights_uri` fetch them from the stack's S3 server.
        "LLMQ_S3_ENDPOINT_URL": f"http://{LOCALHOST}:{settings.s3_port}",
        **_s3_credentials(),
    }
    if settings.platform_cores:
        env["LLMQ_FRONTEND_CORES"] = json.dumps(settings.platform_cores)
    if settings.engine == "simulated":
        return env
    # Engine housekeeping (offline, bounded KV cache, owned caches, Intel OpenMP preloaded), so
    # the worker need not re-execute itself to get it.
    env.update(engine_environment(settings.kv_cache_gib))
    return env


def _gateway_env(settings: DevStackSettings, model_path: Path, bootstrap: str) -> dict[str, str]:
    deployment = {
        "name": settings.model,
        "path": str(model_path),
        "pool": settings.pool,
        "max_model_len": settings.max_model_len,
        "ttft_slo_s": settings.ttft_slo_s,
        "tpot_slo_s": settings.tpot_slo_s,
        "tool_call_parser": settings.tool_call_parser,
        "replicas": {"min": settings.workers, "max": settings.workers},
    }
    deployments = [deployment]
    if settings.max_lora_rank > 0:
        deployments = [{**deployment, "engine_args": {"max_lora_rank": settings.max_lora_rank}}]
    if settings.second_model:
        deployments.append(
            {
                **deployment,
                "name": settings.second_model,
                "pool": settings.second_pool,
                "max_model_len": min(1024, settings.max_model_len),
                "ttft_slo_s": settings.ttft_slo_s / 2,
                "engine_args": {"max_num_seqs": 8},
                "replicas": {"min": 1, "max": 1},
            }
        )
    return {
        "LLMQ_KAFKA_BOOTSTRAP": bootstrap,
        "LLMQ_REDIS_URL": f"redis://{LOCALHOST}:{settings.redis_port}/0",
        "LLMQ_S3_ENDPOINT_URL": f"http://{LOCALHOST}:{settings.s3_port}",
        "LLMQ_HOST": settings.host,
        "LLMQ_PORT": str(settings.port),
        "LLMQ_DEPLOYMENTS": json.dumps(deployments),
        "LLMQ_API_KEYS": json.dumps({settings.api_key: settings.team, **settings.extra_api_keys}),
        "LLMQ_ADMIN_KEYS": json.dumps([settings.admin_key]),
        "LLMQ_LOG_JSON": str(settings.log_json).lower(),
        **_s3_credentials(),
    }


def _s3_credentials() -> dict[str, str]:
    """moto accepts any credentials; real ones in the environment win."""
    return {
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "llmq-dev"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "llmq-dev"),
        "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    }


def _fresh_log(name: str) -> Path:
    path = logs_dir() / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.replace(path.with_suffix(".log.1"))
    return path


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so a terminated `dev up` still cleans up."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _refuse_if_running() -> None:
    parts = read_state()
    if parts is None:
        return
    alive = [p for p in parts if is_alive(p.pid)]
    if not alive:
        log.info("stale_state_removed", path=str(state_path()))
        _remove_state()
        return
    names = ", ".join(f"{p.name} (pid {p.pid})" for p in alive)
    print(f"a local stack is already running: {names}", file=sys.stderr)
    print(
        "stop it first with `llmq dev down` (or check it with `llmq dev status`)", file=sys.stderr
    )
    raise SystemExit(1)


def _start_all(settings: DevStackSettings, started: list[ManagedProcess]) -> None:
    """Start every part, appending each to started (and to the state file) as it comes up.

    With `platform_cores`, the broker, Redis, S3, the gateway and the batch service start on
    them; the controller starts with every core, so that the workers it starts do (their
    engines bind to the other cores, `LLMQ_ENGINE_CORES`), and each worker moves its own
    front end onto them once its engine runs (`LLMQ_FRONTEND_CORES`)."""
    try:
        engine_cores = settings.engine_cores(os.sched_getaffinity(0))
    except ValueError as exc:
        raise ServiceStartError("stack", str(exc)) from exc
    from llmq.modelbuild import ensure_model
    from topics.kafka import ensure_topics

    def record(part: ManagedProcess) -> None:
        started.append(part)
        _write_state(started, settings)

    ports = {
        "gateway": settings.port,
        "tansu": settings.kafka_port,
        "valkey": settings.redis_port,
        "moto": settings.s3_port,
    }
    for name, port in ports.items():
        if tcp_open(LOCALHOST, port):
            raise ServiceStartError(
                name, f"port {port} is already in use on {LOCALHOST} (choose another in LLMQ_DEV_*)"
            )

    print(f"preparing model {settings.model} ...")
    model_path = ensure_model(settings.model)
    log.info("model_ready", model=settings.model, path=str(model_path))

    bootstrap = f"{LOCALHOST}:{settings.kafka_port}"
    valkey_dir = paths.run_dir() / "valkey"
    shutil.rmtree(valkey_dir, ignore_errors=True)  # the broker and S3 start empty: so does Redis
    with pinned(settings.platform_cores):
        record(start_tansu(settings.kafka_port, _fresh_log("tansu")))
        valkey_log = _fresh_log("valkey")
        record(start_valkey(settings.redis_port, valkey_log, data_dir=valkey_dir, append_only=True))
        record(start_moto(settings.s3_port, _fresh_log("moto")))
    try:
        asyncio.run(ensure_topics(bootstrap, settings.pools, settings.partitions))
    except Exception as exc:
        raise ServiceStartError("topics", f"creating topics failed: {exc!r}") from exc

    print("starting workers and gateway (first engine start can take a few minutes) ...")
    gateway_env = _gateway_env(settings, model_path, bootstrap)
    # The pool controller runs the workers: each registered version's `replicas.min` (the
    # seed asks for `settings.workers`), restarting any that exits, draining retired ones.
    controller_env = {
        "LLMQ_KAFKA_BOOTSTRAP": bootstrap,
        "LLMQ_REDIS_URL": gateway_env["LLMQ_REDIS_URL"],
        "LLMQ_DEPLOYMENTS": gateway_env["LLMQ_DEPLOYMENTS"],
        "LLMQ_WORKER_ENV": json.dumps(_worker_env(settings, bootstrap)),
        "LLMQ_WORKER_LOG_DIR": str(logs_dir()),
        "LLMQ_JOB_TOPIC_PARTITIONS": str(settings.partitions),
        "LLMQ_LOG_JSON": str(settings.log_json).lower(),
    }
    if engine_cores is not None:
        controller_env["LLMQ_ENGINE_CORES"] = json.dumps(engine_cores)
    controller = start_llmq("controller", controller_env, _fresh_log("controller"))
    record(controller)
    with pinned(settings.platform_cores):
        gateway = start_llmq("gateway", gateway_env, _fresh_log("gateway"))
        record(gateway)
        batch_env = {**gateway_env, "LLMQ_SERVICE_ID": "batch-dev-0"}
        record(start_llmq("batch", batch_env, _fresh_log("batch"), name="batch"))
    readyz = f"{settings.gateway_url}/readyz"
    wait_ready(
        lambda: http_status(readyz) == 200 and _all_heartbeating(settings),
        settings.ready_timeout_s,
        [gateway, controller],
        f"{readyz} to answer 200 and {settings.expected_workers} worker(s) to heartbeat",
    )


def _all_heartbeating(settings: DevStackSettings) -> bool:
    """Every worker of the stack has a ready heartbeat (readyz needs only one)."""
    import redis

    client = redis.Redis(host=LOCALHOST, port=settings.redis_port, socket_timeout=2)
    try:
        ready = 0
        replica_ids: list[bytes] = client.zrange(catalog.REPLICA_INDEX_KEY, 0, -1)  # type: ignore[assignment]
        for replica_id in replica_ids:
            raw = client.get(catalog.replica_key(replica_id.decode()))
            if raw and ReplicaHeartbeat.model_validate_json(raw).state == "ready":
                ready += 1
        return ready >= settings.expected_workers
    except redis.RedisError:
        return False
    finally:
        client.close()


def _print_ready(settings: DevStackSettings) -> None:
    url = settings.gateway_url
    print(f"llmq is up at {url}/v1 (logs in {logs_dir()})")
    if settings.engine == "simulated":
        print("engine: SIMULATED GPU replicas (placeholder text at modelled GPU speed)")
    models = [settings.model, settings.second_model] if settings.second_model else [settings.model]
    print(f"models: {', '.join(models)} (pools {', '.join(settings.pools)})")
    print(f"API key: {settings.api_key} (team {settings.team})")
    print(f"admin key: {settings.admin_key} (llmq deployments list)")
    body = json.dumps(
        {"model": settings.model, "messages": [{"role": "user", "content": "Say hello"}]}
    )
    print(
        f"try: curl -s {url}/v1/chat/completions -H 'Authorization: Bearer {settings.api_key}' "
        f"-H 'Content-Type: application/json' -d '{body}'"
    )


def _block_until_interrupted(parts: list[ManagedProcess]) -> None:
    print("press Ctrl-C to stop the stack")
    reported: set[int] = set()
    while True:
        time.sleep(1.0)
        for part in parts:
            if part.pid not in reported and not is_alive(part.pid):
                reported.add(part.pid)
                log.warning("part_exited", part=part.name, pid=part.pid, log=str(part.log_path))
                print(f"{part.name} (pid {part.pid}) exited; see {part.log_path}", file=sys.stderr)


def up(settings: DevStackSettings | None = None, detach: bool = False) -> None:
    """Start the local stack; block until Ctrl-C/SIGTERM unless detach, then stop it."""
    settings = settings or DevStackSettings()
    _refuse_if_running()
    started: list[ManagedProcess] = []
    with _sigterm_as_interrupt():
        try:
            _start_all(settings, started)
        except KeyboardInterrupt:
            print("interrupted; stopping what was started", file=sys.stderr)
            _stop_all(started)
            _remove_state()
            raise SystemExit(130) from None
        except Exception as exc:
            log.error("stack_start_failed", error=str(exc).splitlines()[0])
            _stop_all(started)
            _remove_state()
            print(f"llmq dev up failed: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
        log.info("stack_started", url=settings.gateway_url, parts=[p.name for p in started])
        _print_ready(settings)
        if detach:
            print("running in the background; stop it with `llmq dev down`")
            return
        try:
            _block_until_interrupted(started)
        except KeyboardInterrupt:
            print("\nstopping the stack ...")
            _stop_all(started)
            _remove_state()
            log.info("stack_stopped")


def down() -> None:
    """Stop every part named in the state file, in reverse start order."""
    parts = read_state()
    if parts is None:
        print("no local stack is running (no state file)")
        return
    if not any(is_alive(p.pid) for p in parts):
        print("the recorded stack was not running; removing its state file")
    _stop_all(parts)
    _remove_state()
    log.info("stack_stopped", parts=[p.name for p in parts])


def status() -> int:
    """Print one line per part; 0 when every part is alive and its port answers."""
    parts = read_state()
    if parts is None:
        print(f"no local stack is running (no {state_path()})")
        return 1
    if not parts:
        print(f"the state file {state_path()} names no parts")
        return 1
    healthy = True
    for part in parts:
        alive = is_alive(part.pid)
        if part.port is None:
            answering = "-"
        else:
            host = LOCALHOST if part.host in ("0.0.0.0", "::", "") else part.host
            answering = "yes" if alive and tcp_open(host, part.port) else "no"
        healthy = healthy and alive and answering != "no"
        port = str(part.port) if part.port is not None else "-"
        print(
            f"{part.name:<8} pid {part.pid:<8} {'alive' if alive else 'dead':<5}  "
            f"port {port:<6} answering {answering}"
        )
    return 0 if healthy else 1
