"""`encdec translate` prints what Hugging Face's generate() translates, for Marian (its own
language pair) and mBART-50 (source and target codes, the target forced first), and names the
language option when a language is unknown; T5 takes the codes of its translation tasks, long
texts are cut to fit (as `encdec summarize` cuts them) and empty ones refused."""
from __future__ import annotations

import re

import pytest
from transformers import AutoTokenizer

from encdec.entrypoints.cli import main
from encdec.entrypoints.summaries import fit_article
from tests.family_checkpoints import make_family_checkpoint
from tests.hf_reference import hf_texts

TEXTS = ["The rain in spain falls mainly on the plain.", "We need more chairs for the meeting room."]
MAX_TOKENS = 8


def hf_translations(model_dir, texts, src_lang=None, forced_bos=None, prefix="") -> list[str]:
    return [text.strip() for text in hf_texts(
        model_dir, [prefix + text for text in texts], src_lang, do_sample=False, num_beams=1,
        max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, forced_bos_token_id=forced_bos)]


def translate(capsys, model_dir, *options) -> tuple[int, list[str], str]:
    """The checkpoints' generation configs decode greedily (and force </s> at the length limit)."""
    status = main(["translate", "--model", str(model_dir), "--max-tokens", str(MAX_TOKENS),
                   "--min-tokens", str(MAX_TOKENS), *options, *TEXTS])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def said(err: str) -> list[str]:
    """encdec's own lines on stderr (not the progress bars of loading)."""
    return [line for line in err.splitlines() if line.startswith("encdec: ")]


def test_marian_multilingual_target(tmp_path, capsys):
    model_dir = make_family_checkpoint("marian", tmp_path / "marian", seed=1)  # into de or fr
    status, lines, _ = translate(capsys, model_dir, "--target-lang", "fr")
    assert status == 0
    assert lines == hf_translations(model_dir, TEXTS, prefix=">>fr<< ")
    assert lines[0] != lines[1]

    status, lines, err = translate(capsys, model_dir)
    assert status == 2 and not lines
    assert "--target-lang" in err and "one of ['de', 'fr']" in err


def test_marian_says_which_languages_it_does_not_use(tmp_path, capsys):
    """A checkpoint of one language pair translates into its own target, whatever --target-lang
    asks; a multilingual one takes the target but reads its own source. Each says so."""
    model_dir = make_family_checkpoint("marian-separate", tmp_path / "marian", seed=1)
    multilingual = make_family_checkpoint("marian", tmp_path / "multilingual", seed=1)
    status, lines, err = translate(capsys, model_dir, "--source-lang", "en", "--target-lang", "fr")
    assert status == 0 and lines == hf_translations(model_dir, TEXTS)
    assert said(err) == [
        "encdec: warning: --source-lang en: not used: a Marian model reads the source language it was trained on",
        "encdec: warning: --target-lang fr: not used: this Marian model translates into the one language it "
        "was trained on"]
    status, lines, err = translate(capsys, multilingual, "--source-lang", "en", "--target-lang", "fr")
    assert status == 0 and lines == hf_translations(multilingual, TEXTS, prefix=">>fr<< ")
    assert said(err) == [
        "encdec: warning: --source-lang en: not used: a Marian model reads the source language it was trained on"]


def test_mbart50_target_language(tmp_path, capsys):
    model_dir = make_family_checkpoint("mbart-50", tmp_path / "mbart", seed=1)
    status, lines, _ = translate(capsys, model_dir, "--source-lang", "en_XX", "--target-lang", "fr")
    assert status == 0
    fr = AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids("fr_XX")
    assert lines == hf_translations(model_dir, TEXTS, src_lang="en_XX", forced_bos=fr)

    status, lines, err = translate(capsys, model_dir, "--source-lang", "en_XX", "--target-lang", "xx")
    assert status == 2 and not lines
    assert "encdec translate: error: --target-lang xx: unknown language 'xx'" in err
    status, lines, err = translate(capsys, model_dir, "--source-lang", "zz", "--target-lang", "fr")
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert line.startswith("encdec translate: error: --source-lang zz: unknown language 'zz'")


