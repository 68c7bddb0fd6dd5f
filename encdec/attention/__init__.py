"""Attention for encoder/decoder models: types, per-step metadata, the layer, and backends."""
from encdec.attention.layer import Attention
from encdec.attention.metadata import AttentionMetadata, AttentionType
from encdec.attention.position_bias import RelativePositionBias

__all__ = ["Attention", "AttentionMetadata", "AttentionType", "RelativePositionBias"]
