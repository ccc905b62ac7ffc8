"""A Python-model instance run inside the serving process (opt-in, see docs/python-backend.md).

No process start and no copies through a socket, but the model shares the interpreter (and its
GIL) with the HTTP server and with every other in-process model: CPU-bound Python code in
`execute` slows everything else down, and `count > 1` gives no parallelism for it. model.py is
imported under a private package name so that two models' "1/model.py" stay apart; helper modules
imported by plain name (`import helpers` from the version folder) are shared by name across
models, as they would be in any single Python process.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ...errors import InferenceError
from ...inference import InferOutcome, InferRequest
from ...model_io import OutputReshape
from . import conversion
from .bls import BlsBridge
from .local_host import install_local_host
from .model_runner import ModelRunner
from .streams import ResponseRoutes


class InProcessInstance:
    def __init__(self, spec: Any, version: int, name: str, kind: str = "KIND_CPU", device_id: int = 0) -> None:
        started = time.perf_counter()
        self.spec = spec
        self.version = version
        self.name = name
        self.bridge = BlsBridge(spec)
        self.decoupled = bool(spec.decoupled)
        # a decoupled model's senders send here directly; its responses get the output reshape here
        self.routes = ResponseRoutes(reshape=OutputReshape(spec.config))
        local = install_local_host()
        local.remember(self.bridge)
        self.runner = ModelRunner(
            model_file=spec.model_files[version],
            model_dir=spec.directory,
            version=version,
            config=spec.config,
            instance_name=name,
            kind=kind,
            device_id=device_id,
            isolated=True,
            responses=self.routes,
        )
        self.runner.context = replace(self.runner.context, owner=self.bridge)  # BLS goes through this model's bridge
        self.runner.load()
        self.start_seconds = time.perf_counter() - started

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        if not self.decoupled:
            payloads = [conversion.request_payload(r) for r in requests]
            return conversion.outcomes(self.runner.execute(payloads), requests)
        tokens = [self.routes.open(r) for r in requests]
        payloads = [conversion.request_payload(r, t) for r, t in zip(requests, tokens)]
        outcomes = conversion.outcomes(self.runner.execute(payloads), requests)
        for token, outcome in zip(tokens, outcomes):
            if isinstance(outcome, InferenceError):
                self.routes.forget(token)  # the batcher ends the request with the error
        return outcomes

    def is_ready(self) -> bool:
        return self.runner.is_ready()

    def close(self, timeout: float = 30.0) -> None:
        self.runner.finalize()
        self.routes.close_all(f"model instance '{self.name}' was unloaded before it sent the final response")
