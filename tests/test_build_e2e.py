"""End to end with a real container engine: `toolkit build` images, run and driven by tritonclient.

Needs the engine and the Python base image that scripts/ci-docker.sh sets up (a private dockerd
on /tmp/toolkit-docker/docker.sock, or DOCKER_HOST; the base image $TOOLKIT_BASE_IMAGE, default
toolkit-ci/python:3.11-bookworm, made with debootstrap because no registry is reachable). Where
they are missing the tests skip, unless TOOLKIT_REQUIRE_DOCKER=1 (CI sets it): then they fail.

- cloudrun: the image runs with a read-only root as its non-root user; tritonclient.http
  checks health, metadata, config and outputs; SIGTERM drains and exits 0.
- lambda: the image runs as Lambda runs it (read-only root, /tmp tmpfs, an arbitrary non-root
  uid) under AWS's own Lambda Runtime Interface Emulator (`toolkit build --measure-cold-start`,
  `toolkit run`); tritonclient and perf_analyzer talk to it through the Function URL front.
- push: to a local registry (docker-registry from apt) and pulled back.
- python auto-complete: a python model whose auto_complete_config imports a package that only its
  requirements.txt brings (a local wheel built here) is completed by the image build; the
  running container serves the completed config.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import manifest_checks
import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import free_port
from tools import lambda_rie, perf_analyzer

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "samples" / "quickstart"
ENGINE_DIR = Path(os.environ.get("TOOLKIT_DOCKER_DIR", "/tmp/toolkit-docker"))
BASE_IMAGE = os.environ.get("TOOLKIT_BASE_IMAGE", "toolkit-ci/python:3.11-bookworm")
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")
CLOUDRUN_SIZE_GOAL = 500 * 1000**2
LAMBDA_SIZE_GOAL = 600 * 1000**2


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    if "DOCKER_HOST" not in env and (ENGINE_DIR / "docker.sock").exists():
        env["DOCKER_HOST"] = f"unix://{ENGINE_DIR / 'docker.sock'}"
    env["TOOLKIT_DOCKER"] = DOCKER
    return env


@pytest.fixture(scope="module")
def engine() -> dict[str, str]:
    env = engine_env()
    problem = None
    try:
        info = subprocess.run([DOCKER, "info"], check=False, capture_output=True, text=True, env=env, timeout=60)
        if info.returncode != 0:
            problem = f"no docker engine answers ({env.get('DOCKER_HOST', 'default socket')}): {info.stderr.strip()[-300:]}"
        elif subprocess.run([DOCKER, "image", "inspect", BASE_IMAGE], check=False, capture_output=True, env=env).returncode != 0:
            problem = f"base image {BASE_IMAGE} is missing (scripts/ci-docker.sh base)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = f"docker client not usable: {exc}"
    if problem:
        if os.environ.get("TOOLKIT_REQUIRE_DOCKER") == "1":
            pytest.fail(f"TOOLKIT_REQUIRE_DOCKER=1 but {problem}")
        pytest.skip(f"{problem}; run scripts/ci-docker.sh to set up the engine")
    return env


def docker(env: dict[str, str], *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([DOCKER, *args], check=False, capture_output=True, text=True, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed: {result.stdout}{result.stderr}")
    return result


def toolkit_build(env: dict[str, str], output: Path, *args: str, repository: Path = QUICKSTART,
                  base_image: str = BASE_IMAGE) -> dict:
    command = [sys.executable, "-m", "toolkit.cli", "build", str(repository), "--base-image", base_image,
               "--builder", "docker", "--output", str(output), "-q", *args]
    result = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((output / "build-report.json").read_text())
    report["output"] = result.stdout + result.stderr
    return report


def wait_ready(url: str, container: str, env: dict[str, str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        state = docker(env, "inspect", "--format", "{{.State.Running}}", container, check=False).stdout.strip()
        if state != "true":
            break
        time.sleep(0.2)  # polling an HTTP endpoint: there is no event to wait on
    logs = docker(env, "logs", container, check=False)
    raise AssertionError(f"{container} not ready: {logs.stdout}{logs.stderr}")


def deploy_builds(env: dict[str, str], tmp_path: Path, *args: str) -> str:
    """`toolkit deploy QUICKSTART --target cloudrun ARGS` with no --image and no Google credentials:
    it builds the image (toolkit build's pipeline, the base image BASE_IMAGE) and stops at the
    credentials with the commands that would push and deploy it. Returns the image reference those
    commands push (its tag is the build's content tag)."""
    env = {**env, "CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud"), "NO_GCE_CHECK": "True", "PYTHONPATH": str(ROOT)}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    result = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "deploy", str(QUICKSTART), "--target", "cloudrun", "--base-image", BASE_IMAGE,
         "--region", "us-central1", "--project", "p", "--output", str(tmp_path / "deploy-out"), "-q", *args],
        capture_output=True, text=True, env=env, timeout=1200, cwd=tmp_path,
    )
    assert result.returncode == 1 and "not deployed" in result.stderr, result.stdout + result.stderr
    pushed = re.search(r"docker push (us-central1-docker\.pkg\.dev/p/toolkit/\S+)", result.stdout)
    assert pushed, result.stdout
    return pushed.group(1)


