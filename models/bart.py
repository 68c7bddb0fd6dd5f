"""BART (and BART-shaped models) on the paged-cache engine, with Hugging Face weight names.

Post-LayerNorm layers, learned positions with offset 2, `layernorm_embedding`, optional
sqrt(d_model) embedding scale, token embeddings and LM head tied to `model.shared` (unless
`tie_word_embeddings` is false), plus `final_logits_bias`.
The encoder runs only for requests in their first step; its keys/values go to the cross cache.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
from torch import nn

from encdec.attention import AttentionMetadata, AttentionType
from encdec.attention.backends.abstract import AttentionBackend
from encdec.models.layers import (CrossAttention, FeedForward, SelfAttention, embedding,
                                  load_hf_weights)

_POSITION_OFFSET = 2


class BartEncoderLayer(nn.Module):
    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        d = config.d_model
        self.self_attn = SelfAttention(d, config.encoder_attention_heads, backend, AttentionType.ENCODER)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.ffn = FeedForward(d, config.encoder_ffn_dim, config.activation_function)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, h: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        h = self.self_attn_layer_norm(h + self.self_attn(h, None, meta))
        return self.final_layer_norm(h + self.ffn(h))


class BartDecoderLayer(nn.Module):
    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        d = config.d_model
        self.self_attn = SelfAttention(d, config.decoder_attention_heads, backend, AttentionType.DECODER)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = CrossAttention(d, config.decoder_attention_heads, backend)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.ffn = FeedForward(d, config.decoder_ffn_dim, config.activation_function)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, h: torch.Tensor, encoder_h: Optional[torch.Tensor],
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        h = self.self_attn_layer_norm(h + self.self_attn(h, kv_cache, meta))
        h = self.encoder_attn_layer_norm(h + self.encoder_attn(h, encoder_h, kv_cache, meta))
        return self.final_layer_norm(h + self.ffn(h))


class BartStack(nn.Module):
    """Embeddings + layers of one side (encoder or decoder)."""

    def __init__(self, config, num_layers: int, layer_cls, backend: AttentionBackend,
                 embed_tokens: nn.Embedding):
        super().__init__()
        d = config.d_model
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.embed_positions = embedding(config.max_position_embeddings + _POSITION_OFFSET, d)
        self.layernorm_embedding = nn.LayerNorm(d)
        self.layers = nn.ModuleList([layer_cls(config, backend) for _ in range(num_layers)])

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids) * self.embed_scale
        return self.layernorm_embedding(h + self.embed_positions(positions + _POSITION_OFFSET))


class BartModel(nn.Module):
    """With `tie_word_embeddings` (the default) both stacks share the `shared` token embedding;
    without it each has its own, as Hugging Face (transformers 5) saves them."""

    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        self.shared = embedding(config.vocab_size, config.d_model)
        tied = getattr(config, "tie_word_embeddings", True)
        stack_embeddings = [self.shared if tied else embedding(config.vocab_size, config.d_model)
                            for _ in range(2)]
        self.encoder = BartStack(config, config.encoder_layers, BartEncoderLayer, backend,
                                 stack_embeddings[0])
        self.decoder = BartStack(config, config.decoder_layers, BartDecoderLayer, backend,
                                 stack_embeddings[1])


class BartForConditionalGeneration(nn.Module):
    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.model = BartModel(config, backend)
        self.tied = getattr(config, "tie_word_embeddings", True)
        # weight tied to model.shared on load (if tied); bias is Hugging Face's final_logits_bias
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)

    def encode(self, encoder_input_ids: torch.Tensor, encoder_positions: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        h = self.model.encoder.embed(encoder_input_ids, encoder_positions)
        for layer in self.model.encoder.layers:
            h = layer(h, meta)
        return h

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: AttentionMetadata,
                encoder_input_ids: Optional[torch.Tensor] = None,
                encoder_positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        encoder_h = None
        if encoder_input_ids is not None and encoder_input_ids.numel():
            encoder_h = self.encode(encoder_input_ids, encoder_positions, attn_metadata)
        h = self.model.decoder.embed(input_ids, positions)
        for layer, kv_cache in zip(self.model.decoder.layers, kv_caches):
            h = layer(h, encoder_h, kv_cache, attn_metadata)
        return h

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        aliases = {}
        if self.tied:
            self.lm_head.weight = self.model.shared.weight
            aliases = {"model.encoder.embed_tokens.weight": "model.shared.weight",
                       "model.decoder.embed_tokens.weight": "model.shared.weight",
                       "lm_head.weight": "model.shared.weight"}
        weights = ((("lm_head.bias", t.reshape(-1)) if name == "final_logits_bias" else (name, t))
                   for name, t in weights)
        load_hf_weights(self, weights, aliases, zero_if_missing=("lm_head.bias",))
