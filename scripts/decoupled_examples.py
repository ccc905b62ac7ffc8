#!/usr/bin/env python3
"""Run python_backend's decoupled examples, unchanged, against `toolkit serve`.

    .venv/bin/python scripts/decoupled_examples.py /path/to/triton-inference-server/python_backend [--json]

The examples cannot be committed (they are Triton's code) or fetched in CI, so this script takes a
checkout the user provides. It builds the model repository the examples' READMEs describe, from
the checkout's files as they are:

- examples/decoupled: `repeat_int32` and `square_int32` (decoupled models whose responses come from
  threads after `execute` returned); their clients stream over gRPC (`start_stream`,
  `async_stream_infer`);
- examples/bls_decoupled: `bls_decoupled_sync` and `bls_decoupled_async` (BLS
  `exec(decoupled=True)` / `async_exec(decoupled=True)` on `square_int32`); their clients use HTTP.

It serves the repository with `toolkit serve` and runs each client, which passes when it exits 0
after printing its "PASS" line. The clients connect to localhost:8000 (HTTP) and localhost:8001
(gRPC), tritonserver's ports: when both are free the server listens there; otherwise (or with
--free-ports) it listens on free ports and the clients' connections to 8000 / 8001 are redirected
there (a `sitecustomize` on the clients' PYTHONPATH maps the address given to tritonclient's
InferenceServerClient; the example files stay untouched). Exit status 1 when an example fails.
docs/python-backend.md records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# model name -> (example folder, model file, config file), as the READMEs copy them
MODELS = {
    "repeat_int32": ("decoupled", "repeat_model.py", "repeat_config.pbtxt"),
    "square_int32": ("decoupled", "square_model.py", "square_config.pbtxt"),
    "bls_decoupled_sync": ("bls_decoupled", "sync_model.py", "sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled", "async_model.py", "async_config.pbtxt"),
}
# client -> the models it needs
CLIENTS = {
    "decoupled/repeat_client.py": ("repeat_int32",),
    "decoupled/square_client.py": ("square_int32",),
    "bls_decoupled/sync_client.py": ("bls_decoupled_sync", "square_int32"),
    "bls_decoupled/async_client.py": ("bls_decoupled_async", "square_int32"),
}
HTTP_PORT, GRPC_PORT = 8000, 8001

REDIRECT = '''
"""Written by toolkit's scripts/decoupled_examples.py: the examples connect to tritonserver's
ports, the server under test listens elsewhere; tritonclient's clients get its address."""
import os

_TARGETS = dict(item.split("=", 1) for item in os.environ.get("TOOLKIT_EXAMPLES_REDIRECT", "").split(",") if item)


def _patch(module):
    original = module.InferenceServerClient.__init__

    def __init__(self, url, *args, **kwargs):
        original(self, _TARGETS.get(url, url), *args, **kwargs)

    module.InferenceServerClient.__init__ = __init__


try:
    import tritonclient.grpc
    import tritonclient.http
except ImportError:
    pass
else:
    _patch(tritonclient.grpc)
    _patch(tritonclient.http)
'''


def build_repository(examples: Path, repo: Path) -> dict[str, str]:
    """The repository of every example model present in the checkout; the ones missing, with why."""
    missing: dict[str, str] = {}
    for name, (folder, model_file, config_file) in MODELS.items():
        source, config = examples / folder / model_file, examples / folder / config_file
        if not (source.is_file() and config.is_file()):
            missing[name] = f"{source.relative_to(examples.parent)} or {config_file} is not in this checkout"
            continue
        (repo / name / "1").mkdir(parents=True)
        shutil.copyfile(source, repo / name / "1" / "model.py")
        shutil.copyfile(config, repo / name / "config.pbtxt")
    return missing


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(http_port: int, process: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"toolkit serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"toolkit serve was not ready after {timeout} s:\n{log.read_text()[-3000:]}")


def run_examples(checkout: Path, *, free_ports: bool = False, timeout: float = 120) -> list[dict]:
    examples = checkout / "examples"
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="toolkit-decoupled-examples-") as folder:
        work = Path(folder)
        repo = work / "models"
        repo.mkdir()
        missing = build_repository(examples, repo)
        redirect = free_ports or not (_free(HTTP_PORT) and _free(GRPC_PORT))
        http_port, grpc_port = (_free_port(), _free_port()) if redirect else (HTTP_PORT, GRPC_PORT)
        env = dict(os.environ)
        if redirect:
            (work / "redirect").mkdir()
            (work / "redirect" / "sitecustomize.py").write_text(REDIRECT)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(work / "redirect"), env.get("PYTHONPATH", "")) if p)
            env["TOOLKIT_EXAMPLES_REDIRECT"] = ",".join(
                f"{host}:{port}={host}:{target}"
                for host in ("localhost", "127.0.0.1")
                for port, target in ((HTTP_PORT, http_port), (GRPC_PORT, grpc_port))
            )
        log = work / "serve.log"
        with open(log, "w") as handle:
            server = subprocess.Popen(
                [sys.executable, "-m", "toolkit.cli", "serve", str(repo), "--device", "cpu", "--http-port",
                 str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", "0", "--log-level", "warning"],
                cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
            )
            try:
                _wait_ready(http_port, server, log)
                for client, models in CLIENTS.items():
                    path = examples / client
                    absent = [missing[m] for m in models if m in missing]
                    if not path.is_file() or absent:
                        why = absent[0] if absent else f"{path.relative_to(checkout)} is not in this checkout"
                        results.append({"example": client, "status": "not run", "why": why})
                        continue
                    started = time.monotonic()
                    try:
                        run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                                             timeout=timeout, cwd=checkout, env=env)
                        code, output = run.returncode, run.stdout + run.stderr
                    except subprocess.TimeoutExpired as exc:
                        code, output = -1, f"timed out after {timeout} s\n{exc.stdout or ''}"
                    passed = code == 0 and "PASS" in output
                    results.append({
                        "example": client, "status": "PASS" if passed else "FAIL", "exit": code,
                        "seconds": round(time.monotonic() - started, 1),
                        "pass_line": next((line for line in output.splitlines() if line.startswith("PASS")), ""),
                        "output": "" if passed else output[-3000:],
                        "ports": "redirected" if redirect else "8000/8001",
                    })
            finally:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python_backend", type=Path, help="a checkout of github.com/triton-inference-server/python_backend")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--free-ports", action="store_true",
                        help="serve on free ports and redirect the clients' 8000/8001 there, even when those are free")
    args = parser.parse_args()
    if not (args.python_backend / "examples" / "decoupled").is_dir():
        parser.error(f"{args.python_backend}/examples/decoupled is not a folder: pass the root of a python_backend checkout")
    results = run_examples(args.python_backend, free_ports=args.free_ports)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            line = f"{result['status']:>8}  {result['example']}"
            if result.get("pass_line"):
                line += f"  ({result['pass_line']}, {result['seconds']} s)"
            if result.get("why"):
                line += f"  ({result['why']})"
            print(line)
            if result.get("output"):
                print(textwrap.indent(result["output"].strip(), "      | "))
    failed = [r for r in results if r["status"] == "FAIL"]
    print(f"{sum(r['status'] == 'PASS' for r in results)} passed, {len(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
