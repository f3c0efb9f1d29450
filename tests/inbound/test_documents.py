"""The webhook document the pipeline receives: the spliced payload (sender's text kept as
``body``) must decode to exactly the document ``webhook_document`` describes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.inbound import documents
from gateway.inbound.documents import parse_json_text, webhook_document, webhook_payload
from gateway.inbound.signing import MalformedError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)
encodings = st.sampled_from([
    lambda v: json.dumps(v),
    lambda v: json.dumps(v, indent=2, ensure_ascii=False),
    lambda v: "\n  " + json.dumps(v, separators=(",", ":")) + " \r\n",
])


@given(value=json_values, encode=encodings)
def test_spliced_payload_decodes_to_the_document(value: object, encode: object) -> None:
    raw = encode(value).encode()  # type: ignore[operator]
    try:
        text, parsed = parse_json_text(raw)
    except MalformedError:
        return  # NUL or lone surrogates: refused before any payload is built
    payload = webhook_payload("demo", "msg-1", text, parsed)
    assert json.loads(payload) == webhook_document("demo", "msg-1", parsed)


def test_sender_fields_become_title_url_and_text() -> None:
    raw = b'{"text": "hello", "title": "T", "url": "https://x.example/1", "n": 1.5e300}'
    text, parsed = parse_json_text(raw)
    document = json.loads(webhook_payload("demo", "d1", text, parsed))
    assert document == {"text": "hello", "title": "T", "url": "https://x.example/1",
                        "source": "demo", "delivery_id": "d1",
                        "body": {"text": "hello", "title": "T", "url": "https://x.example/1",
                                 "n": 1.5e300}}


@pytest.mark.parametrize("raw", [b'{"a": "\\u0000"}', b'["\\ud800"]', b"\xff", b"{",
                                 b'{"n": 1e400}', b"[-1E999]", b"[NaN]", b'{"a": Infinity}'])
def test_unstorable_or_broken_bodies_are_refused(raw: bytes) -> None:
    with pytest.raises(MalformedError):
        parse_json_text(raw)


@pytest.mark.parametrize("text", ["", " ", "{}", ' {"a":1} ', '{"a":1}\n\n', '{"a":1} x',
                                  '{"a":1}{', "\t[1,2]\r\n", '"s"', "nul", " \n ", '{"a":',
                                  "1 2", "\u00a0{}", "{}\u00a0", '{"a": [1, {"b": null}]}'])
def test_the_decoder_answers_as_json_decode(text: str) -> None:
    """``documents._decode`` (whitespace by string methods) gives ``JSONDecoder.decode``'s
    value, or its error at the same place."""
    def outcome(decode: Any) -> Any:
        try:
            return decode(text)
        except json.JSONDecodeError as exc:
            return (exc.msg, exc.pos, exc.lineno, exc.colno)

    assert outcome(documents._decode) == outcome(documents._DECODER.decode)
