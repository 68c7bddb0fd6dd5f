"""The offline API: `LLM(model=...).generate(prompts, sampling_params)`, as in vLLM."""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import numbers
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from encdec.beam_search import BeamSearchOutput, BeamSearchParams
from encdec.checks import flag, number
from encdec.engine.llm_engine import LLMEngine
from encdec.outputs import RequestOutput
from encdec.sampling.params import RequestOutputKind, SamplingParams
from encdec.worker.cpu_memory import release_free_memory

if TYPE_CHECKING:
    from encdec.whisper.options import InitialPrompt
    from encdec.whisper.transcript import Transcription


class LLM:
    """An encoder/decoder model behind the paged-cache engine.

    `model` is a local Hugging Face checkpoint directory (or a Whisper alias); the keywords
    after it are `LLMEngine.from_model`'s, with its defaults. Cache size comes
    from `num_gpu_blocks` or the `kv_cache_space` budget (GiB); `swap_space` (GiB) sizes the
    swap pool used when requests are preempted by swapping. `tune_malloc=True` (CPU) lets
    the engine keep freed activation memory in the C heap for reuse, a process-wide setting
    (`encdec.worker.cpu_memory`; ENCDEC_KEEP_FREED_MEMORY=0 vetoes it): up to 5% faster, 150-400 MB
    more peak memory (benchmarks/RESULTS.md), hence off by default; without it, each `generate` and
    `transcribe` call gives the C heap's free pages back to the system when it ends. `quantization="int8"`
    (CPU, float32) runs the layers' linears on int8 weights, as faster-whisper's
    `compute_type="int8"` (`encdec.models.quantization`); `dtype="bfloat16"` runs weights,
    activations and the KV cache in bfloat16. `compute_type` takes faster-whisper's names for
    the two ("float32", "bfloat16", "int8", ...) instead. `max_running_requests` bounds the
    requests decoded at once (the rest wait their turn): None, an int, or "auto", which is what
    `encdec serve` uses (`encdec.config.auto_running_requests`). `max_model_len` (vLLM's) cuts
    the decoder positions a request may take to fewer than the model's
    (`ModelConfig.with_max_model_len`). vLLM's `limit_mm_per_prompt` is checked against what a
    prompt holds anyway: one audio for Whisper (`{"audio": 1}`, as vLLM's examples give it),
    none for a text model. vLLM's `enforce_eager` is taken either way: encdec has no CUDA
    graphs to turn off, it always runs eagerly.
    """

    def __init__(self, model: str, limit_mm_per_prompt: Optional[dict[str, int]] = None,
                 enforce_eager: bool = False, **engine_options: Any):
        known = [name for name in inspect.signature(LLMEngine.from_model).parameters if name != "model"]
        if unknown := sorted(set(engine_options) - set(known)):
            raise TypeError(f"LLM() got unknown options {', '.join(unknown)}; it takes model, "
                            f"limit_mm_per_prompt, enforce_eager and {', '.join(known)}")
        flag("enforce_eager", enforce_eager)
        audios = audio_limit(limit_mm_per_prompt)
        self.llm_engine = LLMEngine.from_model(model, **engine_options)
        speech = self.llm_engine.input_preprocessor.audio_processor is not None
        if audios is not None and audios != int(speech):
            raise ValueError(f"limit_mm_per_prompt={limit_mm_per_prompt!r}: " + (
                "a Whisper prompt holds one audio, so {'audio': 1}" if speech else "this model takes no audio"))
        self._request_counter = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def generate(self, prompts: Union[Any, Sequence[Any]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True, lora_request: Optional[list[None]] = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        Sampling params left unset (or none given) take the checkpoint's generation config, as
        Hugging Face's `generate()` does; see `encdec.generation_config`. `lora_request` is
        vLLM's, which its examples pass as None (or a None per prompt): encdec runs no LoRA adapters.
        """
        if not (lora_request is None or (isinstance(lora_request, list) and all(r is None for r in lora_request))):
            raise ValueError(f"lora_request: encdec runs no LoRA adapters, got {lora_request!r}")
        if prompts is None or isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Iterable):
            raise ValueError(f"prompts must be a prompt or a list of prompts, got {type(prompts).__name__}")
        if (isinstance(prompts, (str, dict)) or getattr(prompts, "ndim", None) == 1
                or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], numbers.Integral))):
            prompts = [prompts]  # one prompt: text, a dict, token ids or a 1-D array of them
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if isinstance(sampling_params, (str, bytes, dict)) or not isinstance(sampling_params, Sequence):
            raise ValueError(f"sampling_params must be a SamplingParams or a list of them, "
                             f"got {type(sampling_params).__name__}")
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
        for i, params in enumerate(sampling_params):
            if not isinstance(params, SamplingParams):
                raise ValueError(f"sampling_params[{i}] must be a SamplingParams, got {type(params).__name__}")
        final = [dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY) for p in sampling_params]
        request_ids = self._add_requests(prompts, final)
        return self._run_engine(request_ids, use_tqdm)

    def _add_requests(self, prompts: list[Any], params: list[SamplingParams]) -> list[str]:
        """Queue every prompt, or none: one that fails takes the others out again."""
        engine = self.llm_engine
        added: list[str] = []
        try:
            for prompt, p in zip(prompts, params):
                request_id = str(next(self._request_counter))
                engine.add_request(request_id, prompt, p)
                added.append(request_id)
        except BaseException as err:
            for request_id in added:
                engine.abort_request(request_id)
            if isinstance(err, ValueError):
                raise ValueError(f"prompt {len(added)}: {err}") from err
            raise
        return added

    def beam_search(self, prompts: Union[Any, Sequence[Any]], params: BeamSearchParams,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's beam-search API: each prompt's `params.beam_width` hypotheses, best first
        (`encdec.beam_search`; the search is Hugging Face's)."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        return [BeamSearchOutput.of(out) for out in self.generate(prompts, params.sampling_params(), use_tqdm)]

    def transcribe(self, inputs: Any, language: Optional[str] = None, task: str = "transcribe",
                   timestamps: bool = True, initial_prompt: InitialPrompt = None,
                   on_progress: Optional[Callable[[float], None]] = None, verbose: Optional[bool] = None,
                   fp16: Optional[bool] = None, **options: Any) -> list[Transcription]:
        """Whisper: transcribe (or translate) audio files (paths or binary file objects), 16 kHz
        waveforms (arrays or tensors) or `(waveform, sample_rate)` pairs of any length; one
        `Transcription` per input. `initial_prompt`: text, or token ids.
        `on_progress(seconds)` gets the seconds of audio finished so far as windows finish.
        `verbose`: True prints each segment once it is final, False shows a progress bar, None
        (default) is silent; `fp16` warns if the LLM's `dtype` is not what it asks for
        (`encdec.entrypoints.whisper_console`). `options`: openai-whisper's decoding options
        (`temperature`, `best_of`, `compression_ratio_threshold`, `logprob_threshold`,
        `no_speech_threshold`, `condition_on_previous_text`, `windows_at_once`; see
        `encdec.whisper.options.TranscribeOptions`). See `encdec.whisper.transcribe`.
        """
        from encdec.entrypoints.whisper_console import check_fp16, reporter
        from encdec.whisper.transcribe import transcribe

        check_fp16(fp16, self.llm_engine.model_config.dtype)
        try:
            return transcribe(self, inputs, language=language, task=task, timestamps=timestamps,
                              initial_prompt=initial_prompt, on_progress=on_progress,
                              report=reporter(verbose), **options)
        finally:
            release_free_memory()

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        """Step until every request is done; aborts them all if a step fails."""
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(request_ids), desc="Processed prompts", dynamic_ncols=True)
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
                for request_id, error in engine.take_failures().items():
                    if type(error) in (ValueError, RuntimeError):  # the engine's own: name the prompt
                        raise type(error)(f"prompt {request_ids.index(request_id)}: {error}") from error
                    raise error
        except BaseException:
            for request_id in request_ids:
                if request_id not in finished:
                    engine.abort_request(request_id)
            raise
        finally:
            if bar is not None:
                bar.close()
            release_free_memory()  # the steps' activations, unless `tune_malloc` keeps them on purpose
        return [finished[r] for r in request_ids]


def audio_limit(limit_mm_per_prompt: Optional[dict[str, int]]) -> Optional[int]:
    """The audios per prompt vLLM's `limit_mm_per_prompt` allows (None: none given, or {})."""
    if limit_mm_per_prompt is None or limit_mm_per_prompt == {}:
        return None
    if not isinstance(limit_mm_per_prompt, dict) or set(limit_mm_per_prompt) != {"audio"}:
        raise ValueError(f"limit_mm_per_prompt must be a dict such as {{'audio': 1}} (encdec's models "
                         f"take audio only), got {limit_mm_per_prompt!r}")
    return number("limit_mm_per_prompt['audio']", limit_mm_per_prompt["audio"], 0, integer=True)
