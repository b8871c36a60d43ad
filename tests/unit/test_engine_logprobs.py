"""vLLM's per-token log probabilities become OpenAI's shape (no engine needed)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from workers.engine.vllm_engine import LOGPROB_FLOOR, token_logprobs


@dataclass
class Logprob:  # the fields of vllm.logprobs.Logprob that the adapter reads
    logprob: float
    rank: int | None
    decoded_token: str | None


def test_chosen_tokens_with_their_top_alternatives_in_rank_order() -> None:
    positions = [
        {7: Logprob(-0.1, 1, "Hi"), 9: Logprob(-2.5, 2, "Hey"), 4: Logprob(-3.0, 3, "Yo")},
        # sampled, not the most likely: the chosen token keeps its own entry
        {5: Logprob(-1.2, 2, " é"), 6: Logprob(-0.4, 1, " there"), 8: Logprob(-math.inf, 3, "")},
    ]
    out = token_logprobs([7, 5], positions, top=2)
    assert out is not None and [t.token for t in out] == ["Hi", " é"]
    assert out[1].logprob == -1.2 and out[1].bytes == list(" é".encode())
    assert [c.token for c in out[0].top_logprobs] == ["Hi", "Hey"]
    assert [c.token for c in out[1].top_logprobs] == [" there", " é"]
    floor = token_logprobs([8], [positions[1]], top=0)
    assert floor is not None and floor[0].logprob == LOGPROB_FLOOR and floor[0].top_logprobs == []


def test_nothing_when_not_asked() -> None:
    assert token_logprobs([1], [{1: Logprob(-0.1, 1, "a")}], top=None) is None
