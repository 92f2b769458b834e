"""Tests for exporter.node.podresources: wire codec, interop with the official protobuf runtime,
and a real grpcio server on a unix socket."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given
from hypothesis import strategies as st

from exporter.model import ClaimResource, DynamicResource, PodResources, PodResourcesContainer
from exporter.node.podresources import (
    PodResourcesDecodeError,
    PodResourcesUnavailable,
    decode_list_response,
    encode_list_response,
    list_pod_resources,
)

GPU = "nvidia.com/gpu"
PODS = (
    PodResources(
        name="trainer-0",
        namespace="ml",
        containers=(
            # a 1.27-1.30 kubelet's entry: class_name (skipped) and CDI names only, no device triplet
            PodResourcesContainer("main", ((GPU, ("GPU-aaa", "GPU-bbb")),),
                                  (DynamicResource("c1", "ml", (ClaimResource("", "", ""),)),)),
            PodResourcesContainer("sidecar", ()),
        ),
    ),
    PodResources(
        name="infer",
        namespace="default",
        containers=(PodResourcesContainer("srv", ((GPU, ("GPU-ccc::1",)), ("example.com/x", ("x0",)))),),
    ),
    PodResources(name="no-containers", namespace="kube-system", containers=()),
)


# --- hand-built bytes, field by field from the .proto, independent of the encoder ----------


def ld(tag: int, payload: bytes) -> bytes:
    """Length-delimited field with a one-byte tag; lengths up to 16383 (two varint bytes)."""
    n = len(payload)
    length = bytes([n]) if n < 0x80 else bytes([(n & 0x7F) | 0x80, n >> 7])
    return bytes([tag]) + length + payload


def test_decode_hand_built_bytes_with_every_skipped_field() -> None:
    numa = b"\x08\x01"  # NUMANode{ID: 1}
    topology = ld(0x0a, numa)  # TopologyInfo{nodes: [..]}
    devices = (
        b"\x0a\x0e" + b"nvidia.com/gpu"  # resource_name = 1
        + b"\x12\x05GPU-1"  # device_ids = 2
        + b"\x12\x05GPU-2"
        + ld(0x1a, topology)  # topology = 3 (skipped)
    )
    memory = b"\x0a\x06memory" + b"\x10\x80\x80\x80\x80\x02" + ld(0x1a, topology)
    dra = b"\x0a\x03gpu" + b"\x12\x05claim" + b"\x1a\x02ns"
    container = (
        b"\x0a\x04main"  # name = 1
        + ld(0x12, devices)  # devices = 2
        + b"\x1a\x03\x00\x01\x7f"  # cpu_ids = 3, packed
        + b"\x18\x05"  # cpu_ids = 3, unpacked varint
        + b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"  # cpu_ids = -1 (10-byte varint)
        + ld(0x22, memory)  # memory = 4
        + ld(0x2a, dra)  # dynamic_resources = 5
        + b"\x4d\x01\x02\x03\x04"  # unknown field 9, fixed32
        + b"\x51" + bytes(8)  # unknown field 10, fixed64
        + b"\x63\x08\x01\x6b\x6c\x64"  # unknown group 12 holding a nested group 13
        + b"\xc0\x3e\x96\x01"  # unknown field 1000, varint
    )
    pod = (
        b"\x0a\x03pod"  # name = 1
        + b"\x12\x02ns"  # namespace = 2
        + ld(0x1a, container)  # containers = 3
        + b"\x22\x02\x00\x01"  # field 4 (pod-level cpu_ids in newer kubelets), skipped
        + b"\x08\x07"  # field 1 with the wrong wire type: treated as unknown
    )
    response = ld(0x0a, pod) + b"\x10\x01"  # + unknown varint field 2
    main = PodResourcesContainer("main", (("nvidia.com/gpu", ("GPU-1", "GPU-2")),), (DynamicResource("claim", "ns"),))
    assert len(pod) > 127  # the outer length needs a two-byte varint
    assert decode_list_response(response) == (PodResources("pod", "ns", (main,)),)


def test_encoder_matches_hand_built_bytes() -> None:
    pod = PodResources("p", "n", (PodResourcesContainer("c", (("r", ("d1", "")),)),))
    devices = b"\x0a\x01r" + b"\x12\x02d1" + b"\x12\x00"
    container = b"\x0a\x01c" + ld(0x12, devices)
    body = b"\x0a\x01p" + b"\x12\x01n" + ld(0x1a, container)
    assert encode_list_response([pod]) == ld(0x0a, body)


def test_empty_response_and_empty_strings() -> None:
    assert decode_list_response(b"") == ()
    assert encode_list_response([]) == b""
    assert decode_list_response(b"\x0a\x00") == (PodResources("", "", ()),)


def test_long_length_prefix() -> None:
    # lengths >= 128 need a multi-byte varint
    pod = PodResources("x" * 300, "ns", ())
    data = encode_list_response([pod])
    assert data[:3] == b"\x0a\xb3\x02"  # 1+2+300 (name) + 1+1+2 (namespace) = 307 = 0xb3 0x02
    assert decode_list_response(data) == (pod,)


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a",  # truncated length
        b"\x0a\x05ab",  # length past the end
        b"\x0a\x02\x0a\x05",  # nested length past the end of its message
        b"\x00\x01",  # field number 0
        b"\x0e",  # wire type 6
        b"\x0f",  # wire type 7
        b"\x0c",  # end group without start
        b"\x0b\x08\x01",  # group never closed
        b"\x0b\x14",  # group closed by another field's end tag
        b"\x08" + b"\xff" * 10 + b"\x01",  # varint longer than 10 bytes
        b"\x0d\x01\x02",  # truncated fixed32
        b"\x09\x01",  # truncated fixed64
        b"\x0a\x04\x0a\x02\xff\xfe",  # invalid UTF-8 in a pod name
    ],
)
def test_decode_errors(data: bytes) -> None:
    with pytest.raises(PodResourcesDecodeError):
        decode_list_response(data)


# --- interop with the official protobuf runtime (schema built from the real field numbers) -


def _official_classes() -> type:
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="podres_v1_test.proto", package="v1test", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".v1test.{type_name}"

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    s, msg, i64, u64 = F.TYPE_STRING, F.TYPE_MESSAGE, F.TYPE_INT64, F.TYPE_UINT64
    message("NUMANode", ("ID", 1, i64, opt, ""))
    message("TopologyInfo", ("nodes", 1, msg, rep, "NUMANode"))
    message("ContainerDevices", ("resource_name", 1, s, opt, ""), ("device_ids", 2, s, rep, ""),
            ("topology", 3, msg, opt, "TopologyInfo"))
    message("ContainerMemory", ("memory_type", 1, s, opt, ""), ("size", 2, u64, opt, ""),
            ("topology", 3, msg, opt, "TopologyInfo"))
    message("CDIDevice", ("name", 1, s, opt, ""))
    message("ClaimResource", ("cdi_devices", 1, msg, rep, "CDIDevice"), ("driver_name", 2, s, opt, ""),
            ("pool_name", 3, s, opt, ""), ("device_name", 4, s, opt, ""), ("share_id", 5, s, opt, ""))
    message("DynamicResource", ("class_name", 1, s, opt, ""), ("claim_name", 2, s, opt, ""),
            ("claim_namespace", 3, s, opt, ""), ("claim_resources", 4, msg, rep, "ClaimResource"))
    message("ContainerResources", ("name", 1, s, opt, ""), ("devices", 2, msg, rep, "ContainerDevices"),
            ("cpu_ids", 3, i64, rep, ""), ("memory", 4, msg, rep, "ContainerMemory"),
            ("dynamic_resources", 5, msg, rep, "DynamicResource"))
    message("PodResources", ("name", 1, s, opt, ""), ("namespace", 2, s, opt, ""),
            ("containers", 3, msg, rep, "ContainerResources"))
    message("ListPodResourcesResponse", ("pod_resources", 1, msg, rep, "PodResources"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("v1test.ListPodResourcesResponse"))


Official = _official_classes()


def _official_bytes() -> bytes:
    resp = Official()
    pod = resp.pod_resources.add(name="trainer-0", namespace="ml")
    c = pod.containers.add(name="main", cpu_ids=[0, 1, 63, -2])
    d = c.devices.add(resource_name=GPU, device_ids=["GPU-aaa", "GPU-bbb"])
    d.topology.nodes.add(ID=1)
    mem = c.memory.add(memory_type="hugepages-2Mi", size=2**40)
    mem.topology.nodes.add(ID=0)
    dra = c.dynamic_resources.add(class_name="gpu.nvidia.com", claim_name="c1", claim_namespace="ml")
    dra.claim_resources.add().cdi_devices.add(name="nvidia.com/gpu=gpu0")
    pod.containers.add(name="sidecar")
    pod2 = resp.pod_resources.add(name="infer", namespace="default")
    pod2.containers.add(name="srv").devices.add(resource_name=GPU, device_ids=["GPU-ccc::1"])
    pod2.containers[0].devices.add(resource_name="example.com/x", device_ids=["x0"])
    resp.pod_resources.add(name="no-containers", namespace="kube-system")
    return resp.SerializeToString()


def test_decode_official_serialization() -> None:
    assert decode_list_response(_official_bytes()) == PODS


def test_decode_dynamic_resources_of_current_kubelets() -> None:
    """1.34 (driver/pool/device, CDI names repeated per the kubelet's quirk), 1.35+ (share_id), MIG names."""
    resp = Official()
    pod = resp.pod_resources.add(name="trainer-6c9f7d8b5-q4w2z", namespace="ml")
    c = pod.containers.add(name="main")
    c.devices.add(resource_name="example.com/nic", device_ids=["nic0"])
    dra = c.dynamic_resources.add(claim_name="trainer-6c9f7d8b5-q4w2z-gpu-h5m8d", claim_namespace="ml")
    r0 = dra.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-0")
    r0.cdi_devices.add(name="k8s.gpu.nvidia.com/claim=0f1e2d3c-gpu-0")
    r1 = dra.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node-a",
                                 device_name="gpu-1-mig-1g5gb-19-0", share_id="7f3c1f9e-52c0-4c62-9a0d-3a8d2f3e0b11")
    r1.cdi_devices.add(name="k8s.gpu.nvidia.com/claim=0f1e2d3c-gpu-0")
    r1.cdi_devices.add(name="k8s.gpu.nvidia.com/claim=0f1e2d3c-gpu-1-mig-1g5gb-19-0")
    c.dynamic_resources.add(claim_name="net", claim_namespace="ml").claim_resources.add(
        driver_name="compute-domain.nvidia.com", pool_name="node-a", device_name="channel-0")
    want = PodResourcesContainer("main", (("example.com/nic", ("nic0",)),), (
        DynamicResource("trainer-6c9f7d8b5-q4w2z-gpu-h5m8d", "ml", (
            ClaimResource("gpu.nvidia.com", "node-a", "gpu-0"),
            ClaimResource("gpu.nvidia.com", "node-a", "gpu-1-mig-1g5gb-19-0", "7f3c1f9e-52c0-4c62-9a0d-3a8d2f3e0b11"))),
        DynamicResource("net", "ml", (ClaimResource("compute-domain.nvidia.com", "node-a", "channel-0"),))))
    data = resp.SerializeToString()
    assert decode_list_response(data) == (PodResources("trainer-6c9f7d8b5-q4w2z", "ml", (want,)),)
    parsed = Official.FromString(encode_list_response(decode_list_response(data)))
    got = parsed.pod_resources[0].containers[0].dynamic_resources[0].claim_resources[1]
    assert (got.device_name, got.share_id) == ("gpu-1-mig-1g5gb-19-0", "7f3c1f9e-52c0-4c62-9a0d-3a8d2f3e0b11")


