"""Whisper tiny.en transcription speed and WER: encdec vs faster-whisper vs Hugging Face.

A deterministic espeak-ng corpus (24 clips of 3-15 s with reference texts, and the three long
clips of `tests.speech_corpus.long_clips`, about 6 minutes), the bundled Whisper tiny.en weights
for every engine. In one run, interleaved: encdec (all clips in one continuous batch; on the
long clips also with `windows_at_once=True`, every window at once, not conditioned);
faster-whisper `WhisperModel` float32 and int8, sequential, beam_size=1; faster-whisper
`BatchedInferencePipeline` (batch 8, float32); Hugging Face transformers Whisper built from
the same weights (greedy, batches of 8; short clips only). On the short clips also openai-whisper's
CLI defaults (beam 5, best_of 5, temperature fallback): encdec against faster-whisper
`WhisperModel` float32 with its own defaults (the same), each row's speedup against encdec in
the same configuration.

    python -m benchmarks.bench_whisper [--rounds 3] [--long-rounds 2] [--threads 2]
    python -m benchmarks.bench_whisper --engines encdec-beam5,fw-beam5 --rounds 1  # one row pair
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.common import (COUNT, ENCDEC_COMPUTE, POSITIVE, RESULTS, interleaved, machine,
                               markdown_table, median, names, run_isolated, script_parser,
                               write_json)
from tests.speech_corpus import CORPUS, long_clips, speak, wer

SAMPLE_RATE = 16000
OPENAI_DEFAULTS = "openai-whisper defaults (beam 5, best_of 5, fallback)"
# Engines decoding otherwise than greedily (beam 1), and the encdec engine in the same
# configuration that their speedup is measured against (default: "encdec").
DECODING = {"encdec-beam5": OPENAI_DEFAULTS, "fw-beam5": OPENAI_DEFAULTS}
BASELINE = {"encdec-beam5": "encdec-beam5", "fw-beam5": "encdec-beam5"}
# encdec's lower-precision runs and the faster-whisper run each is measured against
LOW_PRECISION_PAIRS = (("encdec-int8", "fw-int8"), ("encdec-bf16", "fw-fp32"))
SHORT_ONLY = ("hf", "encdec-beam5", "fw-beam5")


def build_clips(folder: Path) -> list[tuple[Path, str]]:
    """24 clips joining 1-4 corpus sentences (3-15 s), as (wav, text)."""
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    sentences = [(voice, speed, text, speak(folder, f"s{i}", voice, speed, text))
                 for i, (voice, speed, text) in enumerate(CORPUS)]
    pause = np.zeros(SAMPLE_RATE // 3, dtype=np.float32)
    clips = []
    for i in range(24):
        count = 1 + (i * 7) % 4
        picked = [sentences[(i + j * 5) % len(sentences)] for j in range(count)]
        audio = np.concatenate([np.concatenate([s[3], pause]) for s in picked])
        path = folder / f"clip{i:02d}.wav"
        sf.write(path, audio, SAMPLE_RATE)
        clips.append((path, " ".join(s[2] for s in picked)))
    return clips


def build_long_clips(folder: Path) -> list[tuple[Path, str]]:
    """The long clips of `tests.speech_corpus.long_clips`, as (wav, text)."""
    import soundfile as sf

    long = []
    for clip in long_clips(folder):
        path = folder / f"long-{clip.name}.wav"
        sf.write(path, clip.audio, SAMPLE_RATE)
        long.append((path, clip.text))
    return long


def _tiny_en_dir() -> str:
    from encdec.weights.whisper_assets import resolve_whisper_model

    return str(resolve_whisper_model("tiny.en").bin_parts[0].parent)


def run_encdec(paths: list[str], at_once: bool, threads: int,
               beam_size: int | None = None, compute: str = "float32") -> dict:
    from encdec import LLM

    llm = LLM(model="tiny.en", **ENCDEC_COMPUTE[compute])
    start = time.perf_counter()
    results = llm.transcribe(paths, language="en", windows_at_once=at_once,
                             beam_size=beam_size)
    return {"seconds": time.perf_counter() - start, "texts": [r.text for r in results]}


def run_encdec_compute(paths: list[str], compute: str, threads: int) -> dict:
    """encdec as `run_encdec` (conditioning on previous text), in bfloat16 or on int8 weights."""
    return run_encdec(paths, False, threads, compute=compute)


def run_encdec_beam5(paths: list[str], threads: int) -> dict:
    """encdec with openai-whisper's defaults: beam 5, best_of 5, temperature fallback."""
    return run_encdec(paths, False, threads, beam_size=5)


def run_faster_whisper_beam5(paths: list[str], threads: int) -> dict:
    """faster-whisper `WhisperModel` with its defaults: beam 5, temperature fallback."""
    return run_faster_whisper(paths, "float32", False, threads, beam_size=5)


def run_faster_whisper(paths: list[str], compute_type: str, batched: bool, threads: int,
                       beam_size: int = 1) -> dict:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(_tiny_en_dir(), device="cpu", compute_type=compute_type, cpu_threads=threads)
    pipeline = BatchedInferencePipeline(model) if batched else None
    texts = []
    start = time.perf_counter()
    for path in paths:
        if pipeline is not None:
            segments, _ = pipeline.transcribe(path, language="en", beam_size=1, batch_size=8)
        else:
            segments, _ = model.transcribe(path, language="en", beam_size=beam_size)
        texts.append(" ".join(s.text.strip() for s in segments))
    return {"seconds": time.perf_counter() - start, "texts": texts}


