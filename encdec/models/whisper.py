"""Whisper on the paged-cache engine, with Hugging Face weight names.

Encoder: two GELU convolutions (the second halves 3000 mel frames to 1500), stored sinusoidal
positions, pre-LayerNorm layers, a final `layer_norm`. Decoder: token embeddings plus learned
positions, pre-LayerNorm layers with paged self- and cross-attention, a final `layer_norm`,
logits from the (usually tied) output projection. Embeddings are not scaled, as in Hugging Face.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from encdec.attention import AttentionMetadata
from encdec.attention.backends.abstract import AttentionBackend
from encdec.models.layers import DecoderLayer, EncoderLayer, LayerSpec, embedding, load_hf_weights

# Windows per encoder pass: the activations grow with the windows encoded together (the
# feed-forward intermediate alone is 9 MB a window in float32), the matmuls' speed does not
# past a few thousand rows. bench_whisper's 24 windows peaked at 1577 MB RSS in one pass,
# 1441-1504 MB in passes of 8, 1327 in passes of 4 (benchmarks/memory_breakdown.py).
WINDOWS_PER_PASS = 8


class WhisperEncoder(nn.Module):
    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        d = config.d_model
        self.num_frames = 2 * config.max_source_positions
        self.conv1 = nn.Conv1d(config.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = embedding(config.max_source_positions, d)
        spec = LayerSpec.of_side(config, "encoder", normalize_before=True)
        self.layers = nn.ModuleList([EncoderLayer(spec, backend)
                                     for _ in range(config.encoder_layers)])
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, features: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """[B, n_mels, 3000] log-mel features -> [B * 1500, d_model] encoder states, in passes
        of at most `WINDOWS_PER_PASS` windows. The features are the step's first B prefills
        (those after them came with their cross keys and values)."""
        assert features.shape[-1] == self.num_frames, \
            f"Whisper features need {self.num_frames} frames, got {features.shape[-1]}"
        lens = meta.encoder_seq_lens
        passes = [
            self._encode(features[i:i + WINDOWS_PER_PASS], dataclasses.replace(
                meta, num_prefills=min(WINDOWS_PER_PASS, len(features) - i),
                encoder_seq_lens=lens[i:i + WINDOWS_PER_PASS], backend_cache={}))
            for i in range(0, len(features), WINDOWS_PER_PASS)]
        return passes[0] if len(passes) == 1 else torch.cat(passes)

    def _encode(self, features: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = F.gelu(self.conv1(features.to(self.embed_positions.weight.dtype)))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        h = (x + self.embed_positions.weight).reshape(-1, x.shape[-1])
        for layer in self.layers:
            h = layer(h, meta)
        return self.layer_norm(h)


class WhisperDecoder(nn.Module):
    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        d = config.d_model
        self.embed_tokens = embedding(config.vocab_size, d)
        self.embed_positions = embedding(config.max_target_positions, d)
        spec = LayerSpec.of_side(config, "decoder", normalize_before=True)
        self.layers = nn.ModuleList([DecoderLayer(spec, backend)
                                     for _ in range(config.decoder_layers)])
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                encoder_h: Optional[torch.Tensor], kv_caches: list[torch.Tensor],
                meta: AttentionMetadata,
                cross_kv: Optional[list[tuple[torch.Tensor, torch.Tensor]]] = None) -> torch.Tensor:
        h = self.embed_tokens(input_ids) + self.embed_positions(positions)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            h = layer(h, encoder_h, kv_cache, meta, cross_kv=cross_kv[i] if cross_kv else None)
        return self.layer_norm(h)


class WhisperModel(nn.Module):
    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        self.encoder = WhisperEncoder(config, backend)
        self.decoder = WhisperDecoder(config, backend)


class WhisperForConditionalGeneration(nn.Module):
    def __init__(self, config, backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.model = WhisperModel(config, backend)
        self.tied = getattr(config, "tie_word_embeddings", True)
        heads = config.decoder_attention_heads
        self.kv_cache_shape = (config.decoder_layers, heads, config.d_model // heads)
        self.proj_out = nn.Linear(config.d_model, config.vocab_size, bias=False)  # tied on load

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn_metadata: AttentionMetadata,
                encoder_input_features: Optional[torch.Tensor] = None,
                cross_kv: Optional[list[tuple[torch.Tensor, torch.Tensor]]] = None) -> torch.Tensor:
        """Decoder hidden states; the encoder runs only when the step has prefills with
        features. `cross_kv`: per layer, the cross keys and values of the prefills after those
        (`EncoderDecoderModelRunner`)."""
        encoder_h = None
        if encoder_input_features is not None and encoder_input_features.numel():
            encoder_h = self.model.encoder(encoder_input_features, attn_metadata)
        return self.model.decoder(input_ids, positions, encoder_h, kv_caches, attn_metadata, cross_kv)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.proj_out(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.tied:
            self.proj_out.weight = self.model.decoder.embed_tokens.weight
        # Whisper's k_proj has no bias: that third of the fused bias stays zero.
        load_hf_weights(self, weights, zero_if_missing=("qkv_proj.bias", "kv_proj.bias"))
