"""T5 v1.0 and v1.1 / Flan-T5 on the paged-cache engine, with Hugging Face weight names.

Pre-norm layers with RMS norms, projections without biases, no attention scaling, a ReLU or
gated-GELU feed-forward, and no position embeddings: each stack has a relative position bias (in
Hugging Face, held by its first block), bidirectional in the encoder and causal in the decoder,
none in cross-attention. The model looks it up once per step (`RelativePositionBias`) and every
layer's attention backend adds it. Token embeddings are shared; the LM head is tied to them unless
the checkpoint has its own (Flan-T5), and a config with tied embeddings (T5 v1.0) scales its input
by d_model ** -0.5. The decoder starts with the pad token.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Iterable, Optional

import torch
from torch import nn

from encdec.attention import AttentionMetadata, RelativePositionBias
from encdec.attention.backends.abstract import AttentionBackend
from encdec.generation_config import task_prefix
from encdec.inputs.tokenizing import encode
from encdec.models.layers import DecoderLayer, EncoderLayer, LayerSpec, embedding, load_hf_weights
from encdec.models.registry import (InputHooks, LanguageError, TranslationInputs, text_input_hooks,
                                   translation_task)

T5_MAX_LENGTH = 512  # T5's training length, for configs without n_positions


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bucket of each key's offset from its query (key minus query position): one bucket
    per distance below half the buckets (per direction where `bidirectional`), then buckets
    growing logarithmically up to `max_distance`, and one for everything farther. Causal
    buckets count only keys before the query."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    # The float operations of Hugging Face, in its order: boundary distances land alike.
    log_bucket = max_exact + (torch.log(distance.float() / max_exact)
                              / math.log(max_distance / max_exact)
                              * (num_buckets - max_exact)).long()
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, log_bucket)


class T5RelativeBias(nn.Module):
    """One stack's learned bias per (bucket, head)."""

    def __init__(self, config, bidirectional: bool):
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.relative_attention_bias = embedding(self.num_buckets, config.num_heads)

    def forward(self, span: int) -> RelativePositionBias:
        """The bias of every key/query offset up to `span` - 1 apart."""
        offsets = torch.arange(1 - span, span, device=self.relative_attention_bias.weight.device)
        buckets = relative_position_bucket(offsets, self.bidirectional, self.num_buckets,
                                           self.max_distance)
        return RelativePositionBias(self.relative_attention_bias(buckets).T.contiguous())


class T5Stack(nn.Module):
    def __init__(self, config, num_layers: int, layer_cls: type, backend: AttentionBackend,
                 embed_tokens: nn.Embedding, bidirectional: bool):
        super().__init__()
        spec = LayerSpec(config.d_model, config.num_heads, config.d_ff, config.dense_act_fn,
                         normalize_before=True, head_size=config.d_kv, bias=False, scale=1.0,
                         rms_norm_eps=config.layer_norm_epsilon, gated_ffn=config.is_gated_act)
        self.embed_tokens = embed_tokens
        self.relative_bias = T5RelativeBias(config, bidirectional)
        self.layers = nn.ModuleList([layer_cls(spec, backend) for _ in range(num_layers)])
        self.final_layer_norm = spec.norm()


