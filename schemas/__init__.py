"""Pydantic models: the OpenAI API surface llmq speaks, and every internal message it sends."""
