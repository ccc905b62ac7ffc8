"""Lambda images under AWS's Lambda Runtime Interface Emulator: cold start, two ways.

    .venv/bin/python bench/lambda_cold_start.py IMAGE [IMAGE ...] [--runs 5] [--builder auto]

IMAGE is a Lambda image built by `toolkit build --target lambda`. Each run starts a fresh
container exactly as `toolkit build --measure-cold-start` does (read-only root, /tmp tmpfs,
non-root user, the RIE as entrypoint) and sends one Function URL event for /v2/health/ready:
- `total`: from asking the engine to start the container to the answer (container creation on
  this host, the RIE, Lambda's init phase, the first invoke);
- `init`: the RIE's INIT REPORT (runtime start to its first /next: imports, models loaded and
  warmed up), what Lambda reports as Init Duration.
Prints the median and every run; the numbers go in docs/cold-start.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.build.builders import detect_builder  # noqa: E402
from toolkit.build.pipeline import SilentUI, measure_lambda_cold_start  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="+")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--builder", default="auto")
    parser.add_argument("--platform", default="linux/amd64")
    args = parser.parse_args()
    builder, _ = detect_builder(args.builder)
    if builder is None or not builder.can_run:
        raise SystemExit("no container engine that runs images (docker or podman)")
    for image in args.images:
        totals, inits = [], []
        for _ in range(args.runs):
            cold, _ = measure_lambda_cold_start(builder, image, args.platform, SilentUI())  # (cold start, /metrics)
            totals.append(cold.seconds)
            inits.append(cold.init_seconds or float("nan"))
        print(f"{image}: total median {statistics.median(totals):.2f} s (runs {', '.join(f'{t:.2f}' for t in totals)}); "
              f"init median {statistics.median(inits):.3f} s (runs {', '.join(f'{t:.3f}' for t in inits)})")


if __name__ == "__main__":
    main()
