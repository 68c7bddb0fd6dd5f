"""Audio loading and the Whisper front end against their references.

"hf" style is checked against transformers' ``WhisperFeatureExtractor``; "whisper" style
against faster-whisper's ``FeatureExtractor`` used the way its ``transcribe`` does.
"""

import io
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from encdec import audio as A
from tests.audio_files import av_encoded

# Measured: hf <= 1.2e-7 (same torch STFT); whisper <= 5.6e-5 (numpy vs torch FFT rounding).
HF_TOL = 1e-6
WHISPER_TOL = 1e-4
SENTENCE = "The quick brown fox jumps over the lazy dog. Whisper turns speech into text."


def _espeak(path, text):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    return path


def _sox(src, dst, *effects):
    if shutil.which("sox") is None:
        pytest.skip("sox is not installed")
    subprocess.run(["sox", str(src), str(dst), *effects], check=True, capture_output=True)
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """espeak-ng speech (22050 Hz) and sox / soundfile variants of it."""
    d = tmp_path_factory.mktemp("speech")
    orig = _espeak(d / "speech.wav", SENTENCE)
    out = {
        "wav22k": orig,
        "short22k": _espeak(d / "short.wav", "Hello."),
        "wav8k": _sox(orig, d / "speech8k.wav", "rate", "8000"),
        "wav44k": _sox(orig, d / "speech44k.wav", "rate", "44100"),
        "wav16k": _sox(orig, d / "speech16k.wav", "rate", "16000"),
    }
    mono44, rate = soundfile.read(out["wav44k"], dtype="float32")
    out["stereo44k"] = d / "stereo44k.wav"
    soundfile.write(out["stereo44k"], np.stack([mono44, 0.5 * mono44], axis=1), rate, subtype="FLOAT")
    out["flac"] = _sox(orig, d / "speech.flac")
    out["ogg"] = d / "speech.ogg"
    soundfile.write(out["ogg"], soundfile.read(orig)[0], 22050, format="OGG", subtype="VORBIS")
    return out


def _noise(seconds, rate, seed=0, channels=None):
    rng = np.random.default_rng(seed)
    shape = (int(seconds * rate),) if channels is None else (channels, int(seconds * rate))
    return (0.1 * rng.standard_normal(shape)).astype(np.float32)


@pytest.fixture(scope="module")
def inputs(files):
    """16 kHz mono waveforms from ``load_audio``, one per kind of source."""
    mono44, _ = soundfile.read(files["wav44k"], dtype="float32")
    stereo = np.stack([mono44, -0.25 * mono44])
    sources = {
        "wav22k": files["wav22k"],
        "short22k": files["short22k"],
        "wav8k": files["wav8k"],
        "wav44k": files["wav44k"],
        "wav16k": files["wav16k"],
        "stereo44k_file": files["stereo44k"],
        "stereo_channels_first": (stereo, 44100),
        "stereo_channels_last": (stereo.T, 44100),
        "noise16k": (_noise(7, 16000), 16000),
        "noise44k_stereo": (_noise(3, 44100, seed=1, channels=2), 44100),
        "noise16k_35s": (_noise(35, 16000, seed=2), 16000),
    }
    return {name: A.load_audio(src) for name, src in sources.items()}


INPUT_NAMES = [
    "wav22k", "short22k", "wav8k", "wav44k", "wav16k", "stereo44k_file",
    "stereo_channels_first", "stereo_channels_last", "noise16k", "noise44k_stereo", "noise16k_35s",
]


@pytest.fixture(scope="module")
def hf_extractors():
    transformers = pytest.importorskip("transformers")
    return {n: transformers.WhisperFeatureExtractor(feature_size=n) for n in (80, 128)}


@pytest.fixture(scope="module")
def fw_extractors():
    fe = pytest.importorskip("faster_whisper.feature_extractor")
    return {n: fe.FeatureExtractor(feature_size=n) for n in (80, 128)}


