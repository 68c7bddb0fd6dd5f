"""Start-up: `import encdec` stays light, `encdec transcribe` imports only what a transcription
runs (no transformers for the bundled Whisper models, no server or Ray, and after `encdec
warmup` no Numba either), and `encdec warmup` compiles the kernels ahead of the first run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from encdec.kernels import cpu_attention

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numba", "transformers", "fastapi", "uvicorn", "ray", "sentencepiece", "pandas")


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> tuple[dict, str]:
    """`encdec warmup` into an empty kernel cache: (the environment that uses it, its output)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path_factory.mktemp("numba_cache")))
    out = subprocess.run([sys.executable, "-m", "encdec", "warmup"], cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True).stdout
    return env, out


def loaded_after(code: str, env: Optional[dict] = None) -> tuple[set[str], str]:
    """Which of HEAVY a fresh interpreter has imported after running `code`, and its output."""
    report = f"import json, sys; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", f"{code}\n{report}"], cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True).stdout
    return set(json.loads(out.splitlines()[-1])), out


def test_import_encdec_imports_nothing_heavy():
    assert loaded_after("import encdec")[0] == set()


def test_public_names_still_import():
    assert loaded_after("from encdec import LLM, SamplingParams, AsyncLLMEngine, TokensPrompt, "
                        "zip_enc_dec_prompts, RequestOutput, EngineDeadError")[0] >= {"torch"}


def test_warmup_compiles_the_kernels(warm_cache):
    lines = warm_cache[1].splitlines()
    assert lines[0].startswith("encdec: decode attention: serial loop compiled ahead of time: "
                               + warm_cache[0]["NUMBA_CACHE_DIR"])
    if cpu_attention.cpu_supported():
        assert (f"encdec: prefill attention: compiled at {warm_cache[0]['NUMBA_CACHE_DIR']}/"
                "encdec_attention_") in warm_cache[1]
    assert lines[-1].startswith("encdec: CPU kernels (float32) ready in ")


def test_warmup_takes_faster_whispers_compute_type(warm_cache):
    """int8 runs a float32 cache, so warms float32's kernels; a contradicting --dtype is a
    usage error before anything compiles."""
    def warmup(*options):
        return subprocess.run([sys.executable, "-m", "encdec", "warmup", *options], cwd=ROOT,
                              env=warm_cache[0], capture_output=True, text=True)

    int8 = warmup("--compute_type", "int8")
    assert int8.returncode == 0 and int8.stdout.splitlines()[-1].startswith("encdec: CPU kernels (float32)")
    both = warmup("--compute-type", "bfloat16", "--dtype", "float32")
    assert both.returncode == 2 and both.stdout == ""
    assert both.stderr.splitlines()[-1] == ("encdec warmup: error: --compute_type=bfloat16 runs in "
                                            "bfloat16, which contradicts --dtype=float32; give one "
                                            "of the two")


def test_transcribing_with_a_bundled_model_needs_no_transformers_nor_numba(warm_cache):
    """openai-whisper's default 5 beams decode on the ahead-of-time loop: Numba stays unloaded;
    a language by name needs no transformers either."""
    code = ("from encdec.entrypoints import cli\n"
            "assert cli.main(['transcribe', 'samples/hello.wav', '--language', 'English']) == 0")
    loaded, out = loaded_after(code, warm_cache[0])
    assert loaded == {"torch"}
    assert "Thank you for calling. Please leave a message after the tone." in out


def test_ctrl_c_while_the_command_loads_ends_as_later():
    """Ctrl-C in a command's first seconds, while torch imports: one line and status 130, as
    an interrupt later gives (`cli.main`), not a traceback."""
    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "sys.argv = ['encdec', 'transcribe', 'samples/hello.wav']\n"
            "from encdec.entrypoints.launcher import run\n"
            "sys.exit(run())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (130, "encdec: interrupted\n")
