"""`encdec translate`: text translation with a Marian, mBART-50 or T5 checkpoint.

The model family says how the languages are given: a Marian checkpoint translates its own
language pair (a multilingual one takes the target as `>>fr<<`), mBART-50 takes source and
target codes (`en_XX`, `fr_XX`; the target code is forced as the first generated token), T5
takes the codes of one of its translation tasks (`en` and `de` for "translate English to
German: ", which goes in front of the text, and whose parameters in config.json's
task_specific_params go over the generation config, as in Hugging Face's pipeline). Texts longer
than the model's input limit are cut to fit, as for `encdec summarize`, unless --no-truncate.
Decoding follows the checkpoint's generation config unless options say otherwise, as for
`encdec summarize`. One translation per line on stdout, TEXTs first, then each --file; an input that
fails gets an empty line (its error on stderr).
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from encdec.entrypoints.cli_args import add_model_options
from encdec.entrypoints.cli_messages import UsageError, error, warn
from encdec.entrypoints.summaries import ArticleTooLong, fit_article
from encdec.entrypoints.summarize_cli import (add_decoding_options, cut_note, decoding_params,
                                              load_text_model, print_outputs, too_long)
from encdec.models.registry import LanguageError, get_model_family, translation_inputs, translation_task
from encdec.models.t5 import t5_translation_pairs

TRANSLATORS = "Marian, mBART-50 or T5"


def add_translate(subparsers) -> None:
    p = subparsers.add_parser("translate", help=f"translate text with a {TRANSLATORS} checkpoint",
                              description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("texts", nargs="*", metavar="TEXT", help="text to translate")
    p.add_argument("--file", dest="files", action="append", default=[], metavar="F",
                   help="read a text from F (- for stdin); may be repeated")
    p.add_argument("--model", required=True, metavar="DIR",
                   help=f"local Hugging Face checkpoint directory ({TRANSLATORS})")
    p.add_argument("--source-lang", default=None,
                   help="language of the texts: en_XX for mBART-50, en for T5 (Marian: the "
                        "checkpoint's own)")
    p.add_argument("--target-lang", default=None,
                   help="language to translate into: fr_XX for mBART-50, de for T5, fr for a "
                        "multilingual Marian checkpoint")
    add_decoding_options(p)
    add_model_options(p)
    p.set_defaults(handler=run_translate)


def check_languages(args: argparse.Namespace, hf_config: Any) -> None:
    """--model against what translates, and a T5 checkpoint's --source-lang and --target-lang
    against its translation tasks (UsageError)."""

    family = get_model_family(hf_config)
    if family.translation is None:
        raise UsageError(f"--model {args.model}: a {family.model_type} checkpoint does not "
                         f"translate (translate takes {TRANSLATORS} checkpoints)")
    pairs = t5_translation_pairs(hf_config)
    if family.model_type == "t5" and (args.source_lang, args.target_lang) not in pairs:
        problem = (f"--source-lang {args.source_lang} --target-lang {args.target_lang}: no such "
                   f"task" if args.source_lang and args.target_lang else
                   "--source-lang and --target-lang are required for T5")
        known = ", ".join(f"{source} to {target}" for source, target in pairs) or "nothing"
        raise UsageError(f"{problem}; this checkpoint translates {known}")


def run_translate(args: argparse.Namespace) -> int:

    llm, texts, failed = load_text_model(args)
    if llm is None:
        return failed
    engine = llm.llm_engine
    hf_config, limit = engine.model_config.hf_config, engine.model_config.max_encoder_len
    check_languages(args, hf_config)
    task = translation_task(args.source_lang, args.target_lang)
    params = decoding_params(engine.generation_defaults, args, task)
    prompts, request_params, unused = [], [], {}
    for label, text in texts:
        ids = forced = None
        if text is not None and not text.strip():
            error(f"{label}: the text to translate is empty")
            failed += 1
        elif text is not None:
            try:
                inputs = translation_inputs(engine.tokenizer, hf_config, text, args.source_lang,
                                            args.target_lang)
            except LanguageError as err:  # the languages: the same for every text
                given = getattr(args, err.field)
                option = f"--{err.field.replace('_', '-')}" + (f" {given}" if given else "")
                raise UsageError(f"{option}: {err}") from None
            except ValueError as err:
                raise UsageError(f"--model {args.model}: {err}") from None
            unused.update(inputs.unused)
            try:
                article = fit_article(inputs.prompt_token_ids, engine.tokenizer, limit, args.truncate)
            except ArticleTooLong as err:
                too_long(label, err)
                failed += 1
            else:
                ids = article.token_ids
                if article.truncated_tokens:
                    cut_note(label, limit, article.truncated_tokens)
                forced = inputs.forced_bos_token_id
        prompts.append(None if ids is None else {"prompt_token_ids": ids})
        request_params.append(params if forced is None
                              else dataclasses.replace(params, forced_bos_token_id=forced))
    for name, reason in unused.items():
        warn(f"--{name.replace('_', '-')} {getattr(args, name)}: not used: {reason}")
    status = print_outputs(llm, prompts, request_params, args)
    return 1 if status or failed else 0
