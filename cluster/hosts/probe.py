"""Readiness and liveness of TensorFlow servers over gRPC (the only module importing grpcio).

A TF server answers ``/tensorflow.WorkerService/GetStatus`` with an empty request by a
``GetStatusResponse``: ``repeated DeviceAttributes device_attributes = 1``, where
``DeviceAttributes`` has ``name = 1`` (``/job:worker/replica:0/task:0/device:CPU:0``),
``device_type = 2`` and ``memory_limit = 4``. The devices a task reports prove that its
CUDA_VISIBLE_DEVICES mask took effect. The few fields needed are decoded here from the
protobuf wire format, so the control machine needs neither TensorFlow nor protobuf.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # imported where a probe is made: a one-shot run (no server) works without grpcio
    import grpc

GET_STATUS = "/tensorflow.WorkerService/GetStatus"
_CHANNEL_OPTIONS = [
    ("grpc.enable_http_proxy", 0),          # a proxy in the environment must not capture cluster traffic
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),  # servers come up within seconds; poll them briskly
]


@dataclass(frozen=True)
class Device:
    name: str
    device_type: str
    memory_limit: int


@dataclass(frozen=True)
class ProbeResult:
    target: str
    ok: bool
    devices: tuple[Device, ...] = ()
    error: str | None = None
    seconds: float = 0.0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes):
    """Yield (field number, wire type, value) of one protobuf message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
            continue
        if wire == 1:
            length = 8
        elif wire == 2:
            length, pos = _varint(data, pos)
        elif wire == 5:
            length = 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos + length > len(data):
            raise ValueError(f"field {number} runs past the end of the message")
        yield number, wire, data[pos:pos + length]
        pos += length


def parse_get_status(data: bytes) -> tuple[Device, ...]:
    """Devices from a serialized ``GetStatusResponse``."""
    devices = []
    for number, wire, value in _fields(data):
        if number != 1 or wire != 2:
            continue
        name = device_type = ""
        memory = 0
        for inner_number, inner_wire, inner in _fields(value):
            if inner_number == 1 and inner_wire == 2:
                name = inner.decode("utf-8", "replace")
            elif inner_number == 2 and inner_wire == 2:
                device_type = inner.decode("utf-8", "replace")
            elif inner_number == 4 and inner_wire == 0:
                memory = inner
        devices.append(Device(name, device_type, memory))
    return tuple(devices)


class Prober:
    """Keeps one gRPC channel per target, so repeated probes reuse the connection."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()     # probes run in threads (status asks every server at once)

    def probe(self, target: str, *, timeout: float = 2.0, via=None) -> ProbeResult:
        """``via``: the task's host transport; a host behind a bastion is probed through its SSH
        connection (:meth:`Transport.tunnel`), the result still names ``target``."""
        import grpc
        start = time.monotonic()
        shown = target
        tunnel = getattr(via, "tunnel", None)
        if tunnel is not None:
            address, _, port = target.rpartition(":")
            target = tunnel(address.strip("[]"), int(port)) or target
        with self._lock:
            channel = self._channels.get(target)
            if channel is None:
                channel = self._channels[target] = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        call = channel.unary_unary(GET_STATUS, request_serializer=None, response_deserializer=None)
        try:
            response = call(b"", timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            return ProbeResult(shown, False, error=f"{code.name if code else 'error'}: {detail}",
                               seconds=time.monotonic() - start)
        try:
            devices = parse_get_status(response)
        except (ValueError, IndexError) as exc:
            return ProbeResult(shown, False, error=f"not a TensorFlow server reply: {exc}",
                               seconds=time.monotonic() - start)
        return ProbeResult(shown, True, devices, seconds=time.monotonic() - start)

    def forget(self, target: str) -> None:
        channel = self._channels.pop(target, None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> "Prober":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
