"""The wire's frame limit is exact and every refusal names its reason."""

from __future__ import annotations

import tracemalloc

import msgpack
import pytest

from worker.ipc.wire import MAX_FRAME, FrameReader, WireError


def _frame_of_size(size: int) -> bytes:
    # A map holding one str: the str's length is tuned until the frame is ``size`` bytes.
    body = b"a" * (size - 20)
    frame: bytes = msgpack.packb({"id": 1, "text": body.decode()})
    frame = msgpack.packb({"id": 1, "text": "a" * (len(body) + size - len(frame))})
    assert len(frame) == size
    return frame


def test_a_frame_of_exactly_the_limit_is_admitted() -> None:
    reader = FrameReader()
    assert len(reader.feed(_frame_of_size(MAX_FRAME))) == 1


@pytest.mark.parametrize("excess", [1, 11, 4096], ids=["1-byte", "11-bytes", "4-KiB"])
def test_a_frame_over_the_limit_is_refused(excess: int) -> None:
    reader = FrameReader()
    with pytest.raises(WireError, match="size limit"):
        reader.feed(_frame_of_size(MAX_FRAME + excess))


def test_a_frame_nested_too_deeply_is_refused_with_a_reason() -> None:
    reader = FrameReader()
    deep = b"\x91" * 2000 + b"\xc0"
    with pytest.raises(WireError, match="nests too deeply"):
        reader.feed(b"\x81\xa1a" + deep)


@pytest.mark.parametrize("size", [100, 101], ids=["at-the-limit", "one-byte-over"])
def test_the_limit_holds_when_a_frame_arrives_a_byte_at_a_time(size: int) -> None:
    reader = FrameReader(max_frame=100)
    frame: bytes = msgpack.packb({"t": "a" * (size - 5)})
    assert len(frame) == size
    messages = []
    for byte in frame[:-1]:
        messages += reader.feed(bytes([byte]))
    if size > 100:
        with pytest.raises(WireError, match="size limit"):
            reader.feed(frame[-1:])
    else:
        assert messages + reader.feed(frame[-1:]) == [{"t": "a" * (size - 5)}]


def test_a_reader_of_small_frames_keeps_a_small_buffer_however_long_it_lives() -> None:
    """msgpack's default first buffer is 1 MiB, which a stream of small frames wrote end to
    end: every worker's connection and every link of the daemon held a dirty megabyte."""
    frame = msgpack.packb({"id": 1, "op": "request", "request": {"text": "x" * 200}})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reader = FrameReader()
        for _ in range((2 << 20) // len(frame)):  # 2 MiB of frames, one at a time
            assert len(reader.feed(frame)) == 1
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 256 << 10, f"the reader holds {held} bytes after 2 MiB of small frames"
    # It still admits a frame of exactly the limit: the buffer grows when a frame needs it.
    assert len(reader.feed(_frame_of_size(MAX_FRAME))) == 1