def _faster_whisper_window(extractor, audio):
    """First 30 s window exactly as faster-whisper's ``transcribe`` builds it."""
    from faster_whisper.audio import pad_or_trim

    features = extractor(audio)
    content_frames = features.shape[-1] - 1
    return pad_or_trim(features[:, : min(A.N_FRAMES, content_frames)])


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("name", INPUT_NAMES)
def test_hf_style_matches_transformers(inputs, hf_extractors, name, n_mels):
    audio = inputs[name]
    ref = hf_extractors[n_mels](audio, sampling_rate=16000, return_tensors="np").input_features[0]
    ours = A.whisper_features(audio, n_mels=n_mels, style="hf")
    assert ours.shape == (n_mels, A.N_FRAMES) and ours.dtype == torch.float32
    assert np.abs(ours.numpy() - ref).max() < HF_TOL


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("name", INPUT_NAMES)
def test_whisper_style_matches_faster_whisper(inputs, fw_extractors, name, n_mels):
    audio = inputs[name]
    ref = _faster_whisper_window(fw_extractors[n_mels], audio)
    ours = A.whisper_features(audio, n_mels=n_mels, style="whisper")
    assert ours.shape == (n_mels, A.N_FRAMES)
    assert np.abs(ours.numpy() - ref).max() < WHISPER_TOL
    content = min(len(audio) // A.HOP_LENGTH, A.N_FRAMES)
    assert torch.all(ours[:, content:] == 0)


def test_input_features_are_faster_whispers_whole_input_log_mel(fw_extractors):
    """A long input's log-mel is taken once, as faster-whisper's `transcribe` takes it, and a
    window cut from it past the start differs from the window's own log-mel: its first frames
    hear the samples before it, and its quiet frames share the loud part's clamp."""
    audio = _noise(70, 16000, seed=3)
    audio[40 * 16000:] *= 1e-4  # 80 dB quieter: under the whole input's clamp floor (max - 8)
    ours = A.input_features(audio)
    ref = fw_extractors[80](audio)[:, :-1]  # its content frames (faster-whisper's `content_frames`)
    assert ours.shape == ref.shape == (80, 7000) and np.abs(ours.numpy() - ref).max() < WHISPER_TOL
    window = A.window_features(ours, 3500, 3500)  # 35 s from 35 s: its first 30 s
    assert window.shape == (80, A.N_FRAMES) and torch.equal(window, ours[:, 3500:6500])
    alone = A.whisper_features(audio[35 * 16000:65 * 16000], style="whisper")
    assert (window[:, :2] - alone[:, :2]).abs().max() > 0.1  # the first frames hear what came before
    quiet = A.window_features(ours, 4200, 3000)  # 42 s to the end: 28 s, zero-padded
    assert torch.equal(quiet[:, 2800:], torch.zeros(80, 200))
    floor = ours.max() - 2.0  # (max - 8 + 4) / 4
    assert (quiet[:, 2:2800] == floor).float().mean() > 0.99
    alone = A.whisper_features(audio[42 * 16000:], style="whisper")[:, 2:2800]  # under its own clamp
    assert (alone < floor - 0.1).float().mean() > 0.5


@pytest.mark.parametrize("style", A.STYLES)
def test_batch_equals_single_windows(inputs, hf_extractors, style):
    names = ["wav22k", "short22k", "noise16k", "noise16k_35s"]
    batch = A.windows_features([inputs[n] for n in names], n_mels=80, style=style)
    assert batch.shape == (len(names), 80, A.N_FRAMES)
    for row, name in zip(batch, names):
        assert torch.equal(row, A.whisper_features(inputs[name], 80, style=style))
    if style == "hf":
        ref = hf_extractors[80]([inputs[n] for n in names], sampling_rate=16000, return_tensors="np")
        assert np.abs(batch.numpy() - ref.input_features).max() < HF_TOL


def test_styles_differ_on_short_clips(inputs):
    hf = A.whisper_features(inputs["short22k"], style="hf")
    whisper = A.whisper_features(inputs["short22k"], style="whisper")
    content = len(inputs["short22k"]) // A.HOP_LENGTH
    assert torch.allclose(hf[:, : content - 2], whisper[:, : content - 2], atol=1e-5)
    assert torch.all(whisper[:, content:] == 0) and torch.all(hf[:, content + 2 :] < 0)


def test_log_mel_spectrogram_shapes():
    audio = _noise(1.01, 16000)
    assert A.log_mel_spectrogram(audio).shape == (80, len(audio) // 160)
    batch = np.stack([audio, audio[::-1].copy()])
    out = A.log_mel_spectrogram(batch, n_mels=128, padding=480)
    assert out.shape == (2, 128, (len(audio) + 480) // 160)
    assert torch.equal(out[0], A.log_mel_spectrogram(audio, n_mels=128, padding=480))


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_equal_librosa_and_are_cached(n_mels):
    import librosa

    bank = A.mel_filters(n_mels)
    assert bank.shape == (n_mels, 201) and A.mel_filters(n_mels) is bank
    ref = librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels, htk=False, norm="slaney")
    assert np.array_equal(bank.numpy(), ref)


# --------------------------------------------------------------------------- resampling


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_resampled_sine_keeps_frequency_and_level(rate):
    t = np.arange(int(2.0 * rate)) / rate
    sine = (0.5 * np.sin(2 * np.pi * 1000.0 * t)).astype(np.float32)
    out = A.load_audio((sine, rate))
    assert out.dtype == np.float32 and abs(len(out) - 32000) <= 1
    spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
    peak_hz = np.argmax(spectrum) * 16000 / len(out)
    assert abs(peak_hz - 1000.0) < 1.0
    rms = np.sqrt(np.mean(out[1000:-1000] ** 2))
    assert abs(rms - 0.5 / np.sqrt(2)) < 0.01


def _corr(a, b):
    n = min(len(a), len(b))
    return float(np.corrcoef(a[:n], b[:n])[0, 1])


def test_resampled_speech_agrees_across_source_rates(inputs):
    ref = inputs["wav22k"]
    for name in ("wav44k", "wav16k", "stereo44k_file", "stereo_channels_first", "stereo_channels_last"):
        assert abs(len(inputs[name]) - len(ref)) <= 2, name
        assert _corr(inputs[name], ref) > 0.99, name
    # 8 kHz loses everything above 4 kHz: compare with the band-limited reference.
    low = A.load_audio((A.load_audio((ref, 16000), sr=8000), 8000))
    assert _corr(inputs["wav8k"], low) > 0.98
    assert np.allclose(inputs["stereo44k_file"], 0.75 * inputs["wav44k"], atol=1e-4)
    assert np.allclose(inputs["stereo_channels_first"], inputs["stereo_channels_last"])


def test_other_containers(files, inputs):
    assert np.allclose(A.load_audio(files["flac"]), inputs["wav22k"], atol=1e-6)
    ogg = A.load_audio(files["ogg"])
    assert abs(len(ogg) - len(inputs["wav22k"])) < 1600 and _corr(ogg, inputs["wav22k"]) > 0.9


def _syncsafe(size: int) -> bytes:
    return bytes((size >> shift) & 0x7F for shift in (21, 14, 7, 0))


def _mislabelled_id3() -> bytes:
    """An ID3v2.4 tag whose title says UTF-8 and holds Latin-1, as many real files' do."""
    title = b"\x03Caf\xe9 del Mar"
    frame = b"TIT2" + _syncsafe(len(title)) + b"\x00\x00" + title
    return b"ID3\x04\x00\x00" + _syncsafe(len(frame)) + frame


def _file_recipe(name: str, files: dict, tmp_path: Path) -> Path:
    speech, rate = soundfile.read(files["wav44k"], dtype="float32")
    path = tmp_path / name
    if name == "stereo-48k.flac":  # 24-bit
        soundfile.write(path, np.stack([speech, 0.5 * speech], axis=1), 48000, subtype="PCM_24")
    elif name == "5.1.m4a":  # FFmpeg's downmix, not a mean over the channels (LFE included)
        path.write_bytes(av_encoded(speech, rate, "mp4", "aac", channels=6))
    elif name in ("corrupt.mp3", "tagged.mp3"):
        soundfile.write(path, speech, rate, format="MP3")
        data = bytearray(path.read_bytes())
        if name == "corrupt.mp3":  # a damaged stretch: skipped, the rest decoded
            middle = len(data) // 2
            data[middle:middle + 3000] = np.random.default_rng(0).integers(0, 256, 3000, np.uint8).tobytes()
        else:
            data[:0] = _mislabelled_id3()
        path.write_bytes(bytes(data))
    else:
        return files[name]
    return path


@pytest.mark.parametrize("name", ["wav16k", "wav8k", "wav22k", "stereo44k", "ogg", "stereo-48k.flac", "5.1.m4a",
                                  "corrupt.mp3", "tagged.mp3"])
def test_files_decode_to_faster_whispers_samples(files, tmp_path, name):
    """Sample for sample: FFmpeg decodes, mixes down and resamples (to 16-bit) as for the
    references, which is what makes their transcripts ours."""
    from faster_whisper.audio import decode_audio

    path = _file_recipe(name, files, tmp_path)
    reference = decode_audio(str(path))
    assert len(reference) > 16000
    np.testing.assert_array_equal(A.load_audio(path), reference)
    with open(path, "rb") as f:
        f.read(100)  # a file object is read whole, wherever it stands
        np.testing.assert_array_equal(A.load_audio(f), reference)


def test_a_path_is_a_file_whatever_its_name(files, tmp_path, monkeypatch):
    """FFmpeg reads a name with a colon as a URL ("clip2:take 1.wav": protocol "clip2"); a path
    is opened as the file it names."""
    for name in ("clip2:take 1?#.wav", "file:x.wav"):
        (tmp_path / name).write_bytes(files["wav16k"].read_bytes())
    monkeypatch.chdir(tmp_path)
    expected = A.load_audio(files["wav16k"])
    for name in ("clip2:take 1?#.wav", "file:x.wav", tmp_path / "clip2:take 1?#.wav"):
        np.testing.assert_array_equal(A.load_audio(name), expected)


def test_a_playlist_reads_no_other_file(files, tmp_path):
    """An FFmpeg playlist (here concat's, whatever its name) is not audio: it must not make
    the decoder read the files it names (a server's upload would read the server's files)."""
    shutil.copy(files["wav16k"], tmp_path / "speech.wav")
    playlist = tmp_path / "clip.wav"
    playlist.write_text("ffconcat version 1.0\nfile 'speech.wav'\n")
    for source in (playlist, io.BytesIO(playlist.read_bytes())):
        with pytest.raises(ValueError, match="not a readable audio file"):
            A.load_audio(source)
    assert len(A.load_audio(tmp_path / "speech.wav")) > 0


def test_mp3_decodes_as_faster_whisper_decodes_it(tmp_path, inputs):
    """FFmpeg decodes MP3, as for openai-whisper and faster-whisper: every frame the file holds,
    whatever its header counts (an upload cut short still counts the whole; libsndfile's reader
    handed back that many frames, the missing ones from memory it had not written)."""
    from faster_whisper.audio import decode_audio

    speech = inputs["wav16k"]
    whole = tmp_path / "speech.mp3"
    soundfile.write(whole, speech, 16000, format="MP3")
    data = whole.read_bytes()
    cut, longer = tmp_path / "cut.mp3", tmp_path / "longer.mp3"
    cut.write_bytes(data[:len(data) * 2 // 5])
    longer.write_bytes(data + data)
    assert soundfile.info(cut).frames == soundfile.info(longer).frames == soundfile.info(whole).frames
    decoded = {}
    for path in (whole, cut, longer):
        decoded[path] = A.load_audio(path)
        reference = decode_audio(str(path))
        assert len(decoded[path]) == len(reference)
        assert np.abs(decoded[path] - reference).max() < 1e-4
    assert abs(len(decoded[whole]) - len(speech)) < 1600
    assert len(decoded[cut]) < 0.45 * len(speech) and len(decoded[longer]) > 1.9 * len(speech)


@pytest.mark.parametrize("container, codec, channels", [("mp4", "aac", 1), ("webm", "libopus", 2)])
def test_formats_of_ffmpeg(tmp_path, inputs, container, codec, channels):
    """M4A (AAC) and WebM (Opus), which libsndfile does not read, decode through PyAV."""
    path = tmp_path / f"speech.{container}"
    path.write_bytes(av_encoded(inputs["wav16k"], 16000, container, codec, channels))
    decoded = A.load_audio(path)
    assert abs(len(decoded) - len(inputs["wav16k"])) < 1600  # AAC adds its encoder delay
    best = max(_corr(decoded[lag:lag + len(inputs["wav16k"]) - 2000], inputs["wav16k"][:-2000])
               for lag in range(0, 1200, 8))
    assert best > 0.9


def test_float_files_are_clipped_as_the_references_decode_them(tmp_path, inputs):
    """openai-whisper and faster-whisper decode files to 16-bit, which clips at full scale: a
    float WAV left at int16 scale is heard clipped, not as numbers in the thousands."""
    from faster_whisper.audio import decode_audio

    path = tmp_path / "loud.wav"
    soundfile.write(path, inputs["wav16k"] * 32768, 16000, subtype="FLOAT")
    loud = A.load_audio(path)
    assert np.array_equal(loud, decode_audio(str(path)))
    speech = np.abs(inputs["wav16k"]) > 1e-3
    assert np.array_equal(np.abs(loud[speech]) >= 32767 / 32768, np.abs(inputs["wav16k"][speech]) * 32768 >= 1)


def test_samples_past_max_samples_are_refused_while_decoding(tmp_path):
    """The bound holds per channel at the file's own rate, also where no header tells the
    length (M4A)."""
    path = tmp_path / "tone.m4a"
    tone = np.sin(np.arange(3 * 96000) * 0.05).astype(np.float32) * 0.1
    path.write_bytes(av_encoded(tone, 96000, "mp4", "aac", channels=6))
    assert len(A.load_audio(path, max_samples=4 * 96000)) == pytest.approx(3 * 16000, abs=400)
    with pytest.raises(A.TooManySamples, match="more than 192000 samples per channel"):
        A.load_audio(path, max_samples=2 * 96000)


def test_integer_pcm_and_torch_input():
    pcm = (np.arange(-8, 8) * 2048).astype(np.int16)
    assert np.allclose(A.load_audio((pcm, 16000)), pcm / 32768.0)
    tensor = torch.linspace(-1, 1, 1600)
    assert np.allclose(A.load_audio((tensor, 16000)), tensor.numpy())
    # unsigned PCM (8-bit WAV) is centred on its midpoint: no DC offset
    unsigned = np.array([0, 64, 128, 192, 255], np.uint8)
    np.testing.assert_allclose(A.load_audio((unsigned, 16000)), (unsigned - 128.0) / 128.0)
    np.testing.assert_allclose(A.load_audio((np.array([0, 32768], np.uint16), 16000)), [-1.0, 0.0])


def test_sample_rates_taken():
    """An integral rate of any numeric type in [MIN_SAMPLE_RATE, MAX_SAMPLE_RATE]."""
    ones = np.ones(1600, np.float32)
    for rate in (16000, np.int64(16000), 16000.0, np.float32(16000)):
        assert len(A.load_audio((ones, rate))) == 1600
    assert len(A.load_audio((ones, A.MIN_SAMPLE_RATE))) == 1600 * 16


# --------------------------------------------------------------------------- errors


def test_missing_file(tmp_path):
    path = tmp_path / "nope.wav"
    with pytest.raises(FileNotFoundError, match="nope.wav"):
        A.load_audio(path)
    with pytest.raises(ValueError, match="nope.wav"):
        A.load_audio(str(path))


def test_a_pipe_is_read_whole(tmp_path):
    """A FIFO (as `<(...)` or /dev/stdin give) decodes like the file written into it."""
    sample = Path(__file__).resolve().parents[1] / "samples" / "hello.wav"
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(sample.read_bytes()))
    writer.start()
    audio = A.load_audio(fifo)
    writer.join()
    np.testing.assert_array_equal(audio, A.load_audio(sample))


def test_a_stream_that_never_ends_is_read_as_far_as_a_bound(monkeypatch):
    """/dev/zero (or a pipe that never closes) is refused past MAX_STREAM_BYTES, rather than read
    until the machine's memory runs out."""
    monkeypatch.setattr(A, "MAX_STREAM_BYTES", 1 << 20)
    with pytest.raises(ValueError, match=r"^/dev/zero: more than 1 MiB read from it, not a file: save the audio"):
        A.load_audio("/dev/zero")


def test_non_audio_file(tmp_path):
    """FFmpeg's reason, without its error number and the file's name again."""
    path = tmp_path / "notes.wav"
    path.write_text("this is not audio\n" * 50)
    with pytest.raises(ValueError) as err:
        A.load_audio(path)
    assert str(err.value) == f"{path}: not a readable audio file (invalid data found when processing input)"


def test_empty_file(tmp_path):
    path = tmp_path / "empty.wav"
    path.touch()
    with pytest.raises(ValueError, match="empty.wav.*empty"):
        A.load_audio(path)


def test_a_float_files_nan_samples_decode_as_the_references_and_a_bfloat16_tensor_is_read(tmp_path):
    """As the references decode such files (a NaN sample is FFmpeg's 16-bit -1, not an error);
    a bfloat16 tensor is widened (numpy has no bfloat16)."""
    from faster_whisper.audio import decode_audio

    samples = np.random.default_rng(0).uniform(-0.5, 0.5, 1600).astype(np.float32)
    samples[[3, 700]] = np.nan
    path = tmp_path / "nan.wav"
    soundfile.write(path, samples, 16000, subtype="FLOAT")
    decoded = A.load_audio(path)
    np.testing.assert_array_equal(decoded, decode_audio(str(path)))
    finite = ~np.isnan(samples)
    np.testing.assert_allclose(decoded[finite], samples[finite], atol=1 / 32768)
    tensor = torch.tensor(decoded).to(torch.bfloat16)
    np.testing.assert_array_equal(A.load_audio(tensor), tensor.float().numpy())


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 2)])
def test_empty_waveforms_are_allowed_when_asked(shape):
    audio = A.load_audio((np.zeros(shape, np.float32), 8000), allow_empty=True)
    assert audio.shape == (0,) and audio.dtype == np.float32


