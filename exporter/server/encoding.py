"""Content negotiation for /metrics: ``Accept-Encoding`` read by the rules of RFC 9110, section 12.5.3.

Only two codings are ever served, the pre-rendered gzip body and the plain one, so the question is
one yes/no: does the client accept gzip at least as much as no coding at all? Codings and the ``q``
parameter are case-insensitive; ``q=0`` means "not acceptable"; ``*`` stands for every coding the
field does not name; ``x-gzip`` is ``gzip`` (RFC 9110, 8.4.1.3). A malformed list member is ignored
(robustness: the rest of the field still counts); a malformed field as a whole never raises.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

# token = 1*tchar (RFC 9110, 5.6.2)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )  (RFC 9110, 12.4.2)
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")
_OWS = " \t"
_ALIASES = {"x-gzip": "gzip"}


def parse_accept_encoding(field: str) -> dict[str, float]:
    """``{coding: q}`` for each well-formed member of one (combined) field value, lower-cased.

    The first well-formed member naming a coding wins; later duplicates are ignored.
    """
    weights: dict[str, float] = {}
    for member in field.split(","):
        parsed = _member(member)
        if parsed is not None and parsed[0] not in weights:
            weights[parsed[0]] = parsed[1]
    return weights


def _member(member: str) -> tuple[str, float] | None:
    coding, *params = member.split(";")
    coding = coding.strip(_OWS)
    if not _TOKEN.fullmatch(coding):
        return None  # an empty list element (allowed by the #rule) or garbage
    q = 1.0
    for param in params:
        name, eq, val = param.strip(_OWS).partition("=")
        # the weight is the only parameter RFC 9110 defines here; anything else is malformed
        if not eq or name.lower() != "q" or not _QVALUE.fullmatch(val):
            return None
        q = float(val)
    coding = coding.lower()
    return _ALIASES.get(coding, coding), q


def _weight(weights: dict[str, float], coding: str) -> float | None:
    return weights.get(coding, weights.get("*"))


def wants_gzip(fields: Iterable[str] | str | None) -> bool:
    """True when gzip is acceptable and not less preferred than identity.

    ``fields`` are the request's ``Accept-Encoding`` header values (several lines combine with a
    comma, RFC 9110 5.3). No field at all: identity, as clients that handle gzip say so.
    """
    if fields is None:
        return False
    text = fields if isinstance(fields, str) else ",".join(fields)
    # A scraper sends the same short field every time: remembered, within a bounded size whatever clients send.
    return _wants_gzip_cached(text) if len(text) <= 256 else _wants_gzip(text)


def _wants_gzip(text: str) -> bool:
    weights = parse_accept_encoding(text)
    gz = _weight(weights, "gzip")
    if not gz:
        return False  # not named (and no "*"), or q=0
    identity = _weight(weights, "identity")
    # identity left unnamed is acceptable with no stated preference: the smaller body wins then
    return identity is None or gz >= identity


_wants_gzip_cached = lru_cache(maxsize=128)(_wants_gzip)
