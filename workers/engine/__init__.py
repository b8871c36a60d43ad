"""Engine adapters behind the `EngineClient` port; only adapters import an engine library."""
