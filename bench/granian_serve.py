"""`toolkit serve` with granian in place of uvicorn under the same ASGI app: a candidate of issue 15,
item 2 (a faster ASGI server), measured by bench/overhead.py and not kept (docs/performance.md,
"Per-request overhead").

    pip install granian==2.8.7
    .venv/bin/python bench/granian_serve.py REPO [toolkit serve's options]

Everything is `toolkit serve` (the CLI, the compiled repository, the runner with its gRPC and
metrics listeners, the model loader, the drain on SIGTERM) except that each HTTP listener is
granian's embedded server (granian.server.embed) running in the runtime's own event loop, where
uvicorn runs: hyper reads and writes the socket on a Rust thread and hands each request to the
loop. The app is the one uvicorn serves (handlers/app.py `create_app`, ASGI with lifespan off as
under uvicorn: the runner loads the models), on the socket the runner bound. One process only
(`--workers` starts workers that would run uvicorn).

Environment (for trying granian's own knobs): TOOLKIT_BENCH_GRANIAN_TASK_IMPL (asyncio, the
default, or rust), TOOLKIT_BENCH_GRANIAN_RUNTIME_THREADS (hyper's threads, default 1).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BACKLOG = 2048  # as handlers.entrypoints.server._bind


class GranianListener:
    """What the runner needs of a uvicorn server: `await serve(sockets=[sock])` until
    `should_exit` is set."""

    def __init__(self, app: Any, sock: socket.socket, graceful_seconds: float, log_level: str) -> None:
        from granian._granian import SocketHolder
        from granian.constants import HTTPModes, Interfaces, TaskImpl
        from granian.http import HTTP1Settings
        from granian.log import LogLevels
        from granian.server.embed import Server

        holder = SocketHolder(sock.fileno(), False, BACKLOG)  # Linux: (fd, uds, backlog)

        class Embedded(Server):
            def _init_shared_socket(self) -> None:  # serve the runner's socket, bind none
                self._ssp, self._shd, self._sfd = None, holder, sock.fileno()

        host, port = sock.getsockname()[:2]
        level = log_level.lower()
        self.server = Embedded(
            app, address=host, port=port,
            interface=Interfaces.ASGINL,  # no lifespan: as uvicorn's lifespan="off"
            http=HTTPModes.http1, websockets=False, backlog=BACKLOG,
            http1_settings=HTTP1Settings(keep_alive=True),
            runtime_threads=int(os.environ.get("TOOLKIT_BENCH_GRANIAN_RUNTIME_THREADS", "1")),
            task_impl=TaskImpl(os.environ.get("TOOLKIT_BENCH_GRANIAN_TASK_IMPL", "asyncio")),
            log_level=LogLevels(level) if level in LogLevels.__members__ else LogLevels.info,
            log_access=False,
        )
        self.server.workers_kill_timeout = max(1, int(graceful_seconds))  # the drain budget

    async def serve(self, sockets: list[socket.socket]) -> None:
        await self.server.serve()

    @property
    def should_exit(self) -> bool:
        return self.server.interrupt_signal

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self.server.stop()


def main() -> None:
    from handlers.entrypoints import server
    from toolkit.cli import app

    if "--workers" in sys.argv[1:]:
        sys.exit("granian_serve.py runs one process: --workers would start workers serving with uvicorn")

    def granian_listener(runner: Any, app: Any, sock: socket.socket) -> GranianListener:
        return GranianListener(app, sock, runner.graceful_seconds, runner.log_level)

    server._Runner._uvicorn = granian_listener  # type: ignore[method-assign]
    os.environ["TOOLKIT_HTTP_FRONTEND"] = "uvicorn"  # the listeners _uvicorn makes: granian's, here
    app(["serve", *sys.argv[1:]], prog_name="toolkit")


if __name__ == "__main__":
    main()