def run_hf(paths: list[str], threads: int) -> dict:
    import torch
    from transformers import (PreTrainedTokenizerFast, WhisperConfig, WhisperFeatureExtractor,
                              WhisperForConditionalGeneration)

    from encdec.audio import load_audio
    from encdec.weights.loader import load_ct2_checkpoint
    from encdec.weights.whisper_assets import resolve_whisper_model

    assets = resolve_whisper_model("tiny.en")
    config, state = load_ct2_checkpoint(assets)
    model = WhisperForConditionalGeneration(WhisperConfig(**config)).eval()
    model.load_state_dict(state, strict=True)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(assets.tokenizer_json))
    extractor = WhisperFeatureExtractor(feature_size=config["num_mel_bins"])
    texts = []
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(paths), 8):
            audio = [load_audio(p) for p in paths[i:i + 8]]
            feats = extractor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
            out = model.generate(feats, max_new_tokens=440, language=None, task=None)
            texts += [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]
    return {"seconds": time.perf_counter() - start, "texts": texts}


# engine name -> (its runner, the runner's options between the paths and the thread count)
ENGINES = {
    "encdec": (run_encdec, (False,)),
    "encdec-parallel": (run_encdec, (True,)),
    "encdec-bf16": (run_encdec_compute, ("bfloat16",)),
    "encdec-int8": (run_encdec_compute, ("int8",)),
    "fw-fp32": (run_faster_whisper, ("float32", False)),
    "fw-int8": (run_faster_whisper, ("int8", False)),
    "fw-batched": (run_faster_whisper, ("float32", True)),
    "hf": (run_hf, ()),
    "encdec-beam5": (run_encdec_beam5, ()),
    "fw-beam5": (run_faster_whisper_beam5, ()),
}


def main(argv=None) -> int:
    parser = script_parser("whisper", __doc__)
    parser.add_argument("--rounds", type=POSITIVE, default=3, help="runs of each engine on the short clips")
    parser.add_argument("--long-rounds", type=COUNT, default=2, help="on the long clips; 0: no long clips")
    parser.add_argument("--threads", type=POSITIVE, default=2, help="each engine's threads")
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "encdec-bench" / "speech",
                        help="where the clips are written")
    parser.add_argument("--engines", type=names(ENGINES),
                        default="encdec,encdec-parallel,fw-fp32,fw-int8,fw-batched,hf,encdec-beam5,"
                                "fw-beam5", help=f"of {', '.join(ENGINES)}")
    parser.add_argument("--json", type=Path, default=RESULTS / "whisper.json", help="results")
    args = parser.parse_args(argv)

    import soundfile as sf

    clips = build_clips(args.work_dir)
    long = build_long_clips(args.work_dir) if args.long_rounds else []
    t = args.threads
    engines = {name: (lambda p, run=ENGINES[name][0], options=ENGINES[name][1]:
                      run_isolated(run, p, *options, t)) for name in args.engines}
    results = {}
    for label, corpus, rounds, chosen in (
            ("short", clips, args.rounds, [k for k in engines if k != "encdec-parallel"]),
            ("long", long, args.long_rounds, [k for k in engines if k not in SHORT_ONLY])):
        if not rounds:
            continue
        paths, refs = [str(p) for p, _ in corpus], [text for _, text in corpus]
        audio_seconds = sum(sf.info(p).duration for p in paths)
        runs = interleaved({k: (lambda f=engines[k]: f(paths)) for k in chosen}, rounds)
        results[label] = summarize(runs, refs, audio_seconds)
        print(f"\n{label}: {len(paths)} clips, {audio_seconds:.0f} s of audio; {rounds} rounds, {t} threads\n\n"
              f"{table(results[label])}")
        speed = {name: s["audio_s_per_s"] for name, s in results[label].items()}
        for ours, theirs in LOW_PRECISION_PAIRS:
            if ours in speed and theirs in speed:
                print(f"{ours} / {theirs}: {speed[ours] / speed[theirs]:.2f}x")
    write_json(args.json, {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
                           "results": results})
    return 0


def summarize(runs: dict, refs: list[str], audio_seconds: float) -> dict:
    """Per engine: median seconds, audio seconds per second, WER, peak RSS, and the speedup of
    encdec in the same decoding configuration (`BASELINE`)."""
    summary = {}
    for name, engine_runs in runs.items():
        secs = median(engine_runs, "seconds")
        summary[name] = {"seconds": secs, "audio_s_per_s": audio_seconds / secs,
                         "wer": wer(refs, engine_runs[0]["texts"]),
                         "peak_rss_mb": median(engine_runs, "peak_rss_mb"),
                         "all_seconds": [r["seconds"] for r in engine_runs],
                         "load": [(r["load_before"], r["load_after"]) for r in engine_runs]}
    for name, s in summary.items():
        baseline = summary.get(BASELINE.get(name, "encdec"))
        s["encdec_speedup"] = baseline["audio_s_per_s"] / s["audio_s_per_s"] if baseline else None
    return summary


def table(summary: dict) -> str:
    rows = [[name, DECODING.get(name, "greedy"), s["seconds"], s["audio_s_per_s"],
             f"{100 * s['wer']:.1f}%", s["peak_rss_mb"],
             f"{s['encdec_speedup']:.2f}x" if s["encdec_speedup"] else "-"]
            for name, s in summary.items()]
    return markdown_table(["engine", "decoding", "wall s (median)", "audio s / s", "WER",
                           "peak RSS MB", "encdec speedup"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
