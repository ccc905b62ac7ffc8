"""Runtime that goes into every image: v2 protocol, batching, backends. Never imports toolkit."""
