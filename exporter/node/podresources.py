"""Client for the kubelet pod-resources API v1 ``List``, without generated code.

The kubelet serves ``v1.PodResourcesLister`` over gRPC on a unix socket. We call it through
grpclib (pure-Python gRPC on asyncio and h2, a few MiB where grpcio's core takes 15) with a codec
that passes bytes through, and carry the few messages we need with a small hand-written protobuf
wire-format codec, which keeps protoc and the generated-code/runtime version pairing out of the
build. Field numbers follow ``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``::

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2;
                               repeated ContainerResources containers = 3; }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2;
                               repeated int64 cpu_ids = 3; repeated ContainerMemory memory = 4;
                               repeated DynamicResource dynamic_resources = 5; }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2;
                               TopologyInfo topology = 3; }
    DynamicResource          { string class_name = 1 (1.27-1.30, removed); string claim_name = 2;
                               string claim_namespace = 3; repeated ClaimResource claim_resources = 4; }
    ClaimResource            { repeated CDIDevice cdi_devices = 1; string driver_name = 2;
                               string pool_name = 3; string device_name = 4;
                               optional string share_id = 5 (1.35+); }

Only the fields the model keeps are decoded; everything else (cpu_ids, memory, topology, CDI
names, an old kubelet's class_name, fields added by later kubelets) is skipped by wire type, as
protobuf requires. ``dynamic_resources`` is empty unless the kubelet's
KubeletPodResourcesDynamicResources gate is on (default since 1.34).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from exporter.model import ClaimResource, DynamicResource, PodResources, PodResourcesContainer

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
_VARINT, _FIXED64, _LEN, _SGROUP, _EGROUP, _FIXED32 = 0, 1, 2, 3, 4, 5


class PodResourcesError(Exception):
    """Base class of the errors this module raises."""


class PodResourcesUnavailable(PodResourcesError):
    """The kubelet socket is missing or the List call failed (timeout, refused, error status)."""


class PodResourcesDecodeError(PodResourcesError):
    """The List response is not a valid ListPodResourcesResponse."""


# --- wire format: decoding ----------------------------------------------------------------


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Return (value, new position); a varint is at most 10 bytes (64 bits)."""
    result = 0
    for shift in range(0, 70, 7):
        if pos >= len(buf):
            raise PodResourcesDecodeError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & 0xFFFF_FFFF_FFFF_FFFF, pos
    raise PodResourcesDecodeError("varint longer than 10 bytes")


def _read_tag(buf: bytes, pos: int) -> tuple[int, int, int]:
    """Return (field number, wire type, new position)."""
    key, pos = _read_varint(buf, pos)
    field, wire = key >> 3, key & 7
    if field == 0 or field > 0x1FFF_FFFF:
        raise PodResourcesDecodeError(f"invalid field number {field}")
    return field, wire, pos


def _skip_group(buf: bytes, pos: int, field: int) -> int:
    """Skip a (deprecated) group body up to its matching end tag; iterative, so no recursion limit."""
    open_groups = [field]
    while open_groups:
        inner, wire, pos = _read_tag(buf, pos)
        if wire == _SGROUP:
            open_groups.append(inner)
        elif wire == _EGROUP:
            if open_groups.pop() != inner:
                raise PodResourcesDecodeError("mismatched end-group tag")
        else:
            pos = _skip_scalar(buf, pos, wire)
    return pos


def _skip_scalar(buf: bytes, pos: int, wire: int) -> int:
    if wire == _VARINT:
        return _read_varint(buf, pos)[1]
    if wire in (_FIXED64, _FIXED32):
        end = pos + (8 if wire == _FIXED64 else 4)
    elif wire == _LEN:
        length, pos = _read_varint(buf, pos)
        end = pos + length
    else:
        raise PodResourcesDecodeError(f"invalid wire type {wire}")
    if end > len(buf):
        raise PodResourcesDecodeError("field runs past the end of its message")
    return end


def _fields(buf: bytes) -> Iterator[tuple[int, bytes]]:
    """Yield (field number, payload) of every length-delimited field; skip all other fields.

    Every field we decode is a string or a message, i.e. wire type 2. A known field number
    arriving with another wire type is treated as unknown, as protobuf runtimes do.
    """
    pos = 0
    while pos < len(buf):
        field, wire, pos = _read_tag(buf, pos)
        if wire == _LEN:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise PodResourcesDecodeError("field runs past the end of its message")
            yield field, buf[pos : pos + length]
            pos += length
        elif wire == _SGROUP:
            pos = _skip_group(buf, pos, field)
        elif wire == _EGROUP:
            raise PodResourcesDecodeError("end-group tag without a start")
        else:
            pos = _skip_scalar(buf, pos, wire)


