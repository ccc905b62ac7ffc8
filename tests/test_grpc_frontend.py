"""The native gRPC front end (grpc++, handlers/protocol/grpc/native + nativeserver.py) against a
real grpcio client: grpcio's server semantics for the handlers it runs (unknown methods, abort,
exceptions, streams, cancellation, message limits, shutdown), and how `toolkit serve` chooses a
front end (TOOLKIT_GRPC_FRONTEND).

The whole gRPC suite (tests/test_grpc_*.py, decoupled, workers, fuzz) runs against the default
front end, native when built; tests/test_grpc_fallback.py runs it again on grpcio's server. Without
the extension these tests skip locally (build it: handlers/protocol/native/build.py grpc) and
fail in CI (TOOLKIT_REQUIRE_TOOLS=1).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from handlers.protocol.grpc import server as grpc_server

SERVICE = "test.Echo"
ADD_SUB = """
    name: "add_sub"
    backend: "onnxruntime"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


@pytest.fixture(scope="module", autouse=True)
def _native_built() -> None:
    if not grpc_server.native_available():
        message = ("the native gRPC front end is not built: "
                   f"{sys.executable} handlers/protocol/native/build.py grpc (needs libgrpc++-dev)")
        if os.environ.get("TOOLKIT_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)


class _Echo:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()

    async def unary(self, request: bytes, context) -> bytes:
        if request == b"abort":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no aborts here")
        if request == b"raise":
            raise ValueError("broken")
        if request == b"metadata":
            return repr((dict(context.invocation_metadata()).get("x-key"), context.peer().startswith("ipv"),
                         context.time_remaining() is not None)).encode()
        if request == b"wait":
            self.started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return request[::-1]

    async def stream(self, requests: AsyncIterator[bytes], context) -> AsyncIterator[bytes]:
        count = 0
        try:
            async for request in requests:
                count += 1
                yield request + b"!"
                if request == b"hang":
                    self.started.set()
                    await asyncio.sleep(60)
            yield f"{count} requests".encode()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def flood(self, request: bytes, context) -> AsyncIterator[bytes]:
        for i in range(200):
            self.produced = i + 1
            yield bytes([i % 256]) * 256 * 1024

    async def watch(self, request: bytes, context) -> None:
        for i in range(3):
            await context.write(request + str(i).encode())


def _handlers(echo: _Echo):
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(echo.unary),
        "Stream": grpc.stream_stream_rpc_method_handler(echo.stream),
        "Watch": grpc.unary_stream_rpc_method_handler(echo.watch),
        "Flood": grpc.unary_stream_rpc_method_handler(echo.flood),
    })


