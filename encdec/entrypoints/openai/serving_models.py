"""The served models: one `AsyncLLMEngine` each, looked up by the name a request gives."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from encdec.engine.async_engine import AsyncLLMEngine
from encdec.entrypoints.openai.errors import OpenAIError, bad_request
from encdec.entrypoints.openai.protocol import ModelCard, ModelList, unix_time

logger = logging.getLogger("encdec.server")
# `encdec serve`'s flags that go to each model's engine: `LLM`'s options, by their names.
ENGINE_OPTIONS = ("dtype", "device", "block_size", "num_gpu_blocks", "kv_cache_space", "swap_space",
                  "max_num_seqs", "max_num_batched_tokens", "max_running_requests", "preemption_mode",
                  "seed", "attention_backend", "tune_malloc", "quantization", "max_model_len")
# Cache budgets and lengths: given once for every model, or once per --model in their order.
PER_MODEL_OPTIONS = ("num_gpu_blocks", "kv_cache_space", "swap_space", "max_model_len")
ServedNames = Sequence[Union[str, Sequence[str]]]  # each model's: a name, or several


def engine_options(args: Any) -> dict[str, Any]:
    """The `ENGINE_OPTIONS` of parsed `encdec serve` arguments (for `per_model_options`)."""
    return {name: getattr(args, name) for name in ENGINE_OPTIONS}


class ModelLoadError(RuntimeError):
    """A model named on the command line could not be loaded."""


@dataclass
class ServedModel:
    name: str  # its first name: the metrics' label
    path: str
    engine: AsyncLLMEngine
    created: int = field(default_factory=unix_time)
    aliases: tuple[str, ...] = ()  # the other names requests may give (vLLM's served names after the first)

    @property
    def is_whisper(self) -> bool:
        return getattr(self.engine.model_config.hf_config, "model_type", None) == "whisper"

    def card(self, name: str) -> ModelCard:
        """Its card under `name`, one of its names."""
        return ModelCard(id=name, created=self.created, root=self.path,
                         max_model_len=self.engine.model_config.max_decoder_len)


class ServedModels:
    def __init__(self, models: Sequence[ServedModel]):
        self.models = list(models)
        self.by_name = {name: m for m in models for name in (m.name, *m.aliases)}

    def __iter__(self):
        return iter(self.models)

    def get(self, name: str, whisper: bool) -> ServedModel:
        """The model `name` for an endpoint that needs a Whisper (or a text) model."""
        served = self.by_name.get(name)
        if served is None:
            raise OpenAIError(404, f"The model `{name}` does not exist; this server serves "
                              f"{sorted(self.by_name)}", "model", "model_not_found")
        if served.is_whisper != whisper:
            needed = "a Whisper model" if whisper else "a text model (BART, T5, PEGASUS, Marian, mBART)"
            raise bad_request(f"model {name!r} cannot serve this endpoint: it needs {needed}", "model")
        if served.engine.dead_error is not None:
            raise OpenAIError(503, f"model {name!r} stopped after an error: "
                              f"{served.engine.dead_error}", "model", "engine_dead")
        return served

    def card(self, name: str) -> ModelCard:
        if name not in self.by_name:
            raise OpenAIError(404, f"The model `{name}` does not exist", "model", "model_not_found")
        return self.by_name[name].card(name)

    def list(self) -> ModelList:
        """A card for each name, as vLLM lists a model served under several."""
        return ModelList(data=[m.card(name) for name, m in self.by_name.items()])


def load_models(models: Sequence[str], names: ServedNames, max_waiting_requests: Any,
                engine_options: dict[str, Any]) -> list[ServedModel]:
    """One engine per model, each with its own cache; a model that fails stops start-up.
    `engine_options` as for `per_model_options`."""
    served = []
    for path, (name, *aliases), options in zip(models, served_names(models, names),
                                               per_model_options(engine_options, len(models))):
        logger.info("loading model %r as %s", path, " or ".join(map(repr, (name, *aliases))))
        try:
            engine = AsyncLLMEngine.from_model(path, max_waiting_requests, **options)
        except Exception as err:
            raise ModelLoadError(f"cannot load model {path!r}: {type(err).__name__}: {err}") from err
        served.append(ServedModel(name, path, engine, aliases=tuple(aliases)))
    return served


def served_names(models: Sequence[str], names: ServedNames) -> list[list[str]]:
    """The names each model is served as: those of its --served-model-name (a name, or several
    as vLLM's), else its --model value."""
    if names and len(names) != len(models):
        times = "once" if len(names) == 1 else f"{len(names)} times"
        raise ModelLoadError(f"--served-model-name was given {times} for "
                             f"{len(models)} --model(s): give the names of each model, or none")
    named = [[group] if isinstance(group, str) else list(group) for group in names] or [[m] for m in models]
    if not all(named):
        raise ModelLoadError("--served-model-name was given without a name")
    every = [name for group in named for name in group]
    twice = [name for name in every if every.count(name) > 1]
    if twice:
        raise ModelLoadError(f"{twice[0]!r} is given as the name of two models, or twice: give each "
                             f"--model names of its own (--served-model-name)")
    return named


def per_model_options(engine_options: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Each of `count` models' engine options. A per-model option (`PER_MODEL_OPTIONS`) holds the
    values its flag was given: one for every model, or one per model; None leaves the engine's
    default. Every other option is every model's."""
    per_model: list[dict[str, Any]] = [{} for _ in range(count)]
    for option, value in engine_options.items():
        if option not in PER_MODEL_OPTIONS:
            values = [value] * count
        elif value is None:
            continue
        elif len(value) == 1:
            values = list(value) * count
        elif len(value) == count:
            values = list(value)
        else:
            raise ModelLoadError(f"--{option.replace('_', '-')} was given {len(value)} times for "
                                 f"{count} --model(s): give one value for every model, or one per model")
        for options, one in zip(per_model, values):
            options[option] = one
    return per_model
