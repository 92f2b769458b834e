"""Pods on this node: raw API objects -> :class:`PodInfo`, and the workload a pod belongs to. Pure.

Everything in a Pod object is written by its author or a scheduler: hostile input. The parser
bounds and validates it, keeps what it can, and names what it dropped (the store,
:mod:`exporter.node.pod_store`, counts those by reason).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from exporter.model import EMPTY, ContainerInfo, PodInfo

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_CONTAINER_ID = re.compile(r"([a-z0-9][a-z0-9.+-]*)://(.*)", re.DOTALL)
# CronJob controller names its Jobs "<cronjob>-<scheduled time in minutes since the epoch>";
# minutes since 1990 already have 8 digits, so fewer digits means a hand-named Job.
_CRONJOB_JOB = re.compile(r"(.+)-([0-9]{8,10})", re.DOTALL)
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
POD_TEMPLATE_HASH = "pod-template-hash"


class MalformedPod(ValueError):
    """A Pod object lacks what identifies it (uid, name, namespace, containers)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason  # short, stable: used as a metric label value


def _mapping(value: Any, reason: str) -> Mapping[str, Any]:
    if value is None:
        return EMPTY
    if not isinstance(value, Mapping):
        raise MalformedPod(reason, f"expected an object, got {type(value).__name__}")
    return value


