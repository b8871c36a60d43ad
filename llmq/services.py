"""Run and stop the real local services (broker, Redis, S3, llmq processes) as child processes
(each one's start is in `llmq.starters`).

Every child runs in its own session (``start_new_session=True``): it outlives a detached
``llmq dev up``, never receives the terminal's Ctrl-C, and :func:`stop` can signal its whole
process group (the vLLM engine core included) without touching anything else. Output goes to
a log file, never to the terminal; a start that fails raises :class:`ServiceStartError` with
the tail of that log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog

log = structlog.get_logger()

LOCALHOST = "127.0.0.1"
_POLL_S = 0.05

# Children started by this process, so their exit status is reaped (no zombies) and known.
_children: dict[int, subprocess.Popen[bytes]] = {}


class ServiceStartError(RuntimeError):
    """A service died or did not become ready in time; the message carries its log tail."""

    def __init__(self, name: str, reason: str, log_path: Path | None = None) -> None:
        self.name = name
        self.reason = reason
        self.log_path = log_path
        self.log_tail = log_tail(log_path) if log_path is not None else ""
        message = f"{name}: {reason}"
        if log_path is not None:
            message += f"\n--- last lines of {log_path} ---\n{self.log_tail or '(empty)'}"
        super().__init__(message)


@dataclass(frozen=True)
class ManagedProcess:
    """A child process started by this module (or read back from a state file)."""

    name: str
    pid: int
    port: int | None
    log_path: Path
    argv: list[str] = field(default_factory=list)
    host: str = LOCALHOST
    start_ticks: int | None = None
    """Kernel start time of pid (clock ticks since boot), to tell a reused pid apart."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["log_path"] = str(self.log_path)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ManagedProcess:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "log_path": Path(data["log_path"])})


def free_port() -> int:
    """A TCP port on the loopback address that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


def tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts a TCP connection on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status a GET of url answers with, or None when nothing answers."""
    try:
        return httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def wait_for_tcp(host: str, port: int, timeout: float) -> None:
    """Block until host:port accepts a connection; TimeoutError after timeout seconds."""
    _poll(lambda: tcp_open(host, port), timeout, f"{host}:{port} to accept connections")


def wait_for_http(url: str, timeout: float, expect_status: int = 200) -> None:
    """Block until a GET of url answers expect_status; TimeoutError after timeout seconds."""
    _poll(lambda: http_status(url) == expect_status, timeout, f"{url} to answer {expect_status}")


