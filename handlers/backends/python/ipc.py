"""Messages between the serving process and a model process, over a stream socket.

No shared memory (AWS Lambda has no /dev/shm): a socketpair carries length-prefixed pickles
(protocol 5) whose large buffers (numpy arrays of 64 KiB or more) travel out-of-band, written
straight from the array's memory and read straight into fresh memory, so an array costs one copy
per direction and arrives writable. Both ends are this runtime's own code; nothing else can
reach the socket.

Frame: header (meta length u64, buffer count u32), buffer lengths (u64 each), the pickle, then
the buffers.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import Any

import numpy as np

_HEADER = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
INLINE_LIMIT = 64 * 1024  # smaller buffers stay inside the pickle: one write instead of several


class ChannelClosed(Exception):
    """The other end went away (process exit, socket closed)."""


class Channel:
    """One end of the socket. `send` may be called from any thread; `receive` from one reader."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._write = threading.Lock()
        self._closed = False

    def send(self, message: Any) -> None:
        buffers: list[pickle.PickleBuffer] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            view = buffer.raw()
            if view.nbytes < INLINE_LIMIT:
                return True  # serialise in-band
            buffers.append(buffer)
            return False

        meta = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
        views = [b.raw() for b in buffers]
        head = _HEADER.pack(len(meta), len(views)) + b"".join(_LENGTH.pack(v.nbytes) for v in views)
        with self._write:
            if self._closed:
                raise ChannelClosed("channel is closed")
            try:
                self.sock.sendall(head + meta)
                for view in views:
                    self.sock.sendall(view)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None

    def receive(self) -> Any:
        meta_length, count = _HEADER.unpack(self._read(_HEADER.size))
        lengths = [_LENGTH.unpack_from(self._read(_LENGTH.size))[0] for _ in range(count)]
        meta = self._read(meta_length)
        # np.empty: no zero-filling of memory that is about to be overwritten
        buffers = [self._read_into(np.empty(length, dtype=np.uint8)) for length in lengths]
        return pickle.loads(meta, buffers=buffers)

    def _read(self, size: int) -> bytearray:
        return self._read_into(bytearray(size))

    def _read_into(self, data: Any) -> Any:
        view = memoryview(data).cast("B")
        size = view.nbytes
        received = 0
        while received < size:
            try:
                n = self.sock.recv_into(view[received:], size - received)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
            if n == 0:
                raise ChannelClosed("the other end closed the connection")
            received += n
        return data

    def close(self) -> None:
        with self._write:
            self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
