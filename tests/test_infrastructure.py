"""Attribution rule 9 (exporter/attribution/infrastructure.py): an MPS daemon of the host or of an
infrastructure namespace is the GPU's infrastructure, neither a user nor unaccounted; a tenant's process of
that name, or a holder's, is judged as before.

The shape is a real one: a public write-up of MPS through the NVIDIA GPU operator on OpenShift (2024-05-09,
driver 550.54.15, two A100-PCIE-40GB) shows nvidia-smi listing ``nvidia-cuda-mps-server`` (PID 543063, type
C, 30 MiB) on both GPUs and a client (``dcgmproftester12``, type M+C, 456 MiB) on the first; an AKS guide
shows the same on one GPU (two ``nbody`` clients, the server at 25 MiB). The server's /proc/<pid>/comm
keeps 15 characters: ``nvidia-cuda-mps``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.attribute import EXCLUSIVE, NONE, SHARE, attribute
from exporter.attribution.infrastructure import DEFAULT_NAMESPACES, MPS_COMM, parse_namespaces
from exporter.model import NodeSample
from tests.test_attribution import MIB, Pods, gpu, in_pod, pod

SERVER = (543063, 30 * MIB, 0)  # pid, memory, SM: the nvidia-smi listing above
DAEMON = 9  # the MPS control daemon's pod (a DaemonSet pod that holds no GPU)


def _pods(daemon_namespace: str = "gpu-operator") -> Pods:
    return Pods.of(pod(1, {"nvidia.com/gpu": "1"}), pod(DAEMON, namespace=daemon_namespace))


def _allocations(devices, pods: Pods):
    return compute_allocations(AllocationInputs(pods.pods.values(), devices, {}, None)).allocations


def _attr(pods: Pods, comms: dict[int, str], server_in_pod: bool = True):
    """(without the command names, with them) on the write-up's two GPUs."""
    devices = [gpu(0, ((686657, 456 * MIB, 80), SERVER)), gpu(1, (SERVER,))]
    pids = {686657: in_pod(1), SERVER[0]: in_pod(DAEMON) if server_in_pod else None}
    sample, allocations = NodeSample(1.0, tuple(devices)), _allocations(devices, pods)
    return attribute(sample, pids, pods, allocations), attribute(sample, pids, pods, allocations, comms)


def test_the_mps_server_of_an_infrastructure_namespace_is_neither_user_nor_unaccounted() -> None:
    before, after = _attr(_pods(), {SERVER[0]: MPS_COMM})
    # Without the command name (rules 5 and 6 alone): the daemon's pod shares GPU 0 and is unaccounted on both.
    assert [d.mode for d in before.devices] == [SHARE, NONE]
    assert [[p.pid for p in d.unaccounted] for d in before.devices] == [[SERVER[0]], [SERVER[0]]]
    # With it: the holder has GPU 0 to itself; nothing is unaccounted; the server is listed, its memory kept.
    assert [d.mode for d in after.devices] == [EXCLUSIVE, NONE]
    assert [d.unaccounted for d in after.devices] == [(), ()]
    assert [[(p.pid, p.used_memory_bytes) for p in d.infrastructure] for d in after.devices] == [
        [(SERVER[0], 30 * MIB)], [(SERVER[0], 30 * MIB)]]
    assert [[u.pod.name for u in d.users] for d in after.devices] == [["pod-1"], []]
    assert all(SERVER[0] in {p.pid for p in d.processes} for d in after.devices)  # per-process rows keep it


@pytest.mark.parametrize("namespace", DEFAULT_NAMESPACES)
def test_each_default_namespace_holds_infrastructure(namespace: str) -> None:
    """GKE and static pods, the GPU operator (Helm, OpenShift), the device plugin's and the DRA driver's
    charts (the driver's mps-control-daemon-<claim uid> Deployment runs in its own namespace)."""
    _, after = _attr(_pods(daemon_namespace=namespace), {SERVER[0]: MPS_COMM})
    assert [[p.pid for p in d.infrastructure] for d in after.devices] == [[SERVER[0]], [SERVER[0]]]


def test_a_host_mps_server_is_infrastructure_too() -> None:
    _, after = _attr(_pods(), {SERVER[0]: MPS_COMM}, server_in_pod=False)
    assert [[p.pid for p in d.infrastructure] for d in after.devices] == [[SERVER[0]], [SERVER[0]]]
    assert [d.unaccounted for d in after.devices] == [(), ()]


def test_a_pod_the_cache_does_not_know_is_no_host_process() -> None:
    """Its cgroup names a pod the pod cache has not seen (just started, or the API down): no namespace to
    trust, so its MPS-named process stays unaccounted rather than passing for the host's."""
    _, after = _attr(Pods.of(pod(1, {"nvidia.com/gpu": "1"})), {SERVER[0]: MPS_COMM})
    assert [[p.pid for p in d.unaccounted] for d in after.devices] == [[SERVER[0]], [SERVER[0]]]
    assert [d.infrastructure for d in after.devices] == [(), ()]


def test_a_tenant_naming_its_process_so_stays_unaccounted() -> None:
    _, after = _attr(_pods(daemon_namespace="team-a"), {SERVER[0]: MPS_COMM})
    assert [d.mode for d in after.devices] == [SHARE, NONE]
    assert [[p.pid for p in d.unaccounted] for d in after.devices] == [[SERVER[0]], [SERVER[0]]]
    assert [d.infrastructure for d in after.devices] == [(), ()]


def test_a_holders_own_mps_server_stays_the_holders() -> None:
    """A pod running its own MPS daemon inside (one tenant, several processes): its usage is its own."""
    p = pod(1, {"nvidia.com/gpu": "1"}, namespace="kube-system")
    pods = Pods.of(p)
    devices = [gpu(0, ((100, 2000 * MIB, 50), (101, 30 * MIB, 0)))]
    pids = {100: in_pod(1), 101: in_pod(1)}
    a = attribute(NodeSample(1.0, tuple(devices)), pids, pods, _allocations(devices, pods), {101: MPS_COMM})
    assert a.devices[0].infrastructure == () and a.devices[0].mode == EXCLUSIVE


def test_other_command_names_are_not_infrastructure() -> None:
    _, after = _attr(_pods(), {SERVER[0]: "python3"})
    assert [[p.pid for p in d.unaccounted] for d in after.devices] == [[SERVER[0]], [SERVER[0]]]


def test_namespaces_parse_and_refuse_in_one_line() -> None:
    assert parse_namespaces(" kube-system, gpu-operator ,,") == {"kube-system", "gpu-operator"}
    assert parse_namespaces("") == frozenset()
    for bad in ("Kube-System", "a_b", "-a", "x" * 64, "ns\nother"):
        with pytest.raises(ValueError) as exc:
            parse_namespaces(bad)
        assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="at most 64"):
        parse_namespaces(",".join(f"n{i}" for i in range(65)))


@given(st.text(max_size=200))
def test_any_text_gives_namespaces_or_one_line(text: str) -> None:
    try:
        names = parse_namespaces(text)
    except ValueError as e:
        assert "\n" not in str(e)
    else:
        assert all(0 < len(n) <= 63 and n == n.strip() and "," not in n for n in names)
