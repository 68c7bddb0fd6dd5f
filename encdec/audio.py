"""Audio loading and the Whisper log-mel front end.

Two ways to turn a 30 s window into the 3000 feature frames the encoder expects:

* ``style="hf"`` (Hugging Face ``WhisperFeatureExtractor``): pad or trim the waveform to
  30 s, then take the log-mel of the padded window.
* ``style="whisper"`` (openai-whisper / faster-whisper, the default and the engine's): take
  the log-mel of the clip itself, keep its ``len(audio) // 160`` content frames and zero-pad
  the *features* to 3000 frames.

They differ in the dynamic-range clamp and in the padded frames, which is enough to
change transcripts of short clips, so callers pick one on purpose. Long audio is cut into
windows after its log-mel is taken, as both references cut it (``input_features`` then
``window_features``): a window that starts past the input's start sees the samples before it,
and every window shares the input's clamp.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import logging
import numbers
import os
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, Sequence, Union

import numpy as np
import torch

logger = logging.getLogger(__name__)

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000

STYLES = ("hf", "whisper")
# Float samples past this overflow float32 in a window's power spectrum (up to (200 x peak)^2).
MAX_AMPLITUDE = 1e16
# Sample rates taken: 1 kHz (below any speech codec's 8 kHz) to 1 MHz (past 768 kHz studio audio).
MIN_SAMPLE_RATE = 1_000
MAX_SAMPLE_RATE = 1_000_000
MAX_STREAM_BYTES = 2 << 30  # what is read of a pipe or a device (2 GiB: two hours of 48 kHz stereo)
# FFmpeg may open nothing a file names (a playlist's entries): only the file itself is read
NO_PROTOCOLS = {"protocol_whitelist": "none"}
MEL_BLOCK_FRAMES = 3000  # log-mel frames of a long input computed at a time

AudioSource = Union[str, os.PathLike, BinaryIO, tuple, np.ndarray, torch.Tensor]
AUDIO_SOURCES = "a path, a binary file object, a 16 kHz waveform or a (waveform, sample_rate) pair"
ArrayLike = Union[np.ndarray, torch.Tensor, Sequence[float]]


class AudioFileNotFoundError(FileNotFoundError, ValueError):
    """The audio file does not exist (catchable as ``ValueError`` too)."""


# --------------------------------------------------------------------------- loading


def load_audio(source: AudioSource, sr: int = SAMPLE_RATE, max_samples: Optional[int] = None,
               allow_empty: bool = False) -> np.ndarray:
    """Return ``source`` as a mono float32 waveform at ``sr`` Hz.

    ``source`` is a path to an audio or video file, such a file opened in binary mode (read
    whole, from its start), a ``(waveform, sample_rate)`` pair, or a 1-D waveform alone (16
    kHz). A file is decoded as openai-whisper and faster-whisper decode it: by FFmpeg (bundled
    with PyAV), its first audio stream mixed down to mono and resampled to ``sr`` in 16-bit
    samples by FFmpeg's resampler (so clipped to [-1, 1)), packets FFmpeg cannot decode skipped.
    A waveform's channels are averaged (a 2-D waveform's smaller dimension is taken as the
    channel axis); integer PCM is scaled to [-1, 1) (unsigned PCM, as 8-bit WAV, is centred on
    its midpoint: (x - 128) / 128); NaN or infinite samples are refused; another rate is
    resampled by FFmpeg's resampler too. A sample rate is an integer in [MIN_SAMPLE_RATE,
    MAX_SAMPLE_RATE]. A file with more than ``max_samples`` samples per channel, at its own
    rate, is refused while it is decoded (bounding the memory an upload can take). No samples
    at all is an error unless ``allow_empty``.
    """
    if sr <= 0:
        raise ValueError(f"target sample rate must be positive, got {sr}")
    if isinstance(source, (np.ndarray, torch.Tensor)):  # a waveform alone: 16 kHz, as in openai-whisper
        if source.ndim != 1:
            raise ValueError(f"a waveform alone must be 1-D (16 kHz mono), got shape {tuple(source.shape)}; "
                             f"pass (waveform, sample_rate) for one with channels")
        source = (source, SAMPLE_RATE)
    if isinstance(source, (tuple, list)):
        if len(source) != 2:
            raise ValueError(f"expected {AUDIO_SOURCES}")
        waveform, rate = source
        name = "waveform"
        audio = _downmix(_as_float_array(waveform, name), name)
        rate = _sample_rate(rate, name)
    elif isinstance(source, (str, os.PathLike)):
        name = os.fspath(source)
        audio = _read_file(Path(name), sr, max_samples)
        rate = sr
    elif hasattr(source, "read"):
        name = str(getattr(source, "name", "") or "file object")
        if getattr(source, "seekable", lambda: False)():
            source.seek(0)
        data = source.read()
        if not isinstance(data, (bytes, bytearray)):
            raise ValueError(f"{name}: a file object must be opened in binary mode ('rb')")
        audio, rate = _decode(io.BytesIO(data), name, sr, max_samples), sr
    else:
        hint = ("; samples in a list are taken as inputs, one each: pass np.asarray(samples)"
                if isinstance(source, numbers.Real) else "")
        raise ValueError(f"expected {AUDIO_SOURCES}, got {type(source).__name__}{hint}")
    if audio.size == 0 and not allow_empty:
        raise ValueError(f"{name}: contains no audio samples")
    if not np.all(np.isfinite(audio)):
        raise ValueError(f"{name}: contains NaN or infinite samples")
    peak = float(np.abs(audio).max(initial=0.0))
    if peak > MAX_AMPLITUDE:
        raise ValueError(f"{name}: samples reach {peak:.3g}, past the {MAX_AMPLITUDE:g} the features "
                         f"can hold (float audio is expected in [-1, 1])")
    if rate != sr and audio.size:
        audio = _resample(audio, rate, sr)
    return np.ascontiguousarray(audio, dtype=np.float32)


def _sample_rate(rate: Any, name: str) -> int:
    """`rate` as an int in [MIN_SAMPLE_RATE, MAX_SAMPLE_RATE]: an integer (numpy's too) or a
    float with an integral value; bools, strings and fractional rates are refused."""
    integral = isinstance(rate, numbers.Integral) or (isinstance(rate, numbers.Real) and float(rate).is_integer())
    if isinstance(rate, (bool, np.bool_)) or not (integral and MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE):
        raise ValueError(f"{name}: sample rate must be an integer in [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}] Hz, "
                         f"got {rate!r}")
    return int(rate)


def _read_file(path: Path, sr: int, max_samples: Optional[int]) -> np.ndarray:
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not an audio file")
    if not path.exists():
        raise AudioFileNotFoundError(f"audio file not found: {path}")
    if path.is_file():
        return _decode(path, str(path), sr, max_samples)
    # a pipe or a device (/dev/stdin, <(...)) is read whole first, as far as a bound: the decoders seek
    data = io.BytesIO()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            if data.write(chunk) and data.tell() > MAX_STREAM_BYTES:
                raise ValueError(f"{path}: more than {MAX_STREAM_BYTES >> 20} MiB read from it, not a "
                                 f"file: save the audio to a file to transcribe it")
    data.seek(0)
    return _decode(data, str(path), sr, max_samples)


def _decode(source: Union[Path, io.BytesIO], name: str, sr: int, max_samples: Optional[int]) -> np.ndarray:
    """A file's (or its bytes') first audio stream, decoded, mixed down to mono and resampled
    to `sr` by FFmpeg, in 16-bit samples as the references take them; as float32."""
    if (source.stat().st_size if isinstance(source, Path) else source.getbuffer().nbytes) == 0:
        raise ValueError(f"{name}: audio file is empty")
    import av

    pieces = []
    try:
        # Read through Python, not FFmpeg's file protocol ("a:b.wav" is no URL), and with no
        # protocol for what a file names: a playlist (concat, HLS) must not read other files
        with contextlib.ExitStack() as stack:
            file = stack.enter_context(open(source, "rb")) if isinstance(source, Path) else source
            container = stack.enter_context(av.open(file, metadata_errors="ignore", options=NO_PROTOCOLS))
            if not container.streams.audio:
                raise UnreadableAudio(f"{name}: not a readable audio file (no audio stream)")
            stream = container.streams.audio[0]
            if stream.codec_context is None or not stream.codec_context.sample_rate:
                raise UnreadableAudio(f"{name}: not a readable audio file (FFmpeg has no decoder for its audio)")
            try:
                _sample_rate(stream.codec_context.sample_rate, name)
            except ValueError as error:
                raise UnreadableAudio(str(error)) from None
            mono = av.AudioResampler(format="s16", layout="mono", rate=sr)
            resampling, decoded = False, 0
            for frame in itertools.chain(_decodable_frames(container.decode(stream)), [None]):  # None: flush
                if frame is not None:
                    decoded += frame.samples
                    if max_samples is not None and decoded > max_samples:
                        raise TooManySamples(f"{name}: more than {max_samples} samples per channel",
                                             decoded / frame.sample_rate)
                    # the resampler would copy such a frame as it is, at twice the cost of decoding it
                    resampling = resampling or not _is_mono_s16(frame, sr)
                if resampling:
                    pieces.extend(out.to_ndarray().reshape(-1) for out in mono.resample(frame))
                elif frame is not None:
                    pieces.append(frame.to_ndarray().reshape(-1))
    except (TooManySamples, UnreadableAudio):
        raise
    except Exception as error:  # FFmpeg's own words, without its error number and the file's name
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        if reason[1:2].islower():  # "Invalid data ...", not "MP3 ..."
            reason = reason[:1].lower() + reason[1:]
        raise ValueError(f"{name}: not a readable audio file ({reason})") from error
    if not pieces:
        return np.zeros(0, np.float32)
    return np.concatenate(pieces).astype(np.float32) / np.float32(32768)


def _is_mono_s16(frame: Any, sr: int) -> bool:
    """Whether an FFmpeg audio frame is already what `_decode` resamples to."""
    return frame.format.name == "s16" and frame.layout.nb_channels == 1 and frame.sample_rate == sr


def _decodable_frames(frames: Iterator[Any]) -> Iterator[Any]:
    """`frames`, past those whose packets FFmpeg finds invalid (a corrupt or cut-off stretch):
    faster-whisper decodes what is left, and so does openai-whisper's ffmpeg."""
    import av

    while True:
        try:
            frame = next(frames)
        except StopIteration:
            return
        except av.error.InvalidDataError:
            continue
        yield frame


