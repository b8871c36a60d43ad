"""checkov over infra/terraform, offline: no failed check, and every skip says why beside it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
TERRAFORM = INFRA / "terraform"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
SCAN_TIMEOUT_S = 600
SKIP = re.compile(r"#\s*checkov:skip=(?P<check>[A-Za-z0-9_]*)(?::(?P<reason>.*))?")


def _reports(output: str) -> list[dict[str, Any]]:
    """checkov's JSON: one report object, or a list of them (one per framework)."""
    parsed = json.loads(output)
    return parsed if isinstance(parsed, list) else [parsed]


def _scan() -> list[dict[str, Any]]:
    if not CHECKOV.is_file():
        pytest.fail(f"checkov is not installed at {CHECKOV}: run `make install`")
    command = [
        str(CHECKOV), "-d", str(TERRAFORM), "--framework", "terraform", "--skip-download",
        "-o", "json",
    ]  # fmt: skip
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}  # offline: no policy metadata download
    try:
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=SCAN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"checkov ran past {SCAN_TIMEOUT_S} s")
    try:
        return _reports(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov (rc {done.returncode}) printed no JSON:\n{done.stderr[-4000:]}")


@pytest.mark.timeout(SCAN_TIMEOUT_S + 60)
def test_checkov_finds_no_failed_check() -> None:
    reports = _scan()
    summaries = [r.get("summary", {}) for r in reports]
    failed = [c for r in reports for c in r.get("results", {}).get("failed_checks", [])]
    listing = "\n".join(
        f"{c['check_id']} {c['resource']} ({c.get('file_path')}:{c.get('file_line_range')})"
        for c in failed
    )
    assert sum(s.get("failed", 0) for s in summaries) == 0 and not failed, (
        f"checkov failed checks:\n{listing}"
    )
    assert sum(s.get("parsing_errors", 0) for s in summaries) == 0, summaries
    assert sum(s.get("passed", 0) for s in summaries) > 0, f"checkov checked nothing: {summaries}"


def test_every_checkov_skip_gives_a_reason() -> None:
    skips = [
        (path, number, match)
        for path in sorted(INFRA.rglob("*"))
        if path.is_file() and ".terraform" not in path.parts
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if (match := SKIP.search(line))
    ]
    unexplained = [
        f"{path.relative_to(REPO)}:{number}: {match.group(0)}"
        for path, number, match in skips
        if not match.group("check") or len((match.group("reason") or "").split()) < 3
    ]
    assert not unexplained, "checkov skips need `#checkov:skip=CKV_...:<reason>`:\n" + "\n".join(
        unexplained
    )
