"""The worker process: a vLLM engine plus a Kafka pull loop, one per GPU replica."""
