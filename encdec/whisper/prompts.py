"""Whisper's decoder prompts: the ids of an initial prompt or hotwords, and a window's prompt
from the text decoded before it (openai-whisper's `<|startofprev|>` context)."""
from __future__ import annotations

import re
from typing import Any, Union

from encdec.inputs.tokenizing import encode
from encdec.whisper.decoding import TIME_PRECISION
from encdec.whisper.tokens import NUM_TIMESTAMP_TOKENS, WhisperTokens

# openai-whisper's special tokens that Hugging Face's Whisper tokenizers read as plain text
OPENAI_TEXT_SPECIALS = frozenset(["<|nospeech|>"] + [f"<|{i * TIME_PRECISION:.2f}|>" for i in range(NUM_TIMESTAMP_TOKENS)])
SPECIAL_SPELLING = re.compile(r"<\|[a-z0-9.]+\|>")
MAX_PROMPT_TOKENS = 223  # context tokens kept in a prompt (openai: n_text_ctx // 2 - 1)


def prompt_ids(tokens: WhisperTokens, tokenizer: Any, text: Union[str, list[int], None], name: str) -> list[int]:
    """Tokens of " " + `text` for a prompt (an empty one is that space, as in openai-whisper),
    the ids themselves if given as ids (faster-whisper's), or none for None. A prompt that holds
    a special token (<|endoftext|>, <|notimestamps|>, ..., or text spelling one) is refused, as
    openai-whisper refuses it: a prompt is plain text, and such a token would steer the decode."""
    if text is None:
        return []
    if tokens.sot_prev is None:
        raise ValueError(f"this Whisper vocabulary has no <|startofprev|>: {name} unsupported")
    ids = text if isinstance(text, list) else encode(tokenizer, text=" " + text.strip(), add_special_tokens=False)
    special = next((t for t in ids if not 0 <= t < tokens.eot), None)  # Whisper's come after its text tokens
    spelled = None if isinstance(text, list) else next(
        (m.group() for m in SPECIAL_SPELLING.finditer(text) if m.group() in OPENAI_TEXT_SPECIALS), None)
    if spelled is not None:  # special in openai-whisper's vocabulary, plain text in Hugging Face's
        raise ValueError(f"{name} contains {spelled!r}, the text of a special token; a prompt is plain text")
    if special is not None:
        what = f"token id {special}, not a text token" if isinstance(text, list) else \
            f"{tokenizer.decode([special])!r}, the text of a special token"
        raise ValueError(f"{name} contains {what}; a prompt is plain text")
    return ids


def decoder_prompt(tokens: WhisperTokens, context: list[int], initial: list[int],
                   hotwords: list[int]) -> list[int]:
    """[<|startofprev|>, hotwords, the last context tokens, sot], or [sot] with neither; a
    non-empty `initial` (`carry_initial_prompt`) stays at the context's start."""
    room = MAX_PROMPT_TOKENS - len(hotwords)
    if room >= len(initial):
        kept = initial + _tail(context[len(initial):], room - len(initial))
    else:
        kept = _tail(initial, room)
    if not kept and not hotwords:
        return [tokens.sot]
    return [tokens.sot_prev, *hotwords, *kept, tokens.sot]


def _tail(ids: list[int], n: int) -> list[int]:
    return ids[max(0, len(ids) - n):] if n > 0 else []
