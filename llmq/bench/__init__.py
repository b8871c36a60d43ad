"""Benchmarks that print numbers (``llmq bench ...``).

``overhead``: the same streaming chat requests sent to llmq's gateway and to vLLM's own OpenAI
server on the same model folder and engine settings, side by side, to show what the queue path
(gateway, Kafka, worker, Redis relay, SSE) costs in latency and throughput.
"""
