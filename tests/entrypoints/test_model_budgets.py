"""`encdec serve`'s cache budgets: each --model gets its own engine and cache, sized by
--num-gpu-blocks / --kv-cache-space / --swap-space given once for every model or once per
model, in the order of the --model flags."""
from __future__ import annotations

import pytest

from encdec.entrypoints import cli
from encdec.entrypoints.openai.serving_models import ModelLoadError, load_models, per_model_options


def serve_args(*options: str):
    return cli.build_parser().parse_args(["serve", "--model", "a", "--model", "b", *options])


def test_flags_collect_one_value_per_model_or_one_for_all():
    args = serve_args("--kv-cache-space", "1", "--kv-cache-space", "0.5", "--num-gpu-blocks", "64",
                      "--max-model-len", "448", "--max-model-len", "512")
    assert args.kv_cache_space == [1.0, 0.5] and args.num_gpu_blocks == [64] and args.max_model_len == [448, 512]
    assert args.swap_space is None
    options = per_model_options({"kv_cache_space": args.kv_cache_space, "num_gpu_blocks": args.num_gpu_blocks,
                                 "swap_space": args.swap_space, "dtype": "float32"}, 2)
    assert options == [{"kv_cache_space": 1.0, "num_gpu_blocks": 64, "dtype": "float32"},
                       {"kv_cache_space": 0.5, "num_gpu_blocks": 64, "dtype": "float32"}]


def test_a_count_that_fits_neither_is_refused_naming_the_flag():
    with pytest.raises(ModelLoadError, match=r"--swap-space was given 2 times for 3 --model\(s\)"):
        per_model_options({"swap_space": [1.0, 2.0]}, 3)


def test_each_engine_gets_its_own_number_of_blocks(tiny_bart_dir):
    served = load_models([str(tiny_bart_dir)] * 2, ["big", "small"], None,
                         {"num_gpu_blocks": [48, 24], "swap_space": [0.01]})
    blocks = {m.name: m.engine.engine.block_manager.num_total_gpu_blocks for m in served}
    assert blocks == {"big": 48, "small": 24}
    assert served[0].engine.engine.block_manager is not served[1].engine.engine.block_manager


def test_every_engine_option_of_llm_is_a_serve_flag_that_ray_replicas_pass_on():
    import inspect

    from encdec.engine.llm_engine import LLMEngine
    from encdec.entrypoints.openai.serving_models import ENGINE_OPTIONS

    # LLM(model, **engine_options) takes these
    options = set(inspect.signature(LLMEngine.from_model).parameters) - {"model", "compute_type"}  # --quantization, --dtype
    assert options <= set(vars(serve_args()))
    assert options == set(ENGINE_OPTIONS)


def test_an_unknown_llm_option_names_itself_and_the_ones_taken(tmp_path):
    """vLLM's `gpu_memory_utilization` and the like, refused with the list before the model is
    looked for (a missing checkpoint would be another error)."""
    from encdec import LLM

    with pytest.raises(TypeError, match=r"^LLM\(\) got unknown options gpu_memory_utilization, kv_cache_dtype; "
                                        r"it takes model, limit_mm_per_prompt, enforce_eager and dtype, device, .*, "
                                        r"max_model_len$"):
        LLM(str(tmp_path / "no-such-model"), kv_cache_dtype="fp8", gpu_memory_utilization=0.5)


def test_max_running_requests_defaults_to_auto_and_reaches_each_engine(tiny_bart_dir):
    assert serve_args().max_running_requests == "auto"
    assert serve_args("--max-running-requests", "3").max_running_requests == 3
    for value, expected in ((3, 3), ("auto", None)):  # auto: no limit for a text model
        (served,) = load_models([str(tiny_bart_dir)], ["bart"], None,
                                {"num_gpu_blocks": [16], "max_running_requests": value})
        assert served.engine.engine.scheduler_config.max_running_requests == expected
