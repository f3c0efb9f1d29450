"""Signature schemes (pure functions) and ``gateway sign``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.inbound import signing
from gateway.outbound.standard_webhooks import Signer
from tests.conftest import TEST_WEBHOOK_SECRET
from tests.inbound.webhook_helpers import SOURCES, github, standard, stripe

NOW = 1_780_000_000
BODY = b'{"text": "hello"}'


def test_standard_signature_matches_the_spec_by_hand() -> None:
    key = base64.b64decode(TEST_WEBHOOK_SECRET.removeprefix("whsec_"))
    digest = hmac.new(key, b"msg_1.1780000000." + BODY, hashlib.sha256).digest()
    headers = signing.sign_standard(key, "msg_1", NOW, BODY)
    assert headers == {"webhook-id": "msg_1", "webhook-timestamp": "1780000000",
                       "webhook-signature": "v1," + base64.b64encode(digest).decode()}
    assert signing.verify(SOURCES["demo"], headers, BODY, now=NOW) == "msg_1"


@pytest.mark.parametrize("size", [0, 1, 32, 64, 65, 200])
def test_signer_pads_the_key_as_hmac_does(size: int) -> None:
    """The pre-hashed pads give ``hmac.digest``'s answer for keys under, at and over the
    block size (a longer key is hashed first)."""
    key = bytes(range(256))[:size] if size <= 256 else b""
    for message in (b"", BODY, BODY * 100):
        assert Signer(key).digest(message) == hmac.digest(key, message, "sha256")
    assert Signer(key).standard("msg_1", NOW, BODY) == signing.standard_signature(
        key, "msg_1", NOW, BODY).encode()


@pytest.mark.parametrize(("offset", "ok"), [(-300, True), (300, True), (-301, False),
                                            (301, False)])
def test_tolerance_is_five_minutes_both_ways(offset: int, ok: bool) -> None:
    headers = standard(BODY, "m", timestamp=NOW)
    if ok:
        assert signing.verify(SOURCES["demo"], headers, BODY, now=NOW + offset) == "m"
    else:
        with pytest.raises(signing.StaleSignature, match="tolerance"):
            signing.verify(SOURCES["demo"], headers, BODY, now=NOW + offset)


@pytest.mark.parametrize("source", ["demo", "stripe"])
def test_a_stale_timestamp_is_stale_only_under_a_matching_signature(source: str) -> None:
    """The barrier counts a wrong signature, not a genuine one that is merely old: the HMAC
    is checked first, so a forged old request is still a SignatureError."""
    old = (standard(BODY, "m", timestamp=NOW - 3600) if source == "demo"
           else stripe(BODY, NOW - 3600))
    with pytest.raises(signing.StaleSignature):
        signing.verify(SOURCES[source], old, BODY, now=NOW)
    with pytest.raises(signing.SignatureError):
        signing.verify(SOURCES[source], old, BODY + b" ", now=NOW)  # tampered and old


def test_missing_header_names_it() -> None:
    headers = standard(BODY, "m", timestamp=NOW)
    del headers["webhook-signature"]
    with pytest.raises(signing.SignatureError, match="webhook-signature"):
        signing.verify(SOURCES["demo"], headers, BODY, now=NOW)


def test_non_ascii_signature_is_a_mismatch_not_a_crash() -> None:
    headers = {**standard(BODY, "m", timestamp=NOW), "webhook-signature": "v1,é"}
    with pytest.raises(signing.SignatureError):
        signing.verify(SOURCES["demo"], headers, BODY, now=NOW)


def test_github_and_stripe_round_trip() -> None:
    assert signing.verify(SOURCES["gh"], github(BODY, "d1"), BODY, now=NOW) == "d1"
    stripe_headers = stripe(BODY, timestamp=NOW)
    delivery = signing.verify(SOURCES["stripe"], stripe_headers, BODY, now=NOW)
    assert delivery == "sha256-" + hashlib.sha256(BODY).hexdigest()
    with pytest.raises(signing.SignatureError):
        signing.verify(SOURCES["stripe"], stripe_headers, BODY + b" ", now=NOW)
    with pytest.raises(signing.SignatureError):
        signing.verify(SOURCES["gh"], github(BODY, "d1"), BODY + b" ", now=NOW)


def test_gateway_sign_prints_curl_ready_headers(tmp_path: Path) -> None:
    body_file = tmp_path / "body.json"
    body_file.write_bytes(BODY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "TELEGRAM_",
                                                                      "SLACK_", "MATTERMOST_"))}
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "sign", "--secret", TEST_WEBHOOK_SECRET,
         "--id", "msg_cli", "--timestamp", str(NOW), str(body_file)],
        capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [
        "webhook-id", "webhook-timestamp", "webhook-signature"]
    headers = dict(line.split(": ", 1) for line in lines)
    assert signing.verify(SOURCES["demo"], headers, BODY, now=NOW) == "msg_cli"