def test_official_parses_our_encoding() -> None:
    parsed = Official.FromString(encode_list_response(PODS))
    assert [(p.name, p.namespace) for p in parsed.pod_resources] == [(p.name, p.namespace) for p in PODS]
    main = parsed.pod_resources[0].containers[0]
    assert main.name == "main"
    assert [(d.resource_name, list(d.device_ids)) for d in main.devices] == [(GPU, ["GPU-aaa", "GPU-bbb"])]
    assert [c.name for c in parsed.pod_resources[1].containers] == ["srv"]


# --- properties -----------------------------------------------------------------------------

_text = st.text(max_size=12)
_pods = st.lists(
    st.builds(
        PodResources,
        name=_text,
        namespace=_text,
        containers=st.lists(
            st.builds(
                PodResourcesContainer,
                name=_text,
                devices=st.lists(
                    st.tuples(_text, st.lists(_text, max_size=3).map(tuple)), max_size=3
                ).map(tuple),
                dynamic_resources=st.lists(st.builds(
                    DynamicResource, claim_name=_text, claim_namespace=_text,
                    claim_resources=st.lists(st.builds(ClaimResource, _text, _text, _text, _text),
                                             max_size=2).map(tuple)), max_size=2).map(tuple),
            ),
            max_size=3,
        ).map(tuple),
    ),
    max_size=4,
).map(tuple)