def _required_str(meta: Mapping[str, Any], key: str, reason: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value:
        raise MalformedPod(reason)
    return value


def _optional_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _str_map(value: Any, what: str, issues: list[str]) -> Mapping[str, str]:
    """A string->string map; non-string entries are dropped (and noted), never fatal."""
    if value is None:
        return EMPTY
    if not isinstance(value, Mapping):
        issues.append(f"{what}_invalid")
        return EMPTY
    out = {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
    if len(out) != len(value):
        issues.append(f"{what}_invalid")
    return MappingProxyType(out)


def _quantities(value: Any, issues: list[str]) -> Mapping[str, str]:
    """Resource quantities as given. The API sends strings; YAML scenarios may hold bare numbers."""
    if value is None:
        return EMPTY
    if not isinstance(value, Mapping):
        issues.append("resources_invalid")
        return EMPTY
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(k, str) and isinstance(v, str):
            out[k] = v
        elif isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = str(v)
        else:
            issues.append("resources_invalid")
    return MappingProxyType(out)


def parse_container_id(raw: Any) -> tuple[str | None, str | None]:
    """``containerd://<64hex>`` (or cri-o://, docker://, or bare hex) -> (lowercase 64 hex, None).

    Returns (None, issue) for anything whose ID part is not exactly 64 hex digits, and (None, None)
    when there is no ID yet (container not started).
    """
    if raw is None or raw == "":
        return None, None
    if not isinstance(raw, str):
        return None, "container_id_invalid"
    m = _CONTAINER_ID.fullmatch(raw)
    ident = m.group(2) if m else raw
    if not _HEX64.fullmatch(ident):
        return None, "container_id_invalid"
    return ident.lower(), None


def _container_ids(status: Mapping[str, Any], issues: list[str], field: str = "containerStatuses") -> dict[str, str]:
    statuses = status.get(field)
    if statuses is None:
        return {}
    if not isinstance(statuses, list):
        issues.append("container_statuses_invalid")
        return {}
    out: dict[str, str] = {}
    for st in statuses:
        if not isinstance(st, Mapping) or not isinstance(st.get("name"), str):
            issues.append("container_statuses_invalid")
            continue
        cid, issue = parse_container_id(st.get("containerID"))
        if issue:
            issues.append(issue)
        if cid:
            out[st["name"]] = cid
    return out


def _controller_ref(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            kind, name = ref.get("kind"), ref.get("name")
            if isinstance(kind, str) and kind and isinstance(name, str) and name:
                return kind, name
    return None


def resolve_workload(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of the workload owning a pod, from the pod object alone.

    Resolving ReplicaSet -> Deployment and Job -> CronJob by name avoids needing RBAC (and API
    calls) on ReplicaSets and Jobs:

    * a Deployment's ReplicaSet is named ``<deployment>-<pod-template-hash>`` and its pods carry
      that hash as the ``pod-template-hash`` label; a ReplicaSet not named so is reported as such;
    * a CronJob's Job is named ``<cronjob>-<scheduled minutes since epoch>`` (8-10 digits) and its
      pods carry the job name in ``batch.kubernetes.io/job-name`` (or the older ``job-name``) label;
      other Jobs are reported as Jobs. A hand-made Job named like ``x-12345678`` would be taken
      for a CronJob's: an accepted cost of the heuristic.

    StatefulSet, DaemonSet and any other controller are reported by kind; a pod without a
    controller is its own workload, ``("Pod", <pod name>)``.
    """
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else EMPTY
    pod_name = _optional_str(meta.get("name"))
    ref = _controller_ref(meta)
    if ref is None:
        return "Pod", pod_name
    kind, name = ref
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else EMPTY
    if kind == "ReplicaSet":
        tmpl_hash = labels.get(POD_TEMPLATE_HASH)
        if isinstance(tmpl_hash, str) and tmpl_hash and name.endswith("-" + tmpl_hash):
            deployment = name[: -len(tmpl_hash) - 1]
            if deployment:
                return "Deployment", deployment
        return "ReplicaSet", name
    if kind == "Job":
        m = _CRONJOB_JOB.fullmatch(name)
        if m and any(labels.get(key) == name for key in JOB_NAME_LABELS):
            return "CronJob", m.group(1)
        return "Job", name
    return kind, name


def parse_pod(obj: Any) -> tuple[PodInfo, tuple[str, ...]]:
    """Like :func:`pod_from_api`, also returning the non-fatal issues met (e.g. a bad container ID)."""
    if not isinstance(obj, Mapping):
        raise MalformedPod("not_an_object", type(obj).__name__)
    meta = _mapping(obj.get("metadata"), "metadata_invalid")
    spec = _mapping(obj.get("spec"), "spec_invalid")
    status = _mapping(obj.get("status"), "status_invalid")
    uid = _required_str(meta, "uid", "missing_uid")
    name = _required_str(meta, "name", "missing_name")
    namespace = _required_str(meta, "namespace", "missing_namespace")
    raw_containers = spec.get("containers")
    if not isinstance(raw_containers, list):
        raise MalformedPod("containers_invalid", "spec.containers is not a list")
    raw_init = spec.get("initContainers")
    if raw_init is None:
        raw_init = []
    if not isinstance(raw_init, list):
        raise MalformedPod("containers_invalid", "spec.initContainers is not a list")
    issues: list[str] = []
    containers = _containers(raw_containers, "containers", _container_ids(status, issues), issues)
    init_ids = _container_ids(status, issues, "initContainerStatuses")
    init_containers = _containers(raw_init, "initContainers", init_ids, issues,
                                  _terminated(status.get("initContainerStatuses")))
    kind, workload = resolve_workload(obj)
    pod = PodInfo(
        uid=uid.lower(),  # cgroup paths give lowercase UIDs
        name=name,
        namespace=namespace,
        node_name=_optional_str(spec.get("nodeName")),
        phase=_optional_str(status.get("phase")) or "Unknown",
        containers=tuple(containers),
        labels=_str_map(meta.get("labels"), "labels", issues),
        annotations=_str_map(meta.get("annotations"), "annotations", issues),
        workload_kind=kind,
        workload_name=workload,
        resource_version=_optional_str(meta.get("resourceVersion")),
        init_containers=init_containers,
    )
    return pod, tuple(issues)


def _terminated(statuses: Any) -> frozenset[str]:
    """Names of the containers whose status says ``state.terminated``."""
    if not isinstance(statuses, list):
        return frozenset()
    return frozenset(st["name"] for st in statuses
                     if isinstance(st, Mapping) and isinstance(st.get("name"), str)
                     and isinstance(st.get("state"), Mapping) and "terminated" in st["state"])


def _containers(raw: list[Any], field: str, ids: Mapping[str, str], issues: list[str],
                terminated: frozenset[str] | None = None) -> tuple[ContainerInfo, ...]:
    """``spec.<field>`` -> containers in order; a nameless entry refuses the pod (indexes would shift).

    ``terminated`` is given for init containers only (None: regular containers).
    """
    out: list[ContainerInfo] = []
    for index, c in enumerate(raw):
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str) or not c["name"]:
            # Indexes of the others would shift, and schemes key annotations by index: refuse the pod.
            raise MalformedPod("containers_invalid", f"spec.{field}[{index}] has no name")
        resources = c.get("resources")
        if resources is not None and not isinstance(resources, Mapping):
            issues.append("resources_invalid")
            resources = None
        resources = resources or EMPTY
        out.append(
            ContainerInfo(
                name=c["name"],
                index=index,
                container_id=ids.get(c["name"]),
                limits=_quantities(resources.get("limits"), issues),
                requests=_quantities(resources.get("requests"), issues),
                init=terminated is not None,
                sidecar=terminated is not None and c.get("restartPolicy") == "Always",
                terminated=terminated is not None and c["name"] in terminated,
            )
        )
    return tuple(out)


def pod_from_api(obj: Mapping[str, Any]) -> PodInfo:
    """A raw Pod object (camelCase JSON dict) -> :class:`PodInfo`; :class:`MalformedPod` if unusable.

    Containers come in ``spec.containers`` order; container IDs from ``status.containerStatuses``,
    runtime prefix stripped and lowercased. IDs that are not 64 hex are ignored (the container then
    has no ID), and so are non-string labels, annotations, quantities and env entries.
    """
    return parse_pod(obj)[0]
