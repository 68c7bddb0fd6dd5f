"""Bad command lines stop before anything loads, with the command's usage, one
`encdec COMMAND: error: ...` line naming the flag (and its limit), and exit status 2; an
option's two spellings (dashes, underscores) are one option."""
from __future__ import annotations

import pytest

from encdec.entrypoints import cli, cli_args, serve_cli, transcribe_cli
from encdec.entrypoints.openai import api_server
from tests.entrypoints.conftest import SAMPLE


@pytest.fixture(autouse=True)
def nothing_loads(monkeypatch):
    for module, name in ((cli_args, "LLM"), (cli_args, "load_llm"), (transcribe_cli, "load_audio"),
                         (api_server, "run_server")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail(f"{name} was called"))


def usage_error(capsys, argv: list[str]) -> str:
    """The message of the usage error `argv` ends in."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    command = argv[0]
    assert err.startswith(f"usage: encdec {command} ")
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert line.startswith(f"encdec {command}: error: ")
    assert "Traceback" not in err
    return line.removeprefix(f"encdec {command}: error: ")


TRANSCRIBE = ["transcribe", str(SAMPLE)]
SUMMARIZE = ["summarize", "--model", "/nonexistent/bart", "some text"]
SERVE = ["serve", "--model", "tiny.en"]


@pytest.mark.parametrize("argv, message", [
    # numbers: finite, within their limits, the limits stated
    (["--temperature", "inf"], "argument --temperature: expected a number in [0, 2], got 'inf'"),
    (["--temperature", "3"], "argument --temperature: expected a number in [0, 2], got '3'"),
    (["--temperature_increment_on_fallback", "inf"],
     "argument --temperature_increment_on_fallback: expected a finite number >= 0 or None, got 'inf'"),
    (["--temperature_increment_on_fallback", "0.0001"],
     "--temperature_increment_on_fallback must be 0, None or a number >= 0.01, got 0.0001"),
    (["--clip_timestamps", "1,inf"],
     "argument --clip_timestamps: expected comma-separated seconds (numbers >= 0), got '1,inf'"),
    (["--clip_timestamps", "nan"],
     "argument --clip_timestamps: expected comma-separated seconds (numbers >= 0), got 'nan'"),
    (["--logprob_threshold", "nan"],
     "argument --logprob_threshold: expected a finite number or None, got 'nan'"),
    (["--suppress_tokens", "1,,2"], "argument --suppress_tokens: expected comma-separated token ids "
                                    "(integers >= 0, or -1), got '1,,2'"),
    (["--suppress_tokens", "-2"], "argument --suppress_tokens: expected comma-separated token ids "
                                  "(integers >= 0, or -1), got '-2'"),
    (["--patience", "0"], "argument --patience: expected a finite number > 0 or None, got '0'"),
    (["--beam_size", "300"], "argument --beam_size: expected an integer in [1, 256] or None, got '300'"),
    (["--best_of", "300"], "argument --best_of: expected an integer in [1, 256] or None, got '300'"),
    (["--threads", "100000"], f"argument --threads: expected an integer in [0, {cli_args.MAX_THREADS}], "
                              f"got '100000'"),
    (["--device", "foo"], "argument --device: expected cpu, cuda or cuda:N, got 'foo'"),
    (["--fp16", "yes"], "argument --fp16: expected True or False, got 'yes'"),
    (["--model_dir", "/nonexistent"], "argument --model_dir: /nonexistent: no such directory"),
    # checks across flags, after parsing
    (["--vad_threshold", "2"], "--vad_threshold must be in [0, 1], got 2.0"),
    (["--highlight_words", "True"], "--highlight_words needs --word_timestamps=True"),
    (["--compute_type", "int8", "--dtype", "bfloat16"],
     "--compute_type=int8 runs in float32, which contradicts --dtype=bfloat16; give one of the two"),
    (["--quantization", "int8", "--dtype", "bfloat16"],
     "--quantization int8 runs with float32 activations, not --dtype bfloat16"),
])
def test_transcribe(capsys, argv, message):
    assert usage_error(capsys, TRANSCRIBE + argv) == message


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "inf"], "argument --temperature: expected a number in [0, 2], got 'inf'"),
    (["--temperature", "1e308"], "argument --temperature: expected a number in [0, 2], got '1e308'"),
    (["--length-penalty", "nan"], "argument --length-penalty: expected a finite number, got 'nan'"),
    (["--num-beams", "300"], "argument --num-beams: expected an integer in [1, 256], got '300'"),
    (["--quantization", "int8", "--dtype", "bfloat16"],
     "--quantization int8 runs with float32 activations, not --dtype bfloat16"),
    (["--device", "cuda:x"], "argument --device: expected cpu, cuda or cuda:N, got 'cuda:x'"),
])
def test_summarize(capsys, argv, message):
    assert usage_error(capsys, SUMMARIZE + argv) == message


@pytest.mark.parametrize("argv, message", [
    (["--max-upload-mb", "inf"], "argument --max-upload-mb: expected a finite number > 0, got 'inf'"),
    (["--max-audio-seconds", "0"], "argument --max-audio-seconds: expected a finite number > 0, got '0'"),
    (["--port", "70000"], "argument --port: expected an integer in [0, 65535], got '70000'"),
    (["--port", "-1"], "argument --port: expected an integer in [0, 65535], got '-1'"),
    (["--seed", "-1"], "argument --seed: expected an integer in [0, 9223372036854775807], got '-1'"),
    (["--kv-cache-space", "0"], "argument --kv-cache-space: expected a finite number > 0, got '0'"),
    (["--kv-cache-space", "inf"], "argument --kv-cache-space: expected a finite number > 0, got 'inf'"),
    (["--swap-space", "inf"], "argument --swap-space: expected a finite number >= 0, got 'inf'"),
    (["--device", "foo"], "argument --device: expected cpu, cuda or cuda:N, got 'foo'"),
    (["--served-model-name", "a", "--served-model-name", "b"],
     "--served-model-name was given 2 times for 1 --model(s): give the names of each model, or none"),
    (["--model", "base", "--served-model-name", "a"],
     "--served-model-name was given once for 2 --model(s): give the names of each model, or none"),
    (["--served-model-name", "a", "a"], "'a' is given as the name of two models, or twice: give each "
                                        "--model names of its own (--served-model-name)"),
    (["--kv-cache-space", "1", "--kv-cache-space", "2"],
     "--kv-cache-space was given 2 times for 1 --model(s): give one value for every model, or one "
     "per model"),
    (["--model", "tiny.en"], "'tiny.en' is given as the name of two models, or twice: give each "
                             "--model names of its own (--served-model-name)"),
    (["--quantization", "int8", "--dtype", "float16"],
     "--quantization int8 runs with float32 activations, not --dtype float16"),
    (["--replicas", "2"], "--replicas: Ray Serve options; add --ray to serve through Ray"),
    (["--ray", "--request-header-timeout", "5"],
     "--request-header-timeout: not with --ray, whose proxy reads the requests"),
    # an option holds for every --model: a second value is refused, not quietly taken for all
    (["--dtype", "bfloat16", "--model", "base", "--dtype", "float32"],
     "--dtype is given twice: each option takes one value for the whole server (one per --model: "
     "only --num-gpu-blocks, --kv-cache-space, --swap-space, --max-model-len)"),
    (["--max-num-seqs", "8", "--max_num_seqs=16"], "--max-num-seqs is given twice: each option takes one "
     "value for the whole server (one per --model: only --num-gpu-blocks, --kv-cache-space, --swap-space, "
     "--max-model-len)"),
    (["--shutdown-timeout", "0.5"], "argument --shutdown-timeout: expected a finite number >= 1, got '0.5'"),
    (["--api-key", "clé"], "argument --api-key: the key (--api-key or $ENCDEC_API_KEY) must be printable ASCII: "
                           "clients send it in an HTTP header"),
    (["--api-key", " "], "argument --api-key: the key is empty (--api-key or $ENCDEC_API_KEY): give a key, "
                         "or neither for a server without one"),
    (["--autoscale", "1,4", "--cpus-per-replica", "2", "--ray-address", "auto"],
     "--autoscale, --cpus-per-replica, --ray-address: Ray Serve options; add --ray to serve through Ray"),
])
def test_serve(capsys, argv, message):
    assert usage_error(capsys, SERVE + argv) == message


def test_serve_takes_its_first_model_as_vllm_serve_does(capsys, monkeypatch):
    """`encdec serve MODEL` as `vllm serve MODEL`: the first model, before any --model; no model
    at all is a usage error; vLLM's dtype names."""
    def check_model(model, flag):
        raise ValueError(f"{flag} {model}: checked first")

    monkeypatch.setattr(serve_cli, "check_model", check_model)
    assert cli.main(["serve", "tiny.en", "--model", "base"]) == 2
    assert capsys.readouterr().err.strip() == "encdec: error: --model tiny.en: checked first"
    assert usage_error(capsys, ["serve", "--port", "0"]) == (
        "no model to serve: give one (encdec serve MODEL) or --model, once per model")
    assert cli.build_parser().parse_args(["serve", "tiny.en", "--dtype", "half"]).dtype == "half"


