"""Token ids of rendered prompts, with the text between special tokens tokenized once.

A team's requests share a long system prompt, and re-tokenizing it was a fifth of the
gateway's CPU per request. A fast (Hugging Face) tokenizer first splits its input at its
added tokens (`<|im_start|>`, ...) and tokenizes each piece between them on its own, so the
same split done here, with each piece's ids kept in an LRU, gives the same ids. Where that
could differ (an added token that strips the whitespace beside it, or is matched after
normalization) the cache is off. The first `VERIFY_FIRST` prompts of each tokenizer are also
tokenized whole and compared; one difference turns the cache off for good.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger()

VERIFY_FIRST = 32
"""Prompts tokenized both ways (pieces and whole) before the pieces are trusted."""
MIN_CACHED_CHARS = 256
"""Pieces shorter than this are tokenized each time (cheap, and rarely repeated)."""
MAX_CACHED_CHARS = 32_768
"""Pieces longer than this are neither cached nor checked twice: a system prompt is far
shorter, and a body at the context's limit (hostile or careless) must not cost twice the
tokenizing, or stay in memory."""


class PieceCachedEncoder:
    """`encode(text)`: the ids `tokenizer.encode(text, add_special_tokens=False)` gives."""

    def __init__(self, tokenizer: Any, max_pieces: int = 1024) -> None:
        self._encode_whole: Callable[[str], list[int]] = lambda text: list(
            tokenizer.encode(text, add_special_tokens=False)
        )
        self._max_pieces = max_pieces
        self._pieces: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()  # prompts are tokenized on a thread pool
        self._to_verify = VERIFY_FIRST
        self._added: dict[str, int] = {}
        self._split: re.Pattern[str] | None = None
        added = getattr(tokenizer, "added_tokens_decoder", None)
        if not isinstance(added, dict) or not added:
            return
        for token_id, token in added.items():
            content = getattr(token, "content", None)
            if not isinstance(content, str) or not content:
                return
            if any(getattr(token, flag, True) for flag in ("lstrip", "rstrip", "single_word")):
                return  # the token takes whitespace beside it: pieces would differ
            if getattr(token, "normalized", True):
                return  # matched after normalization: the split here could miss it
            self._added[content] = int(token_id)
        by_length = sorted(self._added, key=len, reverse=True)  # longest match first
        self._split = re.compile("(" + "|".join(map(re.escape, by_length)) + ")")

    @property
    def enabled(self) -> bool:
        return self._split is not None

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            return self._encode_whole(text)
        ids = self._encode_pieces(self._split, text)
        if self._to_verify > 0 and len(text) <= MAX_CACHED_CHARS:
            self._to_verify -= 1
            whole = self._encode_whole(text)
            if whole != ids:
                log.warning("token_cache_disabled", reason="pieces differ from the whole")
                self._split = None
                with self._lock:
                    self._pieces.clear()
                return whole
        return ids

    def _encode_pieces(self, split: re.Pattern[str], text: str) -> list[int]:
        ids: list[int] = []
        for i, piece in enumerate(split.split(text)):
            if i % 2:  # an added token, matched whole
                ids.append(self._added[piece])
            elif not MIN_CACHED_CHARS <= len(piece) <= MAX_CACHED_CHARS:
                if piece:
                    ids.extend(self._encode_whole(piece))
            else:
                with self._lock:
                    cached = self._pieces.get(piece)
                    if cached is not None:
                        self._pieces.move_to_end(piece)
                if cached is None:
                    cached = tuple(self._encode_whole(piece))
                    with self._lock:
                        self._pieces[piece] = cached
                        if len(self._pieces) > self._max_pieces:
                            self._pieces.popitem(last=False)
                ids.extend(cached)
        return ids
