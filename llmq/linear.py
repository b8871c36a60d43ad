"""Small dense linear systems, for the online least-squares fits (the worker's decode step
time, the gateway's TTFT fit): a few unknowns, solved in pure Python."""

from __future__ import annotations

from collections.abc import Sequence


def solve(matrix: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None for a (nearly) singular system."""
    size = len(rhs)
    m = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    tiny = 1e-10 * max(abs(m[i][i]) for i in range(size))
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= tiny:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, size):
            factor = m[r][col] / m[col][col]
            for k in range(col, size + 1):
                m[r][k] -= factor * m[col][k]
    out = [0.0] * size
    for r in reversed(range(size)):
        out[r] = (m[r][size] - sum(m[r][k] * out[k] for k in range(r + 1, size))) / m[r][r]
    return out