def _string(payload: bytes) -> str:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as exc:  # proto3 strings must be valid UTF-8
        raise PodResourcesDecodeError(f"invalid UTF-8 in string field: {exc}") from None


def _decode_devices(buf: bytes) -> tuple[str, tuple[str, ...]]:
    resource_name = ""
    device_ids: list[str] = []
    for field, payload in _fields(buf):
        if field == 1:
            resource_name = _string(payload)  # singular: last one wins
        elif field == 2:
            device_ids.append(_string(payload))
    return resource_name, tuple(device_ids)


def _decode_claim_resource(buf: bytes) -> ClaimResource:
    strings = {2: "", 3: "", 4: "", 5: ""}  # driver, pool, device, share id; cdi_devices (1) skipped
    for field, payload in _fields(buf):
        if field in strings:
            strings[field] = _string(payload)
    return ClaimResource(strings[2], strings[3], strings[4], strings[5])


def _decode_dynamic_resource(buf: bytes) -> DynamicResource:
    claim_name = claim_namespace = ""
    resources: list[ClaimResource] = []
    for field, payload in _fields(buf):
        if field == 2:
            claim_name = _string(payload)
        elif field == 3:
            claim_namespace = _string(payload)
        elif field == 4:
            resources.append(_decode_claim_resource(payload))
    return DynamicResource(claim_name, claim_namespace, tuple(resources))


def _decode_container(buf: bytes) -> PodResourcesContainer:
    name = ""
    devices: list[tuple[str, tuple[str, ...]]] = []
    dynamic: list[DynamicResource] = []
    for field, payload in _fields(buf):
        if field == 1:
            name = _string(payload)
        elif field == 2:
            devices.append(_decode_devices(payload))
        elif field == 5:
            dynamic.append(_decode_dynamic_resource(payload))
    return PodResourcesContainer(name=name, devices=tuple(devices), dynamic_resources=tuple(dynamic))


def _decode_pod(buf: bytes) -> PodResources:
    name = namespace = ""
    containers: list[PodResourcesContainer] = []
    for field, payload in _fields(buf):
        if field == 1:
            name = _string(payload)
        elif field == 2:
            namespace = _string(payload)
        elif field == 3:
            containers.append(_decode_container(payload))
    return PodResources(name=name, namespace=namespace, containers=tuple(containers))


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """Decode a serialized ListPodResourcesResponse; raises only PodResourcesDecodeError."""
    return tuple(_decode_pod(payload) for field, payload in _fields(bytes(data)) if field == 1)


# --- wire format: encoding (for tests and simulated kubelets) -------------------------------


def _varint(value: int) -> bytes:
    value &= 0xFFFF_FFFF_FFFF_FFFF  # negative int64 is sent as its 64-bit two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | _LEN) + _varint(len(payload)) + payload


def _str_field(field: int, value: str) -> bytes:
    # proto3 omits a singular string equal to its default
    return _len_field(field, value.encode("utf-8")) if value else b""


def encode_list_response(pods: Iterable[PodResources]) -> bytes:
    """Serialize pods as a ListPodResourcesResponse (the fields the model carries)."""
    out = bytearray()
    for pod in pods:
        body = _str_field(1, pod.name) + _str_field(2, pod.namespace)
        for container in pod.containers:
            cbody = _str_field(1, container.name)
            for resource_name, device_ids in container.devices:
                dbody = _str_field(1, resource_name) + b"".join(
                    _len_field(2, d.encode("utf-8")) for d in device_ids  # repeated: keep empties
                )
                cbody += _len_field(2, dbody)
            for dr in container.dynamic_resources:
                rbody = _str_field(2, dr.claim_name) + _str_field(3, dr.claim_namespace)
                for cr in dr.claim_resources:
                    rbody += _len_field(4, _str_field(2, cr.driver_name) + _str_field(3, cr.pool_name)
                                        + _str_field(4, cr.device_name) + _str_field(5, cr.share_id))
                cbody += _len_field(5, rbody)
            body += _len_field(3, cbody)
        out += _len_field(1, body)
    return bytes(out)


# --- gRPC client -----------------------------------------------------------------------------


