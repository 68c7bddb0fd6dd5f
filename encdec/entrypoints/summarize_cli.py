"""`encdec summarize`: summaries of texts (BART, T5, PEGASUS, ... checkpoints), one per line on stdout.

Texts longer than the encoder's positions are cut to fit (a note on stderr) unless
--no-truncate; decoding follows the checkpoint's generation config, with its summarization task
parameters over it, unless options say otherwise (`encdec.entrypoints.summaries`, shared with
`/v1/summarize`). `translate` and `batch summarize` take the same decoding options.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from encdec.entrypoints import cli_args
from encdec.entrypoints.cli_args import add_model_options
from encdec.entrypoints.cli_messages import PROG, UsageError, error, file_error, option_wording
from encdec.entrypoints.summaries import (SUMMARIZATION, Article, ArticleTooLong, prepare_article,
                                          summary_params)
from encdec.entrypoints.transcribe_args import (MAX_SEQS, non_negative_int, number,
                                                positive_int)
from encdec.generation_config import GenerationDefaults, resolve_sampling_params
from encdec.llm import LLM
from encdec.weights.loader import checkpoint_dir_problem, has_tokenizer, is_whisper

# SamplingParams names in messages -> the options that set them
OPTIONS = {"max_tokens": "--max-tokens", "min_tokens": "--min-tokens", "beam_width": "--num-beams",
           "use_beam_search": "--num-beams", "length_penalty": "--length-penalty",
           "no_repeat_ngram_size": "--no-repeat-ngram-size", "temperature": "--temperature",
           "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


def read_texts(args: argparse.Namespace) -> tuple[list[tuple[str, Optional[str]]], int]:
    """`(label, text)` of the TEXT arguments, then of each --file ("-" is stdin); a file that
    cannot be read is reported and keeps its place with the text None. Also the count of those."""
    texts, failed = [(f"TEXT {i}", text) for i, text in enumerate(args.texts, start=1)], 0
    for name in args.files:
        try:
            text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
            texts.append((name, text.removeprefix("\ufeff")))  # a byte-order mark is no text
        except UnicodeDecodeError:
            error(f"{name}: not UTF-8 text")
        except OSError as err:
            file_error(name, err)
        else:
            continue
        texts.append((name, None))
        failed += 1
    return texts, failed


def cut_note(label: str, limit: int, left_out: int) -> None:
    tqdm.write(f"{PROG}: note: {label}: cut to the model's limit of {limit} input tokens "
               f"({left_out} tokens left out)", file=sys.stderr)


def too_long(label: str, err: ArticleTooLong) -> None:
    error(f"{label}: {err} (without --no-truncate it is cut to fit)")


def articles(llm: LLM, texts: list[tuple[str, Optional[str]]],
             truncate: bool) -> tuple[list[Optional[Article]], int]:
    """Each text's encoder tokens, cut to the model's limit (a note on stderr) unless
    --no-truncate; a text that cannot be used is reported and keeps its place as None (as an
    unread one does), and counted."""
    engine = llm.llm_engine
    limit = engine.model_config.max_encoder_len
    kept, failed = [], 0
    for label, text in texts:
        if text is None:
            kept.append(None)
            continue
        try:
            article = prepare_article(text, engine.tokenizer, engine.model_config.hf_config, limit, truncate)
        except ArticleTooLong as err:
            too_long(label, err)
        except ValueError as err:
            error(f"{label}: {err}")
        else:
            if article.truncated_tokens:
                cut_note(label, limit, article.truncated_tokens)
            kept.append(article)
            continue
        kept.append(None)
        failed += 1
    return kept, failed


def load_text_model(args: argparse.Namespace) -> tuple[Optional[LLM], list[tuple[str, Optional[str]]], int]:
    """The checkpoint of `encdec summarize | translate` and the texts; `(None, [], status)` when
    the command cannot go on (the reason already on stderr)."""
    problem = checkpoint_dir_problem(Path(args.model).expanduser())
    if problem:
        error(f"--model {args.model}: {problem} ({args.command} takes a local Hugging Face "
              f"checkpoint directory)")
        return None, [], 2
    check_text_model(args.model, args.command)
    texts, failed = read_texts(args)
    if not texts:
        raise UsageError("give at least one TEXT or --file (--file - reads standard input)")
    if failed == len(texts):
        return None, [], 1
    try:
        llm = cli_args.load_llm(args)
    except (ValueError, OSError) as err:
        error(f"cannot load model {args.model!r}: {err}")
        return None, [], 1
    return llm, texts, failed


def check_text_model(model: str, command: str) -> None:
    """The checkpoint directory `model` of `command` (summarize, translate, batch summarize) must
    hold a text model and its tokenizer (UsageError); told without reading its weights."""
    if is_whisper(model):
        raise UsageError(f"--model {model}: a Whisper checkpoint takes audio ({command} takes a text "
                         f"model such as BART, PEGASUS or T5; for speech use encdec transcribe)")
    if not has_tokenizer(Path(model).expanduser()):
        raise UsageError(f"--model {model}: the directory has no tokenizer files (tokenizer.json, "
                         f"or the tokenizer's own files), so text cannot be read")


def decoding_options(args: argparse.Namespace) -> dict:
    """The decoding options of `summarize`, `translate` and `batch summarize`, as `summary_params`
    takes them (unset ones are None)."""
    return dict(max_tokens=args.max_tokens, min_tokens=args.min_tokens, num_beams=args.num_beams,
                length_penalty=args.length_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def decoding_params(defaults: GenerationDefaults, args: argparse.Namespace,
                    task: Optional[str] = SUMMARIZATION):
    """SamplingParams from the decoding options of `summarize`, `translate` and `batch
    summarize` over the checkpoint's generation config `defaults` and its `task` parameters
    (UsageError for a bad value)."""
    try:
        return summary_params(defaults, **decoding_options(args), task=task)
    except ValueError as err:
        raise UsageError(option_wording(err, OPTIONS)) from None


def check_lengths(llm: LLM, prompt: dict, params, args: argparse.Namespace) -> None:
    """`check_output_lengths` for `prompt`'s decoder prompt on the loaded model."""
    engine = llm.llm_engine
    decoder_ids = engine.input_preprocessor.preprocess(prompt).prompt_token_ids
    check_output_lengths(engine.generation_defaults, len(decoder_ids),
                         engine.model_config.max_decoder_len, params, args.min_tokens)


