import pytest

from tests.e2e.test_chat import test_abandoned_non_streaming_request_frees_the_engine as t


@pytest.mark.parametrize("i", range(12))
async def test_repeat(i, stack, engine_load):
    await t(stack, engine_load)