@given(_pods)
def test_round_trip(pods: tuple[PodResources, ...]) -> None:
    assert decode_list_response(encode_list_response(pods)) == pods


@given(_pods)
def test_official_agrees_with_encoder(pods: tuple[PodResources, ...]) -> None:
    # re-serialising through the official runtime must decode to the same value
    assert decode_list_response(Official.FromString(encode_list_response(pods)).SerializeToString()) == pods


def _decode_only_raises_decode_error(data: bytes) -> None:
    try:
        result = decode_list_response(data)
    except PodResourcesDecodeError:
        return
    assert all(isinstance(p, PodResources) for p in result)


@given(st.binary(max_size=300))
def test_garbage_only_raises_decode_error(data: bytes) -> None:
    _decode_only_raises_decode_error(data)


@given(st.data())
def test_mutated_valid_messages_only_raise_decode_error(data: st.DataObject) -> None:
    buf = bytearray(_official_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    _decode_only_raises_decode_error(bytes(buf[:cut]))


# --- a real grpcio server on a unix socket ---------------------------------------------------


@pytest.fixture
def sock_dir(tmp_path: Path) -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer
    if len(str(tmp_path)) < 80:
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="podres"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


Handler = Callable[[bytes, grpc.ServicerContext], bytes]


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[Callable[[Handler], str]]:
    servers: list[grpc.Server] = []

    def start(handler: Handler) -> str:
        path = str(sock_dir / "kubelet.sock")
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        # no (de)serializers: the handler sees and returns raw bytes, like a real kubelet's wire
        rpc = grpc.unary_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": rpc}),)
        )
        server.add_insecure_port(f"unix:{path}")
        server.start()
        servers.append(server)
        return path

    yield start
    for server in servers:
        server.stop(None)


