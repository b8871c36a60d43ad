"""The control plane: the registry (a fold of `llmq.registry`), deployments and their versions."""