class UnreadableAudio(ValueError):
    """A file whose audio is refused for what it is (no audio stream, no decoder, a sample rate
    out of range), its message whole."""


class TooManySamples(ValueError):
    """An audio file with more samples than its reader was allowed; `seconds`: the audio read
    by then, at the file's own sample rate."""

    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = seconds


def _as_float_array(waveform: ArrayLike, name: str) -> np.ndarray:
    if isinstance(waveform, torch.Tensor):  # bfloat16 has no numpy dtype
        waveform = waveform.detach().cpu()
        waveform = (waveform.float() if waveform.dtype == torch.bfloat16 else waveform).numpy()
    try:
        array = np.asarray(waveform)
    except ValueError:  # a ragged nest of sequences
        raise ValueError(f"{name}: expected a sequence of samples, got a nest of sequences of "
                         f"different lengths") from None
    if np.issubdtype(array.dtype, np.integer):  # PCM: signed around 0, unsigned around its midpoint
        info = np.iinfo(array.dtype)
        half = (float(info.max) - float(info.min) + 1.0) / 2
        return (array.astype(np.float32) - np.float32(info.min + half)) / np.float32(half)
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{name}: expected numeric samples, got dtype {array.dtype}")
    return array.astype(np.float32, copy=False)


def _downmix(audio: np.ndarray, name: str) -> np.ndarray:
    if audio.ndim == 1:
        return audio
    if audio.ndim != 2:
        raise ValueError(f"{name}: expected a 1-D or 2-D waveform, got shape {audio.shape}")
    if audio.size == 0:  # no samples on any channel: as empty as a 1-D waveform
        return audio.reshape(0)
    channel_axis = 0 if audio.shape[0] <= audio.shape[1] else 1
    return audio.mean(axis=channel_axis)


