"""The repository's own layout against what is installed beside it."""

import importlib.metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_package_folder_at_the_root_hides_an_installed_package():
    """Processes started in the repository's root (`python -m pytest`, `python -m benchmarks...`)
    have it first on sys.path, so a package folder there named like an installed distribution's
    package hides that package: a top-level `kernels/` once hid the `kernels` package that
    transformers 5.25 imports, and every BART model failed to load."""
    installed = importlib.metadata.packages_distributions()
    folders = [p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()]
    assert "encdec" in folders
    hidden = {name: installed[name] for name in folders
              if set(installed.get(name, ())) - {"encdec"}}
    assert not hidden, f"folders at {ROOT} hide these installed packages: {hidden}"
