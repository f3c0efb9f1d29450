"""How a verified webhook body becomes a pipeline document.

The pipeline wants ``{"text", "title"?, "url"?}``. A webhook body is whatever JSON the sender
chose, so it is kept whole under ``body`` (nothing the sender said is lost) and the three
fields are derived from it: ``text`` is the body's own ``text`` string when it has one, else
the canonical JSON of the whole body (so chunking, embedding and search still see every
value); ``title`` and ``url`` are taken when the body carries them as strings.
"""

from __future__ import annotations

import json
import math
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from gateway.inbound.signing import MalformedError

_TITLE_FIELDS = ("title", "subject", "name", "type")
# Deeper documents are refused at the door: Python's parser takes ~1,000 levels, but the
# stages that encode the document again would fail on it for good (a dead letter).
MAX_DEPTH = 64
_URL_FIELDS = ("url", "html_url", "link")
MAX_EVENT_CHARS = 100  # an event type named by a header (it becomes a feed row's kind)


def parse_json(body: bytes) -> Any:
    """The body as JSON, or ``MalformedError`` naming what is wrong."""
    return parse_json_text(body)[1]


def parse_json_text(body: bytes) -> tuple[str, Any]:
    """The body as text and as JSON, or ``MalformedError`` naming what is wrong.

    PostgreSQL keeps neither NUL characters nor unpaired surrogates (text or jsonb), nor
    NaN/Infinity (which Python's parser accepts, and which ``1e400`` becomes), so a body
    carrying them would be accepted here and then fail the store stage for good: it is
    refused now instead.
    """
    try:
        text = body.decode("utf-8")
        value = _decode(text)
    except UnicodeDecodeError as exc:
        raise MalformedError(f"body is not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise MalformedError(f"body is not JSON: {exc.msg} at line {exc.lineno} "
                             f"column {exc.colno}") from None
    except RecursionError:
        raise MalformedError(f"body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise MalformedError("body has a number with too many digits") from None
    # Cheap guards first: without enough brackets no nesting can be too deep, and only
    # escapes can smuggle in what PostgreSQL refuses; the walks are skipped otherwise.
    if text.count("[") + text.count("{") > MAX_DEPTH:
        _check_depth(value)
    if "\\u" in text:
        _check_storable(value)
    return text, value


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise MalformedError(f"number {literal[:40]} is out of range")
    return value


def _no_constant(literal: str) -> Any:
    raise MalformedError(f"{literal} is not JSON")


# Built once: json.loads with hooks would build a new decoder per call.
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
_SPACE = " \t\n\r"  # JSON's whitespace


def _decode(text: str) -> Any:
    """``_DECODER.decode(text)``, same value and errors, with its two whitespace regexes
    replaced by string methods (~1.5 µs of a webhook's ~4.5 µs parse)."""
    start = len(text) - len(text.lstrip(_SPACE)) if text[:1] in _SPACE else 0
    value, end = _DECODER.raw_decode(text, start)
    if end != len(text):
        rest = len(text) - len(text[end:].lstrip(_SPACE))
        if rest != len(text):
            raise json.JSONDecodeError("Extra data", text, rest)
    return value


def _check_depth(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise MalformedError(f"body is nested deeper than {MAX_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _check_storable(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                raise MalformedError("body contains \\u0000, which the document store cannot keep")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise MalformedError("body contains an unpaired surrogate escape "
                                     "(\\ud800-\\udfff)") from None


def _first_string(body: dict[str, Any], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = body.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _document_fields(source: str, delivery_id: str, body: Any,
                     event: str | None = None) -> dict[str, str]:
    """The string fields of the document derived from ``body`` (all but ``body`` itself);
    ``event``: the event's type when a header names it (GitHub's ``X-GitHub-Event``)."""
    fields = body if isinstance(body, dict) else {}
    text = fields.get("text")
    if not isinstance(text, str) or not text.strip():
        text = json.dumps(body, sort_keys=True, ensure_ascii=False)
    document = {"text": text, "source": source, "delivery_id": delivery_id}
    if event and event.isascii() and event.isprintable():  # a header: anything may come
        document["event"] = event[:MAX_EVENT_CHARS]
    title = _first_string(fields, _TITLE_FIELDS)
    if title is not None:
        document["title"] = title
    url = _first_string(fields, _URL_FIELDS)
    if url is not None and url.startswith(("http://", "https://")):
        document["url"] = url
    return document


def webhook_document(source: str, delivery_id: str, body: Any,
                     event: str | None = None) -> dict[str, Any]:
    return {**_document_fields(source, delivery_id, body, event), "body": body}


def webhook_payload(source: str, delivery_id: str, body_text: str, body: Any,
                    event: str | None = None) -> str:
    """``webhook_document`` already encoded as JSON, built by hand because this is the ingest
    path's largest cost: every field but ``body`` is a string (escaped by the C function
    behind ``json.dumps``, without its per-call encoder set-up), and ``body`` is the
    sender's own text, parsed by ``parse_json_text`` (so valid JSON that decodes to
    ``body``), spliced in rather than encoded a second time."""
    parts = [f'"{name}":{_quote(value)}'
             for name, value in _document_fields(source, delivery_id, body, event).items()]
    return "{" + ",".join(parts) + ',"body":' + body_text.strip() + "}"
