"""The content store's manifest: its digest names the content, and what it refuses."""

from __future__ import annotations

import hashlib

import pytest

from agent.content.manifest import (
    ContentError,
    ContentFile,
    ContentLimits,
    ContentManifest,
    check_chunk,
    chunk_count,
)

CHUNK = 64 << 10


def _file(path: str, data: bytes, mode: int = 0o644) -> ContentFile:
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    return ContentFile(path, len(data), mode, tuple(hashlib.sha256(p).hexdigest() for p in pieces))


def _manifest(*files: ContentFile, name: str = "imagenet") -> ContentManifest:
    return ContentManifest("dataset", name, CHUNK, files)


def test_the_digest_names_the_content_not_its_name() -> None:
    a = _manifest(_file("train/0.bin", b"x" * (CHUNK + 5)), name="a")
    b = _manifest(_file("train/0.bin", b"x" * (CHUNK + 5)), name="b")
    c = _manifest(_file("train/0.bin", b"y" * (CHUNK + 5)))
    assert a.digest == b.digest != c.digest
    assert ContentManifest.from_wire(a.to_wire()) == a
    places = list(a.chunk_places())
    assert [(p.offset_bytes, p.length_bytes) for p in places] == [(0, CHUNK), (CHUNK, 5)]


def test_an_empty_file_has_one_empty_chunk() -> None:
    m = _manifest(_file("empty", b""))
    assert chunk_count(0, CHUNK) == 1
    assert [p.length_bytes for p in m.chunk_places()] == [0]
    check_chunk(m.files[0].chunks[0], b"", 0)


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ((_file("../etc/passwd", b"x"),), "not a plain relative path"),
        ((_file("/etc/passwd", b"x"),), "not a relative path"),
        ((_file("a", b"x"), _file("a", b"y")), "listed twice"),
        ((_file("a", b"x"), _file("a/b", b"y")), "both a file and a folder"),
        ((_file("a", b"x", mode=0o4755),), "more than rwx bits"),
        ((ContentFile("a", CHUNK + 1, 0o644, ("0" * 64,)),), "do not match its size"),
        ((ContentFile("a", 1, 0o644, ("zz",)),), "not a SHA-256"),
    ],
)
def test_a_bad_manifest_is_refused_in_one_line(files: tuple[ContentFile, ...], why: str) -> None:
    with pytest.raises(ContentError, match=why):
        ContentManifest.from_wire(_manifest(*files).to_wire())


def test_a_digest_that_lies_or_limits_passed_are_refused() -> None:
    m = _manifest(_file("a", b"x" * 10))
    wire = m.to_wire() | {"digest": "0" * 64}
    with pytest.raises(ContentError, match="digest does not match"):
        ContentManifest.from_wire(wire)
    with pytest.raises(ContentError, match="over the limit"):
        ContentManifest.from_wire(m.to_wire(), ContentLimits(max_total_bytes=5))
    with pytest.raises(ContentError, match="chunk size"):
        ContentManifest.from_wire(m.to_wire() | {"chunk_bytes": 1, "digest": None})


def test_a_chunk_is_checked_against_its_digest_and_length() -> None:
    digest = hashlib.sha256(b"abc").hexdigest()
    check_chunk(digest, b"abc", 3)
    with pytest.raises(ContentError, match="do not match"):
        check_chunk(digest, b"abd", 3)
    with pytest.raises(ContentError, match="are due"):
        check_chunk(digest, b"abc", 4)
