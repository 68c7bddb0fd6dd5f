"""`encdec translate` prints what Hugging Face's generate() translates, for Marian (its own
language pair) and mBART-50 (source and target codes, the target forced first), and names the
language option when a language is unknown."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from encdec.entrypoints.cli import main
from tests.family_checkpoints import make_family_checkpoint

TEXTS = ["The rain in spain falls mainly on the plain.", "We need more chairs for the meeting room."]
MAX_TOKENS = 8


def hf_translations(model_dir, texts, src_lang=None, forced_bos=None, prefix="") -> list[str]:
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if src_lang:
        tokenizer.src_lang = src_lang
    model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    out = []
    for text in texts:
        with torch.no_grad():
            ids = model.generate(**tokenizer([prefix + text], return_tensors="pt"), do_sample=False,
                                 num_beams=1, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                 forced_bos_token_id=forced_bos)
        out.append(tokenizer.decode(ids[0], skip_special_tokens=True).strip())
    return out


def translate(capsys, model_dir, *options) -> tuple[int, list[str], str]:
    """The checkpoints' generation configs decode greedily (and force </s> at the length limit)."""
    status = main(["translate", "--model", str(model_dir), "--max-tokens", str(MAX_TOKENS),
                   "--min-tokens", str(MAX_TOKENS), *options, *TEXTS])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def test_marian_multilingual_target(tmp_path, capsys):
    model_dir = make_family_checkpoint("marian", tmp_path / "marian", seed=1)  # into de or fr
    status, lines, _ = translate(capsys, model_dir, "--target-lang", "fr")
    assert status == 0
    assert lines == hf_translations(model_dir, TEXTS, prefix=">>fr<< ")
    assert lines[0] != lines[1]

    status, lines, err = translate(capsys, model_dir)
    assert status == 2 and not lines
    assert "--target-lang" in err and "one of ['de', 'fr']" in err


def test_mbart50_target_language(tmp_path, capsys):
    model_dir = make_family_checkpoint("mbart-50", tmp_path / "mbart", seed=1)
    status, lines, _ = translate(capsys, model_dir, "--source-lang", "en_XX", "--target-lang", "fr")
    assert status == 0
    fr = AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids("fr_XX")
    assert lines == hf_translations(model_dir, TEXTS, src_lang="en_XX", forced_bos=fr)

    status, lines, err = translate(capsys, model_dir, "--source-lang", "en_XX", "--target-lang", "xx")
    assert status == 2 and not lines
    assert "--target-lang" in err and "unknown language 'xx'" in err
