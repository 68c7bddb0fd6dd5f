"""BART and the BART-shaped families on the paged-cache engine, with Hugging Face weight names.

BART: post-LayerNorm layers, learned positions with offset 2, `layernorm_embedding`, optional
sqrt(d_model) embedding scale, token embeddings and LM head tied to `model.shared` (unless
`tie_word_embeddings` is false), plus `final_logits_bias`. mBART, Marian and PEGASUS are the same
model with the differences their `BartVariant` names (models/mbart.py, marian.py, pegasus.py).
The encoder runs only for requests in their first step; its keys/values go to the cross cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional

import torch
from torch import nn

from encdec.attention import AttentionMetadata
from encdec.attention.backends.abstract import AttentionBackend
from encdec.models.layers import (DecoderLayer, EncoderLayer, LayerSpec, SinusoidalPositions,
                                  embedding, load_hf_weights)
from encdec.models.registry import InputHooks, text_input_hooks

_POSITION_OFFSET = 2


@dataclass(frozen=True)
class BartVariant:
    """How a BART-shaped family differs from BART."""

    normalize_before: bool = False  # pre-LayerNorm layers and a final `layer_norm` per stack
    layernorm_embedding: bool = True  # LayerNorm over the embeddings
    sinusoidal_positions: bool = False  # static sinusoidal positions, not learned ones at offset 2


class BartStack(nn.Module):
    """Embeddings, layers and (pre-norm variants) the final `layer_norm` of one side."""

    def __init__(self, config, side: str, layer_cls: type, backend: AttentionBackend,
                 embed_tokens: nn.Embedding, variant: BartVariant):
        super().__init__()
        d = config.d_model
        spec = LayerSpec.of_side(config, side, variant.normalize_before)
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        if variant.sinusoidal_positions:
            self.embed_positions = SinusoidalPositions(config.max_position_embeddings, d)
            self.position_offset = 0
        else:
            self.embed_positions = embedding(config.max_position_embeddings + _POSITION_OFFSET, d)
            self.position_offset = _POSITION_OFFSET
        self.layernorm_embedding = nn.LayerNorm(d) if variant.layernorm_embedding else None
        self.layers = nn.ModuleList([layer_cls(spec, backend)
                                     for _ in range(getattr(config, f"{side}_layers"))])
        self.layer_norm = nn.LayerNorm(d) if variant.normalize_before else None

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = (self.embed_tokens(input_ids) * self.embed_scale
             + self.embed_positions(positions + self.position_offset))
        return h if self.layernorm_embedding is None else self.layernorm_embedding(h)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.layer_norm is None else self.layer_norm(h)


class BartModel(nn.Module):
    """With `tie_word_embeddings` (the default) both stacks share the `shared` token embedding;
    without it each has its own, as Hugging Face (transformers 5) saves them. Marian without
    `share_encoder_decoder_embeddings` has a source and a target vocabulary and no `shared`."""

    def __init__(self, config, backend: AttentionBackend, variant: BartVariant):
        super().__init__()
        d = config.d_model
        if getattr(config, "share_encoder_decoder_embeddings", True):
            self.shared = embedding(config.vocab_size, d)
            tied = getattr(config, "tie_word_embeddings", True)
            embeddings = [self.shared if tied else embedding(config.vocab_size, d) for _ in range(2)]
        else:
            embeddings = [embedding(config.vocab_size, d), embedding(config.decoder_vocab_size, d)]
        self.encoder = BartStack(config, "encoder", EncoderLayer, backend, embeddings[0], variant)
        self.decoder = BartStack(config, "decoder", DecoderLayer, backend, embeddings[1], variant)


class BartForConditionalGeneration(nn.Module):
    variant = BartVariant()

    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.model = BartModel(config, backend, self.variant)
        self.tied = getattr(config, "tie_word_embeddings", True)
        heads = config.decoder_attention_heads
        self.kv_cache_shape = (config.decoder_layers, heads, config.d_model // heads)
        # weight tied to the decoder's token embedding on load (if tied); bias is Hugging
        # Face's final_logits_bias
        self.lm_head = nn.Linear(config.d_model, self.model.decoder.embed_tokens.num_embeddings)

    def encode(self, encoder_input_ids: torch.Tensor, encoder_positions: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        encoder = self.model.encoder
        h = encoder.embed(encoder_input_ids, encoder_positions)
        for layer in encoder.layers:
            h = layer(h, meta)
        return encoder.final_norm(h)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: AttentionMetadata,
                encoder_input_ids: Optional[torch.Tensor] = None,
                encoder_positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        encoder_h = None
        if encoder_input_ids is not None and encoder_input_ids.numel():
            encoder_h = self.encode(encoder_input_ids, encoder_positions, attn_metadata)
        decoder = self.model.decoder
        h = decoder.embed(input_ids, positions)
        for layer, kv_cache in zip(decoder.layers, kv_caches):
            h = layer(h, encoder_h, kv_cache, attn_metadata)
        return decoder.final_norm(h)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A checkpoint without final_logits_bias has none; one without the sinusoidal tables
        (Marian) gets them computed."""
        if self.tied:
            self.lm_head.weight = self.model.decoder.embed_tokens.weight
        names = set()

        def local_names():
            for name, tensor in weights:
                names.add(name)
                yield ("lm_head.bias", tensor.reshape(-1)) if name == "final_logits_bias" else (name, tensor)

        optional = ("lm_head.bias",)
        if self.variant.sinusoidal_positions:
            optional += ("embed_positions.weight",)
        load_hf_weights(self, local_names(), zero_if_missing=optional)
        for name, module in self.named_modules():
            if isinstance(module, SinusoidalPositions) and f"{name}.weight" not in names:
                module.fill()


def bart_input_hooks(hf_config: Any, tokenizer: Any = None,
                     generation_config: Optional[dict] = None) -> InputHooks:
    """BART: the default decoder prompt is [<DEC>, <BOS>] ([2, 0]), the start BART's summarizers
    were fine-tuned on (vLLM's default too)."""
    hooks = text_input_hooks(hf_config, tokenizer, generation_config)
    bos = getattr(hf_config, "bos_token_id", None)
    if bos is None:
        return hooks
    return replace(hooks, default_decoder_prompt=hooks.default_decoder_prompt + [bos])
