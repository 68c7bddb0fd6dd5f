"""`encdec serve --ssl-keyfile --ssl-certfile`: HTTPS with a certificate made here, answering as
the offline API; a key and certificate that do not go together are refused before any model
loads."""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from encdec import LLM, SamplingParams
from tests.entrypoints.remote_server import RemoteServer
from tests.entrypoints.test_cli_usage import usage_error

TEXT = "The rain in spain falls mainly on the plain."


def self_signed(directory: Path, name: str = "127.0.0.1") -> tuple[Path, Path]:
    """A key and a self-signed certificate for 127.0.0.1 (its own CA), as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    keyfile, certfile = directory / f"{name}.key.pem", directory / f"{name}.cert.pem"
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return keyfile, certfile


def test_https_answers_as_the_offline_api(tiny_bart_dir, tmp_path):
    keyfile, certfile = self_signed(tmp_path)
    server = RemoteServer(["--model", str(tiny_bart_dir), "--served-model-name", "bart", "--num-gpu-blocks", "256",
                           "--ssl-keyfile", str(keyfile), "--ssl-certfile", str(certfile)], verify=str(certfile))
    try:
        assert server.url.startswith("https://127.0.0.1:")
        expected = LLM(str(tiny_bart_dir), num_gpu_blocks=256).generate(
            TEXT, SamplingParams(temperature=0.0, max_tokens=8, config_per_field=True), use_tqdm=False)[0].outputs[0]
        result = server.client().completions.create(model="bart", prompt=TEXT, max_tokens=8, temperature=0)
        assert result.choices[0].text == expected.text
        with pytest.raises(openai.APIConnectionError):  # a certificate no CA of the system's signed
            server.client(http_client=httpx.Client()).models.list()
        with pytest.raises(httpx.TransportError):  # plain HTTP is not spoken there
            httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=10)
        server.wait_all_blocks_free()
    finally:
        server.stop()


def test_a_key_and_certificate_that_do_not_go_together_are_refused(tmp_path, capsys):
    keyfile, certfile = self_signed(tmp_path)
    other_key, _ = self_signed(tmp_path, "other")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(serialization.load_pem_private_key(keyfile.read_bytes(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pass")))
    serve = ["serve", "--model", "tiny.en"]
    cases = [
        (["--ssl-keyfile", str(keyfile)], "--ssl-keyfile and --ssl-certfile go together: give both to serve "
                                          "HTTPS, or neither"),
        (["--ssl-keyfile", str(other_key), "--ssl-certfile", str(certfile)],
         f"--ssl-keyfile {other_key}: not the key of the certificate in --ssl-certfile {certfile}"),
        (["--ssl-keyfile", str(keyfile), "--ssl-certfile", str(junk)],
         f"--ssl-certfile {junk}, --ssl-keyfile {keyfile}: not a PEM certificate and its private key"),
        (["--ssl-keyfile", str(encrypted), "--ssl-certfile", str(certfile)],
         f"--ssl-keyfile {encrypted}: the key is encrypted; give it unencrypted"),
        (["--ssl-keyfile", str(tmp_path / "missing.pem"), "--ssl-certfile", str(certfile)],
         f"--ssl-keyfile {tmp_path / 'missing.pem'}: no such file or directory"),
    ]
    for argv, message in cases:
        assert usage_error(capsys, serve + argv).startswith(message)
