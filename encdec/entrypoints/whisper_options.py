"""Transcription options as users spell them (openai-whisper's and faster-whisper's names), for
`encdec transcribe` and the server's audio endpoints alike, turned into `LLM.transcribe` options.

Temperature fallback as openai-whisper's CLI spells it: `temperature` t with
`temperature_increment_on_fallback` i tries t, t + i, ... up to 1.0; an increment of None or 0
tries t alone (no fallback). faster-whisper's `vad_threshold`, `vad_min_silence_duration_ms`, ...
are the fields of `VadOptions` with a `vad_` prefix. Every other option has the name of its
`TranscribeOptions` field. Errors are ValueErrors whose message starts with the user's name of
the option at fault.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Optional

from encdec.whisper.options import TranscribeOptions
from encdec.whisper.vad import VadOptions

FALLBACK_INCREMENT = 0.2
MIN_INCREMENT = 0.01  # at most 101 temperatures from 0 to 1
VAD_PREFIX = "vad_"
VAD_NAMES = {VAD_PREFIX + f.name: f.name for f in dataclasses.fields(VadOptions)}  # user's -> field
# every name `transcribe_options` takes
NAMES = (*(f.name for f in dataclasses.fields(TranscribeOptions) if f.name != "vad_parameters"),
         "temperature_increment_on_fallback", *VAD_NAMES)


def fallback_temperatures(start: float, increment: Optional[float] = FALLBACK_INCREMENT) -> tuple[float, ...]:
    """`start, start + increment, ...` while <= 1.0 (just `start` for no increment)."""
    if not 0 <= start <= 2:
        raise ValueError(f"temperature must be a number in [0, 2], got {start}")
    if increment is not None and not (increment == 0 or MIN_INCREMENT <= increment < math.inf):
        raise ValueError(f"temperature_increment_on_fallback must be 0, None or a number >= "
                         f"{MIN_INCREMENT}, got {increment}")
    if not increment:
        return (start,)
    steps = max(int((1.0 - start) / increment + 1e-6), 0)
    return tuple(round(start + increment * i, 6) for i in range(steps + 1))


def transcribe_options(values: dict[str, Any]) -> dict[str, Any]:
    """`LLM.transcribe` options from user-named `values` (any of `NAMES`), checked: a ValueError
    names the option at fault as the user spelt it."""
    unknown = set(values) - set(NAMES)
    if unknown:
        raise ValueError(f"unknown transcription options {sorted(unknown)}")
    options = {k: v for k, v in values.items()
               if k != "temperature_increment_on_fallback" and k not in VAD_NAMES}
    vad = {VAD_NAMES[k]: v for k, v in values.items() if k in VAD_NAMES}
    try:
        if "temperature" in values:
            options["temperature"] = fallback_temperatures(
                values["temperature"], values.get("temperature_increment_on_fallback", FALLBACK_INCREMENT))
        if vad:
            options["vad_parameters"] = VadOptions(**vad)
        TranscribeOptions(**options)
    except ValueError as err:
        # VadOptions says "vad threshold ..."; the user's name is vad_threshold
        raise ValueError(re.sub(r"\bvad (\w+)", VAD_PREFIX + r"\1", str(err))) from None
    return options
