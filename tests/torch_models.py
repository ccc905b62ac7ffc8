"""TorchScript models made by torch itself (torch.jit.trace / torch.jit.script) for the pytorch
backend's tests, and repositories around them."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import torch


class AddSub(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return x + y, x - y


class Linear(torch.nn.Module):
    """A small MLP with fixed weights: y = relu(x W1 + b1) W2 + b2."""

    def __init__(self, width: int = 16, out: int = 4, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.first = torch.nn.Linear(width, 32)
        self.second = torch.nn.Linear(32, out)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


class DictInput(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"] * 2 + inputs["b"]


class Upper(torch.nn.Module):
    """List[str] in, (List[str], Tensor of lengths) out."""

    def forward(self, words: List[str]) -> Tuple[List[str], torch.Tensor]:
        lengths = [len(w) for w in words]
        return [w.upper() for w in words], torch.tensor(lengths, dtype=torch.int64)


class ReturnsList(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        return [x, x * 2]


class ReturnsDict(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"y": x * 2}


class Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 1000.0):
            raise RuntimeError("input too large for this model")
        return x * 3


class Casts(torch.nn.Module):
    """Every datatype the backend carries, each doubled (bool: negated)."""

    def forward(
        self, b: torch.Tensor, u8: torch.Tensor, i8: torch.Tensor, i16: torch.Tensor, i32: torch.Tensor,
        i64: torch.Tensor, f16: torch.Tensor, f32: torch.Tensor, f64: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
               torch.Tensor, torch.Tensor]:
        return ~b, u8 * 2, i8 * 2, i16 * 2, i32 * 2, i64 * 2, f16 * 2, f32 * 2, f64 * 2


def save_script(module: torch.nn.Module, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(module.eval()).save(str(path))
    return path


def save_trace(module: torch.nn.Module, example, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.jit.trace(module.eval(), example).save(str(path))
    return path


def write_model(repo: Path, name: str, config: str, module_path_maker=None, version: int = 1, filename: str = "model.pt") -> Path:
    """A model directory `repo/name` with config.pbtxt and, if given, the model file made by
    `module_path_maker(path)`."""
    directory = repo / name
    (directory / str(version)).mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(config)
    if module_path_maker is not None:
        module_path_maker(directory / str(version) / filename)
    return directory


def tensor(name: str, dtype: str, dims: list[int]) -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(map(str, dims))} ] }}'


def config(name: str, inputs: list[str], outputs: list[str], *, max_batch_size: int = 0, extra: str = "") -> str:
    return (
        f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n{extra}"
    )
