"""Runtime that goes into every image: v2 protocol, batching, backends. Never imports toolkit."""

__version__ = "0.1.0"
