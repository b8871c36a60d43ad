"""llmq: the product's entry point (CLI, shared settings, logging, the local stack launcher)."""
