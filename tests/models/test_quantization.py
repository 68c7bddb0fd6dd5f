"""`quantization="int8"`: which layers become int8, the option's errors, faster-whisper's
`compute_type` names for it and for the dtype, and BART's greedy ids against float32 (and
bfloat16's) on random weights."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from encdec import LLM, SamplingParams
from encdec.kernels.cpu_int8_linear import Int8Linear, int8_linear_supported
from encdec.kernels.cpu_linear import PackedLinear, WidenedLinear, packed_linear_supported
from encdec.models.quantization import (Float32Output, WidenedConv1d, check_quantization,
                                       resolve_compute_type, widen_convolutions)
from benchmarks.bench_bart import make_workload
from benchmarks.common import prefix_agreement
from tests.bart_checkpoints import make_bart_checkpoint
from tests.conftest import assert_all_blocks_free

needs_int8 = pytest.mark.skipif(not int8_linear_supported(torch.device("cpu")),
                                reason="this torch build has no oneDNN int8 linear")


@needs_int8
def test_int8_replaces_the_stacks_linears_and_keeps_the_head_float(tiny_bart_dir):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=64, quantization="int8")
    model = llm.llm_engine.model_runner.model
    layer = model.model.decoder.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.out_proj, layer.encoder_attn.q_proj,
                   layer.encoder_attn.kv_proj, layer.ffn.fc2):
        assert isinstance(linear, Int8Linear)
    assert isinstance(layer.ffn.fc1, Int8Linear) and layer.ffn.fc1.activation == "gelu"
    assert not isinstance(model.lm_head, Int8Linear)
    assert not any(type(m) is torch.nn.Linear for m in model.model.modules())
    out = llm.generate("The rain in spain.", SamplingParams(temperature=0.0, max_tokens=4),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("quantization, dtype, device, message", [
    ("int4", torch.float32, "cpu", r"quantization must be one of \['int8'\] or None, got 'int4'"),
    ("int8", torch.bfloat16, "cpu", "dtype must be float32"),
    ("int8", torch.float32, "cuda", "needs a CPU device"),
])
def test_bad_quantization_is_refused(quantization, dtype, device, message):
    with pytest.raises(ValueError, match=message):
        check_quantization(quantization, dtype, torch.device(device))


def test_llm_refuses_an_unknown_method_before_loading(tiny_bart_dir):
    with pytest.raises(ValueError, match="quantization must be one of"):
        LLM(model=str(tiny_bart_dir), quantization="fp8")


def test_bfloat16_bart_runs_packed_bf16_linears_and_cache(tiny_bart_dir):
    """oneDNN's bfloat16 linears where the processor has them, else float32 ones on the widened
    weights (`WidenedLinear`); the KV cache is bfloat16 either way."""
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=64, dtype="bfloat16")
    engine = llm.llm_engine
    assert engine.cache_engine.gpu_cache[0].dtype == torch.bfloat16
    fc1 = engine.model_runner.model.model.encoder.layers[0].ffn.fc1
    native = packed_linear_supported(torch.device("cpu"), torch.bfloat16)
    assert type(fc1) is (PackedLinear if native else WidenedLinear) and fc1.activation == "gelu"
    assert fc1.packed_weight.dtype == (torch.bfloat16 if native else torch.float32)
    assert isinstance(engine.model_runner.model.lm_head, Float32Output)
    out = llm.generate(["The rain in spain.", "A longer prompt with more words in it."],
                       SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
                       use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [6, 6]
    assert_all_blocks_free(llm)


def test_widened_convolution_is_float32_arithmetic_on_bfloat16_values():
    """Whisper's second convolution (stride 2) in bfloat16, run in float32 on the widened weight:
    the float64 result of the same bfloat16 values, rounded once to bfloat16."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv1d(80, 96, kernel_size=3, stride=2, padding=1)).bfloat16()
    conv = model[0]
    x = torch.randn(2, 80, 300).bfloat16()
    want = F.conv1d(x.double(), conv.weight.double(), conv.bias.double(), stride=2, padding=1)
    widen_convolutions(model)
    widened = model[0]
    assert isinstance(widened, WidenedConv1d) and widened.weight.dtype == torch.float32
    assert torch.equal(widened.weight, conv.weight.float()) and widened.stride == (2,)
    got = model(x)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 96, 150)
    torch.testing.assert_close(got.double(), want, rtol=2 ** -8, atol=1e-6)


@pytest.fixture(scope="module")
def agreement_bart(tmp_path_factory):
    """The TINY random BART with weights of std 0.1: greedy outputs follow the prompt for a few
    tokens, then settle (about 3 distinct tokens per output), so every step is a real choice."""
    return make_bart_checkpoint(tmp_path_factory.mktemp("agreement_bart"), seed=0, init_std=0.1)


def greedy_ids(model_dir, workload, **options) -> list[list[int]]:
    llm = LLM(model=str(model_dir), num_gpu_blocks=1024, **options)
    outputs = llm.generate([{"prompt_token_ids": w["ids"]} for w in workload],
                           [SamplingParams(temperature=0.0, max_tokens=w["max_tokens"],
                                           ignore_eos=True) for w in workload], use_tqdm=False)
    assert_all_blocks_free(llm)
    return [o.outputs[0].token_ids for o in outputs]


