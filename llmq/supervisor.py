"""A minimal process supervisor for the local stack: restart a worker that dies.

In production Kubernetes (or systemd) restarts a worker that exits; the local stack uses this
instead, so `llmq bench chaos` and a worker failing its health checks (exit code 3) behave as
they would there. Usage: ``python -m llmq.supervisor -- python -m llmq.cli worker``.

- The child runs in the supervisor's process group and shares its stdout/stderr (the part's
  log); stopping the group (`llmq dev down`) stops both.
- A child that exits for any reason other than the supervisor being asked to stop is restarted
  after a back-off (1 s, doubling to 30 s; back to 1 s once a child has run for a minute).
- SIGTERM/SIGINT are passed to the child (it drains); the supervisor then exits with its code.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import FrameType

import structlog

from llmq.logging import configure_logging

log = structlog.get_logger()

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0


class Supervisor:
    def __init__(self, argv: list[str]) -> None:
        self._argv = argv
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = False

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signum)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        backoff = FIRST_BACKOFF_S
        while True:
            started = time.monotonic()
            self._child = subprocess.Popen(self._argv)
            log.info("child_started", pid=self._child.pid)
            code = self._child.wait()
            if self._stopping:
                log.info("child_stopped", pid=self._child.pid, code=code)
                return code if code >= 0 else 128 - code
            ran_s = time.monotonic() - started
            backoff = FIRST_BACKOFF_S if ran_s > STABLE_AFTER_S else backoff
            log.warning(
                "child_exited", pid=self._child.pid, code=code, ran_s=round(ran_s, 1),
                restart_in_s=backoff,
            )  # fmt: skip
            deadline = time.monotonic() + backoff
            while time.monotonic() < deadline and not self._stopping:
                time.sleep(0.1)
            if self._stopping:
                return 0
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m llmq.supervisor -- COMMAND [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    configure_logging(json=False)
    raise SystemExit(Supervisor(args).run())


if __name__ == "__main__":
    main()
