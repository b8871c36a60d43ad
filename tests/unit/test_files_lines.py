"""`iter_lines`: a byte stream split on b"\\n", whatever the chunking."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from batch.ports import iter_lines


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _lines(*parts: bytes) -> list[bytes]:
    return [line async for line in iter_lines(_chunks(*parts))]


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ((), []),
        ((b"",), []),
        ((b"", b""), []),
        ((b"\n",), [b""]),
        ((b"a",), [b"a"]),
        ((b"a\n",), [b"a"]),
        ((b"a\nb",), [b"a", b"b"]),
        ((b"a\nb\n",), [b"a", b"b"]),
        ((b"a\n\nb\n",), [b"a", b"", b"b"]),
        ((b"\n\n",), [b"", b""]),
        ((b"a\r\nb\r\n",), [b"a", b"b"]),
        ((b"a\r",), [b"a\r"]),  # a lone b"\r" at the end is not a line ending
        ((b"a\rb\n",), [b"a\rb"]),
        ((b"ab", b"c\nd", b"e"), [b"abc", b"de"]),
        ((b"a", b"\n", b"b"), [b"a", b"b"]),
        ((b"a\r", b"\nb"), [b"a", b"b"]),  # b"\r\n" split between chunks
        ((b"a", b"", b"b\n"), [b"ab"]),
        ((b"\n", b"\n", b"x"), [b"", b"", b"x"]),
        ((b'{"a": 1}\n{"b": 2}\n',), [b'{"a": 1}', b'{"b": 2}']),
    ],
)
async def test_lines(parts: tuple[bytes, ...], expected: list[bytes]) -> None:
    assert await _lines(*parts) == expected


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
async def test_any_chunking_gives_the_same_lines(size: int) -> None:
    data = b'{"custom_id": "1"}\r\n\n{"custom_id": "2"}\nlast \xc3\xa9 line'
    parts = [data[i : i + size] for i in range(0, len(data), size)]
    assert await _lines(*parts) == data.replace(b"\r\n", b"\n").split(b"\n")


async def test_one_line_across_many_chunks() -> None:
    parts = [b"x" * 1000] * 1000 + [b"\nend"]
    assert await _lines(*parts) == [b"x" * 1_000_000, b"end"]