def test_an_empty_api_key_in_the_environment_is_refused(capsys, monkeypatch):
    """Not a server open to anyone: an empty $ENCDEC_API_KEY is refused as an empty --api-key
    (and by the app itself); a key read from a file loses its line end, as a sent key its spaces."""
    from encdec.entrypoints.openai.api_server import build_app
    from encdec.entrypoints.openai.middleware import ServerState

    monkeypatch.setenv("ENCDEC_API_KEY", "")
    assert usage_error(capsys, SERVE).startswith("argument --api-key: the key is empty")
    with pytest.raises(ValueError, match="^api_key is empty"):
        build_app([], ServerState(), api_key=" ")
    monkeypatch.setenv("ENCDEC_API_KEY", "sekret\n")
    assert cli.build_parser().parse_args(SERVE).api_key == "sekret"


@pytest.mark.parametrize("value", ["0", "-1", "ten", "inf", "nan", ""])
def test_a_bad_stats_interval_is_refused(capsys, monkeypatch, value):
    monkeypatch.setenv("ENCDEC_LOG_STATS_INTERVAL", value)
    assert usage_error(capsys, SERVE) == (
        f"ENCDEC_LOG_STATS_INTERVAL must be a number of seconds above 0, got {value!r}")


@pytest.mark.parametrize("argv, field, value", [
    (SUMMARIZE + ["--max_tokens", "7"], "max_tokens", 7),
    (SUMMARIZE + ["--no_repeat_ngram_size=3"], "no_repeat_ngram_size", 3),
    (SERVE + ["--max_upload_mb", "3"], "max_upload_mb", 3.0),
    (TRANSCRIBE + ["--batch-size", "3"], "batch_size", 3),
    (TRANSCRIBE + ["--temperature-increment-on-fallback", "0.4"], "temperature_increment_on_fallback", 0.4),
    (TRANSCRIBE + ["--output-format=srt"], "output_format", "srt"),
    (["summarize", "--model", "m", "--", "--max_tokens"], "texts", ["--max_tokens"]),  # a text
])
def test_options_take_dashes_or_underscores(argv, field, value):
    """Each command spells its options one way (openai-whisper's underscores for `transcribe`,
    vLLM's dashes elsewhere); the other spelling is the same option."""
    assert getattr(cli.build_parser().parse_args(argv), field) == value


def test_serve_cache_budgets_fit_in_memory(capsys, monkeypatch):
    monkeypatch.setattr(cli_args.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(serve_cli, "memory_gib", lambda device: 16.0)
    assert usage_error(capsys, SERVE + ["--kv-cache-space", "1e6"]) == (
        "--kv-cache-space 1e+06: more than this machine's 16.0 GiB of memory")
    assert usage_error(capsys, SERVE + ["--swap-space", "17"]) == (
        "--swap-space 17: more than this machine's 16.0 GiB of memory")


@pytest.mark.parametrize("gpus, argv, message", [
    (0, ["--device", "cuda"], "--device cuda: CUDA is not available on this machine"),
    (1, ["--device", "cuda:1"], "--device cuda:1: this machine has 1 CUDA device(s)"),
])
def test_devices(capsys, monkeypatch, gpus, argv, message):
    monkeypatch.setattr(cli_args.torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(cli_args.torch.cuda, "is_available", lambda: gpus > 0)
    assert usage_error(capsys, TRANSCRIBE + argv) == message


def test_bench_names_only_the_benchmark_as_missing(capsys):
    assert usage_error(capsys, ["bench"]) == "the following arguments are required: name"
