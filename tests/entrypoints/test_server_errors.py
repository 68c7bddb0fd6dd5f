"""Bad input, limits, keys, overload, disconnects and shutdown: each answer has the right status,
OpenAI's error shape and `param`; the server keeps serving and every block is free after."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import httpx
import numpy as np
import openai
import pytest
import soundfile

from encdec import LLM, SamplingParams
from encdec.engine.async_engine import AsyncLLMEngine
from encdec.entrypoints.openai.api_server import build_app
from encdec.entrypoints.openai.middleware import ServerState
from encdec.entrypoints.openai.serving_models import ServedModel, ServedModels
from tests.audio_files import av_encoded
from tests.entrypoints.conftest import SAMPLE
from tests.entrypoints.remote_server import API_KEY, RemoteServer, metric_samples

TEXT = "The rain in spain falls mainly on the plain."
MAX_UPLOAD_MB = 1
BODY_TIMEOUT = 4
HEADER_TIMEOUT = 3
LONG = {"min_tokens": 150, "max_tokens": 150, "temperature": 0.0}  # about a second of decoding


@pytest.fixture(scope="module")
def server(tiny_bart_dir):
    remote = RemoteServer(["--model", str(tiny_bart_dir), "--served-model-name", "bart",
                           "--model", "tiny.en", "--served-model-name", "tiny.en",
                           "--num-gpu-blocks", "2200", "--swap-space", "0.05",
                           "--max-upload-mb", str(MAX_UPLOAD_MB), "--max-audio-seconds", "5",
                           "--max-audio-seconds-in-flight", "8",
                           "--max-num-seqs", "5", "--max-waiting-requests", "2",
                           "--request-body-timeout", str(BODY_TIMEOUT),
                           "--request-header-timeout", str(HEADER_TIMEOUT), "--disable-log-requests"],
                          api_key=API_KEY)
    yield remote
    remote.stop()


@pytest.fixture(autouse=True)
def server_whole_after(request):
    """After each test on the module's server: every block free, no upload's audio held."""
    yield
    if "server" in request.fixturenames:
        server = request.getfixturevalue("server")
        server.wait_all_blocks_free()
        assert server.metrics()[("encdec_audio_seconds_in_flight", ())] == 0


def wav_bytes(seconds: float) -> bytes:
    out = io.BytesIO()
    noise = np.random.default_rng(0).normal(0, 0.1, int(16000 * seconds)).astype(np.float32)
    soundfile.write(out, noise, 16000, format="WAV")
    return out.getvalue()


def dense_audio(container: str) -> bytes:
    """3 s of 96 kHz audio in 6 to 8 channels: a small file with more samples than 5 s at 48 kHz."""
    tone = (np.sin(np.arange(3 * 96000) * 0.05) * 0.1).astype(np.float32)
    if container == "flac":
        out = io.BytesIO()
        soundfile.write(out, np.repeat(tone[:, None], 8, axis=1), 96000, format="FLAC")
        return out.getvalue()
    return av_encoded(tone, 96000, container, "aac", channels=6)


def assert_error(response: httpx.Response, status: int, param) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    # OpenAI's types: 401 and 404 are invalid requests too
    assert error["type"] == {429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}.get(
        status, "invalid_request_error"), error
    return error


JSON_CASES = [  # (path, body or raw text, status, param)
    ("/v1/completions", '{"model": "bart", "prompt": ', 400, None),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "n": 0}, 400, "n"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"model": "nope", "prompt": TEXT}, 404, "model"),
    ("/v1/completions", {"model": "tiny.en", "prompt": TEXT}, 400, "model"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "maxtokens": 5}, 400, "maxtokens"),
    ("/v1/completions", {"model": "bart", "prompt": [[5] * 300]}, 400, "prompt"),
    ("/v1/completions", {"model": "bart", "prompt": [99999]}, 400, "prompt"),
    ("/v1/completions", {"model": "bart", "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "n": 2, "temperature": 0}, 400, "n"),  # greedy
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "n": 2, "best_of": 3, "temperature": 0}, 400, "best_of"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "n": 2, "best_of": 1}, 400, "best_of"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "logit_bias": {"7": 100.5}}, 400, "logit_bias"),
    ("/v1/completions", {"model": "bart", "prompt": [[5] * 257]}, 400, "prompt"),  # one past the encoder's 256
    # refused before a stream starts: a plain error, not an error event
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "stream": True, "stop_token_ids": [999999]}, 400,
     "stop_token_ids"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "echo": True}, 400, "echo"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "frequency_penalty": -3}, 400, "frequency_penalty"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "min_p": 1.5}, 400, "min_p"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "repetition_penalty": 1e-39}, 400, "repetition_penalty"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "allowed_token_ids": [99999]}, 400, "allowed_token_ids"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "allowed_token_ids": []}, 400, "allowed_token_ids"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "allowed_token_ids": [5] * (2**18 + 1)}, 400,
     "allowed_token_ids"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "seed": 2**64, "temperature": 1}, 400, "seed"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "prompt_logprobs": -1}, 400, "prompt_logprobs"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "prompt_logprobs": 1001}, 400, "prompt_logprobs"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "prompt_logprobs": 21}, 400, "prompt_logprobs"),  # vLLM's
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "logprobs": 21}, 400, "logprobs"),  # vLLM's --max-logprobs
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "truncate_prompt_tokens": 257}, 400,
     "truncate_prompt_tokens"),  # past the encoder's 256, as vLLM refuses one past the model's length
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "prompt_logprobs": 1, "stream": True}, 400,
     "prompt_logprobs"),
    ("/v1/summarize", {"model": "bart", "input": []}, 400, "input"),
    ("/v1/summarize", {"model": "bart", "input": " "}, 400, "input"),
    ("/v1/summarize", {"model": "bart", "input": TEXT * 40, "truncate": False}, 400, "input"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "min_tokens": 9, "max_tokens": 3}, 400, "min_tokens"),
    # past the decoder's room (256 positions): refused, as OpenAI and vLLM refuse it, not cut
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "max_tokens": 100000}, 400, "max_tokens"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "max_tokens": 257}, 400, "max_tokens"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "temperature": -1}, 400, "temperature"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "num_beams": 2, "temperature": 0.5}, 400, "temperature"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "seed": -2**63 - 1}, 400, "seed"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "top_k": -2}, 400, "top_k"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "top_p": 0}, 400, "top_p"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "num_beams": 2, "top_p": 0.5}, 400, "top_p"),
    # JSON's lone surrogates are not Unicode: refused before they reach a tokenizer or a reply
    ("/v1/completions", '{"model": "bart", "prompt": "ab\\ud800cd"}', 400, "prompt"),
    ("/v1/completions", '{"model": "bart", "prompt": "x", "decoder_prompt": "\\udfff"}', 400, "decoder_prompt"),
    ("/v1/completions", '{"model": "\\ud800", "prompt": "x"}', 400, "model"),
    ("/v1/summarize", '{"model": "bart", "input": ["ok", "\\ud800"]}', 400, "input"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "logit_bias": {"\u00b2": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "logit_bias": {"9" * 5000: 1}}, 400, "logit_bias"),
    # a field of several types is named alone (not pydantic's "prompt.list[int]")
    ("/v1/completions", {"model": "bart", "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"model": "bart", "prompt": ["a", 5]}, 400, "prompt"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "stop": [["a"]]}, 400, "stop"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "stop": ["a", ""]}, 400, "stop"),  # as vLLM
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "stop": [f"s{i}" for i in range(65)]}, 400, "stop"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "bad_words": ["w"] * 65}, 400, "bad_words"),
    ("/v1/summarize", {"model": "bart", "input": None}, 400, "input"),
    ("/v1/completions", '{"model": "bart", "prompt": "x", "temperature": NaN}', 400, "temperature"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "stream_options": {"include_usage": True}},
     400, "stream_options"),
    ("/v1/completions", "", 400, None),
    # JSON types as declared: no true for 1, no "yes" for true
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"model": "bart", "prompt": [True, False]}, 400, "prompt"),
    ("/v1/summarize", {"model": "bart", "input": TEXT, "stream": "yes"}, 400, "stream"),
    # unknown fields are named as sent, brackets and all
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "foo[]": 1}, 400, "foo[]"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "": 1}, 400, ""),
    # more samples than the server runs at once (--max-num-seqs 5): the field that asked
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "n": 2, "best_of": 6, "temperature": 1}, 400, "best_of"),
    ("/v1/completions", {"model": "bart", "prompt": TEXT, "n": 6, "temperature": 1}, 400, "n"),
]


def test_only_failed_requests_are_logged_with_disable_log_requests(server):
    """`--disable-log-requests`, as vLLM's: a request that fails still gets its log line (its id,
    method, path, status and time), one answered does not."""
    with server.http() as http:
        headers = {"X-Request-Id": "answered-1"}
        assert http.post("/v1/completions", headers=headers, json={"model": "bart", "prompt": TEXT,
                                                                     "max_tokens": 2}).status_code == 200
        assert_error(http.post("/v1/completions", headers={"X-Request-Id": "refused-1"},
                               json={"model": "nope", "prompt": TEXT}), 404, "model")
    output = server.wait_output(lambda output: "refused-1" in output)
    assert re.search(r"request refused-1: POST /v1/completions -> 404 in \d+\.\d{3} s$", output, re.MULTILINE)
    assert "answered-1" not in output


def test_bad_json_requests(server):
    with server.http() as http:
        for path, body, status, param in JSON_CASES:
            if isinstance(body, str):
                response = http.post(path, content=body, headers={"Content-Type": "application/json"})
            else:
                response = http.post(path, json=body)
            assert_error(response, status, param)
        wrong_type = http.post("/v1/completions", content=json.dumps({"model": "bart", "prompt": TEXT}),
                               headers={"Content-Type": "text/plain"})
        assert "application/json" in assert_error(wrong_type, 400, None)["message"]
        suffixed = http.post("/v1/completions", headers={"Content-Type": "application/vnd.api+json"},
                             content=json.dumps({"model": "bart", "prompt": TEXT, "max_tokens": 2}))
        assert suffixed.status_code == 200 and suffixed.json()["usage"]["completion_tokens"] == 2, suffixed.text
        too_long = http.post("/v1/summarize", json={"model": "bart", "input": TEXT * 40, "truncate": False})
        assert "256" in too_long.json()["error"]["message"]
        second = http.post("/v1/summarize", json={"model": "bart", "input": [TEXT, TEXT * 40], "truncate": False})
        assert assert_error(second, 400, "input")["message"].startswith("input 1: the text has ")
        many = http.post("/v1/completions", json={"model": "bart", "prompt": TEXT, "stop": ["a"] * 65})
        assert "at most 64 strings, got 65" in assert_error(many, 400, "stop")["message"]
        fits = http.post("/v1/completions", json={"model": "bart", "prompt": TEXT, "max_tokens": 2,
                                                  "stop": [f"{i}!" for i in range(64)]})
        assert fits.status_code == 200, fits.text
        union = http.post("/v1/completions", json={"model": "bart", "prompt": 5})
        assert "list[int], list[list[int]], str, list[str]" in union.json()["error"]["message"]
        beams = http.post("/v1/summarize", json={"model": "bart", "input": TEXT, "num_beams": 300})
        assert assert_error(beams, 400, "num_beams")["message"].startswith("num_beams=300 ")  # the API's name
        empty = http.post("/v1/completions", content="", headers={"Content-Type": "application/json"})
        assert "empty" in empty.json()["error"]["message"]
        huge = json.dumps({"model": "bart", "prompt": "x" * (MAX_UPLOAD_MB * 1024 * 1024)})
        assert "--max-upload-mb" in assert_error(http.post("/v1/completions", content=huge, headers={
            "Content-Type": "application/json"}), 413, None)["message"]
        # chunked, with no Content-Length: counted as it comes, and a small one still served
        chunks = [huge[i:i + 65536].encode() for i in range(0, len(huge), 65536)]
        assert "--max-upload-mb" in assert_error(http.post("/v1/completions", content=iter(chunks), headers={
            "Content-Type": "application/json"}), 413, None)["message"]
        small = json.dumps({"model": "bart", "prompt": TEXT, "max_tokens": 3}).encode()
        served = http.post("/v1/completions", content=iter([small[:10], small[10:]]),
                           headers={"Content-Type": "application/json"})
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 3


AUDIO_CASES = [  # (files, form fields, status, param)
    ({"file": ("empty.wav", b"", "audio/wav")}, {}, 400, "file"),
    ({"file": ("notes.wav", b"just some text, not audio\n" * 20, "audio/wav")}, {}, 400, "file"),
    ({"file": ("long.wav", wav_bytes(6.0), "audio/wav")}, {}, 400, "file"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"response_format": "xml"}, 400, "response_format"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"timestamp_granularities[]": "word"},
     400, "timestamp_granularities[]"),  # words come in verbose_json only
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"beam_size": "0"}, 400, "beam_size"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"patience": "2"}, 400, "patience"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"vad_filter": "maybe"}, 400, "vad_filter"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")},
     {"temperature_increment_on_fallback": "-0.5"}, 400, "temperature_increment_on_fallback"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")},
     {"hallucination_silence_threshold": "1", "response_format": "verbose_json"}, 400,
     "hallucination_silence_threshold"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"language": "fr"}, 400, "language"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"temperature": "3"}, 400, "temperature"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"model": "bart"}, 400, "model"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"colour": "blue"}, 400, "colour"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"include[]": "logprobs"}, 400, "include[]"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"chunking_strategy": "fixed"}, 400,
     "chunking_strategy"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")},
     {"chunking_strategy[type]": "server_vad", "chunking_strategy[threshold]": "1.5"}, 400,
     "chunking_strategy.threshold"),  # the object member's own field
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")},
     {"chunking_strategy[type]": "server_vad", "chunking_strategy[colour]": "red"}, 400, "chunking_strategy.colour"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")},
     {"chunking_strategy": "auto", "chunking_strategy[type]": "server_vad"}, 400, "chunking_strategy"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")},
     {"chunking_strategy": '{"type": "server_vad", "threshold": 1.5}'}, 400, "chunking_strategy.threshold"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"chunking_strategy": '{"type": '}, 400,
     "chunking_strategy"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")},
     {"response_format": "verbose_json", "timestamp_granularities[]": "bogus"}, 400, "timestamp_granularities[]"),
    ({"other": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {}, 400, "file"),
    ({"file": ("big.wav", b"\0" * (MAX_UPLOAD_MB * 1024 * 1024 + 1), "audio/wav")}, {}, 413, "file"),
    # the limit is the file's, not the request's: one of exactly that size is read (and is no audio)
    ({"file": ("at_limit.wav", b"\0" * (MAX_UPLOAD_MB * 1024 * 1024), "audio/wav")},
     {"prompt": "words " * 1000}, 400, "file"),
    # more samples than --max-audio-seconds at 48 kHz: from the header, or counted while decoding
    ({"file": ("dense.flac", dense_audio("flac"), "audio/flac")}, {}, 400, "file"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"temperature": "nan"}, 400, "temperature"),
    # more beams or fallback samples than the server runs at once (--max-num-seqs 5)
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"beam_size": "6"}, 400, "beam_size"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"best_of": "6", "temperature": "0.5"},
     400, "best_of"),
    # options against the model and the engine are checked before the upload is decoded
    ({"file": ("notes.wav", b"not audio\n" * 20, "audio/wav")}, {"language": "fr"}, 400, "language"),
    ({"file": ("notes.wav", b"not audio\n" * 20, "audio/wav")}, {"beam_size": "6"}, 400, "beam_size"),
    # a prompt is plain text: one that spells a special token is refused (openai-whisper)
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"prompt": "Hi <|endoftext|>"}, 400, "prompt"),
    ({"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")}, {"language": ["en", "en"]}, 400, "language"),
]


def test_null_fields_take_their_defaults(server):
    """OpenAI's nullable fields: null is the default, not a type error."""
    nulls = {"presence_penalty": None, "frequency_penalty": None, "echo": None, "stream": None,
             "n": None, "stream_options": None, "max_tokens": None}
    with server.http() as http:
        plain = http.post("/v1/completions", json={"model": "bart", "prompt": TEXT})
        nulled = http.post("/v1/completions", json={"model": "bart", "prompt": TEXT, **nulls})
        assert nulled.status_code == 200, nulled.text
        assert nulled.json()["choices"] == plain.json()["choices"]
        summary = http.post("/v1/summarize", json={"model": "bart", "input": TEXT, "truncate": None,
                                                   "stream": None})
        assert summary.status_code == 200 and summary.json()["summaries"][0]["text"]


