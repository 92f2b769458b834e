"""Pod labels copied onto ``nvidia_gpu_pod_info``: the ``--pod-labels-allowlist``. Pure.

The allowlist is a comma-separated list of regular expressions, each matched in full against pod
label KEYS; a matching label is copied as ``label_<sanitised key>`` (as kube-state-metrics does).
Pod labels are written by tenants: hostile input. So:

* a key is matched only when it is 1 to 317 characters long (253 of DNS prefix, ``/``, 63 of name:
  the longest key the API accepts); others are skipped and counted;
* a value must be a valid Kubernetes label value (at most 63 characters of ``[A-Za-z0-9_.-]``);
  others are skipped and counted, never truncated (a cut value could merge two teams);
* two keys with the same sanitised name: the smallest key (by code point) wins, the others count;
* at most :data:`MAX_LABELS_PER_POD` labels per pod (the first by name), the rest count;
* a regex is checked at start so that no key can make Python's backtracking ``re`` slow: no
  backreferences, lookarounds or conditionals, no quantified group holding a quantifier or an
  alternation, and a bound on the ways a regex can split a 317-character key (:func:`_cost`).
"""

from __future__ import annotations

import functools
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from re import _parser as sre  # the parser re.compile itself uses: the tree a regex really is
from types import MappingProxyType
from typing import Any

from exporter.model import EMPTY, OneLineError, PodInfo

PREFIX = "label_"
MAX_KEY_LENGTH = 317
MAX_VALUE_LENGTH = 63
MAX_LABELS_PER_POD = 16
MAX_PATTERNS = 64
MAX_PATTERN_LENGTH = 512
# Worst-case match paths over a 317-character key: 318**2 (two unbounded repeats, ".*team.*") fits,
# 318**3 does not. About 5 ms per key at the limit, once per distinct key (results are cached).
MAX_PATTERN_COST = 2**18
MAX_ALLOWLIST_COST = 2**20

SKIP_KEY_INVALID = "pod_label_key_invalid"
SKIP_VALUE_INVALID = "pod_label_value_invalid"
SKIP_NAME_COLLISION = "pod_label_name_collision"
SKIP_OVER_LIMIT = "pod_labels_over_limit"

_INVALID_CHAR = re.compile(r"[^a-zA-Z0-9_]")
_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_SIMPLE = {sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN, sre.AT, sre.CATEGORY}
_REPEATS = {sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT}


class AllowlistError(OneLineError):
    """The allowlist holds a regex that does not compile or could be slow."""


@dataclass(frozen=True, slots=True)
class PodLabelAllowlist:
    """Compiled allowlist; the empty one (the default) copies nothing."""

    patterns: tuple[re.Pattern[str], ...] = ()

    def allows(self, key: str) -> bool:
        """Whether ``key`` fully matches one of the regexes (keys over 317 characters never do)."""
        return 0 < len(key) <= MAX_KEY_LENGTH and _allowed(self, key)


NO_POD_LABELS = PodLabelAllowlist()


@functools.lru_cache(maxsize=8192)
def _allowed(allowlist: PodLabelAllowlist, key: str) -> bool:
    return any(p.fullmatch(key) for p in allowlist.patterns)


@dataclass(frozen=True, slots=True)
class SelectedLabels:
    """One pod's copied labels, ``(label name, value)`` sorted by name, and what was skipped."""

    labels: tuple[tuple[str, str], ...] = ()
    skips: Mapping[str, int] = field(default_factory=lambda: EMPTY)


NOTHING = SelectedLabels()


def sanitize(key: str) -> str:
    """Every character outside ``[a-zA-Z0-9_]`` becomes ``_``; a leading digit gets a ``_`` prefix."""
    name = _INVALID_CHAR.sub("_", key)
    return "_" + name if name[:1].isdigit() else name


def label_name(key: str) -> str:
    """The label a pod label ``key`` is copied to: ``label_<sanitised key>``."""
    return PREFIX + sanitize(key)


def select_pod_labels(labels: Mapping[str, str], allowlist: PodLabelAllowlist,
                      reserved: Iterable[str] = ()) -> SelectedLabels:
    """The labels of one pod to copy, bounded; ``reserved`` names (the family's own) are never produced."""
    if not allowlist.patterns or not labels:
        return NOTHING
    taken = frozenset(reserved)
    skips: Counter[str] = Counter()
    chosen: dict[str, tuple[str, str]] = {}  # label name -> (key, value)
    for key, value in labels.items():
        if not 0 < len(key) <= MAX_KEY_LENGTH:
            skips[SKIP_KEY_INVALID] += 1
            continue
        if not _allowed(allowlist, key):
            continue
        if len(value) > MAX_VALUE_LENGTH or not _VALUE.fullmatch(value):
            skips[SKIP_VALUE_INVALID] += 1
            continue
        name = label_name(key)
        if name in taken or (name in chosen and chosen[name][0] <= key):
            skips[SKIP_NAME_COLLISION] += 1
            continue
        if name in chosen:  # a smaller key of the same name: it wins whatever the order of the labels
            skips[SKIP_NAME_COLLISION] += 1
        chosen[name] = (key, value)
    names = sorted(chosen)
    if len(names) > MAX_LABELS_PER_POD:
        skips[SKIP_OVER_LIMIT] += len(names) - MAX_LABELS_PER_POD
        names = names[:MAX_LABELS_PER_POD]
    return SelectedLabels(tuple((n, chosen[n][1]) for n in names), MappingProxyType(dict(skips)))


