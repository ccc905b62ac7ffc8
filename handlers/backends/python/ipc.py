"""Messages between the serving process and a model process, over a stream socket.

No shared memory (AWS Lambda has no /dev/shm): a socketpair carries length-prefixed pickles
(protocol 5) whose large buffers (numpy arrays of 64 KiB or more) travel out-of-band, written
straight from the array's memory and read straight into fresh memory, so an array costs one copy
per direction and arrives writable. Both ends are this runtime's own code; nothing else can
reach the socket.

A portable channel (`portable=True`: a model process on another environment's interpreter,
execution_env.py) writes numpy arrays as (bytes, dtype, shape) rebuilt by `_array`, which every
numpy version reads; numpy's own pickles name its private modules (numpy._core in 2.x), which
numpy 1.x cannot import.

Frame: header (meta length u64, buffer count u32), buffer lengths (u64 each), the pickle, then
the buffers.
"""

from __future__ import annotations

import io
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

    def __init__(self, sock: socket.socket, portable: bool = False) -> None:
        self.sock = sock
        self.portable = portable
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

        if self.portable:
            stream = io.BytesIO()
            _PortablePickler(stream, protocol=5, buffer_callback=out_of_band).dump(message)
            meta = stream.getvalue()
        else:
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


def _array(data: Any, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)


def _object_array(items: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def _scalar(data: bytes, dtype: Any) -> Any:
    return np.frombuffer(data, dtype=np.dtype(dtype))[0]


class _PortablePickler(pickle.Pickler):
    """Arrays and numpy scalars as plain bytes, dtype and shape (see the module's doc)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                return _object_array, (obj.ravel().tolist(), obj.shape)
            data = np.ascontiguousarray(obj)
            dtype = data.dtype.descr if data.dtype.fields else data.dtype.str
            # writable, so it arrives as a bytearray (in-band) or fresh memory (out-of-band)
            raw = pickle.PickleBuffer(data.reshape(-1).view(np.uint8)) if data.flags.writeable else bytearray(data.tobytes())
            return _array, (raw, dtype, obj.shape)
        if isinstance(obj, np.generic) and not isinstance(obj, np.object_):
            return _scalar, (obj.tobytes(), obj.dtype.str)
        return NotImplemented
