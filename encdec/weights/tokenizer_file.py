"""A tokenizer read from a tokenizer.json file by the `tokenizers` library, with the part of
transformers' tokenizer API that encdec and its users reach for: calling it on text, `encode`,
`decode`, `batch_decode`, `convert_tokens_to_ids`, `convert_ids_to_tokens`, `get_vocab`,
`get_added_vocab` and `len()`. CTranslate2 models (the bundled Whisper ones) load their tokenizer.json with it
rather than with transformers' `PreTrainedTokenizerFast`, whose import costs about a second of
`encdec transcribe`'s start-up; both run the same `tokenizers` pipeline.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Union

from tokenizers import Tokenizer


class TokenizerFile:
    def __init__(self, path: Union[str, os.PathLike]):
        self.backend = Tokenizer.from_file(os.fspath(path))

    def __call__(self, text: Union[str, list[str], None] = None, add_special_tokens: bool = True,
                 text_target: Union[str, list[str], None] = None, verbose: bool = True) -> dict:
        """`{"input_ids": ids}` of one text, or a list of id lists for a list of texts; the
        decoder side's `text_target` reads the same vocabulary as `text`. `verbose` is
        transformers' (whose tokenizers warn of texts over the model's length); this one never
        warns."""
        if (text is None) == (text_target is None):
            raise ValueError("give one of text and text_target")
        text = text if text_target is None else text_target
        if isinstance(text, str):
            return {"input_ids": self.backend.encode(text, add_special_tokens=add_special_tokens).ids}
        encodings = self.backend.encode_batch(list(text), add_special_tokens=add_special_tokens)
        return {"input_ids": [e.ids for e in encodings]}

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False) -> str:
        """The text of `ids`, spaces as the tokenizer's decoder leaves them (transformers'
        `clean_up_tokenization_spaces` is off for these files, and cannot be turned on here)."""
        if clean_up_tokenization_spaces:
            raise ValueError("TokenizerFile does not clean up tokenization spaces")
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self(text, add_special_tokens=add_special_tokens)["input_ids"]

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]

    def convert_tokens_to_ids(self, tokens: Union[str, list[str]]) -> Union[Optional[int], list[Optional[int]]]:
        """The id of a token (None if unknown), or of each token of a list."""
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: Union[int, list[int]]) -> Union[Optional[str], list[Optional[str]]]:
        """The token of an id, or of each id of a list."""
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def get_added_vocab(self) -> dict[str, int]:
        return {token.content: i for i, token in self.backend.get_added_tokens_decoder().items()}
