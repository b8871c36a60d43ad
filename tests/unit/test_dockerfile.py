"""The image the rendered fleet runs: it carries every package llmq installs, and checkov's
Dockerfile checks find nothing (offline)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "infra/docker/Dockerfile"
CHECKOV = ROOT / ".venv-checkov/bin/checkov"


def test_the_image_copies_every_package_setuptools_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in patterns}
    copied = set(re.findall(r"^COPY (\w+) \./\1$", DOCKERFILE.read_text(), re.MULTILINE))
    assert packages <= copied, packages - copied
    assert re.search(r"^USER 10001$", DOCKERFILE.read_text(), re.MULTILINE)  # as the pods run


def test_checkov_finds_nothing_in_the_dockerfile() -> None:
    assert CHECKOV.exists(), f"{CHECKOV} is missing: run `make install`"
    args = [str(CHECKOV), "-f", str(DOCKERFILE), "--framework", "dockerfile", "--skip-download"]
    out = subprocess.run(
        [*args, "-o", "json"], capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert [f["check_id"] for f in report["results"]["failed_checks"]] == []
    assert report["summary"]["passed"] > 0