def test_an_uploaded_playlist_reads_none_of_the_servers_files(server, tmp_path):
    """An FFmpeg concat playlist uploaded as audio names a file beside the server's temporary
    copy of the upload: a 400, not that file's transcript."""
    shutil.copy(SAMPLE, tmp_path / "hello.wav")
    beside = os.path.relpath(tmp_path / "hello.wav", tempfile.gettempdir())
    assert not beside.startswith("..")  # within reach of concat's safe mode
    playlist = f"ffconcat version 1.0\nfile '{beside}'\n".encode()
    with server.http() as http:
        response = http.post("/v1/audio/transcriptions", data={"model": "tiny.en"},
                             files={"file": ("clip.wav", playlist, "audio/wav")})
        assert "not a readable audio file" in assert_error(response, 400, "file")["message"]


def test_bad_audio_requests(server):
    with server.http() as http:
        for files, fields, status, param in AUDIO_CASES:
            response = http.post("/v1/audio/transcriptions", files=files, data={"model": "tiny.en", **fields})
            assert_error(response, status, param)
        # the form's other fields: at most 32, of at most 1 MiB each (starlette does not say which)
        for fields, message in (({f"x{i}": "1" for i in range(32)}, "the form has more than 32 fields"),
                                ({"prompt": "a" * (1 << 20) + "a"},
                                 "a form field is larger than 1 MiB, the limit of each field other than the file")):
            response = http.post("/v1/audio/transcriptions", files={"file": ("hello.wav", SAMPLE.read_bytes())},
                                 data={"model": "tiny.en", **fields})
            assert assert_error(response, 400, None)["message"] == message
        assert http.post("/v1/audio/transcriptions", files={"file": ("hello.wav", SAMPLE.read_bytes())},
                         data={"model": "tiny.en", "prompt": "a" * (1 << 20)}).status_code == 200
        as_json = http.post("/v1/audio/transcriptions", json={"model": "tiny.en"})
        assert "multipart/form-data" in assert_error(as_json, 400, None)["message"]
        # counted while decoding (libsndfile reads no M4A header): past 5 s of 48 kHz samples in
        # 3 s of 96 kHz audio (a lower rate would pass), or in 7 s of 48 kHz (too long at any rate)
        dense = http.post("/v1/audio/transcriptions", data={"model": "tiny.en"},
                          files={"file": ("dense.m4a", dense_audio("mp4"), "audio/mp4")})
        assert assert_error(dense, 400, "file")["message"].endswith("send it at a lower sample rate")
        tone = (np.sin(np.arange(7 * 48000) * 0.05) * 0.1).astype(np.float32)
        long = http.post("/v1/audio/transcriptions", data={"model": "tiny.en"},
                         files={"file": ("long.m4a", av_encoded(tone, 48000, "mp4", "aac"), "audio/mp4")})
        assert assert_error(long, 400, "file")["message"] == (
            "long.m4a: the audio is longer than the server's limit of 5 s (--max-audio-seconds)")
        two_files = http.post("/v1/audio/transcriptions", data={"model": "tiny.en"},
                              files=[("file", ("a.wav", SAMPLE.read_bytes())), ("file", ("b.wav", SAMPLE.read_bytes()))])
        assert_error(two_files, 400, "file")
        translation = http.post("/v1/audio/translations", data={"model": "tiny.en"},
                                files={"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")})
        assert "English-only" in assert_error(translation, 400, "model")["message"]
        # translations take no word timings (as OpenAI's), so nothing that needs them
        hallucinations = http.post("/v1/audio/translations", data={"model": "tiny.en", "hallucination_silence_threshold": "1"},
                                   files={"file": ("hello.wav", SAMPLE.read_bytes(), "audio/wav")})
        assert_error(hallucinations, 400, "hallucination_silence_threshold")


