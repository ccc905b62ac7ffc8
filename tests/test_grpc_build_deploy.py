"""`--protocol grpc` on the build and deploy side: what a gRPC image carries (and what an HTTP
image still does not), the generated modules copied from tritonclient with their versions checked,
the runtime loading them without tritonclient, and Cloud Run / Knative services declaring h2c
with gRPC health probes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

import model_builders as mb
from conftest import write_config
from toolkit.build.base_image import BaseImage
from toolkit.build.context import ImagePlan, render_context
from toolkit.build.errors import BuildError, BuildOptionError
from toolkit.build.grpc_modules import FILES, FOLDER, check_versions, generated_versions, source_directory
from toolkit.build.pipeline import BuildOptions, _check_options
from toolkit.build.runtime_deps import FORBIDDEN_DISTRIBUTIONS, GRPC, runtime_requirements
from toolkit.build.runtime_imports import check_runtime_imports
from toolkit.build.targets import OPT_LAYOUT, TARGETS
from toolkit.build.wheelhouse import Wheel, Wheelhouse
from toolkit.deploy.command import DeployRequest, check_target_options
from toolkit.deploy.errors import DeployOptionError
from toolkit.deploy.manifests import render_service
from toolkit.deploy.service_settings import ServiceOverrides, service_settings
from toolkit.repository.compile import compile_repository

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    repo = tmp_path_factory.mktemp("grpc-build") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """)
    result = compile_repository(repo, None, "cpu")
    assert result.ok
    return result


def _names(runtime) -> set[str]:
    return {r.name for r in [*runtime.resolved, *runtime.no_deps]}


def test_only_grpc_images_carry_grpc_and_protobuf():
    http = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None)
    grpc = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, protocol="grpc")
    assert not _names(http) & {"grpcio", "grpcio-health-checking", "protobuf"}
    assert "protobuf" in http.forbidden_distributions
    assert _names(grpc) - _names(http) == {"grpcio", "grpcio-health-checking", "protobuf"}
    assert grpc.forbidden_distributions == FORBIDDEN_DISTRIBUTIONS - {"protobuf"}
    assert "tritonclient" in grpc.forbidden_distributions  # only its generated modules, as files
    with pytest.raises(ValueError):
        runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, protocol="h3")


def test_grpc_floors_match_pyproject_and_the_generated_modules():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["grpc"]]
    for requirement in GRPC:
        assert any(d.replace(" ", "").startswith(requirement.spec.split(",")[0]) for d in declared), requirement.spec
    protobuf, grpc = generated_versions(source_directory())
    assert protobuf[0] == 6 and grpc >= (1, 0, 0)
    check_versions(source_directory())  # the installed tritonclient's modules fit the image's requirements


def test_version_check_refuses_newer_generated_code(tmp_path):
    for name in FILES:
        text = (source_directory() / name).read_text()
        (tmp_path / name).write_text(text.replace("Protobuf Python Version: 6.", "Protobuf Python Version: 7."))
    with pytest.raises(BuildError, match="protobuf 7"):
        check_versions(tmp_path)


def test_runtime_import_check_allows_only_google_protobuf(tmp_path):
    package = tmp_path / "handlers"
    package.mkdir()
    (package / "ok.py").write_text("from google.protobuf import json_format\nimport grpc\nimport grpc_health.v1.health\n")
    (package / "bad.py").write_text("import google.auth\nimport tritonclient.grpc\n")
    problems = check_runtime_imports(package)
    assert sorted((p.file.name, p.module) for p in problems) == [("bad.py", "google.auth"), ("bad.py", "tritonclient.grpc")]
    assert check_runtime_imports(ROOT / "handlers") == []


def _wheelhouse(tmp_path: Path) -> Wheelhouse:
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheels = []
    for filename in ("numpy-2.0.0-cp312-cp312-manylinux_2_28_x86_64.whl", "pip-25.0-py3-none-any.whl"):
        with zipfile.ZipFile(folder / filename, "w") as archive:
            archive.writestr("x.txt", filename)
        wheels.append(Wheel.from_file(folder / filename))
    return Wheelhouse(folder, wheels[:1], wheels[1], "k" * 64)


