"""Start-up: `import encdec` stays light, `encdec transcribe` imports only what a transcription
runs (no transformers for the bundled Whisper models, no server or Ray), and `encdec warmup`
compiles the kernels ahead of the first run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from encdec.entrypoints import cli

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numba", "transformers", "fastapi", "uvicorn", "ray", "sentencepiece", "pandas")


def loaded_after(code: str) -> set[str]:
    """Which of HEAVY a fresh interpreter has imported after running `code`."""
    report = f"import json, sys; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", f"{code}\n{report}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_encdec_imports_nothing_heavy():
    assert loaded_after("import encdec") == set()


def test_public_names_still_import():
    assert loaded_after("from encdec import LLM, SamplingParams, AsyncLLMEngine, TokensPrompt, "
                        "zip_enc_dec_prompts, RequestOutput, EngineDeadError") >= {"torch"}


def test_transcribing_with_a_bundled_model_needs_no_transformers():
    code = ("from encdec.entrypoints import cli\n"
            "assert cli.main(['transcribe', 'samples/hello.wav', '--verbose', 'False']) == 0")
    assert loaded_after(code) == {"torch", "numba"}


def test_warmup_compiles_the_kernels(capsys):
    assert cli.main(["warmup"]) == 0
    assert capsys.readouterr().out.startswith("encdec: CPU kernels (float32) ready in ")