@pytest.mark.e2e
def test_list_against_grpc_server_with_our_encoder(kubelet: Callable[[Handler], str]) -> None:
    requests: list[bytes] = []

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        requests.append(request)
        return encode_list_response(PODS)

    path = kubelet(handler)
    assert list_pod_resources(path) == PODS
    assert requests == [b""]  # ListPodResourcesRequest is empty


@pytest.mark.e2e
def test_list_against_grpc_server_with_official_bytes(kubelet: Callable[[Handler], str]) -> None:
    path = kubelet(lambda request, context: _official_bytes())
    assert list_pod_resources(path, timeout=5.0) == PODS


@pytest.mark.e2e
def test_server_error_status_is_unavailable(kubelet: Callable[[Handler], str]) -> None:
    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "go away")
        raise AssertionError("abort returns only by raising")

    path = kubelet(handler)
    with pytest.raises(PodResourcesUnavailable, match="PERMISSION_DENIED: go away"):
        list_pod_resources(path)


@pytest.mark.e2e
def test_server_garbage_is_decode_error(kubelet: Callable[[Handler], str]) -> None:
    path = kubelet(lambda request, context: b"\x0a\x7fnot really")
    with pytest.raises(PodResourcesDecodeError):
        list_pod_resources(path)


@pytest.mark.e2e
def test_timeout(kubelet: Callable[[Handler], str]) -> None:
    release = threading.Event()

    def slow(request: bytes, context: grpc.ServicerContext) -> bytes:
        release.wait(10)
        return b""

    path = kubelet(slow)
    started = time.monotonic()
    try:
        with pytest.raises(PodResourcesUnavailable, match=r"timed out after 0\.3s"):
            list_pod_resources(path, timeout=0.3)
    finally:
        release.set()
    assert time.monotonic() - started < 5


def test_missing_socket(sock_dir: Path) -> None:
    with pytest.raises(PodResourcesUnavailable, match="not accessible"):
        list_pod_resources(str(sock_dir / "nope.sock"))


def test_path_that_is_not_a_socket(sock_dir: Path) -> None:
    f = sock_dir / "file.sock"
    f.write_text("")
    with pytest.raises(PodResourcesUnavailable, match="not a unix socket"):
        list_pod_resources(str(f))


@pytest.mark.e2e
def test_socket_without_listener(sock_dir: Path) -> None:
    path = str(sock_dir / "dead.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)  # the file exists but nobody accepts: connection refused
    try:
        started = time.monotonic()
        with pytest.raises(PodResourcesUnavailable, match="UNAVAILABLE"):
            list_pod_resources(path, timeout=5.0)
        assert time.monotonic() - started < 5
    finally:
        s.close()


@pytest.mark.e2e
def test_a_restarted_kubelet_is_reached_on_the_next_call(sock_dir: Path) -> None:
    path = str(sock_dir / "kubelet.sock")

    def serve() -> grpc.Server:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        rpc = grpc.unary_unary_rpc_method_handler(lambda request, context: encode_list_response(PODS))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": rpc}),))
        server.add_insecure_port(f"unix:{path}")
        server.start()
        return server

    first = serve()
    assert list_pod_resources(path) == PODS  # the channel stays open after this
    first.stop(None).wait(5)  # the kubelet restarts: its connections close, a new socket takes the path
    second = serve()
    try:
        assert list_pod_resources(path) == PODS
    finally:
        second.stop(None)


@pytest.mark.e2e
def test_the_kept_connection_is_renewed_now_and_then(kubelet: Callable[[Handler], str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """h2 keeps a record per closed stream: a connection serves a bounded number of calls."""
    from exporter.node import podresources

    monkeypatch.setattr(podresources._Client, "CALLS_PER_CONNECTION", 2)
    path = kubelet(lambda request, context: encode_list_response(PODS))
    channels = []
    for _ in range(5):
        assert list_pod_resources(path) == PODS
        channels.append(podresources._client.channels[path])
    assert [c is channels[0] for c in channels] == [True, True, False, False, False]
    assert channels[2] is channels[3] and channels[4] is not channels[2]
