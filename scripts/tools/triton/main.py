"""scripts/tools/tritonserver: the real tritonserver 2.51.0 (nvidia-pytriton 0.7.0), two ways.

  validate REPO [--autofill] [--json] [--configs] [--log] [--timeout S]
      Loads REPO as it is (--strict-model-config=true, or auto-complete with --autofill;
      --exit-on-error=false) and prints each model's version, state and reason, as tritonserver
      reports them. A config that fails tritonserver's checks never reaches a load: it is reported
      as INVALID with the reason from tritonserver's log. With --json: one JSON object
      {"server", "mode", "models": [...], "configs": {...} (--configs: GET /v2/models/M/config of
      every model whose versions are all READY), "log": "..." (--log), "failure": {...} (when the
      server died or hung)}. Exit 0 when every model is READY or passed the core checks and only
      lacks its backend ("unable to find backend library"), 1 otherwise, 3 when tritonserver died
      before it was up, 4 when it was not up within --timeout.

  serve REPO [--http-port 8000] [--grpc-port 8001] [--metrics-port 8002] [--ort-threads N]
             [--check] [--ready-timeout S] [-- TRITONSERVER_FLAGS...]
      Serves REPO on 127.0.0.1: ONNX models as python-backend models running ONNX Runtime on CPU
      (repository.py, onnx_model.py), python models and ensembles as they are. --ort-threads: the
      intra-op threads of sessions whose config sets no intra_op_thread_count (default: ORT's). A port of 0 picks a
      free one. Prints "tritonserver ready: {json}" (ports and models) once /v2/health/ready
      answers 200, then runs until SIGTERM/SIGINT. --check: one inference per model, then stop;
      exit 0 when all succeed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import launcher
from launcher import Ports, ServerDied, ServerHung, Tritonserver, http_json, say

# A config that fails tritonserver's checks is never loaded: the index lists the name alone, and
# tritonserver's log says why.
_POLL_FAILED = re.compile(r"Poll failed for model directory '([^']+)': (.*?)\"?$", re.M)
_MISSING_BACKEND = "unable to find backend library"


def _passed(model: dict) -> bool:
    return model.get("state") == "READY" or _MISSING_BACKEND in model.get("reason", "")


def _failure(error: Exception) -> dict:
    if isinstance(error, ServerDied):
        fatal = [line.strip() for line in error.log.splitlines() if line.startswith(("terminate called", "  what():"))]
        return {"kind": "died", "code": error.code, "message": " ".join(fatal) or str(error)}
    return {"kind": "hung", "message": str(error)}


def validate(args: argparse.Namespace) -> int:
    repository = args.repository.resolve()
    mode = "autofill" if args.autofill else "strict"
    flags = [f"--strict-model-config={'false' if args.autofill else 'true'}", "--exit-on-error=false"]
    server = Tritonserver(Ports.choose(0, 0, 0), repository, flags)
    result: dict = {"server": f"tritonserver {launcher.VERSION}", "mode": mode}
    try:
        server.start()
        try:
            server.wait_until_up(args.timeout)
        except (ServerDied, ServerHung) as error:
            result["failure"] = _failure(error)
            if args.log:
                result["log"] = error.log
            if args.json:
                print(json.dumps(result, indent=1))
            else:
                sys.stderr.write("".join(error.log.splitlines(keepends=True)[-30:]))
                say(str(error))
            return 3 if isinstance(error, ServerDied) else 4
        _, models = http_json(f"{server.url}/v2/repository/index", body=b"{}")
        log = server.log()
        invalid = dict(_POLL_FAILED.findall(log))
        for model in models:
            if "state" not in model and model.get("name") in invalid:
                model.update(state="INVALID", reason=invalid[model["name"]])
        result["models"] = models
        if args.configs:
            names = sorted({m["name"] for m in models})
            ready = [n for n in names if all(m.get("state") == "READY" for m in models if m["name"] == n)]
            result["configs"] = {n: http_json(f"{server.url}/v2/models/{n}/config")[1] for n in ready}
        if args.log:
            result["log"] = log
    finally:
        server.stop()
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for m in sorted(models, key=lambda m: (m.get("name", ""), m.get("version", ""))):
            print(f"{m.get('name')}\t{m.get('version') or '-'}\t{m.get('state', '?')}\t{m.get('reason', '')}")
    return 0 if all(_passed(m) for m in models) else 1


def _check(url: str, names: list[str]) -> int:
    """One inference per model: random inputs, batch 1, variable dimensions as 1."""
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import triton_to_np_dtype

    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    failed = 0
    for name in names:
        try:
            config = client.get_model_config(name)
            batch = [1] if config.get("max_batch_size", 0) > 0 else []
            inputs = []
            for tensor in config["input"]:
                datatype = tensor["data_type"].removeprefix("TYPE_").replace("STRING", "BYTES")
                shape = batch + [max(int(d), 1) for d in tensor["dims"]]
                if datatype == "BYTES":
                    data = np.full(shape, b"x", dtype=object)
                else:
                    data = np.random.rand(*shape).astype(triton_to_np_dtype(datatype))
                inputs.append(httpclient.InferInput(tensor["name"], shape, datatype))
                inputs[-1].set_data_from_numpy(data)
            result = client.infer(name, inputs)
            shapes = {t["name"]: list(result.as_numpy(t["name"]).shape) for t in config["output"]}
            print(f"check {name}: ok, outputs {shapes}", flush=True)
        except Exception as error:  # report every model, then fail
            failed += 1
            print(f"check {name}: FAILED: {error}", flush=True)
    return 1 if failed else 0


def serve(args: argparse.Namespace, flags: list[str]) -> int:
    import repository

    ports = Ports.choose(args.http_port, args.grpc_port, args.metrics_port)
    busy = ports.busy()
    if busy:
        say(f"127.0.0.1:{busy[0]} is already in use")
        return 2
    launcher.stop_on_signals()
    if args.ort_threads:
        os.environ["TOOLKIT_TRITON_ORT_THREADS"] = str(args.ort_threads)  # read by onnx_model.py
    server = Tritonserver(ports, flags=flags, log_to_file=args.check)
    try:
        server.repository = server.work / "models"
        try:
            names = repository.prepare(args.repository.resolve(), server.repository)
        except repository.RepositoryError as error:
            say(str(error))
            return 2
        if not names:
            say(f"nothing to serve in {args.repository}")
            return 2
        server.start()
        deadline = time.monotonic() + args.ready_timeout
        while True:
            if server.process.poll() is not None:
                sys.stderr.write("".join(server.log().splitlines(keepends=True)[-40:]))
                say(f"tritonserver exited with code {server.process.returncode} before it was ready")
                return 1
            try:
                if http_json(f"{server.url}/v2/health/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                sys.stderr.write("".join(server.log().splitlines(keepends=True)[-40:]))
                say(f"tritonserver was not ready after {args.ready_timeout:.0f} s")
                return 1
            time.sleep(0.25)
        ready = {"http": ports.http, "grpc": ports.grpc, "metrics": ports.metrics, "models": names}
        print(f"tritonserver ready: {json.dumps(ready)}", flush=True)
        if args.check:
            code = _check(server.url, names)
            if code:
                sys.stderr.write("".join(server.log().splitlines(keepends=True)[-40:]))
            return code
        code = server.process.wait()
        return code if code >= 0 else 128 - code
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/tools/tritonserver", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("validate", help="load a repository as it is; print each model's verdict")
    check.add_argument("repository", type=Path)
    check.add_argument("--autofill", action="store_true", help="auto-complete configs (default: strict)")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument("--configs", action="store_true", help="with --json: the configs READY models serve")
    check.add_argument("--log", action="store_true", help="with --json: tritonserver's log")
    check.add_argument("--timeout", type=float, default=300, help="seconds until the server is up (default 300)")
    run = commands.add_parser("serve", help="serve a repository (ONNX models through the python backend)",
                              epilog="tritonserver flags may follow `--`.")
    run.add_argument("repository", type=Path)
    run.add_argument("--http-port", type=int, default=8000)
    run.add_argument("--grpc-port", type=int, default=8001)
    run.add_argument("--metrics-port", type=int, default=8002)
    run.add_argument("--ort-threads", type=int, default=0,
                     help="intra-op threads where a config sets none (default: ONNX Runtime's)")
    run.add_argument("--check", action="store_true", help="one inference per model, then stop")
    run.add_argument("--ready-timeout", type=float, default=300, help="seconds (default 300)")
    flags: list[str] = []
    if "--" in argv:
        argv, flags = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = parser.parse_args(argv)
    if not args.repository.is_dir():
        parser.error(f"{args.repository} is not a directory")
    if args.command == "validate":
        launcher.stop_on_signals()
        return validate(args)
    return serve(args, flags)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