def stop_and_logs(env: dict[str, str], container: str) -> str:
    """Stop a served container (SIGTERM, 30 s to drain): it exits 0. Returns its log."""
    docker(env, "stop", "--time", "30", container)
    state = json.loads(docker(env, "inspect", "--format", "{{json .State}}", container).stdout)
    logs = docker(env, "logs", container)
    assert state["ExitCode"] == 0, logs.stderr
    return logs.stdout + logs.stderr


def infer_add_sub(client: httpclient.InferenceServerClient) -> None:
    a = np.random.default_rng(0).random((3, 16), dtype=np.float32)
    b = np.random.default_rng(1).random((3, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [3, 16], "FP32"), httpclient.InferInput("INPUT1", [3, 16], "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True), httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    result = client.infer("add_sub", inputs, outputs=outputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


@pytest.fixture(scope="module")
def cloudrun_image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    output = tmp_path_factory.mktemp("cloudrun") / "ctx"
    report = toolkit_build(engine, output, "--target", "cloudrun")
    report["context_dir"] = output
    return report


def test_cloudrun_image_is_small_labelled_and_carries_only_the_runtime(engine: dict[str, str], cloudrun_image: dict) -> None:
    image = cloudrun_image["image"]
    assert cloudrun_image["image_size"] < CLOUDRUN_SIZE_GOAL, cloudrun_image["image_size"]
    assert cloudrun_image["layers"] and cloudrun_image["cold_start"]["seconds"] > 0
    config = json.loads(docker(engine, "image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert config["User"] == "65532:65532"
    labels = config["Labels"]
    assert labels["io.triton-serverless-toolkit.target"] == "cloudrun"
    assert labels["io.triton-serverless-toolkit.models"] == "add_sub"
    assert labels["io.triton-serverless-toolkit.versions"] == "add_sub:1"
    assert labels["io.triton-serverless-toolkit.repository.digest"] == cloudrun_image["repository_digest"]
    assert labels["io.triton-serverless-toolkit.version"] == "0.1.0"
    (service,) = map(Path, cloudrun_image["manifests"])  # the Cloud Run service.yaml written beside the image
    assert manifest_checks.knative_validate(service)[0] == 0
    assert manifest_checks.kubernetes_strict_errors(manifest_checks.load(service)) == []
    check = (
        "import importlib.util as u; "
        "print(sorted(m for m in ('toolkit', 'google', 'onnx', 'jinja2', 'boto3', 'tritonclient', 'mangum') if u.find_spec(m)))"
    )
    found = docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", check).stdout
    assert found.strip() == "[]"


def test_cloudrun_image_serves_tritonclient_read_only_and_drains_on_sigterm(engine: dict[str, str], cloudrun_image: dict) -> None:
    port = free_port()
    container = docker(
        engine, "run", "-d", "--network", "host", "--read-only", "--tmpfs", "/tmp", "-e", f"PORT={port}",
        "-e", "TOOLKIT_HOST=127.0.0.1", cloudrun_image["image"],
    ).stdout.strip()
    try:
        wait_ready(f"http://127.0.0.1:{port}", container, engine)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live() and client.is_model_ready("add_sub")
        metadata = client.get_model_metadata("add_sub")
        assert metadata["platform"] == "onnxruntime_onnx" and metadata["versions"] == ["1"]
        manifest = json.loads((cloudrun_image["context_dir"] / "repository" / "models.json").read_text())
        assert client.get_model_config("add_sub") == manifest["models"][0]["config"]
        infer_add_sub(client)

        docker(engine, "stop", "--time", "30", container)
        state = json.loads(docker(engine, "inspect", "--format", "{{json .State}}", container).stdout)
        assert state["ExitCode"] == 0, docker(engine, "logs", container).stderr
    finally:
        docker(engine, "rm", "-f", container, check=False)


def test_lambda_image_runs_as_lambda_runs_it(engine: dict[str, str], tmp_path: Path) -> None:
    env = {**engine, "TOOLKIT_LAMBDA_RIE": lambda_rie()}
    report = toolkit_build(env, tmp_path / "ctx", "--target", "lambda", "--measure-cold-start")
    assert report["image_size"] < LAMBDA_SIZE_GOAL, report["image_size"]
    assert {"mangum", "awslambdaric"} <= set(report["python_deps"]) and "uvicorn" not in report["python_deps"]
    assert any("6 MB" in w for w in report["warnings"])
    (template,) = map(Path, report["manifests"])  # the SAM template written beside the image
    checked = manifest_checks.sam_validate(template)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    cold = report["cold_start"]  # measured under the RIE: its INIT REPORT is part of the total
    assert cold["measured"] and "AWS Lambda RIE" in cold["how"], cold
    assert 0 < cold["init_seconds"] < cold["seconds"], cold
    (backend,) = report["backends"]  # what ONNX Runtime adds, and its models' share of the cold start (/metrics)
    assert backend["backends"] == ["onnxruntime"] and set(backend["distributions"]) == {"onnxruntime"}
    assert 0 < backend["ready_seconds"] < cold["seconds"], backend

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "run", report["image"], "--port", str(port), "--builder", "docker"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        banner = process.stderr.readline()  # printed once the RIE listens (or the error, at exit)
        assert "under AWS's Lambda Runtime Interface Emulator in container" in banner, banner + process.stderr.read()
        container = banner.split("in container ")[1].split(";")[0]
        host_config = json.loads(docker(engine, "inspect", "--format", "{{json .HostConfig}}", container).stdout)
        config = json.loads(docker(engine, "inspect", "--format", "{{json .Config}}", container).stdout)
        assert host_config["ReadonlyRootfs"] is True and "/tmp" in host_config["Tmpfs"]
        assert config["User"] == "993:990" and config["Entrypoint"] == ["/aws-lambda-rie"]

        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
        assert client.is_server_ready() and client.is_model_ready("add_sub")
        infer_add_sub(client)
        client.close()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/add_sub/infer", data=b"{not json",
                                         method="POST", headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=60)
            raise AssertionError("malformed JSON was accepted")
        except urllib.error.HTTPError as exc:
            assert exc.code == 400 and "error" in json.loads(exc.read())
        out = subprocess.run(
            [perf_analyzer(), "-u", f"127.0.0.1:{port}", "-m", "add_sub", "--shape", "INPUT0:16", "--shape", "INPUT1:16",
             "--concurrency-range", "1", "--request-count", "20"],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0 and "Throughput" in out.stdout, out.stdout + out.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert docker(engine, "ps", "-aq", "--filter", f"name=^{container}$").stdout.strip() == ""  # removed at exit


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """docker-registry (the reference OCI registry, from apt) on a free loopback port."""
    executable = shutil.which("docker-registry")
    if executable is None:
        if os.environ.get("TOOLKIT_REQUIRE_DOCKER") == "1":
            pytest.fail("docker-registry is not installed (scripts/ci-docker.sh install)")
        pytest.skip("docker-registry is not installed (scripts/ci-docker.sh install)")
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: warn\n"
    )
    process = subprocess.Popen([executable, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise AssertionError("docker-registry did not start") from None
                time.sleep(0.1)  # polling an HTTP endpoint: there is no event to wait on
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_push_to_a_registry_and_pull_back(engine: dict[str, str], cloudrun_image: dict, registry: str, tmp_path: Path) -> None:
    report = toolkit_build(engine, tmp_path / "ctx", "--target", "cloudrun", "--name", "team/quickstart", "--push", registry)
    pushed = f"{registry}/team/quickstart:{report['tag']}"
    assert report["pushed"] == pushed
    assert report["tag"] == cloudrun_image["tag"]  # same inputs, same digest (the name is not in the context)
    with urllib.request.urlopen(f"http://{registry}/v2/team/quickstart/tags/list", timeout=10) as response:
        assert json.loads(response.read())["tags"] == [report["tag"]]

    image_id = docker(engine, "image", "inspect", "--format", "{{.Id}}", pushed).stdout.strip()
    docker(engine, "rmi", pushed)
    docker(engine, "pull", pushed)
    assert docker(engine, "image", "inspect", "--format", "{{.Id}}", pushed).stdout.strip() == image_id


def test_buildah_builds_the_same_context(engine: dict[str, str], tmp_path: Path) -> None:
    """buildah (daemonless) builds the image from the same context; its content imports and runs."""
    buildah = shutil.which("buildah")
    if buildah is None:
        if os.environ.get("TOOLKIT_REQUIRE_DOCKER") == "1":
            pytest.fail("buildah is not installed (scripts/ci-docker.sh install)")
        pytest.skip("buildah is not installed (scripts/ci-docker.sh install)")
    env = dict(engine)
    env.setdefault("STORAGE_DRIVER", "vfs")
    env.setdefault("BUILDAH_ISOLATION", "chroot")

    def run(*args: str) -> str:
        result = subprocess.run([buildah, *args], check=False, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, f"buildah {' '.join(args)}: {result.stdout}{result.stderr}"
        return result.stdout

    if subprocess.run([buildah, "inspect", "--type", "image", BASE_IMAGE], check=False, capture_output=True, env=env).returncode != 0:
        archive = tmp_path / "base.tar"
        docker(engine, "save", "-o", str(archive), BASE_IMAGE)
        run("pull", "-q", f"docker-archive:{archive}")
    report = toolkit_build(env, tmp_path / "ctx", "--target", "cloudrun", "--builder", "buildah")
    assert report["builder"] == "buildah" and 0 < report["image_size"] < CLOUDRUN_SIZE_GOAL
    labels = json.loads(run("inspect", "--type", "image", report["image"]))["OCIv1"]["config"]["Labels"]
    assert labels["io.triton-serverless-toolkit.repository.digest"] == report["repository_digest"]
    container = run("from", "--pull-never", report["image"]).strip().splitlines()[-1]
    try:
        out = run("run", container, "--", "python3", "-c", "import handlers.app, onnxruntime, uvloop; print('runtime ok')")
        assert "runtime ok" in out
    finally:
        run("rm", container)


def test_python_model_auto_completed_by_the_image_build(engine: dict[str, str], tmp_path: Path) -> None:
    """The model imports `acme_features` in auto_complete_config; only the image has it (a local
    wheel named in the model's requirements.txt), so the Dockerfile completes its config."""
    from test_python_autocomplete_build import ENSEMBLE_PBTXT, MODEL_PY, SCORE_PBTXT, SCORE_PY, write_model

    import importlib.util

    assert importlib.util.find_spec("acme_features") is None  # the host cannot run auto_complete_config
    source = tmp_path / "acme-src"
    (source / "acme_features").mkdir(parents=True)
    (source / "acme_features" / "__init__.py").write_text("MAX_BATCH = 8\nWIDTH = 3\n")
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "acme-features"\nversion = "0.1"\n'
    )
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(wheels), str(source)],
        check=False, capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("acme_features-0.1-*.whl")

    repo = tmp_path / "models"
    write_model(repo, "featurize", MODEL_PY, requirements=f"../../wheels/{wheel.name}\n")  # relative to the file
    write_model(repo, "score", SCORE_PY, SCORE_PBTXT, requirements="")
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(ENSEMBLE_PBTXT.lstrip())

    output = tmp_path / "ctx"
    report = toolkit_build(engine, output, "--target", "cloudrun", repository=repo)
    assert "python model 'featurize': its auto_complete_config imports 'acme_features'" in report["output"]
    assert report["python_deps"]["acme-features"] == "0.1"
    shipped = json.loads((output / "repository" / "models.json").read_text())
    assert {e["name"]: e.get("autocomplete") for e in shipped["models"]}["featurize"] == "image"  # the context's copy

    port = free_port()
    container = docker(
        engine, "run", "-d", "--network", "host", "--read-only", "--tmpfs", "/tmp", "-e", f"PORT={port}",
        "-e", "TOOLKIT_HOST=127.0.0.1", report["image"],
    ).stdout.strip()
    try:
        wait_ready(f"http://127.0.0.1:{port}", container, engine)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        metadata = client.get_model_metadata("featurize")
        assert metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
        assert metadata["outputs"] == [{"name": "FEATURES", "datatype": "FP32", "shape": [-1, 3]}]
        config = client.get_model_config("featurize")
        assert config["max_batch_size"] == 8 and config["dynamic_batching"]["preferred_batch_size"] == [8]
        raw = httpclient.InferInput("RAW", [2, 1], "BYTES")
        raw.set_data_from_numpy(np.array([[b"abc"], [b"hello"]], dtype=object))
        result = client.infer("pipeline", [raw])
        np.testing.assert_array_equal(result.as_numpy("SCORE"), [[6.0] * 3, [10.0] * 3])
    finally:
        docker(engine, "rm", "-f", container, check=False)


def test_the_images_a_session_built_are_removed_at_its_end(engine: dict[str, str], tmp_path: Path) -> None:
    """conftest.py's session end removes the images toolkit build labelled during the session (by
    id, with every tag), and nothing else: here, one labelled image (a LABEL on the base image, no
    layer) made after `since` goes with its second tag; one made before it and an unlabelled one stay."""
    from conftest import LABEL_PREFIX, remove_images_built_since

    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nLABEL {LABEL_PREFIX}.version=test-{tmp_path.name}\n")
    (tmp_path / "Plain").write_text(f"FROM {BASE_IMAGE}\nLABEL plain=test-{tmp_path.name}\n")
    tag = f"session-images-{os.getpid()}"
    docker(engine, "build", "-q", "-t", f"{tag}:old", str(tmp_path))
    time.sleep(1.1)  # CreatedAt has whole seconds
    since = time.time()
    time.sleep(1.1)
    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nLABEL {LABEL_PREFIX}.version=new-{tmp_path.name}\n")
    docker(engine, "build", "-q", "-t", f"{tag}:new", str(tmp_path))
    docker(engine, "tag", f"{tag}:new", f"127.0.0.1:5000/{tag}:new")
    docker(engine, "build", "-q", "-f", str(tmp_path / "Plain"), "-t", f"{tag}:plain", str(tmp_path))
    new_id = docker(engine, "image", "inspect", "--format", "{{.Id}}", f"{tag}:new").stdout.strip()
    try:
        removed = remove_images_built_since(DOCKER, engine, since)
        assert removed == [new_id]
        for gone in (f"{tag}:new", f"127.0.0.1:5000/{tag}:new"):
            assert docker(engine, "image", "inspect", gone, check=False).returncode != 0, gone
        for kept in (f"{tag}:old", f"{tag}:plain", BASE_IMAGE):
            assert docker(engine, "image", "inspect", kept, check=False).returncode == 0, kept
    finally:
        docker(engine, "rmi", "-f", f"{tag}:old", f"{tag}:new", f"127.0.0.1:5000/{tag}:new", f"{tag}:plain", check=False)
