"""The gateway: OpenAI-compatible HTTP API in front of the job topics and the token relay."""
