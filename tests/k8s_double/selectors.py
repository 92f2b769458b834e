"""Field and label selectors as the API server parses them (the subset a node agent needs).

A selector the real server would reject raises :class:`SelectorError`, which the double answers
with 400 BadRequest, so a client sending a typo finds out in tests rather than in a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

# Field labels the real server accepts per resource (pods: the registry's field set).
POD_FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
NODE_FIELDS = frozenset({"metadata.name", "spec.unschedulable"})
CORE_EVENT_FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    }
)
EVENTS_V1_FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "reason",
        "reportingController",
        "type",
    }
)

_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class SelectorError(ValueError):
    """The selector would be rejected by the API server (400 BadRequest)."""


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, buf, escaped = [], [], False
    for ch in text:
        if escaped:
            buf.append(ch)
            escaped = False
        elif ch == "\\":
            buf.append(ch)
            escaped = True
        elif ch == sep:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    parts.append("".join(buf))
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_field_selector(selector: str | None, allowed: frozenset[str]) -> Predicate:
    """``a=b,c!=d`` over the resource's supported field labels."""
    if not selector:
        return lambda _obj: True
    terms: list[tuple[str, bool, str]] = []
    for raw in _split_unescaped(selector, ","):
        m = re.match(r"^([^=!]+)(==|=|!=)(.*)$", raw)
        if not m:
            raise SelectorError(f"invalid selector: '{selector}'; can't understand '{raw}'")
        key, op, value = m.group(1).strip(), m.group(2), _unescape(m.group(3))
        if key not in allowed:
            raise SelectorError(f"field label not supported: {key}")
        terms.append((key, op == "!=", value))

    def match(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, k) != v) if neg else (_field_value(obj, k) == v) for k, neg, v in terms)

    return match


def _split_terms(selector: str) -> list[str]:
    terms, depth, buf = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    terms.append("".join(buf))
    return [t.strip() for t in terms]


def _check_key(key: str, selector: str) -> str:
    if not _LABEL_KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r} in {selector!r}")
    return key


def _check_value(value: str, selector: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise SelectorError(f"unable to parse requirement: invalid label value {value!r} in {selector!r}")
    return value


def parse_label_selector(selector: str | None) -> Predicate:
    """Equality (=, ==, !=), existence (k, !k) and set (in, notin) requirements, comma-joined."""
    if not selector or not selector.strip():
        return lambda _obj: True
    reqs: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_terms(selector):
        if m := re.match(r"^(\S+)\s+(in|notin)\s*\(([^()]*)\)$", term):
            key = _check_key(m.group(1), selector)
            values = frozenset(_check_value(v.strip(), selector) for v in m.group(3).split(","))
            if m.group(2) == "in":
                reqs.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                reqs.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif m := re.match(r"^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$", term):
            key, value = _check_key(m.group(1), selector), _check_value(m.group(3), selector)
            if m.group(2) == "!=":
                reqs.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                reqs.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif m := re.match(r"^!\s*(\S+)$", term):
            key = _check_key(m.group(1), selector)
            reqs.append(lambda lb, k=key: k not in lb)
        elif re.match(r"^\S+$", term):
            key = _check_key(term, selector)
            reqs.append(lambda lb, k=key: k in lb)
        else:
            raise SelectorError(f"unable to parse requirement: {term!r} in {selector!r}")

    def match(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata")
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        labels = labels if isinstance(labels, Mapping) else {}
        return all(req(labels) for req in reqs)

    return match
