"""The transports under comparison, each a parent endpoint plus a child process.

Every transport has the same shape:

* a *spec*: a small picklable object handed to the child (spawn) whose
  ``connect()`` returns the child's endpoint;
* the parent's ``send(obj)`` / ``recv(timeout)``;
* the child's endpoint with the same two calls plus ``release()`` (the
  consumer is done with the last item it received) and ``close()``.

The child runs :func:`serve`, the same loop for every transport: receive an
item, touch it (:func:`chbench.payloads.touch`), drop it, and send a tiny ack
after every ``ack_every`` items (1 for round trips, K for streaming).

Serialisation: ``shm_slot`` and ``zmq_*`` use the channel's own pickle-5
serializer (:mod:`rlinf.core.channel.serialization`), so those comparisons
isolate the transport. ``mp_queue`` uses what ``multiprocessing.Queue`` always
uses (``ForkingPickler``; for torch tensors that is torch.multiprocessing's
shared-memory file-descriptor passing). The Ray transports use Ray's serializer.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
import uuid
from collections import deque
from multiprocessing import shared_memory
from typing import Any

from chbench.payloads import touch

ACK = b"k"
CTL = "__chbench_ctl__"
# Longest any single blocking wait lasts in the benchmarks (a 64 MiB item
# through multiprocessing.Queue takes ~1 s; anything near this is a hang).
WAIT_S = 120.0
# A child gives up after this long without a message (the parent is gone).
IDLE_S = 900.0
_SLICE_S = 1.0


def serve(endpoint: Any, parent_alive: Any = None) -> None:
    """The consumer loop every child runs, whatever the transport."""
    ack_every, seen = 1, 0
    while True:
        msg = _recv_patiently(endpoint, parent_alive)
        if type(msg) is tuple and msg and msg[0] == CTL:
            endpoint.release()
            if msg[1] == "stop":
                endpoint.send(ACK)
                return
            if msg[1] == "ack_every":
                ack_every, seen = int(msg[2]), 0
            endpoint.send(ACK)
            continue
        touch(msg)
        del msg
        endpoint.release()
        seen += 1
        if seen == ack_every:
            seen = 0
            endpoint.send(ACK)


def _recv_patiently(endpoint: Any, parent_alive: Any) -> Any:
    """Waits in short slices so a dead parent or a long idle ends the child."""
    deadline = time.monotonic() + IDLE_S
    while True:
        try:
            return endpoint.recv(_SLICE_S)
        except TimeoutError:
            if parent_alive is not None and not parent_alive():
                raise SystemExit("chbench child: parent died") from None
            if time.monotonic() > deadline:
                raise SystemExit(f"chbench child: idle for {IDLE_S} s") from None


def settle_malloc() -> None:
    """Puts glibc malloc in the state a long-running process reaches anyway.

    glibc serves large blocks with fresh mmaps until it has freed one of that
    size, then raises its mmap threshold (up to 32 MiB) and recycles heap
    memory instead. A fresh 16 MiB block costs ~4096 page faults (~12 ms on a
    2-vCPU VM), so without this the cost of pickling a 16 MiB ``bytes`` item
    depends on which cells ran before it in the same process.
    """
    block = bytearray(31 << 20)
    del block


def child_main(spec: Any) -> None:
    """Entry point of a spawned child: connect, say hello, serve, clean up."""
    settle_malloc()
    parent = mp.parent_process()
    endpoint = spec.connect()
    try:
        endpoint.send(ACK)  # hello: the parent waits for it before timing anything
        serve(endpoint, parent.is_alive if parent is not None else None)
    finally:
        endpoint.close()


class SpawnTransport:
    """Base class: a parent endpoint whose peer is a spawned child process."""

    name = "?"

    def __init__(self, max_item_bytes: int, namespace: str) -> None:
        self.max_item_bytes = max_item_bytes
        self.namespace = namespace
        self.proc: mp.process.BaseProcess | None = None

    # Subclasses: create resources, return the child's spec.
    def _open(self) -> Any:
        raise NotImplementedError

    # Subclasses: release resources (must be safe after a partial _open).
    def _close(self) -> None:
        raise NotImplementedError

    def send(self, obj: Any) -> None:
        raise NotImplementedError

    def recv(self, timeout: float = WAIT_S) -> Any:
        raise NotImplementedError

    def start(self) -> None:
        try:
            spec = self._open()
            ctx = mp.get_context("spawn")
            self.proc = ctx.Process(target=child_main, args=(spec,), daemon=True)
            self.proc.start()
            self.recv(WAIT_S)  # hello
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops the child (politely, then by force) and frees everything."""
        try:
            if self.proc is not None and self.proc.is_alive():
                with contextlib.suppress(Exception):
                    self.send((CTL, "stop"))
                    self.recv(10.0)
        finally:
            try:
                if self.proc is not None:
                    self.proc.join(10.0)
                    if self.proc.is_alive():
                        self.proc.terminate()
                        self.proc.join(5.0)
                    if self.proc.is_alive():
                        self.proc.kill()
                        self.proc.join(5.0)
                    self.proc = None
            finally:
                self._close()


