"""Int8Linear (oneDNN int8 matmul, activations quantized per row) against F.linear."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from encdec.kernels.cpu_int8_linear import (INPUT_RANGES, Int8Linear, input_range, int8_linear_supported,
                                            quantize_rows, quantize_weight)
from encdec.models.layers import get_activation

pytestmark = pytest.mark.skipif(not int8_linear_supported(torch.device("cpu")),
                                reason="this torch build has no oneDNN int8 linear")


def test_weight_rows_round_to_their_own_scale():
    torch.manual_seed(0)
    weight = torch.randn(8, 32) * torch.logspace(-3, 1, 8)[:, None]  # rows of very unequal size
    quantized, scale = quantize_weight(weight)
    assert quantized.dtype == torch.int8 and scale.shape == (8,)
    assert int(quantized.abs().amax(dim=1).min()) == 127  # every row uses the full range
    assert torch.all((quantized * scale[:, None] - weight).abs() <= scale[:, None] / 2 + 1e-7)


@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_new", "silu"])
def test_int8_linear_is_close_to_linear(rows, activation):
    torch.manual_seed(rows)
    weight, bias = torch.randn(160, 96) * 0.1, torch.randn(160)
    x = torch.randn(rows, 96) + 0.5  # not centred: the zero point matters
    act = (lambda t: t) if activation == "none" else get_activation(activation)
    expected = act(F.linear(x, weight, bias))
    got = Int8Linear(weight, bias, activation)(x)
    assert got.dtype == torch.float32
    # 8-bit input and weight steps: errors of about 1% of the output's range
    assert float((got - expected).abs().max()) <= 0.02 * float(expected.abs().max())


def test_leading_dimensions_empty_inputs_and_no_bias():
    torch.manual_seed(1)
    weight = torch.randn(24, 16)
    linear = Int8Linear(weight, None)
    x = torch.randn(2, 3, 16)
    got = linear(x)
    assert got.shape == (2, 3, 24)
    expected = F.linear(x, weight)
    assert float((got - expected).abs().max()) <= 0.02 * float(expected.abs().max())
    assert linear(torch.zeros(0, 16)).shape == (0, 24)
    assert torch.equal(linear(torch.zeros(1, 16)), torch.zeros(1, 24))


@pytest.mark.parametrize("activation", ["none", "gelu"])
def test_a_rows_result_does_not_depend_on_the_other_rows(activation):
    """Each row is quantized on its own scale: a row gets the same bits alone as beside others,
    and a row of large values beside it costs it no precision."""
    torch.manual_seed(2)
    weight, bias = torch.randn(64, 96) * 0.1, torch.randn(64)
    x = torch.randn(300, 96)
    x[7] *= 1000
    linear = Int8Linear(weight, bias, activation)
    together = linear(x)
    assert torch.equal(together, torch.cat([linear(row[None]) for row in x]))
    act = (lambda t: t) if activation == "none" else get_activation(activation)
    exact = act(F.linear(x[:7], weight, bias))
    assert float((together[:7] - exact).abs().max()) <= 0.02 * float(exact.abs().max())


def test_the_input_range_is_the_widest_that_gets_a_large_case_right():
    """Inputs near the top of the uint8 range and weights near 127 overflow oneDNN's int16 sums
    without VNNI; the range in use does not, and the 7-bit range is right everywhere."""
    torch.manual_seed(3)
    weight = torch.randn(64, 256).sign() * 0.1  # every weight at +-127
    x = torch.rand(5, 256) + 1.0  # every input in the top half of the range
    expected = F.linear(x, weight)
    for top in (input_range(), 127):
        got = Int8Linear(weight, None, input_top=top)(x)
        assert float((got - expected).abs().max()) <= 0.02 * float(expected.abs().max())
    assert input_range() in INPUT_RANGES
    quantized, scales, zero_points = quantize_rows(x, 127)
    assert int(quantized.max()) == 127 and torch.all(zero_points == 0)


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation 'tanhshrink'"):
        Int8Linear(torch.zeros(4, 4), None, "tanhshrink")