def test_a_form_cut_short_is_named(server):
    """A multipart body that ends before its closing boundary (the client stopped sending) is
    refused as such, not as a form without a file."""
    boundary = "xyz"
    whole = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ntiny.en\r\n"
             f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
             "Content-Type: audio/wav\r\n\r\n").encode() + SAMPLE.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    with server.http() as http:
        for cut in (whole[:-len(f"--{boundary}--\r\n")], whole[:len(whole) // 2]):
            response = http.post("/v1/audio/transcriptions", content=cut, headers=headers)
            assert assert_error(response, 400, "file")["message"] == (
                "the multipart form is cut short: it ends before its closing boundary")
        epilogue = b"an epilogue, which RFC 2046 lets a form carry and tells receivers to ignore\r\n" * 3
        for complete in (whole, whole + epilogue):
            assert http.post("/v1/audio/transcriptions", content=complete, headers=headers).status_code == 200


@pytest.mark.parametrize("size, status", [(3 * MAX_UPLOAD_MB << 20, 413), ((MAX_UPLOAD_MB << 20) + 1, 413),
                                          (MAX_UPLOAD_MB << 20, 400)])  # 3x the limit; just over; at it
def test_upload_limit_without_content_length(server, size, status):
    """A chunked upload is cut off by the counting reader once it passes the limit (also when
    its last byte passes it). The limit is the file's (as OpenAI's): a file of exactly that size
    passes, to be refused as audio that cannot be decoded."""
    boundary = "xyz"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\ntiny.en\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode()

    def body():
        yield head
        for start in range(0, size, 65536):  # 64 KiB at a time
            yield b"\0" * min(65536, size - start)
        yield f"\r\n--{boundary}--\r\n".encode()

    with server.http() as http:
        response = http.post("/v1/audio/transcriptions", content=body(),
                             headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert_error(response, status, "file")


def requests_counted(server, endpoint: str, status: int) -> float:
    return server.metrics().get(("encdec_http_requests_total", (("endpoint", endpoint), ("status", str(status)))), 0.0)


def test_api_key(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    before = requests_counted(server, "/v1/models/{model_id:path}", 401)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}, {"Authorization": "Bearer"},
                    {"Authorization": f"Bearer {API_KEY[:-1]}"}, {"Authorization": f"Bearer {API_KEY}x"}):
        assert_error(httpx.get(f"{server.url}/v1/models", headers=headers), 401, None)
    assert_error(httpx.get(f"{server.url}/v1/models/bart"), 401, None)
    # two Authorization headers: refused, whichever holds the key
    for first, second in ((API_KEY, "wrong"), ("wrong", API_KEY), (API_KEY, API_KEY)):
        headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
        assert_error(httpx.get(f"{server.url}/v1/models", headers=headers), 401, None)
    # refused before routing, still counted under its endpoint (an unknown path: "unmatched")
    assert requests_counted(server, "/v1/models/{model_id:path}", 401) == before + 1
    assert requests_counted(server, "/v1/models", 401) >= 9
    unknown = requests_counted(server, "unmatched", 401)
    assert_error(httpx.get(f"{server.url}/v1/nothing"), 401, None)
    assert requests_counted(server, "unmatched", 401) == unknown + 1
    # a browser's CORS preflight carries no key: it is answered before the key is asked for
    origin = {"Origin": "https://app.example.com"}
    preflight = httpx.options(f"{server.url}/v1/completions", headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "*"
    listed = httpx.get(f"{server.url}/v1/models", headers={**origin, "Authorization": f"Bearer {API_KEY}"})
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == "*"
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()


def test_a_clients_request_id_comes_back(server):
    """A client's X-Request-Id names its request in the answer (errors too); one that is not a
    plain id is replaced by the server's own."""
    with server.http() as http:
        for path, status in (("/v1/models", 200), ("/v1/models/nope", 404)):
            answer = http.get(path, headers={"X-Request-Id": "client-42.a_b"})
            assert (answer.status_code, answer.headers["x-request-id"]) == (status, "client-42.a_b")
        replaced = http.get("/v1/models", headers={"X-Request-Id": "two words"}).headers["x-request-id"]
    assert replaced not in ("", "two words")


def test_openai_client_errors(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=TEXT)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="bart", prompt=TEXT, max_tokens=-1)
    assert caught.value.body["param"] == "max_tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_overloaded_queue_answers_429(server, stream):
    """Refused before a stream starts too: a plain 429, not an error event."""
    async def burst():
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120) as http:
            # each over a second and a half of decoding: all 16 arrive while the first run
            body = {"model": "bart", "prompt": TEXT, "stream": stream, **LONG, "min_tokens": 250, "max_tokens": 250}
            return await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(16)))

    responses = asyncio.run(burst())
    statuses = sorted(r.status_code for r in responses)
    assert 429 in statuses and set(statuses) <= {200, 429}, statuses
    # refused only past the batch's places (--max-num-seqs 5) and the queue's (2)
    assert statuses.count(200) >= 7, statuses
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.headers["retry-after"] == "1"
    assert_error(refused, 429, None)
    answered = [r for r in responses if r.status_code == 200]
    assert all(r.text.endswith("data: [DONE]\n\n") if stream else r.json()["choices"] for r in answered)


