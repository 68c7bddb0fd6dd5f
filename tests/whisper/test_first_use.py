"""What a new Whisper user tries first: `generate` without sampling params (greedy to the
decoder's length, with or without generation_config.json), languages given by name, and the
prompts of vLLM's Whisper examples."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from encdec import LLM, SamplingParams
from tests.conftest import assert_all_blocks_free
from tests.speech_corpus import wer
from tests.whisper.conftest import Clip

NUM_CLIPS = 3


@pytest.fixture(scope="module")
def clips(corpus) -> list[Clip]:
    """Three clips of three sentences each (about 30 tokens, past vLLM's 16 default tokens)."""
    return [Clip(" ".join(c.text for c in group), np.concatenate([c.audio for c in group]))
            for group in (corpus[3 * i:3 * i + 3] for i in range(NUM_CLIPS))]


def audio_prompts(clips) -> list[dict]:
    return [{"prompt": "", "multi_modal_data": {"audio": clip.pair}} for clip in clips]


def assert_whisper_defaults(llm: LLM, clips) -> None:
    """No sampling params: the same tokens as greedy decoding up to the decoder's positions in
    all (Hugging Face Whisper's limit), whole sentences (more than vLLM's 16 default tokens),
    and the same on a second call."""
    prompts = audio_prompts(clips)
    outputs = llm.generate(prompts, use_tqdm=False)
    again = llm.generate(prompts, use_tqdm=False)
    longest = llm.llm_engine.model_config.max_decoder_len - len(outputs[0].prompt_token_ids)
    greedy = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=longest), use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outputs]
    assert tokens == [o.outputs[0].token_ids for o in again]
    assert tokens == [o.outputs[0].token_ids for o in greedy]
    assert all(o.outputs[0].finish_reason == "stop" for o in outputs)
    assert max(len(t) for t in tokens) > 16
    assert wer([c.text for c in clips], [o.outputs[0].text for o in outputs]) < 0.2
    defaults = llm.llm_engine.generation_defaults.as_params(len(outputs[0].prompt_token_ids))
    assert (defaults["temperature"], defaults["max_tokens"]) == (0.0, longest)
    assert_all_blocks_free(llm)


def test_bundled_tiny_en_decodes_greedily_to_the_end(tiny_en, clips):
    assert_whisper_defaults(tiny_en, clips)


@pytest.fixture(scope="module")
def saved_tiny_en(tiny_en_assets, tmp_path_factory):
    """tiny.en saved as a Hugging Face checkpoint, as `save_pretrained` writes it (its
    generation_config.json sets no length or decoding fields)."""
    transformers = pytest.importorskip("transformers")
    from encdec.weights.loader import load_ct2_checkpoint

    config, state = load_ct2_checkpoint(tiny_en_assets)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**config))
    model.load_state_dict(state)
    out = tmp_path_factory.mktemp("tiny_en_hf")
    model.save_pretrained(out)
    tokenizer = transformers.WhisperTokenizerFast(tokenizer_file=str(tiny_en_assets.tokenizer_json))
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.parametrize("with_generation_config", [True, False])
def test_saved_checkpoint_decodes_greedily_to_the_end(saved_tiny_en, clips, tmp_path,
                                                      with_generation_config):
    checkpoint = saved_tiny_en
    if not with_generation_config:
        checkpoint = tmp_path / "no_generation_config"
        shutil.copytree(saved_tiny_en, checkpoint,
                        ignore=shutil.ignore_patterns("generation_config.json"))
    assert (checkpoint / "generation_config.json").exists() == with_generation_config
    llm = LLM(model=str(checkpoint), num_gpu_blocks=NUM_CLIPS * 110, swap_space=0.05)
    assert_whisper_defaults(llm, clips)


def test_transcribe_takes_language_names(tiny_en, base, language_clips):
    clips = dict(language_clips)
    for llm, name, code in ((tiny_en, "English", "en"), (base, "french", "fr")):
        by_name, by_code = (llm.transcribe([clips[code].pair], language=language, temperature=0.0)[0]
                            for language in (name, code))
        assert by_name.language == by_code.language == code
        assert by_name.text == by_code.text and by_name.text
    with pytest.raises(ValueError, match=r"language: 'Frnech' .* did you mean fr \(French\)\?"):
        base.transcribe([clips["fr"].pair], language="Frnech")
    with pytest.raises(ValueError, match="English-only"):
        tiny_en.transcribe([clips["fr"].pair], language="French")
    assert_all_blocks_free(tiny_en)
    assert_all_blocks_free(base)


