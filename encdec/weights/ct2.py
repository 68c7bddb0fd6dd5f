"""Read CTranslate2 ``model.bin`` files, of any model, as named variables.

The format (little-endian, no padding): u32 binary version; from version 2 the spec name
and revision; u32 variable count, then per variable its name, rank, dims, dtype (an item size
before version 4) and raw bytes; from version 3 the aliases (name -> target name). Strings are
a u16 length and UTF-8 bytes ending in NUL. A model may be split into parts read as one stream.
Mapping the variables to a model's Hugging Face names is the family's business (`encdec.models`).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Sequence

import numpy as np
import torch

from encdec.weights import PathLike

MAX_BINARY_VERSION = 6

# dtype ids of binary version >= 4; "bfloat16" has no numpy dtype and is widened by hand.
_DTYPE_IDS = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}
# binary versions < 4 store an item size instead of a dtype id.
_ITEM_SIZES = {4: "float32", 2: "int16", 1: "int8"}
_ITEM_BYTES = {"float32": 4, "int8": 1, "int16": 2, "int32": 4, "float16": 2, "bfloat16": 2}


# --------------------------------------------------------------------------- streams


class ChainedFiles:
    """Read-only stream over several files read back to back (e.g. a model split in parts)."""

    def __init__(self, paths: Iterable[PathLike]):
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("ChainedFiles needs at least one file")
        for path in self.paths:
            if not path.is_file():
                raise FileNotFoundError(f"file not found: {path}")
        self._index = 0
        self._file: BinaryIO | None = open(self.paths[0], "rb")
        self._position = 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` from the current file onwards; returns the bytes read (0 at the end)."""
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view) and self._file is not None:
            n = self._file.readinto(view[filled:])
            if n:
                filled += n
            else:
                self._next_file()
        self._position += filled
        return filled

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            chunks = []
            while self._file is not None:
                chunks.append(self._file.read())
                self._next_file()
            data = b"".join(chunks)
            self._position += len(data)
            return data
        buffer = bytearray(size)
        return bytes(buffer[: self.readinto(buffer)])

    def _next_file(self) -> None:
        self._file.close()
        self._index += 1
        self._file = open(self.paths[self._index], "rb") if self._index < len(self.paths) else None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._index = len(self.paths)

    @property
    def closed(self) -> bool:
        return self._file is None

    def __enter__(self) -> "ChainedFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- model.bin


@dataclass
class CT2Variable:
    """One stored variable: C-order ``shape`` and raw little-endian ``data`` of ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: bytearray

    def numpy(self) -> np.ndarray:
        """The stored values (bfloat16 is widened to float32)."""
        if self.dtype == "bfloat16":
            bits = np.frombuffer(self.data, dtype="<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(self.shape)
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<")).reshape(self.shape)


@dataclass
class CT2Model:
    """Parsed ``model.bin``: header, variables by name and ``alias -> target`` names."""

    binary_version: int
    spec_name: str | None
    spec_revision: int | None
    variables: dict[str, CT2Variable] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)


def _read_exact(stream: BinaryIO, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    filled = 0
    while filled < size:
        n = stream.readinto(view[filled:])
        if not n:
            raise ValueError(f"truncated CTranslate2 model: wanted {size} bytes, got {filled}")
        filled += n
    return buffer


def _unpack(stream: BinaryIO, fmt: str):
    return struct.unpack("<" + fmt, _read_exact(stream, struct.calcsize("<" + fmt)))[0]


def _read_string(stream: BinaryIO) -> str:
    length = _unpack(stream, "H")
    raw = _read_exact(stream, length)
    if length == 0 or raw[-1] != 0:
        raise ValueError("malformed CTranslate2 model: string without its trailing NUL")
    return raw[:-1].decode("utf-8")


def read_ct2_model(stream: BinaryIO) -> CT2Model:
    """Parse a CTranslate2 ``model.bin`` (binary versions 1 to 6) from a binary stream."""
    version = _unpack(stream, "I")
    if not 1 <= version <= MAX_BINARY_VERSION:
        raise ValueError(
            f"unsupported CTranslate2 binary version {version} (supported: 1-{MAX_BINARY_VERSION})"
        )
    model = CT2Model(version, None, None)
    if version >= 2:
        model.spec_name = _read_string(stream)
        model.spec_revision = _unpack(stream, "I")
    for _ in range(_unpack(stream, "I")):
        name = _read_string(stream)
        shape = tuple(_unpack(stream, "I") for _ in range(_unpack(stream, "B")))
        if version >= 4:
            type_id = _unpack(stream, "B")
            if type_id not in _DTYPE_IDS:
                raise ValueError(f"{name}: unknown CTranslate2 dtype id {type_id}")
            dtype, num_bytes = _DTYPE_IDS[type_id], _unpack(stream, "I")
        else:
            item_size = _unpack(stream, "B")
            if item_size not in _ITEM_SIZES:
                raise ValueError(f"{name}: unsupported item size {item_size}")
            dtype, num_bytes = _ITEM_SIZES[item_size], item_size * _unpack(stream, "I")
        if num_bytes != _ITEM_BYTES[dtype] * int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{name}: {num_bytes} bytes do not match shape {shape} of {dtype}")
        model.variables[name] = CT2Variable(name, shape, dtype, _read_exact(stream, num_bytes))
    if version >= 3:
        for _ in range(_unpack(stream, "I")):
            alias = _read_string(stream)
            model.aliases[alias] = _read_string(stream)
    return model


def open_ct2_model(paths: PathLike | Sequence[PathLike]) -> CT2Model:
    """Read ``model.bin`` from a path, or from several parts read as one stream."""
    parts = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    with ChainedFiles(parts) as stream:
        return read_ct2_model(stream)


def ct2_tensors(model: CT2Model, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Variables as tensors: floats cast to ``dtype``, int8/int16 weights dequantised with
    their ``<name>_scale`` (``float = q / scale``, one scale per output row or per tensor).
    Scale variables are folded in and not returned; integer scalars keep an integer dtype."""
    quantized = {
        name
        for name, var in model.variables.items()
        if var.dtype in ("int8", "int16") and name + "_scale" in model.variables
    }
    scales = {n + "_scale" for n in quantized}
    tensors = {}
    for name, var in model.variables.items():
        if name in scales:
            continue
        values = var.numpy()
        if name in quantized:
            scale = model.variables[name + "_scale"].numpy().astype(np.float32)
            if scale.size > 1:
                scale = scale.reshape((-1,) + (1,) * (values.ndim - 1))
            tensors[name] = torch.from_numpy(values.astype(np.float32) / scale).to(dtype)
        elif np.issubdtype(values.dtype, np.floating):  # torch widens float16 faster than NumPy
            tensors[name] = torch.from_numpy(values).to(dtype)
        else:
            tensors[name] = torch.from_numpy(values.copy())
    return tensors