async def _serve(echo: _Echo, max_receive: int = 1 << 20):
    from handlers.protocol.grpc.nativeserver import NativeServer

    server = NativeServer([("grpc.max_receive_message_length", max_receive), ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((_handlers(echo),))
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    return server, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


def _run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_unary_abort_exception_unknown_method_and_metadata() -> None:
    async def scenario() -> None:
        server, channel = await _serve(_Echo())
        unary = channel.unary_unary(f"/{SERVICE}/Unary")
        assert await unary(b"hello") == b"olleh"
        assert await unary(b"") == b""
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await unary(b"abort")
        assert (error.value.code(), error.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "no aborts here")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await unary(b"raise")
        assert error.value.code() == grpc.StatusCode.UNKNOWN
        assert error.value.details() == "Unexpected <class 'ValueError'>: broken"
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await channel.unary_unary(f"/{SERVICE}/Missing")(b"x")
        assert (error.value.code(), error.value.details()) == (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        for i in range(50):  # names a client makes up are answered, never remembered
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await channel.unary_unary(f"/{SERVICE}/Made{i}")(b"x")
            assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert set(server._methods) == {f"/{SERVICE}/Unary"}
        assert await unary(b"metadata", metadata=[("x-key", "v")], timeout=30) == b"('v', True, True)"
        assert await unary(b"metadata") == b"(None, True, False)"
        results = await asyncio.gather(*(unary(str(i).encode()) for i in range(200)))
        assert results == [str(i).encode()[::-1] for i in range(200)]
        await channel.close()
        await server.stop(1)

    _run(scenario)


def test_streams_in_order_empty_and_server_streaming() -> None:
    async def scenario() -> None:
        server, channel = await _serve(_Echo())
        stream = channel.stream_stream(f"/{SERVICE}/Stream")

        async def requests(items):
            for item in items:
                yield item

        assert [m async for m in stream(requests([b"a", b"b", b"c"]))] == [b"a!", b"b!", b"c!", b"3 requests"]
        assert [m async for m in stream(requests([]))] == [b"0 requests"]
        watch = channel.unary_stream(f"/{SERVICE}/Watch")
        assert [m async for m in watch(b"w")] == [b"w0", b"w1", b"w2"]
        await channel.close()
        await server.stop(1)

    _run(scenario)


def test_a_slow_reader_holds_back_the_writer() -> None:
    """200 responses of 256 KiB to a client that pauses: the handler waits instead of queueing
    them all in the server (grpcio's server awaits each write; this one lets WRITE_HIGH run ahead
    of what grpc++ has sent; HTTP/2's windows and the sockets hold some 30-80 more here)."""
    async def scenario() -> None:
        echo = _Echo()
        echo.produced = 0
        server, channel = await _serve(echo)
        call = channel.unary_stream(f"/{SERVICE}/Flood")(b"")
        first = await call.read()
        assert first[:1] == b"\x00"
        await asyncio.sleep(1.0)  # the client reads nothing: the handler stalls ...
        stalled = echo.produced
        await asyncio.sleep(0.5)
        assert echo.produced == stalled < 150, (stalled, echo.produced)  # ... where the transport's buffers end
        received = 1
        while await call.read() is not grpc.aio.EOF:
            received += 1
        assert (received, echo.produced) == (200, 200)
        await channel.close()
        await server.stop(1)

    _run(scenario)


def test_a_cancelled_call_cancels_its_handler() -> None:
    async def scenario() -> None:
        echo = _Echo()
        server, channel = await _serve(echo)
        call = channel.unary_unary(f"/{SERVICE}/Unary")(b"wait")
        await echo.started.wait()
        call.cancel()
        await asyncio.wait_for(echo.cancelled.wait(), 10)

        echo.started.clear()
        echo.cancelled.clear()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def requests():
            while (item := await queue.get()) is not None:
                yield item

        streaming = channel.stream_stream(f"/{SERVICE}/Stream")(requests())
        await queue.put(b"hang")
        assert await streaming.read() == b"hang!"
        await echo.started.wait()
        streaming.cancel()
        await asyncio.wait_for(echo.cancelled.wait(), 10)
        assert await channel.unary_unary(f"/{SERVICE}/Unary")(b"ok") == b"ko"  # the server goes on
        await channel.close()
        await server.stop(1)

    _run(scenario)


def test_message_limit_and_shutdown_cancel_what_runs() -> None:
    async def scenario() -> None:
        echo = _Echo()
        server, channel = await _serve(echo, max_receive=1000)
        unary = channel.unary_unary(f"/{SERVICE}/Unary")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await unary(b"x" * 2000)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await unary(b"x" * 900) == b"x" * 900
        waiting = asyncio.ensure_future(unary(b"wait"))
        await echo.started.wait()
        await server.stop(0.2)  # grace over: the running call is cancelled
        await asyncio.wait_for(echo.cancelled.wait(), 10)
        with pytest.raises(grpc.aio.AioRpcError):
            await waiting
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await unary(b"late", timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        await channel.close()

    _run(scenario)


def test_frontend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(grpc_server.FRONTEND_ENV, raising=False)
    assert grpc_server.frontend() == "native"  # built (the fixture): the default
    monkeypatch.setenv(grpc_server.FRONTEND_ENV, "grpcio")
    assert grpc_server.frontend() == "grpcio"
    monkeypatch.setenv(grpc_server.FRONTEND_ENV, "Native")
    assert grpc_server.frontend() == "native"
    monkeypatch.setenv(grpc_server.FRONTEND_ENV, "tonic")
    with pytest.raises(ValueError, match="expected one of native, grpcio"):
        grpc_server.frontend()


@pytest.mark.parametrize("chosen", ["native", "grpcio"])
def test_toolkit_serve_uses_the_chosen_frontend(tmp_path: Path, chosen: str) -> None:
    """`toolkit serve` logs its front end and answers tritonclient.grpc and gRPC health on it."""
    import model_builders as mb
    import numpy as np
    from conftest import write_config
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from serving import serve
    from tritonclient import grpc as triton_grpc

    repository = tmp_path / "models"
    mb.add_sub(repository / "add_sub" / "1" / "model.onnx")
    write_config(repository, "add_sub", ADD_SUB)
    with serve(repository, "--device", "cpu", "--log-level", "info",
               env={grpc_server.FRONTEND_ENV: chosen}) as s:
        client = triton_grpc.InferenceServerClient(s.grpc)
        assert client.is_server_live() and client.is_server_ready()
        with grpc.insecure_channel(s.grpc) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 30
            while True:  # health follows readiness within its polling interval
                answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
                if answer.status == health_pb2.HealthCheckResponse.SERVING or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = triton_grpc.InferInput(name, [1, 16], "FP32")
            tensor.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
            inputs.append(tensor)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * np.arange(16, dtype=np.float32).reshape(1, 16))
        client.close()
        assert f"gRPC front end: {chosen}" in s.output()


def test_images_never_carry_the_module_built_here(tmp_path: Path) -> None:
    """The module built in the tree links this machine's grpc++: `toolkit build` leaves it out,
    and its C++ source and build script (build-time code) with it."""
    from toolkit.build.context import copy_runtime

    copy_runtime(tmp_path)
    shipped = {p.name for p in (tmp_path / "handlers" / "protocol" / "grpc").iterdir()}
    assert "nativeserver.py" in shipped and "server.py" in shipped
    assert not [name for name in shipped if name.startswith("_grpcnative")]
    assert "native" not in shipped


def test_images_take_the_native_wheel_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TOOLKIT_GRPC_NATIVE_WHEELS names the wheels a gRPC image may carry (tests/test_build_e2e_grpc.py
    builds and runs one): one for the image's Python or for the stable ABI (cp311-abi3); unset, it
    names none (the build finds or makes the wheel: tests/test_grpc_frontend_build.py)."""
    from toolkit.build.runtime_deps import GRPC_NATIVE, GRPC_NATIVE_WHEELS_ENV, native_requirement

    def grpc_native_requirement(python: str, arch: str):
        return native_requirement(GRPC_NATIVE, GRPC_NATIVE_WHEELS_ENV, python, arch)

    monkeypatch.delenv(GRPC_NATIVE_WHEELS_ENV, raising=False)
    assert grpc_native_requirement("3.12", "x86_64") is None
    monkeypatch.setenv(GRPC_NATIVE_WHEELS_ENV, str(tmp_path))
    wheel = tmp_path / "toolkit_grpcnative-0.1.0-cp311-cp311-manylinux_2_35_x86_64.whl"
    wheel.write_bytes(b"")
    requirement = grpc_native_requirement("3.11", "x86_64")
    assert requirement is not None and requirement.spec == str(wheel) and requirement.imports == ("toolkit_grpcnative",)
    with pytest.raises(ValueError, match=r"no toolkit_grpcnative wheel for Python 3.12 on x86_64 \(cp311-abi3 or cp312\)"):
        grpc_native_requirement("3.12", "x86_64")
    # what build.py makes: the stable ABI's wheel, for every Python from 3.11 on
    stable = tmp_path / "toolkit_grpcnative-0.1.0-cp311-abi3-manylinux_2_35_x86_64.whl"
    stable.write_bytes(b"")
    for python in ("3.12", "3.13"):
        assert grpc_native_requirement(python, "x86_64").spec == str(stable)
    with pytest.raises(ValueError, match=r"no toolkit_grpcnative wheel for Python 3.10 on x86_64"):
        grpc_native_requirement("3.10", "x86_64")
    with pytest.raises(ValueError, match=r"no toolkit_grpcnative wheel for Python 3.12 on aarch64"):
        grpc_native_requirement("3.12", "aarch64")


_CANCEL_STORM = """
import asyncio, random, sys
import grpc
from handlers.protocol.grpc.nativeserver import NativeServer

async def slow(request, context):
    await asyncio.sleep(random.random() * 0.01)
    return request

async def echo(requests, context):
    async for request in requests:
        yield request

async def main():
    random.seed(7)
    server = NativeServer([("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {
        "U": grpc.unary_unary_rpc_method_handler(slow), "S": grpc.stream_stream_rpc_method_handler(echo)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")

    async def unary():
        try:
            await channel.unary_unary("/t.S/U")(b"x", timeout=random.choice([0.001, 0.003, 0.01, 1]))
        except grpc.aio.AioRpcError as error:
            assert error.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED), error

    async def stream():
        call = channel.stream_stream("/t.S/S")()
        for i in range(random.randint(0, 5)):
            await call.write(b"m")
        call.cancel()

    for _ in range(10):
        await asyncio.gather(*[unary() for _ in range(60)], *[stream() for _ in range(10)])
    assert await channel.unary_unary("/t.S/U")(b"ok") == b"ok"
    await channel.close()
    await server.stop(5)  # returns once grpc++ has seen every call finished
    print("STOPPED", len(server._tasks))

asyncio.run(main())
"""


def test_calls_cancelled_at_any_point_all_finish() -> None:
    """Deadlines of 1-10 ms and cancelled streams hit calls at every stage (before their first
    message, before their task's first step, while it runs, after it replied): every call is
    finished, so the server stops (grpc++'s shutdown waits for each one)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _CANCEL_STORM], cwd=root, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "STOPPED 0" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]


def test_a_wrong_frontend_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess

    import model_builders as mb
    from conftest import write_config
    from serving import TOOLKIT, free_port

    repository = tmp_path / "models"
    mb.add_sub(repository / "add_sub" / "1" / "model.onnx")
    write_config(repository, "add_sub", ADD_SUB)
    done = subprocess.run([*TOOLKIT, "serve", str(repository), "--port", "0", "--grpc-port", str(free_port()),
                           "--metrics-port", "0", "--device", "cpu"], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, grpc_server.FRONTEND_ENV: "tonic"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "TOOLKIT_GRPC_FRONTEND='tonic': expected one of native, grpcio" in done.stdout + done.stderr