@pytest.mark.parametrize("stream", [False, True])
def test_audio_past_the_limit_in_flight_answers_429(server, stream):
    """--max-audio-seconds-in-flight 8: of six 4.5 s uploads at once, one is transcribed at a
    time and those that come while it runs get 429 (a plain one, also where a stream was asked
    for); the audio is counted off when a transcription ends, so a lone upload is taken after.
    (The six are read and decoded in milliseconds; a transcription of 4.5 s takes a few tenths
    of a second at least: here five of six were refused, run after run.)"""
    audio = wav_bytes(4.5)

    async def burst():
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120) as http:
            return await asyncio.gather(*(
                http.post("/v1/audio/transcriptions", files={"file": (f"{i}.wav", audio, "audio/wav")},
                          data={"model": "tiny.en", "stream": str(stream).lower()}) for i in range(6)))

    responses = asyncio.run(burst())
    statuses = sorted(r.status_code for r in responses)
    assert 429 in statuses and set(statuses) == {200, 429}, statuses
    refused = next(r for r in responses if r.status_code == 429)
    assert assert_error(refused, 429, "file")["code"] == "audio_in_flight"
    assert refused.headers["retry-after"] == "5"
    assert "4.5 s more would pass its limit of 8 s in flight (--max-audio-seconds-in-flight)" in refused.text
    answered = [r for r in responses if r.status_code == 200]
    assert all(r.text.endswith("data: [DONE]\n\n") if stream else "text" in r.json() for r in answered)
    with server.http() as http:
        alone = http.post("/v1/audio/transcriptions", files={"file": ("alone.wav", audio, "audio/wav")},
                          data={"model": "tiny.en"})
    assert alone.status_code == 200, alone.text
    assert server.metrics()[("encdec_audio_seconds_in_flight", ())] == 0


