"""Where messages travel: the topic/channel catalog and the Kafka and Redis adapters."""
