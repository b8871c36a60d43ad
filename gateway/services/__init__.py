"""The gateway's logic, independent of HTTP and of the message-plane adapters."""
