"""PackedLinear (oneDNN, weights packed once) against nn.Linear, and its use by the models."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from encdec.kernels.cpu_linear import (ROW_PIECES, ROW_STEP, SMALL_ROWS, PackedLinear, WidenedLinear,
                                      packed_linear_for, packed_linear_supported, row_pieces)
from encdec.models.layers import FeedForward, get_activation, pack_linears
from tests.conftest import torch_threads

pytestmark = pytest.mark.skipif(not packed_linear_supported(torch.device("cpu"), torch.float32),
                                reason="this torch build has no oneDNN linear")


@pytest.mark.parametrize("rows", [1, 7, 64, 333])
@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_new", "silu"])
def test_packed_linear_matches_linear(rows, activation):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 160)
    x = torch.randn(rows, 96)
    act = (lambda t: t) if activation == "none" else get_activation(activation)
    expected = act(linear(x))
    got = PackedLinear.from_linear(linear, activation)(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_packed_linear_without_bias_keeps_its_weight():
    torch.manual_seed(0)
    linear = nn.Linear(32, 48, bias=False)
    packed = PackedLinear.from_linear(linear)
    assert torch.equal(packed.weight, linear.weight)
    assert packed.bias is None
    x = torch.randn(3, 5, 32)  # leading dimensions are kept
    torch.testing.assert_close(packed(x), F.linear(x, linear.weight), rtol=1e-5, atol=1e-5)


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation 'tanhshrink'"):
        PackedLinear(torch.zeros(4, 4), None, "tanhshrink")


def test_pack_linears_fuses_the_feed_forward_activation():
    torch.manual_seed(0)
    model = nn.Sequential(FeedForward(32, 64, "gelu"), nn.Linear(32, 8))
    x = torch.randn(10, 32)
    expected = model(x)
    pack_linears(model)
    ffn, head = model
    assert isinstance(ffn.fc1, PackedLinear) and ffn.fc1.activation == "gelu"
    assert isinstance(ffn.fc2, PackedLinear) and isinstance(head, PackedLinear)
    assert isinstance(ffn.act, nn.Identity)
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_float32_and_bfloat16_on_cpu_are_packed():
    assert not packed_linear_supported(torch.device("cpu"), torch.float16)
    assert not packed_linear_supported(torch.device("cuda"), torch.float32)


needs_bfloat16 = pytest.mark.skipif(not packed_linear_supported(torch.device("cpu"), torch.bfloat16),
                                    reason="this oneDNN has no bfloat16 linear")
native_bfloat16 = pytest.param(PackedLinear, marks=needs_bfloat16)


@pytest.mark.parametrize("linear_cls", [native_bfloat16, WidenedLinear])
def test_bfloat16_packed_linear_matches_linear(linear_cls):
    torch.manual_seed(1)
    linear = nn.Linear(96, 160).bfloat16()
    x = torch.randn(64, 96).bfloat16()
    got = linear_cls.from_linear(linear, "gelu")(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.gelu(linear(x)), rtol=2e-2, atol=2e-2)


def test_widened_linear_is_float32_arithmetic_on_bfloat16_values():
    """Exact products of the bfloat16 values summed in float32, then one rounding: the float32
    linear of the same values, rounded (up to the order of the sums)."""
    torch.manual_seed(2)
    weight, bias = torch.randn(200, 384).bfloat16(), torch.randn(200).bfloat16()
    x = torch.randn(3, 70, 384).bfloat16()
    widened = WidenedLinear(weight, bias, "relu")
    assert widened.packed_weight.dtype == torch.float32
    want = F.relu(F.linear(x.float(), weight.float(), bias.float()))
    got = widened(x)
    assert got.shape == (3, 70, 200) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2 ** -8, atol=1e-5)


def test_bfloat16_layers_are_packed_natively_or_widened():
    native = packed_linear_supported(torch.device("cpu"), torch.bfloat16)
    assert packed_linear_for(torch.device("cpu"), torch.bfloat16) is (PackedLinear if native else WidenedLinear)
    assert packed_linear_for(torch.device("cpu"), torch.float32) is PackedLinear
    assert packed_linear_for(torch.device("cpu"), torch.float16) is None
    assert packed_linear_for(torch.device("cuda"), torch.bfloat16) is None


def test_the_engine_runs_bart_on_packed_linears(tiny_bart_dir):
    from encdec import LLM

    model = LLM(model=str(tiny_bart_dir), num_gpu_blocks=64).llm_engine.model_runner.model
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    assert linears and all(isinstance(m, PackedLinear) for m in linears)
    assert model.model.decoder.layers[0].ffn.fc1.activation == "gelu"


def test_models_fall_back_to_nn_linear_where_onednn_fails(monkeypatch, tiny_bart_dir):
    from encdec import LLM, SamplingParams
    from encdec.kernels import cpu_linear

    def broken(self, x):
        raise RuntimeError("no oneDNN kernel for this processor")

    monkeypatch.setattr(PackedLinear, "forward", broken)
    cpu_linear._packed_linear_works.cache_clear()
    try:
        assert not packed_linear_supported(torch.device("cpu"), torch.float32)
        llm = LLM(model=str(tiny_bart_dir), num_gpu_blocks=64)
        model = llm.llm_engine.model_runner.model
        assert not any(isinstance(m, PackedLinear) for m in model.modules())
        out = llm.generate("The rain in spain.", SamplingParams(temperature=0.0, max_tokens=4),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) >= 1
    finally:
        cpu_linear._packed_linear_works.cache_clear()


def test_row_pieces_keep_few_shapes():
    shapes = set()
    for rows in range(0, 3000):
        pieces = row_pieces(rows)
        assert sum(count for count, _ in pieces) == rows
        for count, padded in pieces:
            assert 0 <= padded - count < ROW_STEP and (padded <= SMALL_ROWS or padded % ROW_STEP == 0)
            shapes.add(padded)
    assert len(shapes) <= SMALL_ROWS + 1 + ROW_PIECES[-1] // ROW_STEP + len(ROW_PIECES)
    assert row_pieces(1500) == [(1024, 1024), (256, 256), (220, 224)]  # one Whisper window's frames
    assert row_pieces(1) == [(1, 2)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bfloat16)])
@pytest.mark.parametrize("in_features", [384, 1536])
def test_a_row_gets_the_same_bits_alone_as_in_a_batch(in_features, dtype, threads):
    """The engine's contract: a sequence's results never depend on the rest of its batch.
    oneDNN's one-row kernel broke it for Whisper's fc2 (1536 inputs), so one row goes as two."""
    torch.manual_seed(in_features)
    linear = PackedLinear((torch.randn(384, in_features) / 20).to(dtype), torch.randn(384).to(dtype))
    x = torch.randn(12, in_features).to(dtype)
    with torch_threads(threads):
        batched = linear(x)
        for i in range(len(x)):
            assert torch.equal(linear(x[i:i + 1])[0], batched[i])
            assert torch.equal(linear(x[i:i + 2])[0], batched[i])


@pytest.mark.parametrize("rows", [0, 65, 255, 256, 257, 1024, 1500])
def test_packed_linear_over_row_pieces_matches_linear(rows):
    torch.manual_seed(rows)
    linear = nn.Linear(64, 96)
    x = torch.randn(rows, 64)
    got = PackedLinear.from_linear(linear, "gelu")(x)
    torch.testing.assert_close(got, F.gelu(linear(x)), rtol=1e-5, atol=1e-5)


def test_new_row_counts_do_not_grow_memory():
    """oneDNN keeps a primitive per row count, each with a scratchpad up to the output's size
    (here 1024 -> 4096 with gelu kept rows x 4096 floats a row count). 136 row counts went in
    9 shapes: before, they kept about 280 MB here."""
    torch.manual_seed(0)
    linear = PackedLinear(torch.randn(4096, 1024) / 32, torch.zeros(4096), "gelu")
    x = torch.randn(200, 1024)
    linear(x[:65])
    before = resident_mb()
    for rows in range(65, 201):
        linear(x[:rows])
    assert resident_mb() - before < 120


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
