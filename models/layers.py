"""Building blocks shared by the encoder/decoder models: fused attention projections, the
feed-forward block, activations, and loading Hugging Face weights into fused parameters."""
from __future__ import annotations

import re
from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from encdec.attention import Attention, AttentionMetadata, AttentionType
from encdec.attention.backends.abstract import AttentionBackend
from encdec.kernels.cpu_linear import PackedLinear, can_fuse

_ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def get_activation(name: str):
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation_function {name!r} is not supported; known: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """nn.Embedding with its weight left uninitialized: the checkpoint fills it. (Its random
    init on the meta device would import torch._dynamo, about 2 s at load.)"""
    return nn.Embedding(num_embeddings, embedding_dim, _weight=torch.empty(num_embeddings, embedding_dim))


class SelfAttention(nn.Module):
    """Self-attention with one fused QKV projection (`qkv_proj` holds q, k, v rows)."""

    def __init__(self, d_model: int, num_heads: int, backend: AttentionBackend,
                 attn_type: AttentionType):
        super().__init__()
        self.d_model = d_model
        self.attn_type = attn_type
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        head_size = d_model // num_heads
        self.attn = Attention(num_heads, head_size, head_size ** -0.5, backend)

    def forward(self, x: torch.Tensor, kv_cache: Optional[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.d_model, dim=-1)
        return self.out_proj(self.attn(q, k, v, kv_cache, meta, self.attn_type))


class CrossAttention(nn.Module):
    """Decoder-to-encoder attention; keys/values are projected only when the encoder ran
    (the request's first step) and are read from the cross cache afterwards."""

    def __init__(self, d_model: int, num_heads: int, backend: AttentionBackend):
        super().__init__()
        self.d_model = d_model
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        head_size = d_model // num_heads
        self.attn = Attention(num_heads, head_size, head_size ** -0.5, backend)

    def forward(self, x: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor],
                kv_cache: Optional[torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        q = self.q_proj(x)
        k = v = None
        if encoder_hidden_states is not None:
            k, v = self.kv_proj(encoder_hidden_states).split(self.d_model, dim=-1)
        return self.out_proj(self.attn(q, k, v, kv_cache, meta, AttentionType.ENCODER_DECODER))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ffn_dim: int, activation: str):
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.activation = activation
        self.act = get_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def pack_linears(model: nn.Module) -> None:
    """Swap every nn.Linear for a oneDNN `PackedLinear` (float32 CPU), fusing each
    feed-forward block's activation into its fc1. Call after the weights are loaded."""
    for module in list(model.modules()):
        if isinstance(module, FeedForward) and can_fuse(module.activation):
            module.fc1 = PackedLinear.from_linear(module.fc1, module.activation)
            module.act = nn.Identity()
    for module in list(model.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear.from_linear(child))


# HF keeps fc1/fc2 directly on the layer; here they live in the shared FeedForward `ffn`.
_FFN = re.compile(r"\.(fc[12])\.")

# Hugging Face projection name -> (fused parameter name, shard index, number of shards).
_STACKED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0, 3),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1, 3),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2, 3),
    "encoder_attn.k_proj": ("encoder_attn.kv_proj", 0, 2),
    "encoder_attn.v_proj": ("encoder_attn.kv_proj", 1, 2),
}


def load_hf_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                    aliases: dict[str, str], ignored: tuple[str, ...] = (),
                    zero_if_missing: tuple[str, ...] = ()) -> None:
    """Copy Hugging Face-named tensors into `model`, stacking q/k/v into fused projections.

    `aliases` renames tied or duplicated names (e.g. embed_tokens -> shared); names ending in
    one of `ignored` are skipped; parameters whose names end in one of `zero_if_missing` may be
    absent (e.g. Whisper's k_proj has no bias) and are zeroed. Any other missing parameter, or an
    unknown name, raises ValueError.
    """
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    for name, param in params.items():
        if name.endswith(zero_if_missing):
            param.data.zero_()
    filled: dict[str, set[int]] = {}
    for name, tensor in weights:
        name = _FFN.sub(r".ffn.\1.", aliases.get(name, name))
        if name.endswith(ignored):
            continue
        target, shard, num_shards = name, None, 1
        for hf_part, (fused, index, count) in _STACKED.items():
            if f".{hf_part}." in name:
                target, shard, num_shards = name.replace(hf_part, fused), index, count
                break
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
        param = params[target]
        dest = param.data if shard is None else param.data.chunk(num_shards, dim=0)[shard]
        if dest.shape != tensor.shape:
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                             f"the model expects {tuple(dest.shape)}")
        dest.copy_(tensor)
        filled.setdefault(target, set()).add(0 if shard is None else shard)
    missing = [name for name in params
               if len(filled.get(name, ())) < _num_shards(name) and not name.endswith(zero_if_missing)]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} parameters of "
                         f"{type(model).__name__}, e.g. {missing[:5]}")


def _num_shards(param_name: str) -> int:
    for fused, _, count in _STACKED.values():
        if param_name.endswith((fused + ".weight", fused + ".bias")):
            return count
    return 1
