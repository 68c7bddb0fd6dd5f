"""`encdec bench NAME` refuses bad options before anything runs, and names itself in its usage."""
import pytest

from encdec.entrypoints import cli


@pytest.mark.parametrize("argv, message", [
    (["serve", "--max-running-requests", "abc"],
     "argument --max-running-requests: expected 'auto' or an integer >= 1, got 'abc'"),
    (["serve", "--requests", "6,24"],
     "argument --requests: expected 3 comma-separated integers >= 2, got '6,24'"),
    (["bart", "--device", "nosuch"], "argument --device: expected cpu, cuda or cuda:N, got 'nosuch'"),
    (["overhead", "--doc-len", "1"], "argument --doc-len: expected an integer in [2, 1024], got '1'"),
    (["overhead", "--batch-sizes", ""],
     "argument --batch-sizes: expected comma-separated integers >= 1, got ''"),
])
def test_bad_options_are_usage_errors(capfd, argv, message):
    assert cli.main(["bench", *argv]) == 2
    assert f"encdec bench {argv[0]}: error: {message}" in capfd.readouterr().err


def test_help_names_the_command_and_the_defaults(capfd):
    assert cli.main(["bench", "whisper", "--help"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("usage: encdec bench whisper")
    assert "(default: 3)" in out
