"""Images with a native front end (the default) against the same images with the Python server:
gRPC images (grpc++ vs grpcio's server, perf_analyzer -i grpc) or HTTP images (libevent's evhttp
vs uvicorn, perf_analyzer -i http), each image run with `docker run`.

    DOCKER_HOST=... .venv/bin/python bench/frontend_image.py [--protocol grpc|http] [--repeats 3] [--concurrency 16]

Builds the tiny model (bench/perf_models.py: a 16x16 MatMul, the serving stack's own per-request
cost) with serve_vs_triton's configuration (2) (dynamic batching, 1 instance) into two Cloud Run
images, `toolkit build` with `--grpc-frontend native` and `grpcio` (`--protocol grpc`), or with
`--http-frontend native` and `uvicorn` (`--protocol http`), and prints each image's size, build
time and the front end its report names. Then both images run (host network, read-only root,
$PORT: as tests/test_build_e2e_grpc.py and tests/test_build_e2e_http_native.py run them) and
perf_analyzer 2.51 sends `-b 2 --concurrency-range C:C` to each in turn, alternating which goes
first (interleaved repeats); the medians and their ratio are printed, and written as JSON with
--output. Needs the container engine (DOCKER_HOST) and the base image (--base-image, default
$TOOLKIT_BASE_IMAGE or toolkit-ci/python:3.11-bookworm).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import perf_analyzer  # noqa: E402
import perf_models  # noqa: E402
from serve_vs_triton import CONFIGS, TINY  # noqa: E402

from toolkit.build.native_frontend import KINDS  # noqa: E402
from toolkit.build.builders import wait_ready  # noqa: E402
from toolkit.build.pipeline import wait_grpc_serving  # noqa: E402
from toolkit.build.report import human_bytes  # noqa: E402

DOCKER = os.environ.get("TOOLKIT_DOCKER") or shutil.which("docker") or "docker"


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=600, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {out.stdout}{out.stderr}")
    return out


def build(repo: Path, output: Path, protocol: str, frontend: str, base_image: str, name: str) -> dict:
    started = time.monotonic()
    command = [sys.executable, "-m", "toolkit.cli", "build", str(repo), "--target", "cloudrun", "--protocol", protocol,
               f"--{protocol}-frontend", frontend, "--base-image", base_image, "--builder", "docker", "--output",
               str(output), "--name", name, "-q"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"toolkit build failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    report = json.loads((output / "build-report.json").read_text())
    return {"image": report["image"], "image_size": report["image_size"], "frontend": report[f"{protocol}_frontend"],
            "toolkit_build_seconds": round(time.monotonic() - started, 1), "engine_build_seconds": report["build_seconds"]}


def start(image: str, port: int, name: str, protocol: str) -> str:
    container = docker("run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
                       "-e", f"PORT={port}", "-e", "TOOLKIT_HOST=127.0.0.1", image).stdout.strip()
    alive = lambda: docker("inspect", "--format", "{{.State.Running}}", container, check=False).stdout.strip() == "true"  # noqa: E731
    if protocol == "grpc":
        served = wait_grpc_serving(f"127.0.0.1:{port}", 300, alive)
    else:
        served = wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", 300, alive)
    if served is None:
        raise RuntimeError(f"{image} did not serve: {docker('logs', container, check=False).stderr[-3000:]}")
    return container


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=sorted(KINDS), default="grpc", help="which images (default grpc)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--measurement-ms", type=int, default=2000)
    parser.add_argument("--base-image", default=os.environ.get("TOOLKIT_BASE_IMAGE", "toolkit-ci/python:3.11-bookworm"))
    parser.add_argument("--name", help="image and container name prefix (default: PROTOCOL-image-bench)")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the images")
    args = parser.parse_args()
    kind = KINDS[args.protocol]
    frontends = ("native", kind.fallback)
    name = args.name or f"{args.protocol}-image-bench"

    work = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    containers: list[str] = []
    images: dict[str, dict] = {}
    try:
        repo = work / "models"
        perf_models.tiny(repo / TINY / "1" / "model.onnx")
        config = next(c for c in CONFIGS[TINY] if c.key == "2")
        (repo / TINY / "config.pbtxt").write_text(config.pbtxt(TINY, 1))
        for frontend in frontends:
            images[frontend] = build(repo, work / f"ctx-{frontend}", args.protocol, frontend, args.base_image,
                                     f"{name}-{frontend}")
            print(f"{frontend}: {images[frontend]['image']} {human_bytes(images[frontend]['image_size'])}, toolkit build "
                  f"{images[frontend]['toolkit_build_seconds']} s ({images[frontend]['frontend']})", flush=True)
        ports = {}
        for frontend in frontends:
            ports[frontend] = _free_port()
            containers.append(start(images[frontend]["image"], ports[frontend], f"{name}-{frontend}-{os.getpid()}",
                                    args.protocol))
            out = docker("logs", containers[-1])
            logs = out.stdout + out.stderr
            images[frontend]["logged_frontend"] = next(
                (f for f in frontends if f"{kind.label} front end: {f}" in logs), "?")
        runs: dict[str, list[dict]] = {f: [] for f in frontends}
        for repeat in range(args.repeats):
            order = frontends if repeat % 2 == 0 else frontends[::-1]
            for frontend in order:
                c = args.concurrency
                (level,) = perf_analyzer.run_levels(TINY, f"127.0.0.1:{ports[frontend]}", concurrency=f"{c}:{c}",
                                                     protocol=args.protocol, measurement_ms=args.measurement_ms)
                runs[frontend].append({"throughput": level.throughput, "p95_us": level.p95_us, "stability": level.stability})
                print(f"repeat {repeat + 1} {frontend}: {level.throughput:.0f} infer/s, p95 {level.p95_us / 1000:.1f} ms",
                      flush=True)
        result = {"protocol": args.protocol, "concurrency": args.concurrency, "batch": 2, "repeats": args.repeats, "images": images, "runs": runs,
                  "load_at_end": os.getloadavg()[0]}
        for frontend in frontends:
            result[frontend] = {"throughput": statistics.median(r["throughput"] for r in runs[frontend]),
                                "p95_us": statistics.median(r["p95_us"] for r in runs[frontend])}
        other = kind.fallback
        ratio = result["native"]["throughput"] / result[other]["throughput"]
        result["ratio"] = round(ratio, 3)
        print(f"medians at c{args.concurrency}: native {result['native']['throughput']:.0f} infer/s "
              f"(p95 {result['native']['p95_us'] / 1000:.1f} ms), {other} {result[other]['throughput']:.0f} infer/s "
              f"(p95 {result[other]['p95_us'] / 1000:.1f} ms): {ratio:.2f}x; image sizes "
              f"{human_bytes(images['native']['image_size'])} vs {human_bytes(images[other]['image_size'])}")
        if args.output:
            args.output.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    finally:
        for container in containers:
            docker("rm", "-f", container, check=False)
        if not args.keep:
            for entry in images.values():
                docker("rmi", entry["image"], check=False)
        shutil.rmtree(work, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
