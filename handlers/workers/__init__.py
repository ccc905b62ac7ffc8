"""Several server processes per container, on the same ports (opt-in: `toolkit serve --workers N`,
TOOLKIT_WORKERS=N in images).

One Python process serves every request of a container through one event loop, whose GIL-bound
work caps it at about one core however many the container has. With N workers, N processes listen
on the same ports (SO_REUSEPORT: the kernel spreads connections across them) and each runs the
runtime over its share of the models' instances:

- `plan.py`: how instances are split (every worker needs at least one instance of every model;
  Triton's instance counts are split across workers, never multiplied) and the CPU budget (each
  worker plans with the whole container's CPUs and every instance of the config, and gives its
  own instances their share: the threads add up to the CPUs, as in one process).
- `peers.py`: what must stay one server's view: readiness (ready when every worker is), the
  statistics extension and `/metrics` (each worker counts the requests it served; a query asks
  every worker over a Unix socket and sums, so every request is counted exactly once).
- `supervisor.py`: the parent process: reserves the ports, starts the workers, forwards SIGTERM
  (each worker drains as a single server does) and stops all when one fails.

The runtime's routes use the three views below; without workers they are the process's own.
Deviations from Triton (docs/triton-compatibility.md): a batch forms from the requests of one
worker only, and the queue limits (`max_queue_size`) and `preserve_ordering` hold per worker.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


async def server_ready(repository: Any) -> bool:
    """The server's readiness: this process's models, and every other worker's."""
    if not repository.ready():
        return False
    peers = getattr(repository, "peers", None)
    return True if peers is None else await peers.all_ready()


async def statistics(repository: Any, models: Iterable[Any]) -> list[dict[str, Any]]:
    """Triton's `model_stats` entries of `models` (LoadedModel), summed over every worker."""
    models = list(models)
    peers = getattr(repository, "peers", None)
    if peers is None:
        return [m.statistics.as_dict() for m in models]
    return await peers.statistics([(m.name, m.version) for m in models])


async def exposition(repository: Any) -> bytes:
    """The Prometheus text of `/metrics`, summed over every worker."""
    peers = getattr(repository, "peers", None) if repository is not None else None
    if peers is None:
        from ..exposition import text  # prometheus-client: on the first scrape, not at start-up

        return text()
    return await peers.exposition()
