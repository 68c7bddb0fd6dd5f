"""Whisper's teacher-forced alignment pass: cross-attention of chosen heads for given tokens.

Word timestamps (`encdec.whisper.timing`) need, for each text token of a decoded window, the
attention its alignment heads pay to the audio frames, computed over the window's text alone
(openai-whisper's `find_alignment`). This pass runs the decoder over those tokens with plain
dense attention, reading each layer's cross-attention keys and values as the engine kept them
from the window's paged cross cache (`RequestOutput.cross_kv`): no second encoder run. Several
windows run as one batch, their token sequences padded at the end.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.inference_mode()
def alignment_pass(model: torch.nn.Module, token_ids: list[list[int]],
                   cross_kv: list[list[tuple[torch.Tensor, torch.Tensor]]],
                   heads: list[tuple[int, int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each window: its token ids, its per-layer cross (keys, values) `[heads, frames,
    head_size]`; returns per window (`scores` [len(heads), tokens, frames]: the alignment heads'
    scaled query-key products, before the softmax; `logits` [tokens, vocab])."""
    decoder = model.model.decoder
    device = decoder.embed_tokens.weight.device
    lengths = [len(ids) for ids in token_ids]
    width = max(lengths)
    ids = torch.tensor([seq + [0] * (width - len(seq)) for seq in token_ids], device=device)
    h = decoder.embed_tokens(ids) + decoder.embed_positions(torch.arange(width, device=device))
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    last_layer = max(layer for layer, _ in heads)
    captured = {}
    for index, layer in enumerate(decoder.layers):
        attn = layer.self_attn
        q, k, v = (_split_heads(t, attn.attn.num_heads)
                   for t in _linear(attn.qkv_proj, layer.self_attn_layer_norm(h)).split(attn.inner_dim, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=attn.attn.scale)
        h = h + _linear(attn.out_proj, _merge_heads(out))
        cross = layer.encoder_attn
        q = _split_heads(_linear(cross.q_proj, layer.encoder_attn_layer_norm(h)), cross.attn.num_heads)
        keys = torch.stack([kv[index][0] for kv in cross_kv]).to(q.dtype)
        values = torch.stack([kv[index][1] for kv in cross_kv]).to(q.dtype)
        scores = q @ keys.transpose(-1, -2) * cross.attn.scale
        if index <= last_layer:
            captured[index] = scores
        h = h + _linear(cross.out_proj, _merge_heads(scores.softmax(dim=-1) @ values))
        h = h + _linear(layer.ffn, layer.final_layer_norm(h))
    logits = _linear(model.compute_logits, decoder.layer_norm(h)).float()
    stacked = torch.stack([captured[layer][:, head] for layer, head in heads], dim=1).float()
    return [(stacked[b, :, :n], logits[b, :n]) for b, n in enumerate(lengths)]


def _linear(module, x: torch.Tensor) -> torch.Tensor:
    """`module` over the last axis of `x` (the model's linears take [tokens, features])."""
    return module(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    batch, length, dim = x.shape
    return x.view(batch, length, num_heads, dim // num_heads).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    batch, heads, length, head_size = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_size)
