"""A folder CTranslate2 can open for a bundled Whisper model (test-only: split parts joined)."""
from __future__ import annotations

import shutil
from pathlib import Path


def ct2_model_dir(assets, make_folder) -> Path:
    """The package folder for a single model.bin; else a joined copy in `make_folder()`."""
    if len(assets.bin_parts) == 1:
        return assets.bin_parts[0].parent
    folder = Path(make_folder())
    with open(folder / "model.bin", "wb") as out:
        for part in assets.bin_parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
    for side in (assets.config_json, assets.tokenizer_json, assets.vocabulary):
        shutil.copy(side, folder / side.name)
    return folder