def pod_label_skips(pods: Iterable[PodInfo], allowlist: PodLabelAllowlist) -> dict[str, int]:
    """Labels skipped over ``pods`` in one cycle, by reason (the sampler adds them to its skip counts)."""
    total: Counter[str] = Counter()
    if allowlist.patterns:
        for p in pods:
            total.update(select_pod_labels(p.labels, allowlist).skips)
    return dict(total)


def parse_allowlist(text: str) -> PodLabelAllowlist:
    """``"team,app\\.kubernetes\\.io/.*"`` -> compiled allowlist (raises :class:`AllowlistError`).

    Items are stripped; empty ones are ignored, so ``""`` is the empty allowlist.
    """
    items = [item.strip() for item in text.split(",")]
    items = [item for item in items if item]
    if len(items) > MAX_PATTERNS:
        raise AllowlistError(f"at most {MAX_PATTERNS} regexes, got {len(items)}")
    patterns: list[re.Pattern[str]] = []
    total = 0
    for item in items:
        pattern, cost = _compile(item)
        patterns.append(pattern)
        total += cost
    if total > MAX_ALLOWLIST_COST:
        raise AllowlistError("the regexes together could take too long on a 317-character key: "
                             "use fewer or simpler ones")
    return PodLabelAllowlist(tuple(dict.fromkeys(patterns)))


def _compile(item: str) -> tuple[re.Pattern[str], int]:
    if len(item) > MAX_PATTERN_LENGTH:
        raise AllowlistError(f"a regex is at most {MAX_PATTERN_LENGTH} characters, got one of {len(item)}")
    if item.count("{") != item.count("}"):
        raise AllowlistError(f"unbalanced braces in {item!r}: regexes are separated by commas, "
                             "so a {m,n} repetition cannot be written")
    try:
        with warnings.catch_warnings():
            # re warns (FutureWarning) of a set it will read differently one day, e.g. "[[a]": refused
            # here, in one line, not printed as a warning; parsed first, as re.compile caches and warns once.
            warnings.simplefilter("error", FutureWarning)
            cost = _cost(sre.parse(item).data)
            pattern = re.compile(item)
    except FutureWarning as e:
        raise AllowlistError(f"{item!r} is ambiguous to Python's re ({e}): escape a literal '[' as '\\['") from None
    except AllowlistError as e:
        raise AllowlistError(f"{item!r}: {e}") from None
    except re.error as e:
        raise AllowlistError(f"{item!r} is not a regular expression: {e.msg} at position {e.pos}") from None
    except (OverflowError, RecursionError, ValueError) as e:  # a repetition count or nesting past re's limits
        raise AllowlistError(f"{item!r} is not a usable regular expression: {e}") from None
    if cost > MAX_PATTERN_COST:
        raise AllowlistError(f"{item!r} could take too long on a {MAX_KEY_LENGTH}-character key "
                             "(too many repetitions in a row): simplify it")
    return pattern, cost


def _cost(items: list[tuple[Any, Any]]) -> int:
    """Bound on the ways a sequence can match a key of at most 317 characters (what backtracking tries).

    A sequence multiplies its items' counts, an alternation adds its branches', a repetition of a
    fixed-width body counts its repetition choices (at most 318); everything else is refused.
    """
    total = 1
    for op, av in items:
        total = min(total * _item_cost(op, av), MAX_ALLOWLIST_COST + 1)
    return total


def _item_cost(op: Any, av: Any) -> int:
    if op in _SIMPLE:
        return 1
    if op is sre.SUBPATTERN:
        return _cost(av[-1].data)  # (group, add flags, del flags, body)
    if op is sre.ATOMIC_GROUP:
        return _cost(av.data)
    if op is sre.BRANCH:
        return sum(_cost(branch.data) for branch in av[1])
    if op in _REPEATS:
        low, high, body = av
        if _cost(body.data) != 1:
            raise AllowlistError("a repeated group may hold neither a repetition nor an alternation")
        return min(high, MAX_KEY_LENGTH) - min(low, MAX_KEY_LENGTH) + 1
    raise AllowlistError("backreferences, lookarounds and conditionals are not supported")
