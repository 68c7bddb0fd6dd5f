"""Prompt types and their preprocessing into encoder/decoder token ids (docs/design.md, "Requests")."""
from encdec.inputs.data import (CrossKVPrompt, ExplicitEncoderDecoderPrompt, PromptType, TextPrompt,
                                TokensPrompt, zip_enc_dec_prompts)
from encdec.inputs.preprocess import InputPreprocessor

__all__ = ["CrossKVPrompt", "ExplicitEncoderDecoderPrompt", "InputPreprocessor", "PromptType", "TextPrompt",
           "TokensPrompt", "zip_enc_dec_prompts"]
