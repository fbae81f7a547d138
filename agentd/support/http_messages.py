"""The messages of :mod:`agentd.support.json_http`: a request's head read and checked
(each rule broken is a :class:`Malformed` naming it, with the status that answers it), and
an answer written."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD = 32 << 10
"""The most bytes a request's line and headers may take together."""
MAX_LINE = 8190
"""The most bytes one line of them may take (as aiohttp's listeners allow)."""
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_WELL_FORMED = re.compile(
    rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ /[^ \r\n\x00]* HTTP/1\.[01]"
    rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n\x00]*)*"
)
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


@dataclass(slots=True)
class Request:
    """One request, whole: its method, path, headers (names in lower case) and body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: str


class Malformed(Exception):
    """A request this server cannot take: answered ``status`` with ``message``, closed.
    Every listener of agentd answers a malformed request 400 (one that is too large 413)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def encode_answer(status: int, body: bytes, headers: Mapping[str, str], close: bool) -> bytes:
    """A whole HTTP/1.1 response carrying the JSON ``body``."""
    lines = [
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        % (status, _REASONS.get(status, b"Unknown"), len(body))
    ]
    lines.extend(f"{name}: {value}\r\n".encode() for name, value in headers.items())
    if close:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)


def parse_head(head: bytes) -> tuple[str, str, dict[str, str], bool]:
    """``(method, path, headers, keep_alive)`` of a request's head (without its blank
    line), or :class:`Malformed` naming what is wrong. A head that one regular expression
    finds well formed is split at once; any other is checked rule by rule, for the first
    rule it breaks (or, a long one, taken all the same)."""
    if len(head) > MAX_LINE or not _WELL_FORMED.fullmatch(head):
        return _parse_checking(head)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return _parse_checking(head)
    line, *fields = text.split("\r\n")
    method, target, version = line.split(" ")
    headers: dict[str, str] = {}
    for field in fields:
        name, _, value = field.partition(":")
        key = name.lower()
        if key in headers:
            return _parse_checking(head)
        headers[key] = value.strip(" \t")
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else False
    return method, target.split("?", 1)[0], headers, keep_alive


def _parse_checking(head: bytes) -> tuple[str, str, dict[str, str], bool]:
    line, *fields = head.split(b"\r\n")
    longest = max(map(len, [line, *fields]))
    if longest > MAX_LINE:
        raise Malformed(f"request head: a line of {longest} bytes, over {MAX_LINE}")
    parts = line.split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1].startswith(b"/"):
        raise Malformed(f"request line: {line[:80]!r} is not METHOD /PATH HTTP/1.x")
    method, target, version = parts
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise Malformed(f"request line: {version[:20]!r} is not HTTP/1.0 or HTTP/1.1")
    headers: dict[str, str] = {}
    for field in fields:
        name, colon, value = field.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise Malformed(f"a header line: {field[:80]!r} is not NAME: VALUE")
        value = value.strip(b" \t")
        if b"\x00" in value or b"\r" in value or b"\n" in value:
            raise Malformed(f"header {name.decode()}: its value holds a control byte")
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed(f"header {name.decode()}: its value is not valid UTF-8") from None
        key = name.decode().lower()
        if key in headers:
            if key in ("content-length", "transfer-encoding", "authorization", "host"):
                raise Malformed(f"header {name.decode()}: given twice")
            text = f"{headers[key]}, {text}"
        headers[key] = text
    try:
        path = target.split(b"?", 1)[0].decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed(f"request line: the path {target[:80]!r} is not UTF-8") from None
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == b"HTTP/1.1" else False
    return method.decode(), path, headers, keep_alive


def body_length(headers: Mapping[str, str], max_body: int) -> int:
    """How many body bytes follow the head, or :class:`Malformed` naming the rule."""
    if "transfer-encoding" in headers:
        raise Malformed("Transfer-Encoding: not accepted; send a Content-Length")
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise Malformed(f"Content-Encoding: {encoding[:40]!r} is not accepted")
    given = headers.get("content-length", "0").strip()
    if not given.isdigit() or not given.isascii() or len(given) > 18:
        raise Malformed(f"Content-Length: {given[:40]!r} must be a number of bytes")
    length = int(given)
    if length > max_body:
        raise Malformed(f"body: larger than {max_body} bytes", 413)
    return length
