"""Hugging Face references for parity tests: greedy and beam-search `generate()`."""
from __future__ import annotations

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer


class HFReference:
    """A checkpoint's Hugging Face outputs (float32, on `device`), each computed once. On the
    CPU they run on one thread: one sequence's small steps gain nothing from a second, and lose
    much when other processes share the cores."""

    def __init__(self, model_dir, device: str = "cpu"):
        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).to(device).eval()
        self.cache: dict = {}

    def greedy(self, encoder_ids: list[int], decoder_ids: list[int], max_new_tokens: int,
               **generate_kwargs) -> list[int]:
        return self._once(hf_greedy, encoder_ids, decoder_ids, max_new_tokens,
                          self.model.config.eos_token_id, **generate_kwargs)

    def beam_search(self, encoder_ids: list[list[int]], num_beams: int, max_new_tokens: int,
                    **generate_kwargs) -> list[list[int]]:
        return self._once(hf_beam_search, encoder_ids, num_beams, max_new_tokens, **generate_kwargs)

    def _once(self, generate, *args, **kwargs):
        key = (generate.__name__, repr(args), repr(sorted(kwargs.items())))
        if key not in self.cache:
            threads = torch.get_num_threads()
            torch.set_num_threads(1 if self.model.device.type == "cpu" else threads)
            try:
                self.cache[key] = generate(self.model, *args, **kwargs)
            finally:
                torch.set_num_threads(threads)
        return self.cache[key]


# Logits processors a checkpoint's generation config may turn on, off unless a test asks.
_PLAIN = dict(no_repeat_ngram_size=0, repetition_penalty=1.0, forced_bos_token_id=None,
              forced_eos_token_id=None)


@torch.inference_mode()
def hf_greedy(model, encoder_ids: list[int], decoder_ids: list[int], max_new_tokens: int,
              eos_token_id: int, **generate_kwargs) -> list[int]:
    """Tokens HF `generate()` appends to `decoder_ids`, greedy, with no logits processors but
    those `generate_kwargs` ask for (inputs go to the model's device)."""
    settings = {**_PLAIN, **generate_kwargs}
    out = model.generate(
        torch.tensor([encoder_ids], device=model.device),
        decoder_input_ids=torch.tensor([decoder_ids], device=model.device),
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, min_length=0,
        eos_token_id=eos_token_id, pad_token_id=model.config.pad_token_id, **settings)
    return out[0, len(decoder_ids):].tolist()


@torch.inference_mode()
def hf_beam_search(model, encoder_ids: list[list[int]], num_beams: int, max_new_tokens: int,
                   **generate_kwargs) -> list[list[int]]:
    """The best hypothesis of HF beam search for each encoder prompt (one padded batch), after
    the decoder start token and up to its EOS."""
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    width = max(map(len, encoder_ids))
    ids = torch.tensor([e + [pad] * (width - len(e)) for e in encoder_ids], device=model.device)
    mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in encoder_ids],
                        device=model.device)
    settings = {**_PLAIN, **generate_kwargs}
    out = model.generate(ids, attention_mask=mask, do_sample=False, num_beams=num_beams,
                         max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                         **settings).tolist()
    return [seq[1:seq.index(eos, 1) + 1] if eos in seq[1:] else seq[1:] for seq in out]


NEAR_TIE = 1e-4


@torch.inference_mode()
def divergence_margin(model, encoder_ids: list[int], decoder_ids: list[int],
                      engine_ids: list[int], expected: list[int]) -> float:
    """Top-1 minus the logit of the engine's choice, where the engine first left HF's path.

    Float rounding differs between a batched paged engine and HF's dense one, so when two
    logits tie to ~1e-6 the greedy paths may part; anything larger is a real difference.
    """
    step = next(i for i, (a, b) in enumerate(zip(engine_ids, expected)) if a != b)
    logits = model(input_ids=torch.tensor([encoder_ids], device=model.device),
                   decoder_input_ids=torch.tensor([decoder_ids + expected[:step]],
                                                  device=model.device)).logits[0, -1]
    return (logits.max() - logits[engine_ids[step]]).item()


def hf_texts(model_dir, texts: list[str], src_lang=None, **generate_kwargs) -> list[str]:
    """What `generate()` makes of each text alone, decoded without special tokens, the
    checkpoint's tokenizer reading it (in `src_lang`, for mBART-50)."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if src_lang:
        tokenizer.src_lang = src_lang
    model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()
    out = []
    for text in texts:
        with torch.no_grad():
            ids = model.generate(**tokenizer([text], return_tensors="pt"), **generate_kwargs)[0]
        out.append(tokenizer.decode(ids, skip_special_tokens=True))
    return out