def check_output_lengths(defaults: GenerationDefaults, prompt_len: int, max_decoder_len: int,
                         params, min_tokens: Optional[int]) -> None:
    """--max-tokens against the room a decoder of `max_decoder_len` positions has after a
    decoder prompt of `prompt_len` tokens, and --min-tokens against the longest output, which
    the checkpoint's generation config and the model's length set when --max-tokens does not
    (UsageError)."""
    try:
        longest = resolve_sampling_params(dataclasses.replace(params, min_tokens=None), defaults,
                                          prompt_len, max_decoder_len).max_tokens
    except ValueError as err:  # --max-tokens past the decoder's room
        raise UsageError(option_wording(err, OPTIONS)) from None
    if min_tokens is not None and min_tokens > longest:
        raise UsageError(f"--min-tokens {min_tokens}: the checkpoint's default max tokens is "
                         f"{longest}; set --max-tokens")


def print_outputs(llm: LLM, prompts: list[Optional[dict]], params, args: argparse.Namespace) -> int:
    """Decode `prompts` (`params`: one SamplingParams, or one per prompt) and print one output a
    line (its own line breaks become spaces), an empty line for each None (an input that failed,
    its error already on stderr), so that line i answers input i; 0, or 1 if the engine refused
    them."""
    if not isinstance(params, list):
        params = [params] * len(prompts)
    todo = [(prompt, p) for prompt, p in zip(prompts, params) if prompt is not None]
    if not todo:
        print("\n" * (len(prompts) - 1))
        return 0
    check_lengths(llm, *todo[0], args)
    try:
        outputs = iter(llm.generate([prompt for prompt, _ in todo], [p for _, p in todo],
                                    use_tqdm=False))
    except ValueError as err:
        error(option_wording(err, OPTIONS))
        return 1
    for prompt in prompts:
        print("" if prompt is None else one_line(next(outputs).outputs[0].text))
    return 0