def _resample(audio: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """`audio` (mono float32) at `target_sr`, by FFmpeg's resampler (as a file's is resampled)."""
    import av

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, dtype=np.float32)[None, :],
                                       format="flt", layout="mono")
    frame.sample_rate = orig_sr
    resampler = av.AudioResampler(format="flt", layout="mono", rate=target_sr)
    pieces = [out.to_ndarray().reshape(-1) for piece in (frame, None) for out in resampler.resample(piece)]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


# --------------------------------------------------------------------------- log-mel


# Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above.
_MEL_LINEAR_STEP = 200.0 / 3  # Hz per mel below 1 kHz
_MEL_LOG_START_HZ = 1000.0
_MEL_LOG_START = _MEL_LOG_START_HZ / _MEL_LINEAR_STEP
_MEL_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz < _MEL_LOG_START_HZ:
        return hz / _MEL_LINEAR_STEP
    return _MEL_LOG_START + np.log(hz / _MEL_LOG_START_HZ) / _MEL_LOG_STEP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    log_part = _MEL_LOG_START_HZ * np.exp(_MEL_LOG_STEP * (mels - _MEL_LOG_START))
    return np.where(mels >= _MEL_LOG_START, log_part, mels * _MEL_LINEAR_STEP)


@functools.lru_cache(maxsize=None)
def mel_filters(n_mels: int) -> torch.Tensor:
    """Slaney-normalised mel filter bank ``[n_mels, N_FFT // 2 + 1]`` (float32, cached; do not
    modify), the same numbers as ``librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels)``:
    triangles between adjacent mel band edges, each scaled to unit area."""
    fft_hz = np.fft.rfftfreq(N_FFT, 1.0 / SAMPLE_RATE)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    bank = np.zeros((n_mels, len(fft_hz)), dtype=np.float32)
    for i in range(n_mels):
        rising = -ramps[i] / widths[i]
        falling = ramps[i + 2] / widths[i + 1]
        bank[i] = np.maximum(0, np.minimum(rising, falling))
    bank *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return torch.from_numpy(bank)


