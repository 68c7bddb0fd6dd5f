"""What keeps a GPU on its fast kernels, checked on the CPU: the LM head padded to a multiple of
64 rows (half precision on cuda) gives the unpadded ids and log-probabilities and shares the tied
embedding's storage; cuda runs SDPA without cuDNN."""
from __future__ import annotations

import pytest
import torch

from encdec import LLM, SamplingParams
from encdec.models.vocab_padding import PaddedLMHead, pad_vocab_size, pads_lm_head
from encdec.worker.model_runner import sdpa_without_cudnn
from tests.conftest import assert_all_blocks_free

PROMPTS = ["The rain in spain falls mainly.", "A quick brown fox jumps over the lazy dog."]


def _run(llm: LLM) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    outs = [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert_all_blocks_free(llm)
    return [(list(o.token_ids), [step[t].logprob for step, t in zip(o.logprobs, o.token_ids)])
            for o in outs]


def test_padded_head_gives_the_unpadded_ids_and_shares_the_tied_weight(tiny_bart_dir, monkeypatch):
    plain = _run(LLM(model=str(tiny_bart_dir), num_gpu_blocks=64))
    monkeypatch.setattr("encdec.weights.loader.pads_lm_head", lambda device, dtype: True)
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=64)
    model = llm.llm_engine.model_runner.model
    head, embedding = model.lm_head, model.model.decoder.embed_tokens
    assert isinstance(head, PaddedLMHead)
    assert head.weight.shape[0] == 1024 and embedding.weight.shape[0] == head.vocab_size == 1000
    assert embedding.weight.data_ptr() == head.weight.data_ptr()
    assert not head.weight[1000:].any() and not head.bias[1000:].any()
    padded = _run(llm)
    for (ids, logprobs), (plain_ids, plain_logprobs) in zip(padded, plain):
        assert ids == plain_ids
        assert logprobs == pytest.approx(plain_logprobs, abs=1e-5)


@pytest.mark.parametrize("vocab, padded", [(50265, 50304), (51864, 51904), (32128, 32128),
                                           (1, 64)])
def test_pad_vocab_size(vocab, padded):
    assert pad_vocab_size(vocab) == padded


@pytest.mark.parametrize("device, dtype, pads", [
    ("cuda", torch.float16, True), ("cuda", torch.bfloat16, True),
    ("cuda", torch.float32, False), ("cpu", torch.bfloat16, False), ("cpu", torch.float32, False),
])
def test_which_models_get_a_padded_head(device, dtype, pads):
    assert pads_lm_head(torch.device(device), dtype) is pads


def test_cuda_runs_sdpa_without_cudnn(monkeypatch):
    """cuDNN's SDPA plans every new shape anew (RESULTS.md, "On a GPU, second lease"): a model
    runner on cuda turns it off; one on the CPU leaves torch's flags as they are."""
    turned_off = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda on: turned_off.append(not on))
    sdpa_without_cudnn(torch.device("cpu"))
    assert turned_off == []
    sdpa_without_cudnn(torch.device("cuda"))
    assert turned_off == [True]
