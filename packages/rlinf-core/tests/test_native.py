"""The compiled extension ``rlinf.core._native`` is built, importable and callable."""

import importlib.metadata

import pytest

from rlinf.core import _native


def test_version_matches_the_crate_and_package() -> None:
    # The crate and the Python distribution are versioned together.
    assert _native.version() == importlib.metadata.version("rlinf-core")


def test_segment_name_builds_the_shm_name() -> None:
    assert _native.segment_name("run1", "rollout.obs") == "rlinf.run1.rollout.obs"
    assert _native.SEGMENT_PREFIX == "rlinf."


@pytest.mark.parametrize(
    ("namespace", "channel", "fragment"),
    [
        ("", "ch", "namespace name is empty"),
        ("ns", "", "channel name is empty"),
        ("ns", "a/b", "invalid character '/' at offset 1"),
        ("n.s", "ch", "namespace name has invalid character '.'"),
        ("ns", "x" * 300, "over the limit of 240"),
    ],
)
def test_segment_name_rejects_bad_names(namespace: str, channel: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        _native.segment_name(namespace, channel)


def test_parse_segment_name_roundtrip_and_foreign_names() -> None:
    name = _native.segment_name("ns_1", "a.b-c")
    assert _native.parse_segment_name(name) == ("ns_1", "a.b-c")
    assert _native.parse_segment_name("psm_12345") is None
    assert _native.parse_segment_name("rlinf.only") is None