@functools.lru_cache(maxsize=None)
def _hann_window() -> torch.Tensor:
    return torch.hann_window(N_FFT, periodic=True, dtype=torch.float32)


def _as_batch(audio: ArrayLike) -> tuple[torch.Tensor, bool]:
    tensor = audio if isinstance(audio, torch.Tensor) else torch.from_numpy(np.asarray(audio))
    tensor = tensor.to(torch.float32)
    if tensor.dim() not in (1, 2):
        raise ValueError(f"expected audio of shape [N] or [B, N], got {tuple(tensor.shape)}")
    return (tensor.unsqueeze(0), True) if tensor.dim() == 1 else (tensor, False)


def _log10_mel(batch: torch.Tensor, n_mels: int) -> torch.Tensor:
    """``log10(max(mel power, 1e-10))`` of ``[B, N]`` audio, ``N // HOP_LENGTH`` frames."""
    if batch.shape[-1] <= N_FFT // 2:  # reflect padding needs more samples than the pad
        batch = torch.nn.functional.pad(batch, (0, N_FFT // 2 + 1 - batch.shape[-1]))
    window = _hann_window().to(batch.device)
    stft = torch.stft(
        batch, N_FFT, HOP_LENGTH, window=window, center=True, pad_mode="reflect", return_complex=True
    )
    return _log10_power_mel(stft[..., :-1].abs() ** 2, n_mels)


def _log10_power_mel(power: torch.Tensor, n_mels: int) -> torch.Tensor:
    """``log10(max(mel power, 1e-10))`` of a power spectrum ``[..., N_FFT // 2 + 1, frames]``."""
    mel = mel_filters(n_mels).to(power.device) @ power
    return torch.clamp(mel, min=1e-10).log10()


def _normalize(log_spec: torch.Tensor) -> torch.Tensor:
    """Clamp to (per-item max - 8) and rescale, in place (an hour's log-mel is 110 MB a copy)."""
    peak = log_spec.amax(dim=(-2, -1), keepdim=True)
    return log_spec.clamp_(min=peak - 8.0).add_(4.0).div_(4.0)


def log_mel_spectrogram(audio: ArrayLike, n_mels: int = 80, padding: int = 0) -> torch.Tensor:
    """Whisper's normalised log-mel spectrogram.

    ``audio`` is ``[N]`` or ``[B, N]`` at 16 kHz; ``padding`` zeros are appended first.
    Returns ``[n_mels, frames]`` or ``[B, n_mels, frames]`` with ``frames = (N + padding) // 160``.
    """
    batch, single = _as_batch(audio)
    if padding > 0:
        batch = torch.nn.functional.pad(batch, (0, padding))
    features = _normalize(_log10_mel(batch, n_mels))
    return features[0] if single else features


def pad_or_trim(array: ArrayLike, length: int, axis: int = -1) -> torch.Tensor:
    """Zero-pad or cut ``array`` to ``length`` along ``axis``."""
    tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.asarray(array))
    size = tensor.shape[axis]
    if size > length:
        return tensor.narrow(axis, 0, length)
    if size < length:
        shape = list(tensor.shape)
        shape[axis] = length - size
        return torch.cat([tensor, tensor.new_zeros(shape)], dim=axis)
    return tensor


def windows_features(
    windows: Sequence[ArrayLike], n_mels: int = 80, style: str = "whisper"
) -> torch.Tensor:
    """Features ``[B, n_mels, 3000]`` for a batch of 16 kHz windows (see the module doc)."""
    if style not in STYLES:
        raise ValueError(f"unknown front-end style {style!r}; expected one of {STYLES}")
    if len(windows) == 0:
        raise ValueError("expected at least one audio window")
    clips = [_as_batch(w)[0][0] for w in windows]
    if any(len(c) == 0 for c in clips):
        raise ValueError("audio windows must not be empty")
    if style == "hf":
        batch = torch.stack([pad_or_trim(c, N_SAMPLES) for c in clips])
        return _normalize(_log10_mel(batch, n_mels))
    return _whisper_style(clips, n_mels)


def _whisper_style(clips: list[torch.Tensor], n_mels: int) -> torch.Tensor:
    return torch.stack([window_features(input_features(c, n_mels), 0, N_FRAMES) for c in clips])


def input_features(audio: ArrayLike, n_mels: int = 80) -> torch.Tensor:
    """The normalised log-mel ``[n_mels, len(audio) // 160]`` of a whole 16 kHz input, as
    faster-whisper (and, but for the last frame or two, openai-whisper) computes it before
    cutting windows from it: 160 zeros appended, one clamp (max - 8) over every frame, and each
    frame sees its neighbours' samples, also across the windows' edges. The spectrum is taken
    ``MEL_BLOCK_FRAMES`` frames at a time (the same numbers as one STFT of it all, without an
    hour of audio's complex spectrum in memory at once)."""
    clip = _as_batch(audio)[0][0]
    signal = torch.nn.functional.pad(clip, (0, max(HOP_LENGTH, N_FFT // 2 + 1 - len(clip))))
    frames = len(signal) // HOP_LENGTH  # a centred STFT's, less its last (as `_log10_mel`)
    padded = torch.nn.functional.pad(signal[None, None], (N_FFT // 2, N_FFT // 2), mode="reflect")[0, 0]
    del signal  # an hour of audio is 230 MB a copy: the peak holds no more copies than it needs
    log_spec = torch.empty(n_mels, frames)
    for first in range(0, frames, MEL_BLOCK_FRAMES):
        last = min(frames, first + MEL_BLOCK_FRAMES)
        stft = torch.stft(padded[first * HOP_LENGTH:(last - 1) * HOP_LENGTH + N_FFT], N_FFT, HOP_LENGTH,
                          window=_hann_window(), center=False, return_complex=True)
        log_spec[:, first:last] = _log10_power_mel(stft.abs() ** 2, n_mels)
    del padded
    return _normalize(log_spec)[:, :len(clip) // HOP_LENGTH]


def window_features(features: torch.Tensor, start: int, num_frames: int) -> torch.Tensor:
    """Frames ``[start, start + num_frames)`` of an input's ``features`` (at most 3000, and
    what the input has) zero-padded to the 3000 frames of a window, as both references pad."""
    return pad_or_trim(features[:, start:start + min(num_frames, N_FRAMES)], N_FRAMES).contiguous()


def whisper_features(audio: ArrayLike, n_mels: int = 80, style: str = "whisper") -> torch.Tensor:
    """Features ``[n_mels, 3000]`` for one 16 kHz window (first 30 s of ``audio``)."""
    return windows_features([audio], n_mels=n_mels, style=style)[0]