class _Client:
    """An event loop and one channel per socket, kept between calls (one call at a time: ``lock``).

    The connection stays open (grpclib reconnects when the kubelet closed it, e.g. on its restart);
    the loop runs only during a call, so nothing else happens on it. Closed at exit.
    """

    # h2 remembers every closed stream of a connection (up to 65,536) and stream ids only grow: a
    # connection is renewed after this many calls, which keeps it to a few kilobytes.
    CALLS_PER_CONNECTION = 1000

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.channels: dict[str, Any] = {}
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        atexit.register(self.close)

    def close(self) -> None:
        with self.lock:
            for path in list(self.channels):
                self.drop(path)
            self.loop.close()

    def channel(self, socket_path: str) -> Any:
        calls = self.calls[socket_path] = self.calls.get(socket_path, 0) + 1
        if calls > self.CALLS_PER_CONNECTION:
            self.drop(socket_path)
            self.calls[socket_path] = 1
        channel = self.channels.get(socket_path)
        if channel is None:
            from grpclib.client import Channel
            from grpclib.encoding.base import CodecBase

            class Raw(CodecBase):
                """Bytes in, bytes out: the request is empty, the answer is decoded after the call."""

                __content_subtype__ = "proto"

                def encode(self, message: Any, message_type: Any) -> bytes:
                    return b""

                def decode(self, data: bytes, message_type: Any) -> bytes:
                    return data

            async def make() -> Any:  # a Channel belongs to the loop running when it is made
                return Channel(path=socket_path, codec=Raw())

            channel = self.channels[socket_path] = self.loop.run_until_complete(make())
        return channel

    def drop(self, socket_path: str) -> None:
        self.calls.pop(socket_path, None)
        channel = self.channels.pop(socket_path, None)
        if channel is not None:
            channel.close()


_client = _Client()


async def _call(channel: Any, timeout: float) -> bytes:
    from grpclib.const import Cardinality

    async with channel.request(LIST_METHOD, Cardinality.UNARY_UNARY, None, None, timeout=timeout) as stream:
        await stream.send_message(b"", end=True)
        return await stream.recv_message() or b""


def list_pod_resources(socket_path: str, timeout: float = 2.0) -> tuple[PodResources, ...]:
    """Call ``List`` on the kubelet pod-resources socket.

    Raises PodResourcesUnavailable when the socket is missing or the call fails or times out,
    PodResourcesDecodeError when the answer cannot be decoded.
    """
    try:
        mode = os.stat(socket_path).st_mode
    except OSError as exc:
        raise PodResourcesUnavailable(
            f"pod-resources socket {socket_path} is not accessible ({exc.strerror}); "
            "is /var/lib/kubelet/pod-resources mounted into the exporter?"
        ) from None
    if not stat.S_ISSOCK(mode):
        raise PodResourcesUnavailable(f"pod-resources path {socket_path} is not a unix socket")
    return decode_list_response(_list(socket_path, timeout))


def _list(socket_path: str, timeout: float) -> bytes:
    """The raw answer; any failure closes the channel (the next call connects anew)."""
    from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
    from h2.exceptions import H2Error

    try:
        with _client.lock:
            reused = socket_path in _client.channels
            try:
                return _client.loop.run_until_complete(_call(_client.channel(socket_path), timeout))
            except (OSError, EOFError, StreamTerminatedError, ProtocolError, H2Error):
                if not reused:
                    raise
                _client.drop(socket_path)  # the kubelet closed it since (a restart): once more, connecting anew
                return _client.loop.run_until_complete(_call(_client.channel(socket_path), timeout))
    except BaseException as exc:
        with _client.lock:
            _client.drop(socket_path)
        if isinstance(exc, TimeoutError):  # grpclib's deadline, as asyncio.TimeoutError
            raise PodResourcesUnavailable(
                f"pod-resources List on {socket_path} timed out after {timeout:g}s") from None
        if isinstance(exc, GRPCError):
            detail = f"{exc.status.name}: {exc.message}" if exc.message else exc.status.name
            raise PodResourcesUnavailable(f"pod-resources List on {socket_path} failed: {detail}") from None
        if isinstance(exc, OSError | EOFError | StreamTerminatedError | ProtocolError | H2Error):  # refused, reset
            raise PodResourcesUnavailable(
                f"pod-resources List on {socket_path} failed: UNAVAILABLE: {type(exc).__name__}: {exc}") from None
        raise
