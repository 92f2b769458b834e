"""Place a process in a pod and container from the text of ``/proc/<pid>/cgroup``.

Pure functions, no I/O. Every kubelet cgroup layout is recognised by looking at path
*components*, never by anchoring on ``^/kubepods``: a reader inside a private cgroup
namespace sees relative paths (``/../../kubepods-...-pod<uid>.slice/...``), and kind / k3d /
docker-in-docker nodes put the kubepods tree below ``/docker/<id>/`` or ``/kubelet.slice/``.

Decisions (the attribution code relies on them):

* **Pod component.** cgroupfs driver: a component exactly ``pod<uid>``; systemd driver: a
  component ``[<prefix>-]kubepods[-<qos>]-pod<uid_with_underscores>.slice`` (before Kubernetes
  1.6: ``BestEffort-pod<uid>.slice`` / ``Burstable-pod<uid>.slice``). The UID is a
  dashed RFC 4122 UUID, or 32 hex digits for static pods (kubelet derives their UID from a
  hash; those have no dashes to restore). If several components look like pods (Kubernetes
  nested inside a pod), the **outermost** wins: that is the pod the kubelet of the node the
  exporter reads from knows about; an inner cluster's pods are invisible to it.
* **Container.** Only the component *directly below* the pod component names the container
  (``cri-containerd-<id>.scope``, ``crio-<id>[.scope]``, ``docker-<id>.scope``, bare
  ``<id>``). Anything deeper (``init.scope``, a sub-cgroup made inside the container,
  docker-in-docker) belongs to that container. An unrecognised component there, or none,
  gives a pod-level ref ``CgroupRef(uid, None)``.
* **Colon form.** When the kubelet uses the systemd driver but the runtime's runc does not
  (containerd without ``SystemdCgroup = true``), runc takes the systemd-style cgroup name
  ``<pod slice>:<prefix>:<id>`` as one literal directory, usually below the runtime's service:
  ``/system.slice/containerd.service/kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>``.
  Such a component is the pod and the container in one (prefixes ``cri-containerd``, ``crio``,
  ``docker``; an unknown prefix or a malformed id gives the pod alone).
* **conmon.** ``crio-conmon-<id>[.scope]`` is CRI-O's monitor process, not the workload.
  It yields a pod-level ref ``CgroupRef(uid, None, "cri-o")``: the process is charged to the
  pod (it lives in the pod's cgroup) but never to the container whose id it carries.
* **Which line.** The cgroup v2 ``0::`` line wins when it places the process in a pod. On a
  hybrid host it often does not (systemd tracks the process under the runtime's service),
  so the v1 lines are then tried in a fixed controller order: memory, cpu/cpuacct, pids,
  name=systemd, then any other hierarchy; ties go to the earlier line. That order also
  decides conflicts: if v1 hierarchies name different pods, the highest-ranked line wins.
  kubelet creates memory and cpu cgroups for every pod, so they are the most trustworthy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.model import CgroupRef

_HEX64 = r"[0-9a-f]{64}"


def _uid_pattern(sep: str) -> str:
    return sep.join(f"[0-9a-f]{{{n}}}" for n in (8, 4, 4, 4, 12))


_UID_DASHED = _uid_pattern("-")
_UID_UNDERSCORED = _uid_pattern("_")  # systemd driver: "-" would mean slice nesting
_UID_STATIC = r"[0-9a-f]{32}"

_CGROUPFS_POD = re.compile(rf"pod(?P<uid>{_UID_DASHED}|{_UID_STATIC})", re.IGNORECASE)
# The prefix covers kind's "kubelet-kubepods-..." and any other parent slice name, since
# systemd slice names spell out their whole ancestry joined by dashes. Kubernetes before 1.6
# (--experimental-cgroups-per-qos) named pods "BestEffort-pod<uid>.slice" / "Burstable-pod<uid>.slice".
_SYSTEMD_POD = re.compile(
    rf"(?:(?:[^/]+-)?kubepods(?:-[a-z]+)?|burstable|besteffort)-pod(?P<uid>{_UID_UNDERSCORED}|{_UID_STATIC})\.slice",
    re.IGNORECASE,
)

_CONMON = re.compile(rf"crio-conmon-(?P<id>{_HEX64})(?:\.scope)?", re.IGNORECASE)
# (pattern, runtime); CRI-O on the cgroupfs driver names directories "crio-<id>" without .scope.
_CONTAINERS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(rf"cri-containerd-(?P<id>{_HEX64})(?:\.scope)?", re.IGNORECASE), "containerd"),
    (re.compile(rf"crio-(?P<id>{_HEX64})(?:\.scope)?", re.IGNORECASE), "cri-o"),
    (re.compile(rf"docker-(?P<id>{_HEX64})(?:\.scope)?", re.IGNORECASE), "docker"),
    (re.compile(rf"(?P<id>{_HEX64})", re.IGNORECASE), None),
)

# "<pod slice>:<prefix>:<id>" as one directory name (see "Colon form" above).
_COLON_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}
_COLON_ID = re.compile(_HEX64, re.IGNORECASE)

_HIERARCHY_ID = re.compile(r"[0-9]+")
# cgroup v2 appends this to the path of a cgroup that was removed while the process was in it.
_DELETED_SUFFIX = " (deleted)"
_V1_RANK_DEFAULT = 4


@dataclass(frozen=True)
class CgroupParse:
    """Result of :func:`parse_cgroup`: where the process lives and how many lines were garbage."""

    ref: CgroupRef | None  # None: not in a pod (host process, plain docker container, ...)
    malformed_lines: int  # lines that are not "<id>:<controllers>:<path>"


def _pod_uid(component: str) -> str | None:
    """Return the dashed lowercase pod UID if ``component`` is a pod cgroup, else None."""
    m = _CGROUPFS_POD.fullmatch(component)
    if m is None:
        m = _SYSTEMD_POD.fullmatch(component)
    if m is None:
        return None
    return m.group("uid").lower().replace("_", "-")


def parse_cgroup_path(path: str) -> CgroupRef | None:
    """Place one cgroup path (the third field of a line) in a pod/container, or None."""
    if path.endswith(_DELETED_SUFFIX):
        path = path[: -len(_DELETED_SUFFIX)]
    parts = [p for p in path.split("/") if p not in ("", ".", "..")]
    for i, part in enumerate(parts):
        uid = _pod_uid(part)
        if uid is None:
            colon = _colon_form(part)
            if colon is not None:
                return colon
            continue
        child = parts[i + 1] if i + 1 < len(parts) else ""
        if _CONMON.fullmatch(child):
            return CgroupRef(uid, None, "cri-o")
        colon = _colon_form(child)
        if colon is not None and colon.pod_uid == uid:
            return colon
        for pattern, runtime in _CONTAINERS:
            m = pattern.fullmatch(child)
            if m is not None:
                return CgroupRef(uid, m.group("id").lower(), runtime)
        return CgroupRef(uid, None, None)
    return None


def _colon_form(component: str) -> CgroupRef | None:
    """``<pod slice>:<prefix>:<id>`` as one component -> the pod and container, else None."""
    fields = component.split(":")
    if len(fields) != 3:
        return None
    uid = _pod_uid(fields[0])
    if uid is None or not _SYSTEMD_POD.fullmatch(fields[0]):
        return None
    runtime = _COLON_RUNTIMES.get(fields[1].lower())
    if runtime is None or not _COLON_ID.fullmatch(fields[2]):
        return CgroupRef(uid, None, None)
    return CgroupRef(uid, fields[2].lower(), runtime)


def _v1_rank(controllers: str) -> int:
    """Lower is more trusted; see the module docstring for why this order."""
    names = controllers.split(",")
    if "memory" in names:
        return 0
    if "cpu" in names or "cpuacct" in names:
        return 1
    if "pids" in names:
        return 2
    if "name=systemd" in names:
        return 3
    return _V1_RANK_DEFAULT


def parse_cgroup(text: str) -> CgroupParse:
    """Parse the whole content of ``/proc/<pid>/cgroup`` (v1, v2 or hybrid). Never raises."""
    malformed = 0
    v2_ref: CgroupRef | None = None
    best_v1: tuple[int, CgroupRef] | None = None  # (rank, ref); first line wins ties
    # split("\n") rather than splitlines(): cgroup names may legally contain \r, \x0b, ...
    for line in text.split("\n"):
        if not line.strip():
            continue
        fields = line.split(":", 2)
        if (
            len(fields) != 3
            or not _HIERARCHY_ID.fullmatch(fields[0])
            or not fields[2].startswith("/")
        ):
            malformed += 1
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and controllers == "":
            if v2_ref is None:
                v2_ref = parse_cgroup_path(path)
            continue
        rank = _v1_rank(controllers)
        if best_v1 is not None and best_v1[0] <= rank:
            continue
        ref = parse_cgroup_path(path)
        if ref is not None:
            best_v1 = (rank, ref)
    if v2_ref is not None:
        return CgroupParse(v2_ref, malformed)
    return CgroupParse(best_v1[1] if best_v1 is not None else None, malformed)