def test_an_mbart_cc25_tokenizer_is_refused(tmp_path, capsys):
    """mBART-cc25's tokenizer reads `text </s> en_XX`, not mBART-50's `[en_XX] text </s>`:
    translating it as mBART-50 would be wrong without a word, so it is refused."""
    from transformers import MBartTokenizer

    from tests.family_checkpoints import train_sentencepiece

    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / "sentencepiece.bpe.model").write_bytes(
        train_sentencepiece(400, unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
    tokenizer = MBartTokenizer.from_pretrained(str(tmp_path / "spm"), src_lang="en_XX", tgt_lang="ro_RO")
    model_dir = make_family_checkpoint("mbart-50", tmp_path / "cc25", seed=2, tokenizer=tokenizer,
                                       decoder_start_token_id=tokenizer.convert_tokens_to_ids("ro_RO"))
    status, lines, err = translate(capsys, model_dir, "--source-lang", "en_XX", "--target-lang", "ro_RO")
    assert status == 2 and not lines
    assert "translation takes mBART-50 checkpoints (MBart50Tokenizer); this one's tokenizer is MBartTokenizer" in err


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return make_family_checkpoint("t5", tmp_path_factory.mktemp("t5"), seed=1)  # en to de, fr, ro


def usage_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: encdec translate ")
    return err.splitlines()[-1].removeprefix("encdec translate: error: ")


def test_languages_and_models_that_cannot_translate(t5_dir, tiny_bart_dir, capsys):
    t5 = ["translate", "--model", str(t5_dir), "text"]
    assert usage_error(capsys, t5) == (
        "--source-lang and --target-lang are required for T5; this checkpoint translates en to de, en to "
        "fr, en to ro")
    assert usage_error(capsys, [*t5, "--source-lang", "English", "--target-lang", "German"]) == (
        "--source-lang English --target-lang German: no such task; this checkpoint translates en "
        "to de, en to fr, en to ro")
    assert usage_error(capsys, ["translate", "--model", str(tiny_bart_dir), "text"]) == (
        f"--model {tiny_bart_dir}: a bart checkpoint does not translate (translate takes Marian, "
        f"mBART-50 or T5 checkpoints)")


def test_long_texts_are_cut_as_hugging_face_cuts_them(t5_dir, capsys):
    long_text = " ".join(TEXTS * 100)
    status, lines, err = translate(capsys, t5_dir, "--source-lang", "en", "--target-lang", "de",
                                   long_text)
    assert status == 0 and len(lines) == len(TEXTS) + 1
    assert re.search(r"encdec: note: TEXT 1: cut to the model's limit of 512 input tokens \(\d+ "
                     r"tokens left out\)", err)

    status, lines, err = translate(capsys, t5_dir, "--source-lang", "en", "--target-lang", "de",
                                   "--no-truncate", long_text)
    assert status == 1 and len(lines) == len(TEXTS) + 1 and lines[0] == ""  # its line, empty
    assert re.search(r"encdec: error: TEXT 1: the text has \d+ tokens, more than the model's limit "
                     r"of 512 input tokens \(without --no-truncate it is cut to fit\)", err)

    tokenizer = AutoTokenizer.from_pretrained(str(t5_dir))
    ids = tokenizer("translate English to German: " + long_text)["input_ids"]
    assert fit_article(ids, tokenizer, 512).token_ids == tokenizer(
        "translate English to German: " + long_text, truncation=True, max_length=512)["input_ids"]


def test_empty_texts_are_refused(t5_dir, capsys):
    status, lines, err = translate(capsys, t5_dir, "--source-lang", "en", "--target-lang", "de", " ")
    assert status == 1 and len(lines) == len(TEXTS) + 1 and lines[0] == ""  # its line, empty
    assert "encdec: error: TEXT 1: the text to translate is empty" in err


def test_a_text_cut_to_fit_gets_no_tokenizer_warning(tmp_path, capsys, caplog):
    """The note says the text was cut; the tokenizer's logged "will result in indexing errors",
    which contradicts it, is not logged."""
    model_dir = make_family_checkpoint("marian", tmp_path / "marian", seed=1)
    assert main(["translate", "--model", str(model_dir), "--target-lang", "fr", "--max-tokens", "2",
                 " ".join(TEXTS * 100)]) == 0
    assert "cut to the model's limit" in capsys.readouterr().err
    assert not [r for r in caplog.records if "indexing errors" in r.getMessage()]