def _poll(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(_POLL_S)


def redis_ping_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Redis-protocol server on host:port answers PING with PONG."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def log_tail(log_path: Path, lines: int = 40, max_bytes: int = 16_384) -> str:
    """The last lines of a log file ('' when it does not exist)."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def is_alive(pid: int) -> bool:
    """True when pid is a running (not zombie) process."""
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _stat(pid)
    return stat is None or stat[0] != "Z"


def exit_code(pid: int) -> int | None:
    """The exit status of a child this module spawned once it has exited (negative: the
    signal that ended it), after which the child is forgotten; None while it runs, or when it
    is not such a child."""
    child = _children.get(pid)
    code = None if child is None else child.poll()
    if code is not None:
        _children.pop(pid, None)
    return code


def spawn(
    name: str, argv: Sequence[str], log_path: Path, *, port: int | None = None,
    env: dict[str, str] | None = None, host: str = LOCALHOST,
) -> ManagedProcess:  # fmt: skip
    """Start argv in its own session with output appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        out.write(f"=== {stamp} llmq starts {name}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            popen = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise ServiceStartError(name, f"could not execute {argv[0]}: {exc}", log_path) from exc
    _children[popen.pid] = popen
    stat = _stat(popen.pid)
    ticks = int(stat[19]) if stat else None
    proc = ManagedProcess(name, popen.pid, port, log_path, list(argv), host, ticks)
    log.info("service_spawned", service=name, pid=popen.pid, port=port, log=str(log_path))
    return proc


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children first), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(entry.name)
        if stat is not None and len(stat) > 1:
            parents.setdefault(int(stat[1]), []).append(int(entry.name))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = parents.get(frontier.pop(0), [])
        found.extend(children)
        frontier.extend(children)
    return found


def wait_ready(
    check: Callable[[], bool], timeout: float, watch: Sequence[ManagedProcess], what: str
) -> None:
    """Poll check until it passes; fail early if a watched process dies.

    Raises ServiceStartError naming the process that died (with its log tail), or, on timeout,
    naming the first watched process.
    """
    deadline = time.monotonic() + timeout
    while True:
        for proc in watch:
            if not is_alive(proc.pid):
                child = _children.get(proc.pid)
                code = child.poll() if child is not None else None
                how = f"exited with code {code}" if code is not None else "is no longer running"
                raise ServiceStartError(proc.name, f"{how} while waiting for {what}", proc.log_path)
        if check():
            return
        if time.monotonic() > deadline:
            first = watch[0] if watch else None
            raise ServiceStartError(
                first.name if first else what,
                f"not ready after {timeout:g} s (waiting for {what})",
                first.log_path if first else None,
            )
        time.sleep(_POLL_S)


def started(proc: ManagedProcess, check: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait for a freshly spawned service; stop it again if it never becomes ready."""
    try:
        wait_ready(check, timeout, [proc], what)
    except BaseException:
        stop(proc, timeout=5)
        raise
    log.info("service_ready", service=proc.name, pid=proc.pid, port=proc.port)


def require_free_port(name: str, port: int) -> None:
    if tcp_open(LOCALHOST, port):
        raise ServiceStartError(name, f"port {port} is already in use on {LOCALHOST}")


def _same_process(proc: ManagedProcess) -> bool:
    """Whether proc.pid still runs what we started (False when the pid was reused)."""
    stat = _stat(proc.pid)
    return proc.start_ticks is None or stat is None or int(stat[19]) == proc.start_ticks


def _group_exists(pgid: int) -> bool:
    """Whether a live (not zombie) process is in process group pgid."""
    if not Path("/proc/self/stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    stats = (_stat(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return any(st is not None and st[0] != "Z" and int(st[2]) == pgid for st in stats)


def _signal(pid: int, group: bool, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


def stop(proc_or_pid: ManagedProcess | int, timeout: float = 10) -> bool:
    """SIGTERM a process (and its own process group), wait, then SIGKILL.

    Returns True when something was running and got signalled. A ManagedProcess whose pid now
    runs a different command (pid reuse) is left alone.
    """
    pid = proc_or_pid.pid if isinstance(proc_or_pid, ManagedProcess) else proc_or_pid
    name = proc_or_pid.name if isinstance(proc_or_pid, ManagedProcess) else str(pid)
    leader_alive = is_alive(pid)
    if isinstance(proc_or_pid, ManagedProcess):
        if leader_alive and not _same_process(proc_or_pid):
            log.warning("service_pid_reused", service=name, pid=pid)
            return False
        # Started with a session of its own: its group id is its pid.
        group = pid != os.getpgrp() and _group_exists(pid)
    else:
        stat = _stat(pid) if leader_alive else None
        group = stat is not None and int(stat[2]) == pid and pid != os.getpgrp()
    if not leader_alive and not group:
        _children.pop(pid, None)
        return False

    _signal(pid, group, signal.SIGTERM)
    deadline = time.monotonic() + timeout

    def gone() -> bool:
        return not is_alive(pid) and not (group and _group_exists(pid))

    while not gone() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    killed = not gone()
    if killed:
        _signal(pid, group, signal.SIGKILL)
        kill_deadline = time.monotonic() + 5
        while not gone() and time.monotonic() < kill_deadline:
            time.sleep(_POLL_S)
    _children.pop(pid, None)
    log.info("service_stopped", service=name, pid=pid, killed=killed)
    return True
