"""How a worker process says why it stopped, for whatever restarts it (the pool controller's
local adapter, Kubernetes, a supervisor)."""

UNHEALTHY_EXIT_CODE = 3
"""The engine stopped answering or failed: restart the replica."""
WEIGHTS_EXIT_CODE = 4
"""The version's weights are missing or do not match its `sha256`: restarting cannot help;
the pool controller marks the version `failed`."""