# ----- ours: rlinf.core.channel.Channel ------------------------------------------------
class _OursEndpoint:
    def __init__(self, channel: Any, rx: str, tx: str) -> None:
        self.ch, self.rx, self.tx = channel, rx, tx

    def send(self, obj: Any) -> None:
        self.ch.put(obj, key=self.tx, timeout=WAIT_S)

    def recv(self, timeout: float = WAIT_S) -> Any:
        return self.ch.get(key=self.rx, timeout=timeout)

    def release(self) -> None:
        pass  # blocks return to the channel when the item's views are collected

    def close(self) -> None:
        self.ch = None


class _OursSpec:
    def __init__(self, channel: Any) -> None:
        self.channel = channel  # a Channel pickles as its name and reconnects

    def connect(self) -> _OursEndpoint:
        return _OursEndpoint(self.channel, rx="data", tx="ack")


class OursTransport(SpawnTransport):
    """The channel under test: items to key ``data``, acks back on key ``ack``."""

    name = "ours"

    def _open(self) -> Any:
        from rlinf.core.channel import Channel

        # Room for a streaming batch of the largest items plus every smaller
        # size class the matrix carves (pages are only used once touched).
        capacity = max(2 << 30, 8 * self.max_item_bytes)
        self.ch = Channel.create(
            f"chbench-{uuid.uuid4().hex[:8]}",
            namespace=self.namespace,
            capacity_bytes=capacity,
        )
        self.ep = _OursEndpoint(self.ch, rx="ack", tx="data")
        return _OursSpec(self.ch)

    def _close(self) -> None:
        ch = getattr(self, "ch", None)
        if ch is not None:
            ch.close()
        self.ch = self.ep = None  # the last handle dropped unlinks the segment

    def send(self, obj: Any) -> None:
        self.ep.send(obj)

    def recv(self, timeout: float = WAIT_S) -> Any:
        return self.ep.recv(timeout)


class _SplitEndpoint(_OursEndpoint):
    """Sends through one channel handle (remote, over TCP), receives on another."""

    def __init__(self, local: Any, remote: Any, rx: str, tx: str) -> None:
        super().__init__(local, rx, tx)
        self.remote = remote

    def send(self, obj: Any) -> None:
        self.remote.put(obj, key=self.tx, timeout=WAIT_S)


class OursTcpTransport(OursTransport):
    """Our channel over its TCP transport, as a producer on another node uses it.

    The parent puts through a ``ChannelAgent`` over loopback TCP (the agent
    receives straight into the arena block); the child, on the channel's home
    node, consumes from shared memory. Payloads cross TCP once, as with zmq_tcp.
    """

    name = "ours_tcp"
    tls = False
    """Whether the producer's connection asks for TLS (``RLINF_CHANNEL_TLS=1``)."""

    def _open(self) -> Any:
        from rlinf.core.channel import TLS_ENV, TRANSPORT_ENV, Channel, ChannelAgent

        spec = super()._open()
        self.agent = ChannelAgent("127.0.0.1:0")
        # Our TCP transport, whatever the environment says: with UCX in the
        # extension, `auto` would pick UCX. TLS exactly as this peer asks.
        wanted = {TRANSPORT_ENV: "tcp", TLS_ENV: "1" if self.tls else "0"}
        old = {k: os.environ.get(k) for k in wanted}
        os.environ.update(wanted)
        try:
            self.remote = Channel.connect(
                self.ch.name, namespace=self.namespace, address=self.agent.address
            )
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        expected = "tcp+tls" if self.tls else "tcp"
        assert self.remote.transport == expected, self.remote.transport
        self.ep = _SplitEndpoint(self.ch, self.remote, rx="ack", tx="data")
        return spec

    def _close(self) -> None:
        self.remote = None
        agent = getattr(self, "agent", None)
        if agent is not None:
            agent.stop()
        super()._close()


class OursTcpTlsTransport(OursTcpTransport):
    """As :class:`OursTcpTransport`, with the producer's connection encrypted by TLS."""

    name = "ours_tcp_tls"
    tls = True