def test_a_stated_length_is_counted_in_flight_before_the_upload_decodes(server):
    """A FLAC cut to its first second still states 4.5 s in its header. Beside a 4.5 s upload
    being transcribed (--max-audio-seconds-in-flight 8) it is refused for the 4.5 s it states,
    before it is decoded: decoded, its second would have fitted."""
    flac = io.BytesIO()
    soundfile.write(flac, np.random.default_rng(1).normal(0, 0.1, 72000).astype(np.float32), 16000, format="FLAC")
    cut = flac.getvalue()[:len(flac.getvalue()) // 4]
    in_flight = ("encdec_audio_seconds_in_flight", ())

    def transcribe(name: str, audio: bytes) -> httpx.Response:
        with server.http() as http:
            return http.post("/v1/audio/transcriptions", files={"file": (name, audio, "audio/wav")},
                             data={"model": "tiny.en", "timestamp_granularities[]": "word",
                                   "response_format": "verbose_json"})

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for _ in range(5):  # until the cut one comes while the first is seen in flight
            first = pool.submit(transcribe, "first.wav", wav_bytes(4.5))
            while server.metrics()[in_flight] != 4.5 and not first.done():
                time.sleep(0.005)
            refused = None if first.done() else transcribe("cut.flac", cut)
            assert first.result().status_code == 200, first.result().text
            if refused is not None and refused.status_code == 429:
                break
    assert refused is not None, "the first upload was never seen in flight"
    assert assert_error(refused, 429, "file")["code"] == "audio_in_flight"
    assert ("cut.flac: the server is transcribing 4.5 s of audio already, and 4.5 s more would pass its limit "
            "of 8 s in flight") in refused.text
    alone = transcribe("cut.flac", cut)
    assert alone.status_code == 200 and 1.0 < alone.json()["duration"] < 1.1, alone.text
    assert server.metrics()[in_flight] == 0


def generated_tokens(server) -> float:
    return server.metrics().get(("encdec_generation_tokens_total", (("model", "bart"),)), 0.0)


def left(server, endpoint: str) -> float:
    """Requests to `endpoint` counted as 499: the client left before the end of the response."""
    return server.metrics().get(("encdec_http_requests_total", (("endpoint", endpoint), ("status", "499"))), 0.0)


def wait_for(condition, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)


def aborted(server) -> float:
    """The engine's requests stopped before they finished."""
    return server.metrics().get(("encdec_num_aborted_requests_total", (("model", "bart"),)), 0.0)


def test_disconnects_abort_their_requests(server):
    # two prompts of 250 tokens (no more: max_waiting_requests=2): over a second of decoding
    body = {"model": "bart", "prompt": [TEXT] * 2, "min_tokens": 250, "max_tokens": 250, "temperature": 0}
    whole = 2 * 250
    before, left_before, aborted_before = generated_tokens(server), left(server, "/v1/completions"), aborted(server)
    with pytest.raises(httpx.ReadTimeout):  # not streamed: the client gives up waiting
        httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=0.3)
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True},
                      headers=server.headers, timeout=30) as response:
        next(response.iter_lines())  # streamed: leave after the first event
    server.wait_all_blocks_free()
    assert generated_tokens(server) - before < 2 * whole  # both were cut short
    assert aborted(server) == aborted_before + 4  # in the engine: each request's two prompts
    wait_for(lambda: left(server, "/v1/completions") == left_before + 2)
    assert left(server, "/v1/completions") == left_before + 2  # the stream cut short counts too


def test_a_stream_cut_with_a_request_pipelined_behind_it(server):
    """The client closes its connection mid-stream with a second request already sent on it:
    a 499, the blocks free, no traceback in the server's log."""
    def request(path: str, body: dict) -> bytes:
        data = json.dumps(body).encode()
        return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data

    before = left(server, "/v1/summarize")
    stream = {"model": "bart", "input": [TEXT] * 2, "stream": True, **LONG}
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request("/v1/summarize", stream) + request("/v1/completions", {"model": "bart", "prompt": TEXT}))
        received = b""
        while b"data: " not in received:
            received += sock.recv(4096)
    server.wait_all_blocks_free()
    wait_for(lambda: left(server, "/v1/summarize") == before + 1)
    assert left(server, "/v1/summarize") == before + 1
    assert "Traceback" not in server.output()


def test_many_prompts_are_taken_together(server):
    """More prompts than --max-waiting-requests (2) in one request: admitted as one job."""
    result = server.client().completions.create(model="bart", prompt=[TEXT] * 3, max_tokens=2, temperature=0)
    assert len(result.choices) == 3
    with server.http() as http:
        summaries = http.post("/v1/summarize", json={"model": "bart", "input": [TEXT] * 3, "max_tokens": 2})
    assert summaries.status_code == 200 and len(summaries.json()["summaries"]) == 3
    server.wait_all_blocks_free()


def test_a_client_leaving_mid_upload_is_counted_499(server):
    def leaving_uploads() -> float:
        return server.metrics().get(("encdec_http_requests_total", (
            ("endpoint", "/v1/audio/transcriptions"), ("status", "499"))), 0.0)

    before = leaving_uploads()
    head = ("POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: 100000\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n\r\n"
            '--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n')
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head.encode() + b"\0" * 1024)  # then leave, 99 KB short
    deadline = time.monotonic() + 10
    while leaving_uploads() == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leaving_uploads() == before + 1
    assert "500" not in {status for (name, labels), _ in server.metrics().items()
                         if name == "encdec_http_requests_total" for key, status in labels if key == "status"}


