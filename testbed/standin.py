"""Stand-in task processes for the many-hosts lab (testbed/manylab.py): what pscluster sees of a
TensorFlow task, without TensorFlow, so a benchmark of hundreds of hosts measures the control
side and not 256 TensorFlow imports on two cores.

``python standin.py server`` behaves like ``python -m roles.server`` to pscluster: it reads
``TF_CONFIG``, listens on its task's port, answers ``/tensorflow.WorkerService/GetStatus`` (any
method, in fact) with a ``GetStatusResponse`` naming one CPU device of its task, reports on stderr
as roles.server does, and ends at once on SIGTERM or SIGINT (default actions, as roles.server).
gRPC is spoken by a minimal HTTP/2 responder written here on the standard library: it decodes no
request headers (every stream ending is answered), acknowledges SETTINGS and PING, gives back
flow-control window for the bytes it reads, and encodes its few headers as HPACK literals. A
grpcio server costs 36 MB of RSS, 8 threads and 0.22 CPU-s to start on this machine; this one
11 MB, one thread per connection, 0.03 CPU-s.

``python standin.py program [--every S]`` is a stand-in for a training process under ``pscluster
run``: it prints one progress line every S seconds (what the hosts' watch streams carry) until
TERM.

Standard library only: the lab's interpreter wrapper runs it with ``-I -S``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2);
    names and values here stay under 127 bytes, so each length is one byte."""
    raw_name, raw_value = name.encode(), value.encode()
    return bytes((0, len(raw_name))) + raw_name + bytes((len(raw_value),)) + raw_value


RESPONSE_HEADERS = b"\x88" + _literal("content-type", "application/grpc")   # 0x88: ":status: 200"
TRAILERS = _literal("grpc-status", "0")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def get_status_response(job: str, index: int) -> bytes:
    """A serialized ``GetStatusResponse`` with one CPU device of ``/job:JOB/.../task:INDEX``
    (the fields cluster/hosts/probe.py decodes: name 1, device_type 2, memory_limit 4)."""
    device = (_field(1, f"/job:{job}/replica:0/task:{index}/device:CPU:0".encode())
              + _field(2, b"CPU") + _varint(4 << 3) + _varint(268435456))
    return _field(1, device)


def _read_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def serve_connection(conn: socket.socket, message: bytes) -> None:
    """Answer every gRPC call on one connection with ``message`` until the peer goes."""
    reply = b"\x00" + struct.pack(">I", len(message)) + message
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if _read_exact(conn, len(PREFACE)) != PREFACE:
                return
            conn.sendall(frame(SETTINGS, 0, 0))
            while True:
                length, kind, flags, stream = _header(_read_exact(conn, 9))
                payload = _read_exact(conn, length) if length else b""
                if kind == SETTINGS and not flags & ACK:
                    conn.sendall(frame(SETTINGS, ACK, 0))
                elif kind == PING and not flags & ACK:
                    conn.sendall(frame(PING, ACK, 0, payload))
                elif kind == GOAWAY:
                    return
                out = b""
                if kind == DATA and length:
                    out += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", length))
                if kind in (DATA, HEADERS) and flags & END_STREAM:
                    out += (frame(HEADERS, END_HEADERS, stream, RESPONSE_HEADERS) + frame(DATA, 0, stream, reply)
                            + frame(HEADERS, END_HEADERS | END_STREAM, stream, TRAILERS))
                if out:     # one write per frame read: two small writes meet Nagle and a 40 ms delayed ACK
                    conn.sendall(out)
        except OSError:
            return


def _header(raw: bytes) -> tuple[int, int, int, int]:
    length = int.from_bytes(raw[:3], "big")
    return length, raw[3], raw[4], int.from_bytes(raw[5:9], "big") & 0x7FFFFFFF


def task_of(tf_config: str) -> tuple[str, int, str]:
    """(job, index, address) of this task from TF_CONFIG's text."""
    config = json.loads(tf_config)
    job, index = config["task"]["type"], int(config["task"]["index"])
    return job, index, config["cluster"][job][index]


def serve(tf_config: str) -> int:
    job, index, address = task_of(tf_config)
    port = int(address.rpartition(":")[2])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("0.0.0.0", port))      # as tf.distribute.Server: every address of the host
    except OSError as exc:
        print(f"standin.server: could not start {job}:{index} on {address}: {exc}", file=sys.stderr, flush=True)
        return 1
    listener.listen(64)
    message = get_status_response(job, index)
    print(f"roles.server: {job}:{index} serving at grpc://{address} (stand-in, testbed/standin.py)",
          file=sys.stderr, flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve_connection, args=(conn, message), daemon=True).start()


def program(every: float) -> int:
    name = f"{os.environ.get('PSCLUSTER_TASK_TYPE', 'task')}:{os.environ.get('PSCLUSTER_TASK_INDEX', '0')}"
    began, step = time.monotonic(), 0
    while True:
        step += 1
        print(f"{name} step {step} at {time.monotonic() - began:.1f} s", flush=True)
        time.sleep(every)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    parser = argparse.ArgumentParser(prog="standin.py")
    sub = parser.add_subparsers(dest="role", required=True)
    sub.add_parser("server", help="stand in for python -m roles.server")
    prog = sub.add_parser("program", help="stand in for a training process under pscluster run")
    prog.add_argument("--every", type=float, default=1.0)
    args, _ = parser.parse_known_args(argv)
    if args.role == "server":
        tf_config = os.environ.get("TF_CONFIG")
        if not tf_config:
            print("standin.server: TF_CONFIG is not set", file=sys.stderr, flush=True)
            return 2
        return serve(tf_config)
    return program(args.every)


if __name__ == "__main__":
    sys.exit(main())
