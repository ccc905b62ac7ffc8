"""`toolkit` command line (Typer + Rich)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from . import __version__

app = typer.Typer(
    name="toolkit",
    help="Ship an NVIDIA Triton model repository to serverless platforms.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

RepoArg = Annotated[str, typer.Argument(help="Model repository: a directory, s3://bucket/prefix or gs://bucket/prefix")]
ModelOpt = Annotated[
    Optional[list[str]],
    typer.Option("--model", "-m", help="Only this model (repeatable), like tritonserver --load-model; ensembles bring their composing models"),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="Target device the config is compiled for: cpu, gpu or gpu:N")]
StrictOpt = Annotated[
    bool,
    typer.Option("--disable-auto-complete-config", help="Like tritonserver --disable-auto-complete-config: configs must be complete"),
]


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"toolkit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version")] = False,
) -> None:
    """Ship an NVIDIA Triton model repository to serverless platforms."""


def _compile(repo: str, models: list[str] | None, device: str, strict: bool):
    from .repository.compile import compile_repository
    from .repository.discover import ensure_repository
    from .repository.errors import RepositoryError

    try:
        root = ensure_repository(repo)
        return compile_repository(root, models, device, auto_complete=not strict)
    except (RepositoryError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None


def _batching(config: dict) -> str:
    mbs = config.get("max_batch_size", 0)
    if "dynamic_batching" in config:
        db = config["dynamic_batching"]
        delay = db.get("max_queue_delay_microseconds", 0)
        preferred = db.get("preferred_batch_size", [])
        return f"dynamic (max {mbs}, preferred {preferred}, delay {delay} us)"
    if mbs > 0:
        return f"none (max {mbs})"
    return "none"


def _instances(config: dict) -> str:
    groups = config.get("instance_group", [])
    if not groups:
        return "-"
    return ", ".join(f"{g['count']} x {g['kind'].removeprefix('KIND_')}" for g in groups)


@app.command()
def validate(
    repo: RepoArg,
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON")] = False,
    device: DeviceOpt = "cpu",
    strict: StrictOpt = False,
) -> None:
    """Check a repository the way tritonserver would; exit 1 if any selected model is invalid."""
    result = _compile(repo, model, device, strict)
    if as_json:
        doc = {
            "repository": str(result.root),
            "device": str(result.device),
            "models": [
                {
                    "name": name,
                    "status": "READY" if name in result.models else "INVALID",
                    **(
                        {
                            "versions": result.models[name].versions,
                            "backend": result.models[name].backend,
                            "warnings": result.models[name].warnings,
                        }
                        if name in result.models
                        else {
                            "error": result.failures[name].message,
                            "file": result.failures[name].file,
                            "line": result.failures[name].line,
                            "column": result.failures[name].column,
                        }
                    ),
                }
                for name in sorted(result.selected)
            ],
        }
        print(json.dumps(doc, indent=2))
        raise typer.Exit(0 if result.ok else 1)

    table = Table(title=f"Model repository {result.root} (device: {result.device})")
    for column in ("model", "versions", "backend", "batching", "instances", "status"):
        table.add_column(column)
    for name in sorted(result.selected):
        if name in result.models:
            m = result.models[name]
            table.add_row(
                name, ",".join(map(str, m.versions)), m.backend, _batching(m.config), _instances(m.config), "[green]OK[/green]"
            )
        else:
            table.add_row(name, "-", "-", "-", "-", "[red]INVALID[/red]")
    console.print(table)
    for name in sorted(result.selected):
        if name in result.models:
            for warning in result.models[name].warnings:
                err_console.print(f"[yellow]warning:[/yellow] {name}: {warning}", highlight=False)
    for name in sorted(result.failures):
        error = result.failures[name]
        where = f"{error.location}: " if error.location else ""
        err_console.print(f"[red]error:[/red] {name}: {where}{error.message}", highlight=False, soft_wrap=True)
    if not result.selected:
        err_console.print("[yellow]warning:[/yellow] the repository has no models", highlight=False)
    raise typer.Exit(0 if result.ok else 1)


@app.command()
def config(
    repo: RepoArg,
    model_name: Annotated[str, typer.Argument(metavar="MODEL", help="Model name")],
    device: DeviceOpt = "cpu",
    strict: StrictOpt = False,
) -> None:
    """Print a model's completed configuration as Triton's JSON (what GET /v2/models/M/config returns)."""
    result = _compile(repo, [model_name], device, strict)
    if model_name in result.failures:
        error = result.failures[model_name]
        where = f"{error.location}: " if error.location else ""
        err_console.print(f"[red]error:[/red] {model_name}: {where}{error.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    compiled = result.models[model_name]
    for warning in compiled.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {model_name}: {warning}", highlight=False)
    sys.stdout.write(json.dumps(compiled.config, indent=2) + "\n")


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import onnxruntime
    except ImportError:
        return "cpu"
    return "gpu" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "cpu"


@app.command()
def serve(
    repo: RepoArg,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8000,
    model: ModelOpt = None,
    device: Annotated[str, typer.Option("--device", help="auto (GPU when onnxruntime has CUDA), cpu, gpu or gpu:N")] = "auto",
    exit_on_error: Annotated[
        bool,
        typer.Option("--exit-on-error/--no-exit-on-error", help="Fail at startup if a model fails to load (tritonserver's default)"),
    ] = True,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Serve a repository locally with the same runtime the images run (v2 protocol over HTTP)."""
    import logging

    from handlers.entrypoints.server import serve as run_server
    from handlers.manifest import Manifest
    from handlers.model_repository import ModelRepository

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = _compile(repo, model, _resolve_device(device), False)
    for name in sorted(result.failures):
        error = result.failures[name]
        where = f"{error.location}: " if error.location else ""
        err_console.print(f"[red]error:[/red] {name}: {where}{error.message}", highlight=False, soft_wrap=True)
    if result.failures and exit_on_error:
        raise typer.Exit(1)
    for name, compiled in sorted(result.models.items()):
        for warning in compiled.warnings:
            err_console.print(f"[yellow]warning:[/yellow] {name}: {warning}", highlight=False)
    manifest = Manifest.from_dict(result.manifest(), root=result.root)
    repository = ModelRepository(manifest)
    err_console.print(f"serving {len(manifest.models)} model(s) from {result.root} on http://{host}:{port}", highlight=False)
    raise typer.Exit(run_server(repository, host, port, exit_on_error=exit_on_error, log_level=log_level))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
