"""The API server's Event validation (create and update), for both Event APIs.

Mirrors the behaviour of the real server as documented in shared/reference/kubernetes.md:

* Both APIs ("legacy" rules): when ``eventTime`` is set, ``reportingController`` (a qualified name;
  ``reportingComponent`` in core/v1), ``reportingInstance``, ``action`` and ``reason`` are required,
  each at most 128 characters, and the note/message at most 1024. An event about a cluster-scoped
  object (empty ``regarding.namespace``, e.g. a Node) may only live in ``default`` or ``kube-system``.
* ``events.k8s.io/v1`` adds strict rules: ``eventTime`` required, ``type`` Normal|Warning,
  ``series.count >= 2`` and ``series.lastObservedTime`` set, deprecated fields unset, and on update
  the identifying fields are immutable (only ``series`` and metadata may change).
* Stricter than the real server, on purpose: ``regarding`` (``involvedObject``) must be set; a real
  server would store an Event about nothing, which is always a client bug.

Returned causes use the field names of the API the request came through.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

EVENTS_V1 = "events.k8s.io/v1"
CORE_V1 = "v1"

REASON_MAX = 128
ACTION_MAX = 128
REPORTING_INSTANCE_MAX = 128
REPORTING_CONTROLLER_MAX = 128
NOTE_MAX = 1024

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

Cause = dict[str, str]


def _cause(reason: str, field: str, message: str) -> Cause:
    return {"reason": reason, "field": field, "message": message}


def _required(field: str) -> Cause:
    return _cause("FieldValueRequired", field, "Required value")


def _invalid(field: str, value: Any, detail: str) -> Cause:
    return _cause("FieldValueInvalid", field, f"Invalid value: {value!r}: {detail}")


def field_names(api: str) -> dict[str, str]:
    """Internal role -> JSON field name, per Event API."""
    if api == EVENTS_V1:
        return {
            "regarding": "regarding",
            "note": "note",
            "controller": "reportingController",
            "source": "deprecatedSource",
            "first": "deprecatedFirstTimestamp",
            "last": "deprecatedLastTimestamp",
            "count": "deprecatedCount",
        }
    return {
        "regarding": "involvedObject",
        "note": "message",
        "controller": "reportingComponent",
        "source": "source",
        "first": "firstTimestamp",
        "last": "lastTimestamp",
        "count": "count",
    }


def _str(ev: Mapping[str, Any], key: str) -> str:
    value = ev.get(key)
    return value if isinstance(value, str) else ""


def qualified_name_errors(value: str, field: str) -> list[Cause]:
    """``[prefix/]name`` with a DNS-subdomain prefix and a 63-character name part."""
    prefix, _, name = value.rpartition("/")
    out = []
    if not name:
        out.append(_invalid(field, value, "name part must be non-empty"))
    elif len(name) > 63 or not _QUALIFIED_NAME.match(name):
        out.append(
            _invalid(
                field,
                value,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
                "and end with an alphanumeric character (at most 63 characters)",
            )
        )
    if "/" in value and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        out.append(_invalid(field, value, "prefix part must be a lowercase RFC 1123 subdomain"))
    return out


def _legacy(ev: Mapping[str, Any], api: str, namespace: str) -> list[Cause]:
    f = field_names(api)
    causes: list[Cause] = []
    regarding = ev.get(f["regarding"])
    reg_ns = regarding.get("namespace", "") if isinstance(regarding, Mapping) else ""
    reg_ns = reg_ns if isinstance(reg_ns, str) else ""
    if not ev.get("eventTime"):
        if not reg_ns:
            if namespace not in ("", "default"):
                causes.append(
                    _invalid(f"{f['regarding']}.namespace", reg_ns, "does not match event.namespace")
                )
        elif namespace != reg_ns:
            causes.append(_invalid(f"{f['regarding']}.namespace", reg_ns, "does not match event.namespace"))
    else:
        if not reg_ns and namespace not in ("default", "kube-system"):
            causes.append(_invalid(f"{f['regarding']}.namespace", reg_ns, "does not match event.namespace"))
        controller = _str(ev, f["controller"])
        if not controller:
            causes.append(_required(f["controller"]))
        else:
            causes.extend(qualified_name_errors(controller, f["controller"]))
            if len(controller) > REPORTING_CONTROLLER_MAX:
                causes.append(
                    _invalid(f["controller"], "", f"can have at most {REPORTING_CONTROLLER_MAX} characters")
                )
        for key, limit in (
            ("reportingInstance", REPORTING_INSTANCE_MAX),
            ("action", ACTION_MAX),
            ("reason", REASON_MAX),
        ):
            value = _str(ev, key)
            if not value:
                causes.append(_required(key))
            elif len(value) > limit:
                causes.append(_invalid(key, "", f"can have at most {limit} characters"))
        if len(_str(ev, f["note"])) > NOTE_MAX:
            causes.append(_invalid(f["note"], "", f"can have at most {NOTE_MAX} characters"))
    if not isinstance(regarding, Mapping) or not any(regarding.get(k) for k in ("kind", "name", "uid")):
        causes.append(_required(f["regarding"]))
    return causes


def _series(ev: Mapping[str, Any]) -> list[Cause]:
    series = ev.get("series")
    if series is None:
        return []
    if not isinstance(series, Mapping):
        return [_invalid("series", series, "must be an object")]
    causes = []
    count = series.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 2:
        causes.append(_invalid("series.count", count, "should be at least 2"))
    if not series.get("lastObservedTime"):
        causes.append(_required("series.lastObservedTime"))
    return causes


def validate_create(ev: Mapping[str, Any], api: str, namespace: str) -> list[Cause]:
    """Causes the API server would list in its 422 for this new Event (empty = accepted)."""
    causes = _legacy(ev, api, namespace)
    if api != EVENTS_V1:
        return causes  # core/v1 keeps only the legacy rules, for old clients
    f = field_names(api)
    name = (ev.get("metadata") or {}).get("name", "")
    if name and (len(name) > 253 or not _DNS_SUBDOMAIN.match(name)):
        causes.append(_invalid("metadata.name", name, "a lowercase RFC 1123 subdomain must consist of ..."))
    causes.extend(_series(ev))
    if not ev.get("eventTime"):
        causes.append(_required("eventTime"))
    if ev.get("type") not in ("Normal", "Warning"):
        causes.append(
            _cause(
                "FieldValueNotSupported",
                "type",
                f'Unsupported value: {ev.get("type", "")!r}: supported values: "Normal", "Warning"',
            )
        )
    for role in ("first", "last", "count", "source"):
        if ev.get(f[role]):
            causes.append(_invalid(f[role], "", "needs to be unset"))
    return causes


IMMUTABLE_V1 = (
    "regarding",
    "related",
    "reason",
    "note",
    "type",
    "eventTime",
    "action",
    "reportingController",
    "reportingInstance",
    "deprecatedSource",
    "deprecatedFirstTimestamp",
    "deprecatedLastTimestamp",
    "deprecatedCount",
)


def validate_update(new: Mapping[str, Any], old: Mapping[str, Any], api: str, namespace: str) -> list[Cause]:
    """Causes for an update (PUT/PATCH result) of an existing Event."""
    causes = _legacy(new, api, namespace)
    if api != EVENTS_V1:
        return causes
    if new.get("series") != old.get("series"):
        causes.extend(_series(new))
    for key in IMMUTABLE_V1:
        if new.get(key) != old.get(key):
            causes.append(_invalid(key, new.get(key), "field is immutable"))
    return causes