def test_header_only_wav_has_no_samples(tmp_path):
    path = tmp_path / "silent.wav"
    soundfile.write(path, np.zeros(0, dtype=np.float32), 16000)
    with pytest.raises(ValueError, match="no audio samples"):
        A.load_audio(path)


@pytest.mark.parametrize(
    "source, message",
    [
        ((np.zeros(0, np.float32), 16000), "no audio samples"),
        ((np.zeros(100, np.float32), 0), "sample rate"),
        ((np.zeros(100, np.float32), -8000), "sample rate"),
        ((np.array([0.0, np.nan, 0.1], np.float32), 16000), "NaN"),
        ((np.array([0.0, np.inf], np.float32), 16000), "NaN or infinite"),
        ((np.array([0.0, -1e20], np.float32), 16000), "samples reach 1e\\+20"),
        ((np.zeros((2, 3, 4), np.float32), 16000), "1-D or 2-D"),
        ((np.zeros((2, 0), np.float32), 16000), "no audio samples"),
        (0.5, r"got float; samples in a list are taken as inputs, one each: pass np.asarray\(samples\)"),
        ((np.zeros(100, np.float32), True), r"sample rate must be an integer in \[1000, 1000000\] Hz, got True"),
        ((np.zeros(100, np.float32), float("inf")), "sample rate must be an integer.*got inf"),
        ((np.zeros(100, np.float32), float("nan")), "sample rate"),
        ((np.zeros(100, np.float32), 44100.5), "got 44100.5"),
        ((np.zeros(100, np.float32), "16000"), "got '16000'"),
        ((np.zeros(100, np.float32), None), "sample rate"),
        ((np.zeros(100, np.float32), 999), "got 999"),
        ((np.zeros(100, np.float32), 1_000_001), "got 1000001"),
    ],
)
def test_bad_waveforms(source, message):
    with pytest.raises(ValueError, match=message):
        A.load_audio(source)


def test_loudest_float_audio_taken_has_finite_features():
    """Samples up to MAX_AMPLITUDE (far past [-1, 1]) still give a finite log-mel."""
    noise = np.random.default_rng(0).uniform(-1, 1, A.SAMPLE_RATE)
    tone = np.sin(2 * np.pi * 1000 * np.arange(A.SAMPLE_RATE) / A.SAMPLE_RATE)  # one bin's worth
    for signal in (noise, tone):
        audio = A.load_audio(((signal * A.MAX_AMPLITUDE * 0.999).astype(np.float32), A.SAMPLE_RATE))
        for style in A.STYLES:
            assert torch.isfinite(A.windows_features([audio], style=style)).all()


def test_bad_style_and_empty_window():
    with pytest.raises(ValueError, match="style"):
        A.whisper_features(np.zeros(16000, np.float32), style="kaldi")
    with pytest.raises(ValueError, match="empty"):
        A.windows_features([np.zeros(0, np.float32)])
