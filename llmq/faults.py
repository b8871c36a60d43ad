"""Fault injection on the running local stack (`llmq dev up`), for `llmq bench chaos`.

- `kill_worker`: SIGKILL a worker's whole process tree (the worker and its engine core), as
  an OOM kill or a lost node would; its supervisor restarts it.
- `restart_redis`: stop Valkey and start it again on the same port with the same data (its
  append-only file), as a Redis failover or a pod restart would.
"""

from __future__ import annotations

import json
import os
import signal

import structlog

from llmq import services
from llmq.devstack import read_state, state_path
from llmq.services import LOCALHOST, ManagedProcess

log = structlog.get_logger()


class FaultError(RuntimeError):
    """The stack is not in a shape the fault needs (not running, no such part)."""


def _part(name: str) -> ManagedProcess:
    parts = read_state()
    if not parts:
        raise FaultError("no local stack is running: start one with `llmq dev up --detach`")
    for part in parts:
        if part.name == name and services.is_alive(part.pid):
            return part
    names = ", ".join(p.name for p in parts)
    raise FaultError(f"no running part named {name!r} in the local stack ({names})")


def worker_names() -> list[str]:
    """The stack's worker parts ("worker", or "worker-0", "worker-1", ...)."""
    return [p.name for p in read_state() or [] if p.name.startswith("worker")]


def kill_worker(name: str) -> list[int]:
    """SIGKILL every process under the worker's supervisor (not the supervisor itself, which
    restarts the worker). Returns the killed pids."""
    supervisor = _part(name)
    victims = services.descendants(supervisor.pid)
    if not victims:
        raise FaultError(f"{name} (pid {supervisor.pid}) has no worker process to kill")
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log.warning("worker_killed", part=name, pids=victims)
    return victims


def restart_redis(timeout_s: float = 20.0) -> ManagedProcess:
    """Stop Valkey (SIGTERM: it flushes its append-only file) and start it again with the same
    command line, port and data; the state file records the new pid."""
    old = _part("valkey")
    if old.port is None:
        raise FaultError("the recorded valkey part has no port")
    services.stop(old, timeout=timeout_s)
    new = services.spawn(old.name, old.argv, old.log_path, port=old.port)
    services.wait_ready(
        lambda: services.redis_ping_ok(LOCALHOST, old.port or 0),
        timeout_s,
        [new],
        f"valkey on port {old.port}",
    )
    _replace_in_state(new)
    log.warning("redis_restarted", old_pid=old.pid, new_pid=new.pid, port=new.port)
    return new


def _replace_in_state(new: ManagedProcess) -> None:
    path = state_path()
    data = json.loads(path.read_text())
    data["parts"] = [new.to_dict() if p["name"] == new.name else p for p in data["parts"]]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
