"""`JsonBody`: large bodies are validated off the event loop, with FastAPI's error format, and
the chat route still documents its request body in OpenAPI."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Annotated

import httpx
import pytest
from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, field_validator

from gateway.app import create_app
from gateway.errors import install_error_handlers
from gateway.request_body import INLINE_BYTES, JsonBody
from gateway.services.offload import ThreadOffload
from gateway.settings import GatewaySettings

validated_on: list[str] = []


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str

    @field_validator("text")
    @classmethod
    def _record_thread(cls, text: str) -> str:
        validated_on.append(threading.current_thread().name)
        return text


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    install_error_handlers(app)
    offload = ThreadOffload(1, name="test-offload")
    app.state.offload = offload

    @app.post("/notes")
    async def create(note: Annotated[Note, Depends(JsonBody(Note))]) -> dict[str, int]:
        return {"chars": len(note.text)}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c
    offload.close()


async def test_small_bodies_are_validated_inline_and_large_ones_on_the_pool(
    client: httpx.AsyncClient,
) -> None:
    validated_on.clear()
    small = await client.post("/notes", json={"text": "hi"})
    large = await client.post("/notes", json={"text": "x" * (2 * INLINE_BYTES)})
    assert small.json() == {"chars": 2} and large.json() == {"chars": 2 * INLINE_BYTES}
    assert validated_on[0] == threading.current_thread().name  # the event loop's thread
    assert validated_on[1].startswith("test-offload")


@pytest.mark.parametrize("pad", [0, 2 * INLINE_BYTES])
async def test_errors_keep_openais_format_either_way(client: httpx.AsyncClient, pad: int) -> None:
    unknown = await client.post("/notes", json={"text": "x" * pad, "colour": "red"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "colour"
    assert "Unrecognized request argument" in unknown.json()["error"]["message"]
    broken = await client.post("/notes", content=b'{"text": "' + b"x" * pad)
    assert broken.status_code == 400
    assert broken.json()["error"]["message"] == "We could not parse the JSON body of your request."


def test_the_chat_route_documents_its_request_body() -> None:
    schema = create_app(GatewaySettings(deployments=[])).openapi()
    body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ChatCompletionRequest"
    components = schema["components"]["schemas"]
    assert "messages" in components["ChatCompletionRequest"]["properties"]
    assert "UserMessage" in components  # nested models are there for the refs to resolve