def test_a_waveform_alone_is_16khz_audio_in_generate(tiny_en, clips):
    """As `transcribe` (and openai-whisper) take it; a 2-D one, or something else, is a
    ValueError that names the prompt, raised before anything runs."""
    params = SamplingParams(temperature=0.0, max_tokens=20)
    alone = tiny_en.generate([{"prompt": "", "multi_modal_data": {"audio": clips[0].audio}}], params, use_tqdm=False)
    paired = tiny_en.generate(audio_prompts(clips[:1]), params, use_tqdm=False)
    assert alone[0].outputs[0].token_ids == paired[0].outputs[0].token_ids
    for audio, message in ((np.stack([clips[0].audio] * 2), r"prompt 1: a waveform alone must be 1-D"),
                           ({"samples": clips[0].audio}, r"prompt 1: expected a path, a binary file object, a 16 kHz waveform or a "
                                                         r"\(waveform, sample_rate\) pair, got dict")):
        with pytest.raises(ValueError, match=message):
            tiny_en.generate([*audio_prompts(clips[:1]), {"prompt": "", "multi_modal_data": {"audio": audio}}],
                             params, use_tqdm=False)
    assert_all_blocks_free(tiny_en)


def test_the_prompts_of_vllms_whisper_examples(tiny_en, clips):
    """vLLM's examples build the LLM with `max_model_len=448, limit_mm_per_prompt={"audio": 1}`,
    give the audio in a list of one, pass `lora_request=None`, and its prompt builders add an
    empty `mm_processor_kwargs`: the same tokens as the plain pair. Two audios in one prompt,
    or a limit other than one audio, are refused with the count."""
    vllm_style = LLM(model="tiny.en", max_model_len=448, max_num_seqs=5, limit_mm_per_prompt={"audio": 1})
    for limit in ({"audio": 2}, {"audio": 0}):
        with pytest.raises(ValueError, match=rf"^limit_mm_per_prompt={limit!r}: a Whisper prompt holds one audio"):
            LLM(model="tiny.en", limit_mm_per_prompt=limit)
    with pytest.raises(ValueError, match=r"^limit_mm_per_prompt must be a dict such as \{'audio': 1\} \(encdec's "
                                         r"models take audio only\), got \{'image': 1\}$"):
        LLM(model="tiny.en", limit_mm_per_prompt={"image": 1})
    start = "<|startoftranscript|><|notimestamps|>"
    params = SamplingParams(temperature=0.0, max_tokens=60)
    pair = clips[0].pair
    forms = [{"prompt": start, "multi_modal_data": {"audio": pair}},
             {"prompt": start, "multi_modal_data": {"audio": [pair]}, "mm_processor_kwargs": {}},
             {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": [pair]}},
              "decoder_prompt": start, "mm_processor_kwargs": {}},
             {"prompt": start, "multi_modal_data": {"audio": list(pair)}}]
    outputs = tiny_en.generate(forms, params, use_tqdm=False)
    outputs += vllm_style.generate(forms[1], params, use_tqdm=False, lora_request=None)
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) == 1
    assert "quarterly report" in outputs[0].outputs[0].text
    with pytest.raises(ValueError, match=r"^prompt 1: multi_modal_data\['audio'\] holds 2 audios: a Whisper "
                                         r"prompt takes one$"):
        tiny_en.generate([forms[0], {"prompt": start, "multi_modal_data": {"audio": [pair, pair]}}],
                         params, use_tqdm=False)
    with pytest.raises(ValueError, match=r"^prompt 0: multi_modal_data\['audio'\] is an empty list: a Whisper "
                                         r"prompt takes one audio$"):
        tiny_en.generate({"prompt": start, "multi_modal_data": {"audio": []}}, params, use_tqdm=False)
    with pytest.raises(ValueError, match=r"^prompt 0: waveform: expected a sequence of samples, got a nest"):
        tiny_en.generate({"prompt": start, "multi_modal_data": {"audio": (pair, 16000)}}, params, use_tqdm=False)
    assert_all_blocks_free(tiny_en)
