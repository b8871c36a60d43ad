"""SIMULATION: a queue-less OpenAI server over one simulated GPU replica, the direct baseline
for benchmarks on simulated workers (as llm-d's inference simulator stands in for vLLM's server).

It does what vLLM's own OpenAI server does with a request, minus the model: tokenize the chat
with the deployment's tokenizer (the gateway's renderer, so prompt lengths match), hand it to
the engine at once (no queue, no admission: past the engine's knee everyone waits), and stream
one chunk per engine step. The engine is `workers.main.build_simulated_engine` with the same
``LLMQ_*`` worker settings a simulated llmq worker reads, so both targets model the same GPU.
``POST /bench/engine-alone`` drains that engine with callers that only read their streams
(`llmq.bench.engine_alone`: what the engine itself costs a process).

Run: ``python -m llmq.bench.sim_server PORT`` with ``LLMQ_MODEL``, ``LLMQ_MODEL_PATH`` and the
``LLMQ_SIM_*`` / ``LLMQ_MAX_NUM_SEQS`` settings in the environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmq import paths, services
from llmq.bench import engine_alone
from schemas.chat import ChatCompletionRequest
from schemas.deployment import Deployment
from schemas.render import ChatRenderer
from workers.engine.port import EngineStep
from workers.engine.simulated import SimulatedGpuEngine
from workers.main import build_simulated_engine
from workers.settings import WorkerSettings


def modelled_env() -> dict[str, str]:
    """The ``LLMQ_SIM_*`` a direct simulated server models: this process's environment,
    overridden by what the running local stack's workers were started with, so both targets
    model the same GPU and model even when the benchmark's shell lacks the stack's settings."""
    from llmq.devstack import SIM_ENV, stack_simulated_env

    own = {k: v for k, v in os.environ.items() if k.startswith(SIM_ENV)}
    return {**own, **stack_simulated_env()}


def modelled_settings() -> WorkerSettings:
    """A simulated worker's settings as `modelled_env` makes them."""
    from llmq.devstack import SIM_ENV

    fields: dict[str, Any] = {
        f"sim_{k.removeprefix(SIM_ENV).lower()}": v for k, v in modelled_env().items()
    }
    return WorkerSettings(engine="simulated", **fields)


def start_sim_server(
    model: str, model_path: Path, *, max_num_seqs: int, max_model_len: int, timeout_s: float = 60
) -> tuple[services.ManagedProcess, str]:
    """Start this server on a free loopback port; return it with its base URL once /health
    answers. `modelled_env` chooses the modelled GPU and model (the running stack's)."""
    port = services.free_port()
    env = {
        **os.environ,
        **modelled_env(),
        "LLMQ_MODEL": model,
        "LLMQ_MODEL_PATH": str(model_path),
        "LLMQ_MAX_NUM_SEQS": str(max_num_seqs),
        "LLMQ_MAX_MODEL_LEN": str(max_model_len),
    }
    argv = [sys.executable, "-m", "llmq.bench.sim_server", str(port)]
    log_path = paths.run_dir() / "bench" / f"sim-direct-{port}.log"
    proc = services.spawn("sim-direct", argv, log_path, port=port, env=env)
    root = f"http://{services.LOCALHOST}:{port}"
    try:
        services.wait_ready(
            lambda: services.http_status(f"{root}/health") == 200,
            timeout_s, [proc], "simulated server /health",
        )  # fmt: skip
    except BaseException:
        services.stop(proc, timeout=10)
        raise
    return proc, f"{root}/v1"


def create_app(settings: WorkerSettings) -> FastAPI:
    engine = build_simulated_engine(settings)
    assert isinstance(engine, SimulatedGpuEngine)
    deployment = Deployment(
        name=settings.model,
        path=settings.model_path,
        pool=settings.pool,
        max_model_len=settings.max_model_len,
    )
    renderer = ChatRenderer.load([deployment])

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        yield
        await engine.shutdown()

    app = FastAPI(title="llmq simulated direct server", lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = {"id": settings.model, "object": "model", "created": 0, "owned_by": "simulated"}
        return {"object": "list", "data": [model]}

    @app.post(engine_alone.PATH)
    async def drain_engine_alone(
        request: engine_alone.EngineAloneRequest,
    ) -> engine_alone.EngineAloneResult:
        message = {"role": "user", "content": request.prompt}
        body = {"model": settings.model, "messages": [message]}
        prompt = renderer.tokenize(deployment.ref, ChatCompletionRequest(**body).messages)
        return await engine_alone.drain(
            engine, prompt, request.streams, request.duration_s, request.max_tokens
        )

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(raw: Request) -> Response:
        request = ChatCompletionRequest.model_validate(await raw.json())
        prompt = renderer.tokenize(deployment.ref, request.messages)
        max_tokens = request.output_limit or settings.max_model_len - len(prompt)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        steps = engine.stream(request_id, prompt, max_tokens)
        head = {"id": request_id, "created": int(time.time()), "model": settings.model}
        if request.stream:
            return StreamingResponse(_sse(steps, head), media_type="text/event-stream")
        text, completion, reason = [], 0, None
        async with contextlib.aclosing(steps):
            async for step in steps:
                text.append(step.text)
                completion += step.num_new_tokens
                reason = step.finish_reason or reason
        message = {"role": "assistant", "content": "".join(text)}
        choice = {"index": 0, "message": message, "finish_reason": reason}
        usage = _usage(len(prompt), completion)
        body = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        return JSONResponse(body)

    return app


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


async def _sse(
    steps: AsyncGenerator[EngineStep, None], head: dict[str, Any]
) -> AsyncIterator[bytes]:
    """One chunk per engine step, then a usage chunk and [DONE] (as vLLM streams)."""
    chunk = {**head, "object": "chat.completion.chunk"}
    completion = prompt = 0
    async with contextlib.aclosing(steps):  # a caller leaving aborts the request
        async for step in steps:
            prompt = step.prompt_tokens
            completion += step.num_new_tokens
            delta = {"content": step.text} if step.text else {}
            choice = {"index": 0, "delta": delta, "finish_reason": step.finish_reason}
            yield b"data: " + json.dumps({**chunk, "choices": [choice]}).encode() + b"\n\n"
    usage = {**chunk, "choices": [], "usage": _usage(prompt, completion)}
    yield b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"


if __name__ == "__main__":
    import uvicorn

    port = int(sys.argv[1])
    app = create_app(WorkerSettings(engine="simulated"))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