def one_line(text: str) -> str:
    """`text` on one line: its lines, stripped, joined by a space."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def run_summarize(args: argparse.Namespace) -> int:
    llm, texts, failed = load_text_model(args)
    if llm is None:
        return failed
    params = decoding_params(llm.llm_engine.generation_defaults, args)
    inputs, unusable = articles(llm, texts, args.truncate)
    start = llm.llm_engine.model_config.decoder_start_token_id
    prompts = [None if a is None else a.prompt(start) for a in inputs]
    status = print_outputs(llm, prompts, params, args)
    return 1 if status or failed + unusable else 0


def add_decoding_options(p: argparse.ArgumentParser) -> None:
    """The summarization options of `encdec summarize` (the same as `/v1/summarize`'s)."""
    p.add_argument("--max-tokens", type=positive_int, default=None,
                   help="longest output in tokens (default: the checkpoint's generation config's "
                        "max_length, 20 new tokens if it sets none, as in Hugging Face; 128 for a "
                        "checkpoint without a generation config)")
    p.add_argument("--min-tokens", type=non_negative_int, default=None,
                   help="shortest output in tokens (default: the generation config's)")
    p.add_argument("--num-beams", type=number(int, 1, MAX_SEQS), default=None,
                   help=f"beam search width, at most {MAX_SEQS}; 1 decodes greedily (default: the "
                        f"generation config's)")
    p.add_argument("--length-penalty", type=number(float), default=None,
                   help="beam search: score = log-probability / length ** this (default: the "
                        "generation config's)")
    p.add_argument("--no-repeat-ngram-size", type=non_negative_int, default=None,
                   help="never repeat an n-gram of this size; 0 allows all (default: the "
                        "generation config's)")
    p.add_argument("--temperature", type=number(float, 0, 2), default=None,
                   help="in [0, 2]: 0 decodes greedily (or with the config's beam search), "
                        "higher samples, without the config's beams (default: the generation "
                        "config's decoding)")
    p.add_argument("--top-k", type=number(int, -1), default=None,
                   help="sampling: draw from the k likeliest tokens; -1 or 0 from all (default: "
                        "the generation config's when it samples, else all)")
    p.add_argument("--top-p", type=number(float, 0, 1, above=True), default=None,
                   help="sampling: draw from the likeliest tokens whose probabilities add up to "
                        "this, in (0, 1] (default: the generation config's when it samples, else 1)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=True,
                   help="cut texts longer than the model's input limit to fit, with a note on "
                        "stderr; --no-truncate reports them as errors instead (default: on)")


def add_summarize(subparsers) -> None:
    p = subparsers.add_parser("summarize", help="summarize text with a BART, PEGASUS or T5 checkpoint",
                              description="Summarize texts with a BART, PEGASUS or T5 checkpoint, "
                                          "decoding as its generation config (with "
                                          "config.json's task_specific_params for summarization "
                                          "over it, as Hugging Face's pipeline) says unless "
                                          "options say otherwise; "
                                          "one summary per line on stdout, TEXTs first, then "
                                          "each --file; an input that fails gets an empty line "
                                          "(its error on stderr).")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="text to summarize")
    p.add_argument("--file", dest="files", action="append", default=[], metavar="F",
                   help="read a text from F (- for stdin); may be repeated")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="local Hugging Face checkpoint directory (BART, PEGASUS, T5, ...)")
    add_decoding_options(p)
    add_model_options(p)
    p.set_defaults(handler=run_summarize)
