"""A T5 checkpoint summarizes and translates as Hugging Face's pipelines for those tasks do: the
task's prefix in front of the text and the generation fields of its `task_specific_params`
(t5-small's: 4 beams, 30 to 200 tokens, no repeated trigram, length penalty 2 for summaries) over
the generation config, which sets none. Hugging Face's side runs the pipeline's steps."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

from encdec.entrypoints.cli import main
from encdec.entrypoints.summarize_cli import one_line
from tests.family_checkpoints import make_family_checkpoint

TEXT = "The rain in spain falls mainly on the plain. We need more chairs for the meeting room."


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return make_family_checkpoint("t5", tmp_path_factory.mktemp("t5"), seed=1)


def pipeline_output(model_dir, task: str, text: str) -> str:
    """What Hugging Face's pipeline for `task` does: the task's parameters over the generation
    config, its prefix, generate(), decode."""
    params = dict(AutoConfig.from_pretrained(model_dir).task_specific_params[task])
    prefix = params.pop("prefix")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        ids = model.generate(**tokenizer([prefix + text], return_tensors="pt"), **params)[0]
    return one_line(tokenizer.decode(ids, skip_special_tokens=True))


@pytest.mark.parametrize("task, argv", [
    ("summarization", ["summarize"]),
    ("translation_en_to_de", ["translate", "--source-lang", "en", "--target-lang", "de"]),
])
def test_t5_decodes_with_its_task_parameters(t5_dir, capsys, task, argv):
    expected = pipeline_output(str(t5_dir), task, TEXT)
    assert main([argv[0], "--model", str(t5_dir), *argv[1:], TEXT]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_bart_without_forced_bos_summarizes_as_the_pipeline(tiny_bart_dir, capsys):
    """A BART checkpoint whose config forces no BOS (bart-base's) starts its summaries where
    Hugging Face's generate() starts: at <DEC> alone, not at the engine's default [<DEC>, <BOS>]
    (on these random weights the two differ)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_bart_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_bart_dir).eval()
    assert model.generation_config.forced_bos_token_id is None  # the case under test
    texts = [TEXT, "Paged attention keeps keys and values in blocks."]
    with torch.no_grad():
        expected = [one_line(tokenizer.decode(model.generate(**tokenizer([text], return_tensors="pt"),
                                                             max_new_tokens=10)[0], skip_special_tokens=True))
                    for text in texts]
    assert main(["summarize", "--model", str(tiny_bart_dir), *texts, "--max-tokens", "10"]) == 0
    assert capsys.readouterr().out.splitlines() == expected
