"""Fuzzing the checkpoint transfer protocol (``agent.checkpoints.transfer``): manifests as a peer
could send them, frames as raw bytes off the wire, and a receiver fed frames in any order. Each
refuses with ``TransferError`` or yields a value within the manifest's rules; nothing written lies
outside the checkpoint's files, its sizes or its limits."""

from __future__ import annotations

import contextlib
import hashlib
import struct
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from agent.checkpoints.transfer import (
    HEADER_BYTES,
    MAGIC,
    VERSION,
    FileEntry,
    Frame,
    Manifest,
    Receiver,
    TransferError,
    TransferLimits,
    check_path,
)
from tests.hostile import ANY, FUZZ, FUZZ_EACH, JSON, mutated

LIMITS = TransferLimits(max_total_bytes=1 << 20, max_files=8, max_chunk_bytes=64)
JOB = "c" * 32


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


CONTENT = {"model.pt": b"weights" * 20, "opt/state.bin": b"s" * 70, "step": b"42"}
GOOD = Manifest(
    JOB,
    3,
    tuple(FileEntry(p, len(d), _sha(d)) for p, d in CONTENT.items()),
)


def _checked(m: Manifest) -> None:
    """What a manifest that was let in must be."""
    assert m.attempt >= 1 and len(m.files) <= LIMITS.max_files
    assert m.total_bytes <= LIMITS.max_total_bytes
    for f in m.files:
        assert check_path(f.path) == f.path and f.size_bytes >= 0 and len(f.sha256) == 64


@FUZZ
@given(value=JSON | ANY)
@example(value=None)  # found: a manifest that was not an object raised WireError, not refused
@example(value=[])
def test_any_value_as_a_manifest_is_refused_or_within_the_rules(value: Any) -> None:
    with contextlib.suppress(TransferError):
        _checked(Manifest.from_wire(value, LIMITS))


@FUZZ
@given(value=mutated(GOOD.to_wire()))
@example(value={**GOOD.to_wire(), "attempt": 2**70})
@example(value={**GOOD.to_wire(), "files": [{"path": "a/../b", "size_bytes": 1, "sha256": "0"}]})
def test_a_manifest_with_one_part_changed_is_refused_or_within_the_rules(value: Any) -> None:
    with contextlib.suppress(TransferError):
        _checked(Manifest.from_wire(value, LIMITS))


def _header(index: int, offset: int, length: int, digest: bytes) -> bytes:
    return struct.pack("!4sBIQI32s", MAGIC, VERSION, index, offset, length, digest)


@FUZZ
@given(raw=st.binary(max_size=HEADER_BYTES + 80))
@example(raw=_header(0, 0, 2**32 - 1, b"\0" * 32))
@example(raw=_header(0, 2**64 - 1, 1, hashlib.sha256(b"x").digest()) + b"x")
def test_any_bytes_as_a_frame_are_refused_or_a_frame_whose_checksum_holds(raw: bytes) -> None:
    try:
        frame = Frame.decode(raw, LIMITS)
    except TransferError:
        return
    assert len(frame.data) <= LIMITS.max_chunk_bytes
    assert raw[HEADER_BYTES:] == frame.data and frame.encode() == raw


@st.composite
def _frames(draw: st.DrawFn) -> list[Frame]:
    """Frames a lying or confused sender might send: right and wrong files, offsets, lengths."""
    out = []
    for _ in range(draw(st.integers(0, 12))):
        index = draw(st.integers(-1, len(GOOD.files)))
        offset = draw(st.integers(0, 200) | st.integers(0, 2**64 - 1))
        data = draw(st.binary(max_size=LIMITS.max_chunk_bytes + 4))
        if draw(st.booleans()) and 0 <= index < len(GOOD.files):
            whole = CONTENT[GOOD.files[index].path]
            data = whole[offset : offset + LIMITS.max_chunk_bytes]
        out.append(Frame(index, offset, data))
    return out


@FUZZ_EACH
@given(frames=_frames(), held=st.lists(st.integers(-5, 300), min_size=3, max_size=3))
def test_a_receiver_writes_only_in_order_within_each_file(
    frames: list[Frame], held: list[int]
) -> None:
    receiver = Receiver(GOOD, LIMITS, held)
    files: list[bytearray] = [bytearray(b"?" * o) for o in receiver.offsets]
    for frame in frames:
        before = receiver.offsets
        try:
            write = receiver.accept(frame)
        except TransferError:
            assert receiver.offsets == before  # a refused frame moves nothing
            continue
        if write:
            target = files[frame.index]
            assert frame.offset_bytes == len(target)  # the next bytes, never a gap or overlap
            target += frame.data
    for f, written in zip(GOOD.files, files, strict=True):
        assert len(written) <= f.size_bytes
    if receiver.complete:
        sums = [_sha(bytes(b)) for b in files]
        honest = all(bytes(b) == CONTENT[f.path] for f, b in zip(GOOD.files, files, strict=True))
        try:
            receiver.verify(sums)
        except TransferError:
            assert not honest
        else:
            assert honest  # only the true bytes are ever kept as the checkpoint