# ----- multiprocessing.Queue ------------------------------------------------------------
class _QueueEndpoint:
    def __init__(self, rx: Any, tx: Any) -> None:
        self.rx, self.tx = rx, tx

    def send(self, obj: Any) -> None:
        self.tx.put(obj, timeout=WAIT_S)

    def recv(self, timeout: float = WAIT_S) -> Any:
        try:
            return self.rx.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message within {timeout} s") from None

    def release(self) -> None:
        pass

    def close(self) -> None:
        self.tx.close()
        self.tx.join_thread()  # flush the last ack before the child exits


class _QueueSpec:
    def __init__(self, data: Any, ack: Any) -> None:
        self.data, self.ack = data, ack

    def connect(self) -> _QueueEndpoint:
        return _QueueEndpoint(rx=self.data, tx=self.ack)


class MpQueueTransport(SpawnTransport):
    """Two ``multiprocessing.Queue`` s (data out, acks back)."""

    name = "mp_queue"

    def _open(self) -> Any:
        ctx = mp.get_context("spawn")
        self.data, self.ack = ctx.Queue(), ctx.Queue()
        return _QueueSpec(self.data, self.ack)

    def _close(self) -> None:
        for q in (getattr(self, "data", None), getattr(self, "ack", None)):
            if q is not None:
                q.cancel_join_thread()  # never hang on a child that died mid-item
                q.close()

    def send(self, obj: Any) -> None:
        self.data.put(obj, timeout=WAIT_S)

    def recv(self, timeout: float = WAIT_S) -> Any:
        try:
            return self.ack.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no ack within {timeout} s") from None


# ----- hand-rolled: reused shared-memory slots + pickle 5 + a Pipe ---------------------
_ALIGN = 64
_SLOTS = 2  # double buffering: the producer fills one slot while the consumer reads the other


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _SlotChild:
    """Consumer side: reads items in place from the slot named in each Pipe message."""

    def __init__(self, shm_name: str, slot_bytes: int, conn: Any) -> None:
        # A spawned child shares its parent's resource tracker, so attaching here
        # registers nothing new, and the creator's unlink unregisters the segment.
        self.shm = shared_memory.SharedMemory(name=shm_name)
        self.slot_bytes, self.conn = slot_bytes, conn
        self.current: int | None = None
        self.released: list[int] = []

    def recv(self, timeout: float = WAIT_S) -> Any:
        from rlinf.core.channel.serialization import loads

        if self.released:  # hand finished slots back before waiting
            self.conn.send(("credit", self.released, None))
            self.released = []
        if not self.conn.poll(timeout):
            raise TimeoutError(f"no message within {timeout} s")
        slot, header_len, spans = self.conn.recv()
        base = slot * self.slot_bytes
        buf = self.shm.buf
        header = buf[base : base + header_len]
        views = [buf[base + off : base + off + n] for off, n in spans]
        self.current = slot
        try:
            return loads(header, views)
        finally:
            header.release()

    def release(self) -> None:
        if self.current is not None:
            self.released.append(self.current)
            self.current = None

    def send(self, obj: Any) -> None:
        self.conn.send(("msg", self.released, obj))  # piggyback pending credits
        self.released = []

    def close(self) -> None:
        try:
            with contextlib.suppress(BufferError):  # a view still alive after an error
                self.shm.close()
        finally:
            self.conn.close()


class _SlotSpec:
    def __init__(self, shm_name: str, slot_bytes: int, conn: Any) -> None:
        self.shm_name, self.slot_bytes, self.conn = shm_name, slot_bytes, conn

    def connect(self) -> _SlotChild:
        return _SlotChild(self.shm_name, self.slot_bytes, self.conn)


