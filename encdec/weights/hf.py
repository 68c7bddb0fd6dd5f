"""Weights of a local Hugging Face checkpoint directory: safetensors (sharded or not) or
pytorch_model.bin, read without network access."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The weight files of a checkpoint directory, following a shard index when present."""
    for index_name, single in (("model.safetensors.index.json", "model.safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        index = model_dir / index_name
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [model_dir / s for s in shards]
        if (model_dir / single).exists():
            return [model_dir / single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise ValueError(f"no weights in {model_dir}: expected model.safetensors, "
                     "pytorch_model.bin or a sharded index of either")


def iterate_weights(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) for every tensor in the checkpoint."""
    for path in checkpoint_files(model_dir):
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
            yield from state.items()
