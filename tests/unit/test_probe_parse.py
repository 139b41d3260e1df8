"""Decoding of GetStatusResponse (cluster/hosts/probe.py ``parse_get_status``), without a server.

Test bytes come from a tiny protobuf encoder below (itself checked against the wire-format
examples of the protobuf documentation), and once from protobuf's own serialization of
TensorFlow's DeviceAttributes message.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cluster.hosts.probe import Device, parse_get_status

CPU = "/job:worker/replica:0/task:0/device:CPU:0"
GPU = "/job:worker/replica:0/task:0/device:GPU:0"


# ----------------------------------------------------------------------------- a tiny encoder

def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64                      # int64: two's complement, ten bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def field_varint(number: int, value: int) -> bytes:
    return tag(number, 0) + varint(value)


def field_bytes(number: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return tag(number, 2) + varint(len(data)) + data


def field_fixed64(number: int, value: int) -> bytes:
    return tag(number, 1) + value.to_bytes(8, "little")


def field_fixed32(number: int, value: int) -> bytes:
    return tag(number, 5) + value.to_bytes(4, "little")


def device_attributes(name: str = "", device_type: str = "", memory_limit: int = 0, *extra: bytes) -> bytes:
    """DeviceAttributes: name = 1, device_type = 2, memory_limit = 4 (int64), then ``extra`` fields."""
    data = b""
    if name:
        data += field_bytes(1, name)
    if device_type:
        data += field_bytes(2, device_type)
    if memory_limit:
        data += field_varint(4, memory_limit)
    return data + b"".join(extra)


def get_status_response(*devices: bytes) -> bytes:
    """GetStatusResponse: repeated DeviceAttributes device_attributes = 1."""
    return b"".join(field_bytes(1, device) for device in devices)


def test_encoder_matches_the_protobuf_documentation():
    # https://protobuf.dev/programming-guides/encoding/: 150 in field 1 is 08 96 01,
    # "testing" in field 2 is 12 07 74 65 73 74 69 6e 67, 300 is ac 02.
    assert field_varint(1, 150) == bytes.fromhex("089601")
    assert field_bytes(2, "testing") == bytes.fromhex("120774657374696e67")
    assert varint(300) == bytes.fromhex("ac02")
    assert varint(-1) == b"\xff" * 9 + b"\x01"


# ----------------------------------------------------------------------------- hand-built replies

def test_one_cpu_device_literal_bytes():
    # Hand-assembled: outer field 1 (0a) of 0x36 bytes; inside, name (0a 29 + 41 bytes),
    # type (12 03 CPU), memory_limit (20, varint 268435456 = 2**28 = 80 80 80 80 01).
    inner = b"\x0a\x29" + CPU.encode() + b"\x12\x03CPU" + b"\x20\x80\x80\x80\x80\x01"
    assert len(CPU) == 0x29 and len(inner) == 0x36
    data = b"\x0a\x36" + inner
    assert data == get_status_response(device_attributes(CPU, "CPU", 268435456))
    assert parse_get_status(data) == (Device(CPU, "CPU", 268435456),)


def test_cpu_and_gpu_devices_in_order():
    data = get_status_response(device_attributes(CPU, "CPU", 268435456),
                               device_attributes(GPU, "GPU", 15_728_640_000))
    assert parse_get_status(data) == (Device(CPU, "CPU", 268435456), Device(GPU, "GPU", 15_728_640_000))


def test_empty_reply_has_no_devices():
    assert parse_get_status(b"") == ()


def test_unknown_fields_are_skipped():
    locality = field_varint(1, 1) + field_varint(2, 0)                  # DeviceLocality bus_id, numa_node
    device = device_attributes(GPU, "GPU", 1 << 34,
                               field_bytes(5, locality),               # locality (message)
                               field_fixed64(6, 0x1234567890ABCDEF),   # incarnation (fixed64)
                               field_bytes(7, "device: 0, name: NVIDIA A100, pci bus id: 0000:00:04.0"),
                               field_varint(8, -1))                    # xla_global_id (int64, ten bytes)
    data = field_fixed32(9, 7) + get_status_response(device) + field_varint(3, 5)   # unknown outer fields
    assert parse_get_status(data) == (Device(GPU, "GPU", 1 << 34),)


def test_fields_in_any_order_and_missing_fields():
    reordered = field_varint(4, 1024) + field_bytes(2, "CPU") + field_bytes(1, CPU)
    assert parse_get_status(get_status_response(reordered, b"")) == \
        (Device(CPU, "CPU", 1024), Device("", "", 0))


def test_unicode_and_undecodable_names():
    name = "/job:wörker/replica:0/task:0/device:CPU:0"
    data = get_status_response(field_bytes(1, name), field_bytes(1, b"\xff/device:CPU:0"))
    assert [device.name for device in parse_get_status(data)] == [name, "\ufffd/device:CPU:0"]


def test_group_wire_types_are_rejected():
    with pytest.raises(ValueError):
        parse_get_status(tag(1, 3) + tag(1, 4))


def test_truncated_varint_is_rejected():
    with pytest.raises((ValueError, IndexError)):       # what Prober reports as "not a TensorFlow server reply"
        parse_get_status(b"\x0a\x80")


def test_truncated_reply_is_rejected():
    # The reply is cut in the middle of the device name: a real protobuf parser refuses it,
    # and so must the probe (rather than report a device with half a name).
    data = get_status_response(device_attributes(CPU, "CPU", 268435456))
    with pytest.raises((ValueError, IndexError)):
        parse_get_status(data[:20])


# ----------------------------------------------------------------------------- real protobuf serialization

def _get_status_response_class():
    """TensorFlow's GetStatusResponse class, without importing all of TensorFlow when possible.

    Wheels that ship ``tensorflow/core/protobuf/worker_pb2.py`` provide it directly. Recent
    wheels do not; they still ship ``device_attributes_pb2.py``, and worker.proto declares
    ``message GetStatusResponse { repeated DeviceAttributes device_attributes = 1; }``, which is
    rebuilt here on top of TensorFlow's real DeviceAttributes descriptor.
    """
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        pytest.skip("tensorflow is not installed")
    root = Path(spec.origin).parent
    if (root / "core" / "protobuf" / "worker_pb2.py").exists():
        from tensorflow.core.protobuf import worker_pb2   # imports all of TensorFlow (seconds)
        return worker_pb2.GetStatusResponse
    attributes_file = root / "core" / "framework" / "device_attributes_pb2.py"
    if not attributes_file.exists():
        pytest.skip(f"neither worker_pb2 nor device_attributes_pb2 in {root}")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    module_spec = importlib.util.spec_from_file_location("_tf_device_attributes_pb2", attributes_file)
    attributes = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(attributes)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(attributes.DESCRIPTOR.serialized_pb)
    worker = descriptor_pb2.FileDescriptorProto(
        name="tensorflow/core/protobuf/worker.proto", package="tensorflow", syntax="proto3",
        dependency=[attributes.DESCRIPTOR.name])
    message = worker.message_type.add(name="GetStatusResponse")
    message.field.add(name="device_attributes", number=1,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                      type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                      type_name=".tensorflow.DeviceAttributes")
    pool.Add(worker)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.GetStatusResponse"))


def test_real_get_status_response_serialization():
    response_class = _get_status_response_class()
    response = response_class()
    cpu = response.device_attributes.add()
    cpu.name, cpu.device_type, cpu.memory_limit, cpu.incarnation = CPU, "CPU", 268435456, 0xDEADBEEF12345678
    gpu = response.device_attributes.add()
    gpu.name, gpu.device_type, gpu.memory_limit = GPU, "GPU", 15_728_640_000
    gpu.incarnation = 42
    gpu.physical_device_desc = "device: 0, name: NVIDIA A100-SXM4-40GB, pci bus id: 0000:00:04.0"
    gpu.locality.bus_id = 1
    gpu.locality.numa_node = 0
    gpu.xla_global_id = -1
    data = response.SerializeToString()
    assert parse_get_status(data) == (Device(CPU, "CPU", 268435456), Device(GPU, "GPU", 15_728_640_000))
    # The tiny encoder above writes the same bytes for the fields it knows.
    assert parse_get_status(data) == parse_get_status(get_status_response(
        device_attributes(CPU, "CPU", 268435456), device_attributes(GPU, "GPU", 15_728_640_000)))