@needs_int8
def test_bfloat16_and_int8_greedy_ids_agree_with_float32(agreement_bart):
    """bench_bart's workload shape (32 documents of 100-250 tokens, 32-128 new tokens each):
    at least 90% of float32's tokens come before the first divergence."""
    workload = make_workload(32, seed=0, vocab_size=1000, max_len=250)
    reference = greedy_ids(agreement_bart, workload)
    rates = {name: prefix_agreement(greedy_ids(agreement_bart, workload, **options), reference)
             for name, options in (("bfloat16", {"dtype": "bfloat16"}),
                                   ("int8", {"quantization": "int8"}))}
    print(f"tokens before the first divergence from float32: {rates}")
    assert min(rates.values()) >= 0.9


def test_cli_quantization_option_reaches_the_llm(monkeypatch):
    from encdec.entrypoints import cli, cli_args

    made = {}
    monkeypatch.setattr(cli_args, "LLM", lambda **options: made.update(options))
    cli_args.load_llm(cli.build_parser().parse_args(["transcribe", "x.wav", "--quantization", "int8"]))
    assert made["quantization"] == "int8" and made["dtype"] == "auto"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["transcribe", "x.wav", "--quantization", "int4"])


@pytest.mark.parametrize("compute_type, dtype, quantization, expected", [
    ("float32", "auto", None, ("float32", None)),
    ("bfloat16", "auto", None, ("bfloat16", None)),
    ("int8", "auto", None, ("float32", "int8")),
    ("int8_float32", "float32", "int8", ("float32", "int8")),
    ("default", "bfloat16", None, ("bfloat16", None)),
    (None, "auto", "int8", ("auto", "int8")),
    # the same dtype spelled another way is no contradiction
    ("bfloat16", torch.bfloat16, None, ("bfloat16", None)),
    ("int8", "float", None, ("float32", "int8")),
    ("float16", "half", None, ("float16", None)),
    ("int8", torch.float32, "int8", ("float32", "int8")),
])
def test_compute_type_names(compute_type, dtype, quantization, expected):
    assert resolve_compute_type(compute_type, dtype, quantization) == expected


@pytest.mark.parametrize("compute_type, dtype, quantization, message", [
    ("int4", "auto", None, r"compute_type must be one of \['float32', 'bfloat16', 'float16', 'int8', "
                           r"'int8_float32', 'default', 'auto'\], got 'int4'"),
    ("int8_bfloat16", "auto", None, "got 'int8_bfloat16' \\(int8 runs with float32 activations\\)"),
    ("int8", "bfloat16", None, "compute_type='int8' runs in float32, which contradicts dtype='bfloat16'"),
    ("bfloat16", "auto", "int8", "compute_type='bfloat16' contradicts quantization='int8'"),
    (["int8"], "auto", None, r"compute_type must be one of .*got \['int8'\]"),
    ("int8", ["float32"], None, r"dtype must be one of .*got \['float32'\]"),
])
def test_bad_compute_type_is_refused(compute_type, dtype, quantization, message):
    with pytest.raises(ValueError, match=message):
        resolve_compute_type(compute_type, dtype, quantization)


@needs_int8
def test_llm_takes_compute_type(tiny_bart_dir):
    llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=64, compute_type="int8")
    assert isinstance(llm.llm_engine.model_runner.model.model.decoder.layers[0].ffn.fc2, Int8Linear)
    with pytest.raises(ValueError, match="contradicts dtype='bfloat16'"):
        LLM(model=str(tiny_bart_dir), num_gpu_blocks=64, compute_type="int8", dtype="bfloat16")


@pytest.mark.parametrize("argv, dtype, quantization", [
    (["--compute_type", "int8"], "float32", "int8"),
    (["--compute-type", "bfloat16"], "bfloat16", None),
    (["--dtype", "bfloat16"], "bfloat16", None),
])
def test_cli_compute_type_becomes_dtype_and_quantization(monkeypatch, argv, dtype, quantization):
    from encdec.entrypoints import cli, cli_args

    class Loaded(Exception):
        pass

    def fake_llm(**options):
        raise Loaded(options)

    monkeypatch.setattr(cli_args, "LLM", fake_llm)
    with pytest.raises(Loaded) as loaded:
        cli.main(["transcribe", "samples/hello.wav", *argv])
    assert (loaded.value.args[0]["dtype"], loaded.value.args[0]["quantization"]) == (dtype, quantization)


def test_cli_refuses_a_contradicting_compute_type(capsys):
    from encdec.entrypoints import cli

    assert cli.main(["transcribe", "x.wav", "--compute_type", "int8", "--dtype", "bfloat16"]) == 2
    assert "encdec transcribe: error: --compute_type=int8 runs in float32, which contradicts " \
           "--dtype=bfloat16" in capsys.readouterr().err


def test_float16_on_the_cpu_warns_and_names_bfloat16(tiny_bart_dir, capsys):
    from encdec.entrypoints import cli

    with pytest.warns(UserWarning, match=r"dtype float16 on the CPU .* dtype='bfloat16'"):
        LLM(model=str(tiny_bart_dir), num_gpu_blocks=64, dtype="float16")
    assert cli.main(["summarize", "--model", str(tiny_bart_dir), "The rain in spain.",
                     "--dtype", "float16", "--max-tokens", "2"]) == 0
    assert "encdec: warning: --dtype float16 on the CPU runs without fast kernels (several times " \
           "slower than float32); --dtype=bfloat16 is" in capsys.readouterr().err
