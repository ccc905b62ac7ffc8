"""What the `handlers` runtime needs inside an image: declared here, once.

The image installs exactly these distributions (plus their own dependencies, resolved by pip for
the image's platform and Python) and nothing of the build-time side: never toolkit, onnx, jinja2,
boto3 or tritonclient, and protobuf only in gRPC images (`--protocol grpc`), whose Triton messages
need it: those images carry grpcio, grpcio-health-checking and protobuf, plus tritonclient's
generated modules copied as files (toolkit/build/grpc_modules.py), never tritonclient itself. The
version floors match pyproject.toml's (a test checks).

ONNX Runtime is installed without its declared dependencies: the `onnxruntime` module needs only
numpy at run time; flatbuffers, packaging and protobuf serve its offline tools (quantisation,
transformers optimiser), which the runtime never imports. That keeps protobuf out of the image.

GPU images take `onnxruntime-gpu` from the release line whose CUDA major matches the platform's
NVIDIA driver, with CUDA and cuDNN from NVIDIA's PyPI wheels (no CUDA base image needed):

- CUDA 12 (default): `onnxruntime-gpu` 1.26.0, the last release built for CUDA 12 (1.27 and later
  need CUDA 13). Runs on drivers >= 525.60.13 through CUDA 12's minor-version compatibility; Cloud
  Run's L4 GPUs document driver 535.216.03 (CUDA 12.2).
- CUDA 13: `onnxruntime-gpu` >= 1.28 (CUDA 13 wheels), drivers >= 580.65.06 (Cloud Run's RTX PRO
  6000 Blackwell documents a 580 driver, CUDA 13.0).

A backend's framework enters an image only when one of its models uses the backend
(`BACKEND_RUNTIME`, one entry per backend: its requirements for a CPU image or a CUDA line).

PyTorch (backend `pytorch`) comes from PyTorch's own package index, pinned with its build label:
`torch==2.13.0+cpu` from download.pytorch.org/whl/cpu in CPU images (PyPI's `torch` is the CUDA
build: over 2 GB of CUDA libraries a CPU image must never carry), `+cu128` (CUDA 12.8, the CUDA 12
line) or `+cu130` (CUDA 13.0) in GPU images, matching the CUDA major of ONNX Runtime's line. The
index is only given to the download of torch itself; `TOOLKIT_TORCH_INDEX_URL` replaces it (an
internal mirror), and an empty value leaves it to pip's own configuration (PIP_INDEX_URL,
PIP_FIND_LINKS). torch is installed without the dependencies that serve its compilers and export
tools (sympy, networkx, jinja2, fsspec, filelock, setuptools, triton): TorchScript's loader and
interpreter import none of them; the rest of what its wheel declares (typing-extensions, and the
CUDA libraries of a CUDA build) is resolved with the image's other requirements.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RuntimeRequirement:
    """One distribution the runtime needs, with the top-level modules it provides."""

    spec: str  # PEP 508 requirement, as pip reads it
    imports: tuple[str, ...]
    no_deps: bool = False  # installed without its declared dependencies (see module docstring)
    # An extra package index the requirement itself is downloaded from (PyTorch's wheels).
    index_url: str | None = None
    # Installed alone, then with the dependencies its wheel declares except these (canonical
    # names), resolved with the image's other requirements. Implies no_deps for itself.
    skip_dependencies: frozenset[str] | None = None

    @property
    def alone(self) -> bool:
        """Downloaded without pip resolving its dependencies."""
        return self.no_deps or self.skip_dependencies is not None

    @property
    def key(self) -> str:
        """Everything that decides what this requirement downloads (the wheelhouse's cache key)."""
        parts = [self.spec]
        if self.index_url:
            parts.append(f"index={self.index_url}")
        if self.skip_dependencies is not None:
            parts.append("skip=" + ",".join(sorted(self.skip_dependencies)))
        return " ".join(parts)
    # Files of the installed distribution that the runtime never loads, removed from the image
    # (shell globs relative to the folder the wheels are installed into).
    prune: tuple[str, ...] = ()
    # Distributions this one replaces in an image (the same module, more in it).
    supersedes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        for i, ch in enumerate(self.spec):
            if ch in "<>=!~[; ":
                return self.spec[:i]
        return self.spec


# Everything the runtime imports whatever the target (handlers/ app, protocol, batching, metrics).
CORE: tuple[RuntimeRequirement, ...] = (
    RuntimeRequirement("numpy>=1.26", ("numpy",)),
    RuntimeRequirement("fastapi>=0.110", ("fastapi", "starlette", "pydantic", "anyio", "typing_extensions")),
    RuntimeRequirement("orjson>=3.9", ("orjson",)),
    RuntimeRequirement("prometheus-client>=0.20", ("prometheus_client",)),
)

# The HTTP server of Cloud Run / Knative images (handlers.entrypoints.server). pyproject's
# `uvicorn[standard]` also brings websockets, watchfiles, python-dotenv and PyYAML for
# development servers; the image takes only the two accelerators the runtime uses.
SERVER: tuple[RuntimeRequirement, ...] = (
    RuntimeRequirement("uvicorn>=0.29", ("uvicorn",)),
    RuntimeRequirement("uvloop>=0.19", ("uvloop",)),
    RuntimeRequirement("httptools>=0.6", ("httptools",)),
)

# gRPC images (handlers.protocol.grpc): grpcio's asyncio server, the standard health service, and
# protobuf for Triton's generated messages. grpcio >= the version tritonclient's service_pb2_grpc
# was generated for; protobuf >= the one its *_pb2 were generated with and < 7 (checked at build
# time against the modules copied, toolkit/build/grpc_modules.py); health-checking 1.82+ needs
# protobuf 7.
GRPC: tuple[RuntimeRequirement, ...] = (
    RuntimeRequirement("grpcio>=1.81.1", ("grpc",)),
    RuntimeRequirement("grpcio-health-checking>=1.81.1,<1.82", ("grpc_health",)),
    RuntimeRequirement("protobuf>=6.33.5,<7", ("google.protobuf",)),
)
# The native front ends as wheels (handlers/protocol/native/build.py grpc|http --wheel), which
# handlers.protocol.grpc.nativeserver and handlers.protocol.httpnative.server import when their
# in-tree modules are absent. Not on PyPI: a Cloud Run / Knative image takes its front end's wheel
# from TOOLKIT_GRPC_NATIVE_WHEELS / TOOLKIT_HTTP_NATIVE_WHEELS (native_requirement), else builds
# it on demand and caches it (toolkit/build/native_frontend.py); otherwise it serves with grpcio's
# server / uvicorn.
GRPC_NATIVE = RuntimeRequirement("toolkit-grpcnative", ("toolkit_grpcnative",))
GRPC_NATIVE_WHEELS_ENV = "TOOLKIT_GRPC_NATIVE_WHEELS"
HTTP_NATIVE = RuntimeRequirement("toolkit-httpnative", ("toolkit_httpnative",))
HTTP_NATIVE_WHEELS_ENV = "TOOLKIT_HTTP_NATIVE_WHEELS"


def _fits_python(filename: str, python: str) -> bool:
    """Whether a wheel's Python and ABI tags install on CPython `python` (`3.12`), as pip decides
    (packaging.tags): built for it (`cp312-cp312`), or for the stable ABI of it or an older 3.x
    (`cp311-abi3`)."""
    from packaging.tags import cpython_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        tags = parse_wheel_filename(filename)[3]
    except InvalidWheelFilename:
        return False
    version = tuple(int(part) for part in python.split("."))
    supported = {(t.interpreter, t.abi) for t in cpython_tags(version, abis=["cp%d%d" % version], platforms=["any"])}
    return any((t.interpreter, t.abi) in supported for t in tags)


def native_requirement(wheel: RuntimeRequirement, variable: str, python: str, arch: str) -> RuntimeRequirement | None:
    """A native front end's wheel (GRPC_NATIVE, HTTP_NATIVE) for an image's Python (`3.12`) and
    arch, from the directory `variable` names; None when it is unset. The wheel is for that Python
    (`cp312-cp312`) or for the stable ABI (`cp311-abi3`, what build.py makes). ValueError when the
    directory holds no wheel for that Python and arch."""
    folder = os.environ.get(variable, "").strip()
    if not folder:
        return None
    package = wheel.name.replace("-", "_")
    found = sorted(w for w in Path(folder).glob(f"{package}-*{arch}.whl") if _fits_python(w.name, python))
    if not found:
        frontend = package.removeprefix("toolkit_").removesuffix("native")
        raise ValueError(
            f"{variable}={folder} holds no {package} wheel for Python {python} on {arch} (cp311-abi3 or "
            f"cp{python.replace('.', '')}): build one: python handlers/protocol/native/build.py {frontend} --wheel {folder}"
        )
    return RuntimeRequirement(str(found[-1].resolve()), wheel.imports)


PROTOCOLS = ("http", "grpc")

# AWS Lambda (handlers.entrypoints.aws_lambda). awslambdaric is the Lambda runtime interface
# client: the AWS base images carry their own, any other base image gets this one as entrypoint.
LAMBDA: tuple[RuntimeRequirement, ...] = (RuntimeRequirement("mangum>=0.17", ("mangum",)),)
LAMBDA_RUNTIME_CLIENT = RuntimeRequirement("awslambdaric>=2.2", ("awslambdaric",))

ONNXRUNTIME_CPU = RuntimeRequirement("onnxruntime>=1.18", ("onnxruntime",), no_deps=True)

# The fil backend (handlers/backends/fil) runs libtreelite through its C API and never imports
# the treelite package, whose scipy (113 MB) serves sparse input only: installed alone, the wheel
# adds 3 MB (docs/fil.md). The same library on CPU and GPU images (FIL predicts on CPU here).
# 4.7 is the first to read XGBoost 3's JSON/UBJSON models as they are (4.3-4.4 refuse their
# new `cats` field) and the last with manylinux2014 wheels (Lambda's Python 3.11 base, glibc
# 2.26); newer bases get 4.8's manylinux_2_28 wheels.
TREELITE = RuntimeRequirement("treelite>=4.7,<5", ("treelite",), no_deps=True)

# ONNX Runtime with OpenVINO's execution provider, for onnxruntime models that ask for
# `cpu_execution_accelerator: [{ name: "openvino" }]`: it replaces `onnxruntime` in the image (the
# same module, never both). 1.24.1 is the newest release (OpenVINO 2025.4.1 inside); its wheel
# ships each OpenVINO library three times (libopenvino.so, .so.2025.4.1, .so.2541) and the Intel
# GPU and NPU plugins: the image keeps the sonames that are loaded (262 -> 170 MB installed).
ONNXRUNTIME_OPENVINO = RuntimeRequirement(
    "onnxruntime-openvino==1.24.1",
    ("onnxruntime",),
    no_deps=True,
    prune=tuple(
        f"onnxruntime/capi/{name}"
        for name in (
            "libopenvino.so", "libopenvino.so.2025.4.1", "libopenvino_onnx_frontend.so",
            "libopenvino_onnx_frontend.so.2025.4.1", "libopenvino_c.so*", "libtbb.so",
            "libopenvino_intel_gpu_plugin.so", "libopenvino_intel_npu_plugin.so",
        )
    ),
    supersedes=("onnxruntime",),
)

# The openvino backend (handlers/backends/openvino.py): the OpenVINO runtime. At run time it needs
# numpy only (openvino-telemetry serves its conversion tools). The image keeps what CPU inference
# of IR and ONNX models loads (the CPU, AUTO, HETERO and batching plugins; the IR and ONNX
# readers); the Intel GPU and NPU plugins, the GPU's tuning cache, the other frameworks' readers,
# the C++ headers and the conversion tools are removed (184 -> 100 MB installed).
OPENVINO = RuntimeRequirement(
    "openvino==2026.4.1",
    ("openvino",),
    no_deps=True,
    prune=(
        "openvino/libs/cache.json",
        "openvino/libs/libopenvino_intel_gpu_plugin.so",
        "openvino/libs/libopenvino_intel_npu_plugin.so",
        *(f"openvino/libs/libopenvino_{f}_frontend.so.*" for f in ("gguf", "jax", "paddle", "pytorch", "tensorflow",
                                                                   "tensorflow_lite")),
        *(f"openvino/frontend/{f}" for f in ("jax", "paddle", "pytorch", "tensorflow")),
        "openvino/include",
        "openvino/tools",
    ),
)

# GPU metrics (handlers.metrics reads GPU utilisation through NVML when it is importable).
NVML = RuntimeRequirement("nvidia-ml-py>=12.535", ("pynvml",))


@dataclass(frozen=True)
class CudaLine:
    """An onnxruntime-gpu release line and the CUDA libraries (PyPI wheels) it loads."""

    cuda_major: int
    min_driver: str
    onnxruntime: RuntimeRequirement
    libraries: tuple[RuntimeRequirement, ...]
    note: str


def _lib(spec: str) -> RuntimeRequirement:
    return RuntimeRequirement(spec, ())


CUDA_LINES: dict[int, CudaLine] = {
    12: CudaLine(
        cuda_major=12,
        min_driver="525.60.13",
        onnxruntime=RuntimeRequirement("onnxruntime-gpu==1.26.0", ("onnxruntime",), no_deps=True),
        # onnxruntime-gpu 1.26.0's `cuda` and `cudnn` extras (cuBLAS comes with cuDNN).
        libraries=(
            _lib("nvidia-cuda-runtime-cu12~=12.0"),
            _lib("nvidia-cuda-nvrtc-cu12~=12.0"),
            _lib("nvidia-cufft-cu12~=11.0"),
            _lib("nvidia-curand-cu12~=10.0"),
            _lib("nvidia-cudnn-cu12~=9.0"),
        ),
        note="Cloud Run L4 (driver 535.216.03, CUDA 12.2) via CUDA 12 minor-version compatibility",
    ),
    13: CudaLine(
        cuda_major=13,
        min_driver="580.65.06",
        onnxruntime=RuntimeRequirement("onnxruntime-gpu>=1.28,<2", ("onnxruntime",), no_deps=True),
        # onnxruntime-gpu 1.28+'s `cuda` and `cudnn` extras.
        libraries=(
            _lib("nvidia-cuda-runtime~=13.0"),
            _lib("nvidia-cuda-nvrtc~=13.0"),
            _lib("nvidia-cufft~=12.0"),
            _lib("nvidia-curand~=10.0"),
            _lib("nvidia-cudnn-cu13~=9.0"),
        ),
        note="drivers >= 580 (e.g. Cloud Run RTX PRO 6000 Blackwell, CUDA 13.0)",
    ),
}
DEFAULT_CUDA_MAJOR = 12

# Distributions and modules the runtime must never carry (build-time side, cloud SDKs). Only
# gRPC images carry protobuf (GRPC), and `google.protobuf` is the one `google` module allowed.
FORBIDDEN_DISTRIBUTIONS = frozenset(
    {"triton-serverless-toolkit", "protobuf", "onnx", "jinja2", "boto3", "botocore", "tritonclient"}
)
GRPC_ALLOWED_DISTRIBUTIONS = frozenset({"protobuf"})
FORBIDDEN_IMPORTS = frozenset({"toolkit", "google", "onnx", "jinja2", "boto3", "botocore", "tritonclient"})


@dataclass(frozen=True)
class RuntimeSet:
    """The runtime requirements of one image."""

    resolved: tuple[RuntimeRequirement, ...]  # installed with their dependencies
    no_deps: tuple[RuntimeRequirement, ...]  # installed alone
    cuda: CudaLine | None = None
    # backend -> the requirements it brought (build report, `toolkit validate`)
    backends: dict[str, tuple[RuntimeRequirement, ...]] = field(default_factory=dict)
    protocol: str = "http"  # "grpc": the image serves gRPC (GRPC requirements, generated modules)

    @property
    def forbidden_distributions(self) -> frozenset[str]:
        """What this image must not carry (FORBIDDEN_DISTRIBUTIONS; protobuf is allowed for gRPC)."""
        if self.protocol == "grpc":
            return FORBIDDEN_DISTRIBUTIONS - GRPC_ALLOWED_DISTRIBUTIONS
        return FORBIDDEN_DISTRIBUTIONS

    @property
    def prune(self) -> tuple[str, ...]:
        """Installed files the image leaves out (RuntimeRequirement.prune)."""
        return tuple(p for r in [*self.resolved, *self.no_deps] for p in r.prune)


def _onnxruntime(cuda: CudaLine | None) -> tuple[RuntimeRequirement, ...]:
    return (ONNXRUNTIME_CPU,) if cuda is None else (cuda.onnxruntime, *cuda.libraries)


# --- PyTorch ---------------------------------------------------------------------------------------

TORCH_VERSION = "2.13.0"
TORCH_INDEX_ENV = "TOOLKIT_TORCH_INDEX_URL"
PYTORCH_INDEX = "https://download.pytorch.org/whl"
# torch's build label per image: CPU, or the CUDA line's build (CUDA 12.8 / 13.0).
TORCH_BUILDS: dict[int | None, str] = {None: "cpu", 12: "cu128", 13: "cu130"}
# What torch's wheel declares for its compilers and export tools (torch.compile, torch.fx's
# symbolic shapes, inductor's templates and GPU kernels): never imported by TorchScript.
TORCH_BUILD_TIME_DEPENDENCIES = frozenset(
    {"sympy", "networkx", "jinja2", "fsspec", "filelock", "setuptools", "triton", "pytorch-triton"}
)


def torch_index(build: str) -> str | None:
    """The index torch is downloaded from: PyTorch's for the build, or $TOOLKIT_TORCH_INDEX_URL
    (empty: pip's own configuration)."""
    configured = os.environ.get(TORCH_INDEX_ENV)
    if configured is not None:
        return configured.strip() or None
    return f"{PYTORCH_INDEX}/{build}"


def torch_requirement(cuda: CudaLine | None) -> RuntimeRequirement:
    build = TORCH_BUILDS[None if cuda is None else cuda.cuda_major]
    return RuntimeRequirement(
        f"torch=={TORCH_VERSION}+{build}", ("torch",), index_url=torch_index(build),
        skip_dependencies=TORCH_BUILD_TIME_DEPENDENCIES,
    )


def _pytorch(cuda: CudaLine | None) -> tuple[RuntimeRequirement, ...]:
    return (torch_requirement(cuda),)


ONNXRUNTIME_OPENVINO_KEY = "onnxruntime+openvino"


def wants_openvino_accelerator(config: dict) -> bool:
    """An onnxruntime model whose config asks for OpenVINO's execution provider on CPU."""
    accelerators = config.get("optimization", {}).get("execution_accelerators", {})
    return any(a.get("name") == "openvino" for a in accelerators.get("cpu_execution_accelerator", []))


def runtime_backends(configs: Iterable[dict], gpu: bool = False) -> set[str]:
    """The keys of BACKEND_RUNTIME an image's models need: their backends, and
    ONNXRUNTIME_OPENVINO_KEY for onnxruntime models with the OpenVINO accelerator (CPU images;
    a GPU image's onnxruntime-gpu cannot carry it, so its KIND_CPU instances are refused)."""
    keys: set[str] = set()
    for config in configs:
        backend = config.get("backend") or config.get("platform", "")
        keys.add(backend)
        if backend == "onnxruntime" and wants_openvino_accelerator(config):
            cpu_groups = [g for g in config.get("instance_group", []) if g.get("kind", "KIND_CPU") == "KIND_CPU"]
            if not gpu:
                keys.add(ONNXRUNTIME_OPENVINO_KEY)
            elif cpu_groups:
                raise ValueError(
                    f"model '{config.get('name')}' asks for the OpenVINO execution accelerator on KIND_CPU instances, "
                    "but a GPU image carries onnxruntime-gpu, which has no OpenVINO provider (onnxruntime-openvino and "
                    "onnxruntime-gpu are the same module and cannot both be installed): build a CPU image "
                    "(--device cpu), or remove the openvino accelerator"
                )
    return keys


# Where the OpenVINO wheels exist (PyPI, checked for the pinned versions): onnxruntime-openvino
# for x86_64 only (manylinux_2_28, CPython 3.10-3.13); openvino for x86_64 (manylinux_2_28) and
# aarch64 (manylinux_2_35: glibc 2.35 or newer).
ONNXRUNTIME_OPENVINO_PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def check_wheels_exist(backends: Iterable[str], arch: str, python: str, glibc: tuple[int, int]) -> None:
    """Refuse, before downloading anything, an image whose OpenVINO wheels do not exist."""
    keys = set(backends)
    if ONNXRUNTIME_OPENVINO_KEY in keys and (arch != "x86_64" or python not in ONNXRUNTIME_OPENVINO_PYTHONS):
        raise ValueError(
            f"the OpenVINO execution accelerator needs {ONNXRUNTIME_OPENVINO.spec}, which has wheels for x86_64 "
            f"(CPython {', '.join(ONNXRUNTIME_OPENVINO_PYTHONS)}) only, not {arch} with Python {python}: build for "
            "--platform linux/amd64 on such a base image, or remove the openvino accelerator (the model then runs on "
            "ONNX Runtime's CPU provider), or serve the model with backend \"openvino\""
        )
    if "openvino" in keys and arch == "aarch64" and glibc < (2, 35):
        raise ValueError(
            f"{OPENVINO.spec} has aarch64 wheels for glibc 2.35 or newer only; the base image has glibc "
            f"{glibc[0]}.{glibc[1]}: choose a newer base image (e.g. python:3.12-slim-bookworm) or build for linux/amd64"
        )


# What each backend's models add to an image: backend -> f(CUDA line of a GPU image, or None for
# CPU) -> its requirements (each installed with its dependencies unless it says otherwise).
# Python models keep ONNX Runtime (model.py files commonly import it without listing it; see
# docs/build.md); they get torch, or anything else, through their requirements.txt.
BACKEND_RUNTIME: dict[str, Callable[[CudaLine | None], tuple[RuntimeRequirement, ...]]] = {
    "onnxruntime": _onnxruntime,
    "python": _onnxruntime,
    "fil": lambda _cuda: (TREELITE,),
    "pytorch": _pytorch,
    "openvino": lambda cuda: (OPENVINO,),
    # onnxruntime models with the OpenVINO execution accelerator (runtime_backends)
    ONNXRUNTIME_OPENVINO_KEY: lambda cuda: (ONNXRUNTIME_OPENVINO,),
}
DEFAULT_BACKENDS = frozenset({"onnxruntime"})


def backend_requirements(backend: str, cuda: CudaLine | None = None) -> tuple[RuntimeRequirement, ...]:
    """What `backend`'s models add to an image (nothing for ensembles and unknown backends)."""
    entry = BACKEND_RUNTIME.get(backend)
    return () if entry is None else entry(cuda)


def runtime_requirements(
    *,
    server: bool,
    aws_lambda: bool,
    runtime_client: bool,
    gpu_cuda: int | None,
    backends: Iterable[str] = DEFAULT_BACKENDS,
    protocol: str = "http",
) -> RuntimeSet:
    """The requirements of an image: `server` (uvicorn), `aws_lambda` (Mangum), `runtime_client`
    (awslambdaric, for non-AWS base images), `gpu_cuda` (CUDA major of a GPU image, else CPU),
    `backends` (the backends of its models: each adds its framework, BACKEND_RUNTIME),
    `protocol` ("grpc" adds grpcio, its health service and protobuf)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r} (choose {' or '.join(PROTOCOLS)})")
    resolved: list[RuntimeRequirement] = list(CORE)
    if server:
        resolved.extend(SERVER)
    if protocol == "grpc":
        resolved.extend(GRPC)
    if aws_lambda:
        resolved.extend(LAMBDA)
        if runtime_client:
            resolved.append(LAMBDA_RUNTIME_CLIENT)
    cuda = None
    if gpu_cuda is not None:
        if gpu_cuda not in CUDA_LINES:
            raise ValueError(f"unsupported CUDA major {gpu_cuda} (supported: {', '.join(map(str, CUDA_LINES))})")
        cuda = CUDA_LINES[gpu_cuda]
        resolved.append(NVML)
    no_deps: list[RuntimeRequirement] = []
    by_backend: dict[str, tuple[RuntimeRequirement, ...]] = {}
    for backend in sorted(backends):
        requirements = backend_requirements(backend, cuda)
        if requirements:
            by_backend[backend] = requirements
        for requirement in requirements:
            group = no_deps if requirement.alone else resolved
            if requirement not in group:
                group.append(requirement)
    superseded = {name for requirement in no_deps for name in requirement.supersedes}
    no_deps = [r for r in no_deps if r.name not in superseded]
    by_backend = {
        backend: kept for backend, requirements in by_backend.items()
        if (kept := tuple(r for r in requirements if r.name not in superseded))
    }
    return RuntimeSet(tuple(resolved), tuple(no_deps), cuda, by_backend, protocol)


def allowed_runtime_imports() -> frozenset[str]:
    """Top-level modules the `handlers` package may import besides the standard library."""
    every = [*CORE, *SERVER, *GRPC, GRPC_NATIVE, HTTP_NATIVE, *LAMBDA, LAMBDA_RUNTIME_CLIENT, ONNXRUNTIME_CPU, NVML]
    for backend in BACKEND_RUNTIME:
        for cuda in (None, *CUDA_LINES.values()):
            every.extend(backend_requirements(backend, cuda))
    return frozenset(module for requirement in every for module in requirement.imports)
