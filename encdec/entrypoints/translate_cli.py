"""`encdec translate`: text translation with a Marian, mBART-50 or T5 checkpoint.

The model family says how the languages are given (`encdec.models.registry.translation_inputs`):
a Marian checkpoint translates its own language pair (a multilingual one takes the target as
`>>fr<<`), mBART-50 takes source and target codes (`en_XX`, `fr_XX`; the target code is forced
as the first generated token), T5 writes "translate English to German: " in front of the text.
Decoding follows the checkpoint's generation config unless options say otherwise, as for
`encdec summarize`. One translation per line on stdout, TEXTs first, then --files.
"""
from __future__ import annotations

import argparse
import dataclasses

from encdec.models.registry import translation_inputs


def add_translate(subparsers) -> None:
    from encdec.entrypoints.cli import add_decoding_options, add_model_options

    p = subparsers.add_parser("translate", help="translate text with a Marian, mBART-50 or T5 checkpoint",
                              description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("texts", nargs="*", metavar="TEXT", help="text to translate")
    p.add_argument("--file", dest="files", action="append", default=[], metavar="F",
                   help="read a text from F (- for stdin); may be repeated")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="local Hugging Face checkpoint directory (Marian, mBART-50 or T5)")
    p.add_argument("--source-lang", default=None,
                   help="language of the texts: en_XX for mBART-50, English for T5 (Marian: the "
                        "checkpoint's own)")
    p.add_argument("--target-lang", default=None,
                   help="language to translate into: fr_XX for mBART-50, French for T5, fr for a "
                        "multilingual Marian checkpoint")
    add_decoding_options(p)
    add_model_options(p)
    p.set_defaults(handler=run_translate)


def run_translate(args: argparse.Namespace) -> int:
    from encdec.entrypoints.cli import decoding_params, error, load_text_model, option_wording

    llm, texts, failed = load_text_model(args)
    if llm is None:
        return failed
    engine = llm.llm_engine
    limit = engine.model_config.max_encoder_len
    try:
        params = decoding_params(llm, args)
    except ValueError as err:
        error(option_wording(err))
        return 2
    try:
        requests = [translation_inputs(engine.tokenizer, engine.model_config.hf_config, text,
                                       args.source_lang, args.target_lang) for _, text in texts]
    except ValueError as err:  # the languages: the same for every text
        error(f"--source-lang / --target-lang: {err}")
        return 2
    prompts, request_params = [], []
    for (label, _), inputs in zip(texts, requests):
        if len(inputs.prompt_token_ids) > limit:
            error(f"{label}: {len(inputs.prompt_token_ids)} tokens, more than the model's limit "
                  f"of {limit} input tokens")
            failed += 1
            continue
        prompts.append({"prompt_token_ids": inputs.prompt_token_ids})
        forced = inputs.forced_bos_token_id
        request_params.append(params if forced is None
                              else dataclasses.replace(params, forced_bos_token_id=forced))
    if prompts:
        for output in llm.generate(prompts, request_params, use_tqdm=False):
            print(output.outputs[0].text.strip())
    return 1 if failed else 0