class T5ForConditionalGeneration(nn.Module):
    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.shared = embedding(config.vocab_size, config.d_model)
        self.encoder = T5Stack(config, config.num_layers, EncoderLayer, backend, self.shared, True)
        self.decoder = T5Stack(config, config.num_decoder_layers, DecoderLayer, backend,
                               self.shared, False)
        # transformers 5 keeps the checkpoint's tie_word_embeddings as scale_decoder_outputs
        self.scale_logits = getattr(config, "scale_decoder_outputs",
                                    getattr(config, "tie_word_embeddings", True))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.kv_cache_shape = (config.num_decoder_layers, config.num_heads, config.d_kv)

    def encode(self, encoder_input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        encoder = self.encoder
        bias = encoder.relative_bias(max(meta.encoder_seq_lens[:meta.num_prefills]))
        h = encoder.embed_tokens(encoder_input_ids)
        for layer in encoder.layers:
            h = layer(h, meta, bias)
        return encoder.final_layer_norm(h)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: AttentionMetadata,
                encoder_input_ids: Optional[torch.Tensor] = None,
                encoder_positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Decoder hidden states; positions are implied by the metadata's sequence lengths."""
        encoder_h = None
        if encoder_input_ids is not None and encoder_input_ids.numel():
            encoder_h = self.encode(encoder_input_ids, attn_metadata)
        decoder = self.decoder
        bias = decoder.relative_bias(max(attn_metadata.seq_lens))
        h = decoder.embed_tokens(input_ids)
        for layer, kv_cache in zip(decoder.layers, kv_caches):
            h = layer(h, encoder_h, kv_cache, attn_metadata, bias)
        return decoder.final_layer_norm(h)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.scale_logits:
            hidden_states = hidden_states * self.config.d_model ** -0.5
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A checkpoint without `lm_head.weight` ties the LM head to the token embeddings."""
        names = set()

        def local_names():
            for name, tensor in weights:
                names.add(name)
                yield hf_to_local(name, self.config.is_gated_act), tensor

        load_hf_weights(self, local_names(), ignored=("encoder_attn.relative_attention_bias.weight",),
                        zero_if_missing=("lm_head.weight",))
        if "lm_head.weight" not in names:
            self.lm_head.weight = self.shared.weight


# Hugging Face's T5 names -> this module's, in order. Block i's sublayers: 0 self-attention,
# then (decoder) 1 cross-attention, then the feed-forward.
_RENAMES = [
    (re.compile(r"\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\."),
     ".relative_bias.relative_attention_bias."),
    (re.compile(r"\.block\.(\d+)\.layer\.0\.SelfAttention\."), r".layers.\1.self_attn."),
    (re.compile(r"\.block\.(\d+)\.layer\.0\.layer_norm\."), r".layers.\1.self_attn_layer_norm."),
    (re.compile(r"^decoder\.block\.(\d+)\.layer\.1\.EncDecAttention\."),
     r"decoder.layers.\1.encoder_attn."),
    (re.compile(r"^decoder\.block\.(\d+)\.layer\.1\.layer_norm\."),
     r"decoder.layers.\1.encoder_attn_layer_norm."),
    (re.compile(r"\.block\.(\d+)\.layer\.\d\.DenseReluDense\."), r".layers.\1.DenseReluDense."),
    (re.compile(r"\.block\.(\d+)\.layer\.\d\.layer_norm\."), r".layers.\1.final_layer_norm."),
]
_PROJECTIONS = re.compile(r"\.(self_attn|encoder_attn)\.([qkvo])\.")
_FEED_FORWARD = re.compile(r"\.DenseReluDense\.(wi|wi_0|wi_1|wo)\.")
_FFN_NAMES = {False: {"wi": "fc1", "wo": "fc2"},
              True: {"wi_0": "ffn.gate_proj", "wi_1": "ffn.up_proj", "wo": "ffn.down_proj"}}


def hf_to_local(name: str, gated: bool) -> str:
    """A Hugging Face T5 weight name as this module's (q/k/v still apart: the loader fuses them)."""
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    name = _PROJECTIONS.sub(lambda m: f".{m[1]}.{'out' if m[2] == 'o' else m[2]}_proj.", name)
    return _FEED_FORWARD.sub(lambda m: f".{_FFN_NAMES[gated].get(m[1], m[1])}.", name)


def t5_input_hooks(hf_config: Any, tokenizer: Any = None,
                   generation_config: Optional[dict] = None) -> InputHooks:
    """T5 has no absolute positions: inputs and outputs are limited to the length it was trained
    on, the config's n_positions (512)."""
    limit = getattr(hf_config, "n_positions", None) or T5_MAX_LENGTH
    return replace(text_input_hooks(hf_config, tokenizer, generation_config), max_lengths=(limit, limit))


def t5_translation_pairs(hf_config: Any) -> list[tuple[str, str]]:
    """The (source, target) codes of a T5 checkpoint's `translation_{source}_to_{target}` tasks."""
    pairs = []
    for task in getattr(hf_config, "task_specific_params", None) or {}:
        source, to, target = task.removeprefix("translation_").partition("_to_")
        if task.startswith("translation_") and to:
            pairs.append((source, target))
    return pairs


def t5_translation(tokenizer: Any, hf_config: Any, text: str, source_lang: Optional[str],
                   target_lang: Optional[str]) -> TranslationInputs:
    """T5 translates with the prefix of its `translation_{source}_to_{target}` task parameters
    ("translate English to German: ")."""
    pairs = t5_translation_pairs(hf_config)
    if not source_lang or not target_lang:
        known = ", ".join(f"{source} to {target}" for source, target in pairs) or "nothing"
        raise LanguageError("source_lang" if not source_lang else "target_lang",
                            f"T5 translates with a source and a target language of its tasks; this "
                            f"checkpoint translates {known}")
    task = translation_task(source_lang, target_lang)
    prefix = task_prefix(hf_config, task)
    if not prefix:
        known = sorted(f"translation_{source}_to_{target}" for source, target in pairs)
        field = "target_lang" if source_lang in {source for source, _ in pairs} else "source_lang"
        raise LanguageError(field, f"this T5 checkpoint has no {task} task; it has {known or 'none'}")
    return TranslationInputs(encode(tokenizer, text=prefix + text, verbose=False))