def test_grpc_context_copies_the_generated_modules(tmp_path, compiled):
    base = BaseImage("python:3.12-slim-bookworm", "3.12", (2, 36), "x86_64", False, "test")
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, protocol="grpc")
    plan = ImagePlan(TARGETS["cloudrun"], base, "cpu", OPT_LAYOUT, runtime, "add-sub")
    context = render_context(plan, compiled, _wheelhouse(tmp_path), tmp_path / "ctx", [])
    copied = context.directory / "app" / FOLDER
    for name in FILES:
        assert (copied / name).read_bytes() == (source_directory() / name).read_bytes()  # unchanged
    assert (copied / "LICENSE.tritonclient.txt").is_file()
    dockerfile = context.dockerfile.read_text()
    assert 'TOOLKIT_PROTOCOL="grpc"' in dockerfile
    assert f'TOOLKIT_GRPC_MODULES="{OPT_LAYOUT.app_dir}/{FOLDER}"' in dockerfile
    assert context.labels["io.triton-serverless-toolkit.protocol"] == "grpc"
    # the runtime loads them from that folder, with no tritonclient importable at all
    script = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name.startswith('tritonclient') and 'tritonclient.grpc' not in sys.modules: raise ImportError(name)\n"
        "    return real(name, *a, **k)\n"
        "import importlib.util\n"
        "builtins.__import__ = guard\n"
        "importlib.util.find_spec = lambda name, *a: None\n"
        "from handlers.protocol.grpc import generated\n"
        "config, service, stubs = generated.load()\n"
        "print(service.__file__, 'tritonclient.grpc' in sys.modules, hasattr(stubs, 'GRPCInferenceServiceServicer'))\n"
    )
    env = {**os.environ, "TOOLKIT_GRPC_MODULES": str(copied), "PYTHONPATH": str(context.directory / "app")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    file, stand_in_left, servicer = out.stdout.split()
    assert file == str(copied / "service_pb2.py") and stand_in_left == "False" and servicer == "True"


def test_http_context_has_no_generated_modules(tmp_path, compiled):
    base = BaseImage("python:3.12-slim-bookworm", "3.12", (2, 36), "x86_64", False, "test")
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None)
    plan = ImagePlan(TARGETS["cloudrun"], base, "cpu", OPT_LAYOUT, runtime, "add-sub")
    context = render_context(plan, compiled, _wheelhouse(tmp_path), tmp_path / "ctx", [])
    assert not (context.directory / "app" / FOLDER).exists()
    assert "TOOLKIT_PROTOCOL" not in context.dockerfile.read_text()


def test_lambda_has_no_grpc():
    with pytest.raises(BuildOptionError, match="lambda has no gRPC.*toolkit proxy URL --grpc-port 8001"):
        _check_options(BuildOptions(repository="r", target="lambda", protocol="grpc"))
    with pytest.raises(BuildOptionError, match="unknown protocol"):
        _check_options(BuildOptions(repository="r", target="cloudrun", protocol="h2"))
    with pytest.raises(DeployOptionError, match="AWS Lambda has no gRPC"):
        check_target_options(DeployRequest(target="lambda", protocol="grpc"))


