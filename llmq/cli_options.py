"""Options shared by the `llmq` commands that call llmq's HTTP API."""

from __future__ import annotations

from typing import Annotated

import typer

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
BaseUrlOption = Annotated[
    str, typer.Option("--base-url", envvar="LLMQ_BASE_URL", help="llmq's OpenAI base URL.")
]