def test_a_client_leaving_mid_json_body_is_counted_499(server):
    """Not a 400 for the JSON it never finished sending."""
    before = requests_counted(server, "/v1/completions", 499), requests_counted(server, "/v1/completions", 400)
    body = json.dumps({"model": "bart", "prompt": TEXT, "max_tokens": 2}).encode()
    head = ("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n"
            "Content-Type: application/json\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head.encode() + body[:-10])  # then leave, 10 bytes short
    wait_for(lambda: requests_counted(server, "/v1/completions", 499) > before[0])
    assert (requests_counted(server, "/v1/completions", 499),
            requests_counted(server, "/v1/completions", 400)) == (before[0] + 1, before[1])


@pytest.mark.parametrize("path, content_type, part", [
    ("/v1/completions", "application/json", b'{"model": "bart", "prompt": "'),
    ("/v1/audio/transcriptions", "multipart/form-data; boundary=b",
     b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF'),
])
def test_a_stalled_body_gets_408(server, path, content_type, part):
    """A client that stops sending its body (and stays connected) is answered once the body has
    been silent for --request-body-timeout seconds, in OpenAI's shape."""
    before = requests_counted(server, path, 408)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Length: 10000\r\nContent-Type: {content_type}\r\n\r\n")
    status_line, error, waited = stalled_exchange(server, head.encode() + part)
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    assert error["code"] == "request_timeout" and "--request-body-timeout" in error["message"]
    assert BODY_TIMEOUT <= waited < BODY_TIMEOUT + 20
    wait_for(lambda: requests_counted(server, path, 408) == before + 1)


@pytest.mark.parametrize("path, content_type, part", [
    ("/v1/completions", "application/json", b'{"model": "bart", "prompt": "'),
    ("/v1/audio/transcriptions", "multipart/form-data; boundary=b",
     b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF'),
])
def test_a_trickled_body_gets_408(server, path, content_type, part):
    """A client that sends its body a byte a second or so is never silent for
    --request-body-timeout seconds, but it is slower than 500 bytes a second: it is answered
    once that time has passed with too little of its body."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Length: 10000\r\nContent-Type: {content_type}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=1) as sock:
        start = time.monotonic()
        sock.sendall(head.encode() + part)
        response = b""
        while not response and time.monotonic() - start < BODY_TIMEOUT + 20:
            sock.sendall(b"a")
            with contextlib.suppress(socket.timeout):
                response = sock.recv(65536)
        waited = time.monotonic() - start
        response += read_to_end(sock)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout"), response
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert re.fullmatch(r"the request body came too slowly: \d+ bytes in \d+ s, less than 500 bytes a "
                        r"second after the first 4 s \(--request-body-timeout\)", error["message"]), error
    assert BODY_TIMEOUT <= waited < BODY_TIMEOUT + 20


@pytest.mark.parametrize("sent", ["nothing", "a head", "a response, then a head"])
def test_a_request_head_that_never_ends_is_closed(server, sent):
    """A connection that sends nothing, or a header line a second, never ending its request's
    head, is closed --request-header-timeout seconds after it opened (or after its first
    request's response ended); uvicorn alone keeps it open."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=0.5) as sock:
        if sent == "a response, then a head":
            sock.settimeout(30)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while not answer.endswith(b"}"):
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 OK"), answer
            sock.settimeout(0.5)
        start = time.monotonic()
        line = b"" if sent == "nothing" else b"X-Padding: a\r\n"
        if line:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n".encode())
        closed = False
        while not closed and time.monotonic() - start < HEADER_TIMEOUT + 10:
            try:
                sock.sendall(line)
                closed = sock.recv(65536) == b""
            except socket.timeout:
                time.sleep(0.5)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        waited = time.monotonic() - start
    assert closed and HEADER_TIMEOUT - 1.5 <= waited < HEADER_TIMEOUT + 10, waited


def read_to_end(sock: socket.socket) -> bytes:
    """What the server still sends before it closes the connection or goes quiet for a second."""
    data = b""
    with contextlib.suppress(socket.timeout):
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize("path, content_type", [
    ("/v1/completions", "application/json"),
    ("/v1/completions", "multipart/form-data; boundary=b"),  # not a route that reads a form
    ("/v1/audio/transcriptions", "multipart/form-data; boundary=b"),
])
def test_a_body_over_the_limit_gets_413_though_it_then_stalls(server, path, content_type):
    """A chunked body past the limit (with the form's room, 1 MiB) is refused with 413, and a
    client that then stops sending gets that 413, not a 408; a multipart body is limited on
    every route, not only where a form is read."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Transfer-Encoding: chunked\r\nContent-Type: {content_type}\r\n\r\n")
    data = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
            + b"\0" * ((MAX_UPLOAD_MB + 2) << 20))
    status_line, error, _ = stalled_exchange(server, head.encode() + f"{len(data):x}\r\n".encode() + data + b"\r\n")
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large", error
    assert "--max-upload-mb" in error["message"]


def stalled_exchange(server, sent: bytes) -> tuple[bytes, dict, float]:
    """Send `sent` and stall (connected); the response's status line, its error and the wait."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=BODY_TIMEOUT + 30) as sock:
        start = time.monotonic()
        sock.sendall(sent)
        response = b""
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            response += chunk
    status_line, _, rest = response.partition(b"\r\n")
    return status_line, json.loads(rest.partition(b"\r\n\r\n")[2])["error"], time.monotonic() - start


def test_still_serving_after_errors(server, tiny_bart_dir):
    """After the bad requests above, both models answer as the offline LLM does."""
    [expected] = LLM(str(tiny_bart_dir), num_gpu_blocks=256).generate(
        TEXT, SamplingParams(temperature=0.0, max_tokens=8, config_per_field=True), use_tqdm=False)[0].outputs
    result = server.client().completions.create(model="bart", prompt=TEXT, max_tokens=8, temperature=0, logprobs=0,
                                                extra_body={"return_tokens_as_token_ids": True})
    assert result.choices[0].text == expected.text
    assert result.choices[0].logprobs.tokens == [f"token_id:{t}" for t in expected.token_ids]
    transcript = LLM("tiny.en", num_gpu_blocks=256).transcribe(str(SAMPLE))[0]
    with open(SAMPLE, "rb") as audio:
        assert server.client().audio.transcriptions.create(model="tiny.en", file=audio).text == transcript.text
    server.wait_all_blocks_free()


def test_sigterm_drains_then_exits(tiny_bart_dir):
    """Requests in flight finish; one that comes meanwhile gets 503 (not a scrape of /metrics);
    then the process ends."""
    remote = RemoteServer(["--model", str(tiny_bart_dir), "--served-model-name", "bart",
                           "--num-gpu-blocks", "256", "--max-num-seqs", "1"])
    body = {"model": "bart", "prompt": TEXT, "stream": True, **LONG}

    async def drain() -> tuple[list[list[str]], httpx.Response]:
        async with httpx.AsyncClient(base_url=remote.url, timeout=60) as http:
            async def stream() -> list[str]:
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    return [line async for line in response.aiter_lines() if line.startswith("data: ")]

            streams = [asyncio.ensure_future(stream()) for _ in range(3)]
            while sum(v for (name, _), v in remote.metrics().items() if name in (
                    "encdec_num_requests_running", "encdec_num_requests_waiting")) < 3:
                await asyncio.sleep(0.02)
            remote.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while (refused := await http.get("/v1/models")).status_code == 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # until the signal is handled
            scraped = await http.get("/metrics")  # a scrape may watch the drain
            return await asyncio.gather(*streams), refused, scraped

    try:
        events, refused, scraped = asyncio.run(drain())
        assert_error(refused, 503, None)
        assert scraped.status_code == 200 and "encdec_num_requests_running" in scraped.text
        assert all(e[-1] == "data: [DONE]" and '"finish_reason":"length"' in e[-2] for e in events)
        assert remote.proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "refusing new requests" in remote.output()
    finally:
        remote.stop()


def test_what_the_shutdown_timeout_cuts_off_gets_openai_errors(tiny_bart_dir):
    """Past --shutdown-timeout, a request not yet answered gets a 503 in OpenAI's shape and a
    stream under way a last error event (not uvicorn's plain-text 500, not a cut connection)."""
    remote = RemoteServer(["--model", str(tiny_bart_dir), "--served-model-name", "bart",
                           "--num-gpu-blocks", "2048", "--max-num-seqs", "64", "--shutdown-timeout", "1"])
    # 3 s of decoding after its first event here (on one thread), well past the 1 s uvicorn
    # waits before it cancels what is left
    long_stream = {"model": "bart", "prompt": TEXT, "stream": True, "n": 64, "temperature": 1.0, "seed": 0,
                   "min_tokens": 250, "max_tokens": 250}

    async def cut_off() -> tuple[list[str], httpx.Response]:
        async with httpx.AsyncClient(base_url=remote.url, timeout=60) as http:
            started = asyncio.Event()

            async def stream() -> list[str]:
                async with http.stream("POST", "/v1/completions", json=long_stream) as response:
                    events = []
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line)
                            started.set()
                    return events

            streamed = asyncio.ensure_future(stream())
            await started.wait()
            queued = asyncio.ensure_future(http.post("/v1/completions", json={"model": "bart", "prompt": TEXT, **LONG}))
            while not remote.metrics().get(("encdec_num_requests_waiting", (("model", "bart"),))):
                await asyncio.sleep(0.02)
            remote.proc.send_signal(signal.SIGTERM)
            return await streamed, await queued

    try:
        events, queued = asyncio.run(cut_off())
        assert assert_error(queued, 503, None)["code"] == "shutting_down"
        assert events[-1] == "data: [DONE]"  # after the error, as vLLM ends a stream that failed
        last = json.loads(events[-2].removeprefix("data: "))["error"]
        assert (last["type"], last["code"]) == ("server_error", "shutting_down"), last
        assert remote.proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Internal Server Error" not in remote.output()
        # uvicorn's cancel of what is left is what the timeout is for: a warning
        assert "WARNING uvicorn.error: Cancel " in remote.output()
        assert " ERROR " not in remote.output()
        assert "POST /v1/completions -> 503 (an error event ending its stream) in " in remote.output()
    finally:
        remote.stop()


# loaded by the server's interpreter at start (PYTHONPATH): while the file exists, a step hangs
HANGING_STEP = """
import os, time
from encdec.engine import llm_engine
step = llm_engine.LLMEngine.step
def hanging_step(self, *args, **kwargs):
    if os.path.exists({hang!r}):
        open({hang!r} + ".stepping", "w").close()
        time.sleep(120)
    return step(self, *args, **kwargs)
llm_engine.LLMEngine.step = hanging_step
"""


def test_a_second_signal_stops_at_once(tiny_bart_dir, tmp_path, monkeypatch):
    """A step that does not end (a hung device): after Ctrl-C the server waits for it; a second
    Ctrl-C ends the process at once (exit status 130), without a traceback."""
    hang = tmp_path / "hang"
    (tmp_path / "sitecustomize.py").write_text(HANGING_STEP.format(hang=str(hang)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    remote = RemoteServer(["--model", str(tiny_bart_dir), "--served-model-name", "bart",
                           "--num-gpu-blocks", "256", "--shutdown-timeout", "1"])
    try:
        hang.touch()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(httpx.post, remote.url + "/v1/completions", json={"model": "bart", "prompt": TEXT},
                        timeout=30)
            deadline = time.monotonic() + 30
            while not os.path.exists(f"{hang}.stepping"):  # the request's step hangs
                assert time.monotonic() < deadline
                time.sleep(0.05)
            remote.proc.send_signal(signal.SIGINT)
            time.sleep(3)
            assert remote.proc.poll() is None  # waiting for the step
            remote.proc.send_signal(signal.SIGINT)
            start = time.monotonic()
            assert remote.proc.wait(timeout=30) == 128 + signal.SIGINT
            assert time.monotonic() - start < 3
            assert "SIGINT again: stopping at once" in remote.output() and "Traceback" not in remote.output()
    finally:
        remote.stop()


def test_model_that_fails_to_load_stops_start_up(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a checkpoint directory, of no model
    done = subprocess.run([sys.executable, "-m", "encdec", "serve", "--model", str(tmp_path), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"encdec: error: cannot load model '{tmp_path}'" in done.stderr
    # the engine's refusal of its options, in the command line's spelling
    done = subprocess.run([sys.executable, "-m", "encdec", "serve", "--model", "tiny.en", "--num-gpu-blocks", "50",
                           "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "encdec: error: cannot load model 'tiny.en': ValueError: --num-gpu-blocks=50: the KV cache cannot "
        "hold one Whisper window, whose 1500 encoder positions and 448 decoder positions need 122 blocks of 16 "
        "tokens")


@pytest.mark.parametrize("ray", [[], ["--ray"]])
def test_a_model_that_is_not_there_is_refused_before_the_server_starts(monkeypatch, tmp_path, capsys, ray):
    from encdec.entrypoints import cli
    from encdec.entrypoints.openai import api_server
    from encdec.entrypoints.ray import serve

    for module, name in ((api_server, "run_server"), (serve, "run_ray_server")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("the server started"))
    missing = tmp_path / "missing"
    assert cli.main(["serve", *ray, "--model", "tiny.en", "--model", str(missing)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"encdec: error: --model '{missing}' is neither a bundled Whisper model (tiny.en, base) nor a "
        f"local checkpoint directory: no such directory"]


def test_an_unknown_route_or_method_is_named_with_what_the_server_has():
    """vLLM's own routes (/tokenize, chat) and a wrong method: a 404 or 405 in OpenAI's shape
    that names the request and the routes, or the methods, the server has."""
    app = build_app(ServedModels([]), ServerState())

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            return [await http.request(method, path) for method, path in (
                ("POST", "/tokenize"), ("POST", "/v1/chat/completions"), ("GET", "/v1/completions"),
                ("POST", "/health"), ("GET", "/openapi.json"), ("POST", "/openapi.json"))]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI's warning of an operation id used twice
        tokenize, chat, get, post, schema, post_schema = asyncio.run(run())
    assert (post.status_code, post.headers["allow"]) == (405, "GET, HEAD")  # of the GET and HEAD routes
    assert post.json()["error"]["message"] == "POST /health: the method is not allowed there; use GET, HEAD"
    assert schema.json()["paths"]["/health"].keys() == {"get"}
    assert (post_schema.status_code, post_schema.headers["allow"]) == (405, "GET, HEAD")  # a route of FastAPI's own
    routes = ("/health, /metrics, /v1/audio/transcriptions, /v1/audio/translations, /v1/completions, "
              "/v1/models, /v1/models/{model_id}, /v1/summarize, /version")
    assert (tokenize.status_code, tokenize.json()["error"]["message"]) == (
        404, f"POST /tokenize: no such route; this server serves {routes}")
    assert chat.json()["error"]["message"].startswith("POST /v1/chat/completions: no such route;")
    assert (get.status_code, get.headers["allow"], get.json()["error"]) == (405, "POST", {
        "message": "GET /v1/completions: the method is not allowed there; use POST",
        "type": "invalid_request_error", "param": None, "code": None})


def test_dead_engine_makes_health_503(tiny_bart_dir, monkeypatch):
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=64)
    app = build_app(ServedModels([ServedModel("bart", str(tiny_bart_dir), engine)]), ServerState())

    def broken_step():
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.engine, "step", broken_step)

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            failed = await http.post("/v1/completions", json={"model": "bart", "prompt": TEXT})
            health = await http.get("/health")
            refused = await http.post("/v1/completions", json={"model": "bart", "prompt": TEXT})
        await engine.shutdown()
        return failed, health, refused

    failed, health, refused = asyncio.run(run())
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "engine_dead"
    assert_error(health, 503, None)
    assert_error(refused, 503, "model")


def test_an_engine_that_dies_mid_stream_ends_it_with_engine_dead(tiny_bart_dir, monkeypatch):
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=64)
    app = build_app(ServedModels([ServedModel("bart", str(tiny_bart_dir), engine)]), ServerState())
    step, steps = engine.engine.step, []

    def step_then_fail():
        steps.append(1)
        if len(steps) > 3:
            raise RuntimeError("device lost")
        return step()

    monkeypatch.setattr(engine.engine, "step", step_then_fail)

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            async with http.stream("POST", "/v1/completions", json={"model": "bart", "prompt": TEXT, "stream": True,
                                                                    **LONG}) as response:
                events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
            metrics = (await http.get("/metrics")).text
        await engine.shutdown()
        return response.status_code, events, metrics

    status, events, metrics = asyncio.run(run())
    assert status == 200 and events[-1] == "data: [DONE]" and len(events) >= 3
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_dead")
    assert error["message"].startswith("the engine failed") and "device lost" in error["message"], error
    counted = {dict(labels)["status"]: value for (name, labels), value in metric_samples(metrics).items()
               if name == "encdec_http_requests_total" and dict(labels)["endpoint"] == "/v1/completions"}
    assert counted == {"500": 1.0}  # the error event's status, not the status line's


def test_each_models_series_start_at_zero(tiny_bart_dir):
    """Before any request, /metrics has each model's counters and histograms at 0 (a rate over
    them is 0, not missing); audio seconds only for a Whisper model."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=64)
    app = build_app(ServedModels([ServedModel("bart", str(tiny_bart_dir), engine)]), ServerState())

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            text = (await http.get("/metrics")).text
        await engine.shutdown()
        return text

    lines = asyncio.run(run()).splitlines()
    for sample in ("encdec_prompt_tokens_total", "encdec_generation_tokens_total",
                   "encdec_time_to_first_token_seconds_count"):
        assert f'{sample}{{model="bart"}} 0.0' in lines, sample
    assert not any(line.startswith("encdec_audio_seconds_total") for line in lines)


def test_probes_and_scrapes_are_logged_at_debug(tiny_bart_dir, caplog):
    """A health probe or a scrape that succeeds comes every few seconds: logged at DEBUG, every
    other request at INFO."""
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=64)
    app = build_app(ServedModels([ServedModel("bart", str(tiny_bart_dir), engine)]), ServerState())

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            for path in ("/health", "/metrics", "/v1/models", "/v1/nope"):
                await http.get(path)
        await engine.shutdown()

    with caplog.at_level(logging.DEBUG, logger="encdec.server"):
        asyncio.run(run())
    levels = {match[1]: r.levelname for r in caplog.records
              if (match := re.search(r"GET (\S+) -> (\d+)", r.getMessage()))}
    assert levels == {"/health": "DEBUG", "/metrics": "DEBUG", "/v1/models": "INFO", "/v1/nope": "INFO"}


def test_an_idle_server_gives_free_memory_back(tiny_bart_dir, monkeypatch):
    """Once no request has been in flight for IDLE_TRIM_SECONDS the heap is trimmed, once: also
    after work no engine step did (uploads decoded, texts tokenized); a request that comes in
    meanwhile calls the pending trim off."""
    from encdec.entrypoints.openai import middleware

    trims = []
    monkeypatch.setattr(middleware, "trim_heap", lambda: trims.append(time.monotonic()))
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=64)
    app = build_app(ServedModels([ServedModel("bart", str(tiny_bart_dir), engine)]), ServerState())
    idle = middleware.IDLE_TRIM_SECONDS

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            assert (await http.get("/v1/models")).status_code == 200
            last = time.monotonic()
            await asyncio.sleep(idle + 0.5)
            counts = [len(trims)]
            for _ in range(3):  # each within the last one's wait
                assert (await http.get("/v1/models")).status_code == 200
                await asyncio.sleep(idle / 3)
            counts.append(len(trims))
            await asyncio.sleep(idle)
            counts.append(len(trims))
            await http.get("/health")  # not a request in flight: no trim of its own
            await asyncio.sleep(idle + 0.5)
            counts.append(len(trims))
        await engine.shutdown()
        return last, counts

    last, counts = asyncio.run(run())
    assert counts == [1, 1, 2, 2]
    assert idle - 0.05 <= trims[0] - last <= idle + 0.5


def test_a_prompt_the_cache_can_never_hold_names_the_endpoints_field(tiny_bart_dir):
    engine = AsyncLLMEngine.from_model(str(tiny_bart_dir), num_gpu_blocks=8)  # 128 positions
    app = build_app(ServedModels([ServedModel("bart", str(tiny_bart_dir), engine)]), ServerState())
    article = " ".join([TEXT] * 20)

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            answers = [await http.post(path, json={"model": "bart", field: article})
                       for path, field in (("/v1/completions", "prompt"), ("/v1/summarize", "input"))]
        await engine.shutdown()
        return answers

    completion, summary = asyncio.run(run())
    for response, field in ((completion, "prompt"), (summary, "input")):
        assert assert_error(response, 400, field)["message"].startswith(
            f"{field}: the request needs "), response.text


def test_a_port_in_use_is_an_error_before_any_model_loads(monkeypatch, capsys):
    from encdec.entrypoints import cli
    from encdec.entrypoints.openai import api_server

    monkeypatch.setattr(api_server, "load_models", lambda *a, **k: pytest.fail("a model loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--model", "tiny.en", "--port", str(port)]) == 1
    assert capsys.readouterr().err == (f"encdec: error: --host 127.0.0.1 --port {port}: cannot "
                                       f"listen there: address already in use\n")
