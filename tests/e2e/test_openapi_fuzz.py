"""The OpenAPI document tells the truth: schemathesis fuzzes every operation of the running
gateway (real engine behind it) from `/openapi.json`, and no answer is a 5xx, an undocumented
status code or content type, or a body that breaks its documented schema.

Excluded: schemathesis's `positive_data_acceptance` (a schema-valid request must succeed),
which cannot hold for requests naming ids that do not exist (a batch of a file nobody
uploaded is a documented 404) or for limits that depend on state (quotas, the context).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import FUZZ_KEY, Stack

pytestmark = pytest.mark.e2e


def test_a_schema_fuzzer_finds_no_undocumented_answer(stack: Stack, tmp_path: Path) -> None:
    schemathesis = Path(sys.executable).parent / "schemathesis"
    argv = [
        str(schemathesis), "run", f"{stack.base_url}/openapi.json",
        "--header", f"Authorization: Bearer {FUZZ_KEY}",
        "--checks", "all", "--exclude-checks", "positive_data_acceptance",
        "--max-examples", "5", "--seed", "20261201", "--max-time", "60",
        "--request-timeout", "30",
    ]  # fmt: skip
    result = subprocess.run(
        argv,
        cwd=tmp_path,  # its cache and reports stay out of the checkout
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
