"""Print the completed config tritonserver serves for every READY model of a repository.

Run with the anchors' venv (record.py does it):

    $ANCHORS_CACHE/triton-venv/bin/python tests/oracle/triton_configs.py REPO [--autofill]

It starts the same tritonserver 2.51.0 as triton-validate (from /work/shared/anchors, which it
imports), waits until the repository is loaded, prints {model: GET /v2/models/<model>/config}
as JSON for the models whose every version is READY, and stops the server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

ANCHORS = Path(os.environ.get("ANCHORS_DIR", "/work/shared/anchors"))
sys.path.insert(0, str(ANCHORS))

from triton_anchor import CACHE, NO_PROXY, PYTRITON, TRITON, die_with_parent  # noqa: E402
from triton_validate import free_port, index  # noqa: E402


def _get(url: str) -> dict:
    with NO_PROXY.open(urllib.request.Request(url), timeout=10) as response:
        return json.load(response)


def main() -> int:
    repository = Path(sys.argv[1]).resolve()
    autofill = "--autofill" in sys.argv[2:]
    (CACHE / "runs").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"configs-{os.getpid()}-", dir=CACHE / "runs"))
    proc = None
    try:
        backends = work / "backends"
        shutil.copytree(TRITON / "backends", backends)
        stub = TRITON / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}"
        shutil.copy(stub / "triton_python_backend_stub", backends / "python")
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [
            str(PYTRITON.parent / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR"),
            os.environ.get("LD_LIBRARY_PATH")]))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        ports = [free_port() for _ in range(3)]
        cmd = [str(TRITON / "bin" / "tritonserver"), f"--model-repository={repository}",
               f"--backend-directory={backends}", f"--cache-directory={TRITON / 'caches'}",
               f"--strict-model-config={'false' if autofill else 'true'}", "--exit-on-error=false",
               "--http-address=127.0.0.1", f"--http-port={ports[0]}",
               "--grpc-address=127.0.0.1", f"--grpc-port={ports[1]}",
               "--metrics-address=127.0.0.1", f"--metrics-port={ports[2]}",
               "--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0",
               f"--backend-config=python,shm-region-prefix-name=triton_configs_{os.getpid()}_"]
        log = open(work / "tritonserver.log", "w+")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent, start_new_session=True)
        url = f"http://127.0.0.1:{ports[0]}"
        deadline, models = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                models = index(url)
                break
            except OSError:
                time.sleep(0.3)
        if models is None:
            sys.exit("tritonserver did not come up")
        names = sorted({m["name"] for m in models})
        ready = [n for n in names if all(m.get("state") == "READY" for m in models if m["name"] == n)]
        print(json.dumps({n: _get(f"{url}/v2/models/{n}/config") for n in ready}, indent=1, sort_keys=True))
        return 0
    finally:
        if proc and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for f in Path("/dev/shm").glob(f"triton_configs_{os.getpid()}_*"):
            f.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