class ShmSlotTransport(SpawnTransport):
    """The "hand-rolled" baseline of channel.md: what pure Python gets with care.

    One ``multiprocessing.shared_memory`` segment holds two reused slots. The
    producer pickles with protocol 5, copies the pickle stream and every
    out-of-band buffer (64-byte aligned) into a free slot, and sends
    ``(slot, header_len, spans)`` over a ``Pipe``; the consumer unpickles with
    zero-copy views of the slot and returns the slot with a credit message
    (piggybacked on its acks where possible).
    """

    name = "shm_slot"

    def _open(self) -> Any:
        self.slot_bytes = _aligned(self.max_item_bytes + (1 << 20))
        self.shm = shared_memory.SharedMemory(create=True, size=_SLOTS * self.slot_bytes)
        self.conn, child_conn = mp.get_context("spawn").Pipe()
        self.free = deque(range(_SLOTS))
        self.acks: deque[Any] = deque()
        return _SlotSpec(self.shm.name, self.slot_bytes, child_conn)

    def _close(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.close()
        shm = getattr(self, "shm", None)
        if shm is not None:
            try:
                shm.close()
            finally:
                shm.unlink()
            self.shm = None

    def _pump(self, timeout: float) -> None:
        """Reads one message from the child: credits and/or an ack."""
        if not self.conn.poll(timeout):
            raise TimeoutError(f"no message from the shm_slot child within {timeout} s")
        kind, credits, obj = self.conn.recv()
        self.free.extend(credits)
        if kind == "msg":
            self.acks.append(obj)

    def send(self, obj: Any) -> None:
        from rlinf.core.channel.serialization import dumps

        header, buffers = dumps(obj)
        deadline = time.monotonic() + WAIT_S
        while not self.free:
            self._pump(max(0.0, deadline - time.monotonic()))
        slot = self.free.popleft()
        base = slot * self.slot_bytes
        buf = self.shm.buf
        buf[base : base + len(header)] = header
        off, spans = _aligned(len(header)), []
        for b in buffers:
            n = b.nbytes
            if off + n > self.slot_bytes:
                raise ValueError(f"item larger than the {self.slot_bytes}-byte slot")
            buf[base + off : base + off + n] = b
            spans.append((off, n))
            off = _aligned(off + n)
        self.conn.send((slot, len(header), spans))

    def recv(self, timeout: float = WAIT_S) -> Any:
        deadline = time.monotonic() + timeout
        while not self.acks:
            self._pump(max(0.0, deadline - time.monotonic()))
        return self.acks.popleft()


# ----- pyzmq: PAIR over ipc:// or tcp:// loopback ----------------------------------------
class _ZmqEndpoint:
    def __init__(self, addr: str, bind: bool) -> None:
        import zmq

        self.zmq = zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PAIR)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDTIMEO, int(WAIT_S * 1000))
        self.rcvtimeo = -1
        if bind:
            if addr.startswith("tcp://"):
                port = self.sock.bind_to_random_port(addr)
                addr = f"{addr}:{port}"
            else:
                self.sock.bind(addr)
        else:
            self.sock.connect(addr)
        self.addr = addr

    def send(self, obj: Any) -> None:
        from rlinf.core.channel.serialization import dumps

        header, buffers = dumps(obj)
        try:
            self.sock.send_multipart([header, *buffers], copy=False)
        except self.zmq.Again:
            raise TimeoutError("zmq send timed out") from None

    def recv(self, timeout: float = WAIT_S) -> Any:
        from rlinf.core.channel.serialization import loads

        # RCVTIMEO, not poll(): a poll before every recv costs ~10 us per message.
        ms = int(timeout * 1000)
        if ms != self.rcvtimeo:
            self.sock.setsockopt(self.zmq.RCVTIMEO, ms)
            self.rcvtimeo = ms
        try:
            frames = self.sock.recv_multipart(copy=False)
        except self.zmq.Again:
            raise TimeoutError(f"no message within {timeout} s") from None
        return loads(frames[0].buffer, [f.buffer for f in frames[1:]])

    def release(self) -> None:
        pass

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


class _ZmqSpec:
    def __init__(self, addr: str) -> None:
        self.addr = addr

    def connect(self) -> _ZmqEndpoint:
        return _ZmqEndpoint(self.addr, bind=False)


class ZmqTransport(SpawnTransport):
    """pyzmq PAIR sockets; pickle-5 header plus out-of-band buffers as frames (copy=False)."""

    def __init__(self, max_item_bytes: int, namespace: str, scheme: str) -> None:
        super().__init__(max_item_bytes, namespace)
        self.scheme = scheme
        self.name = f"zmq_{scheme}"
        self.ep: _ZmqEndpoint | None = None
        self.tmpdir: str | None = None

    def _open(self) -> Any:
        if self.scheme == "ipc":
            self.tmpdir = tempfile.mkdtemp(prefix="chbench-zmq-")
            addr = f"ipc://{os.path.join(self.tmpdir, 'sock')}"
        else:
            addr = "tcp://127.0.0.1"
        self.ep = _ZmqEndpoint(addr, bind=True)
        return _ZmqSpec(self.ep.addr)

    def _close(self) -> None:
        if self.ep is not None:
            self.ep.close()
            self.ep = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def send(self, obj: Any) -> None:
        assert self.ep is not None
        self.ep.send(obj)

    def recv(self, timeout: float = WAIT_S) -> Any:
        assert self.ep is not None
        return self.ep.recv(timeout)