@pytest.mark.parametrize("target", ["cloudrun", "knative"])
def test_grpc_services_declare_h2c_and_grpc_probes(compiled, target):
    image = "us-central1-docker.pkg.dev/p/toolkit/add-sub:1"
    grpc = yaml.safe_load(render_service(service_settings(target, "add-sub", compiled, ServiceOverrides(protocol="grpc")), image))
    http = yaml.safe_load(render_service(service_settings(target, "add-sub", compiled), image))
    (container,) = grpc["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "h2c", "containerPort": 8080}]
    probes = [k for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container]
    assert probes and all(container[k]["grpc"] == {"port": 8080, "service": ""} for k in probes)
    (plain,) = http["spec"]["template"]["spec"]["containers"]
    assert all("httpGet" in plain[k] for k in probes)
    if target == "cloudrun":
        assert plain["ports"] == [{"name": "http1", "containerPort": 8080}]


def test_deploy_dry_run_with_protocol_grpc(tmp_path, compiled):
    repo = compiled.root
    out = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "deploy", str(repo), "--target", "knative", "--image", "registry.local/add-sub:1",
         "--name", "add-sub", "--protocol", "grpc", "--dry-run", "--output", str(tmp_path / "out"), "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    manifest = yaml.safe_load(Path(record["manifest"]).read_text())
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    assert container["ports"][0]["name"] == "h2c" and "grpc" in container["readinessProbe"]


@pytest.mark.parametrize(("request_", "message"), [
    (DeployRequest(target="cloudrun", protocol="grpc", grpc_frontend="fast"), "--grpc-frontend fast: choose auto, native, grpcio"),
    (DeployRequest(target="cloudrun", grpc_frontend="native"), "--grpc-frontend native applies to --protocol grpc services only"),
    (DeployRequest(target="cloudrun", protocol="grpc", grpc_frontend="native", image="r.io/m:1"), "--image r.io/m:1 is built already"),
    (DeployRequest(target="lambda", base_image="r.io/python:3.11", image="m.tar"), "--base-image chooses what the image built"),
    (DeployRequest(target="knative", protocol="grpc", grpc_frontend="grpcio"), "does not apply to --target knative: it deploys a pushed --image"),
    (DeployRequest(target="knative", base_image="r.io/python:3.11"), "toolkit build --target knative --base-image r.io/python:3.11 --push"),
    (DeployRequest(target="lambda", grpc_frontend="native"), "applies to Cloud Run services only: a Lambda function has no gRPC server"),
    (DeployRequest(target="lambda", http_frontend="native"), "applies to Cloud Run services only: a Lambda function has no HTTP server"),
    (DeployRequest(target="cloudrun", http_frontend="granian"), "--http-frontend granian: choose auto, native, uvicorn"),
    (DeployRequest(target="cloudrun", protocol="grpc", http_frontend="uvicorn"), "--http-frontend uvicorn applies to --protocol http services only"),
])
def test_deploy_build_options_apply_where_deploy_builds(request_, message):
    with pytest.raises(DeployOptionError, match=re.escape(message)):
        check_target_options(request_)
    check_target_options(DeployRequest(target="cloudrun", protocol="grpc", grpc_frontend="grpcio", base_image="r.io/python:3.11"))
    check_target_options(DeployRequest(target="lambda", base_image="r.io/python:3.11"))
    check_target_options(DeployRequest(target="cloudrun", http_frontend="uvicorn"))


def test_deploy_plan_names_the_grpc_frontend_it_builds_with(tmp_path, compiled):
    out = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "deploy", str(compiled.root), "--target", "cloudrun", "--region", "us-central1",
         "--project", "p", "--name", "add-sub", "--protocol", "grpc", "--grpc-frontend", "grpcio", "--base-image",
         "registry.local/python:3.11-slim", "--gpu", "none", "--dry-run", "--output", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "COLUMNS": "250"},
    )
    assert out.returncode == 0, out.stderr
    assert "(base image registry.local/python:3.11-slim, gRPC front end grpcio)" in " ".join(out.stdout.split())
    http = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "deploy", str(compiled.root), "--target", "cloudrun", "--region", "us-central1",
         "--project", "p", "--name", "add-sub", "--http-frontend", "uvicorn", "--gpu", "none", "--dry-run", "--output",
         str(tmp_path / "out-http")],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "COLUMNS": "250"},
    )
    assert http.returncode == 0, http.stderr
    assert "(HTTP front end uvicorn)" in " ".join(http.stdout.split())
