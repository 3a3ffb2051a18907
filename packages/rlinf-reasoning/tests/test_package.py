import importlib.metadata

import rlinf.reasoning


def test_version_matches_distribution_metadata() -> None:
    assert rlinf.reasoning.__version__ == importlib.metadata.version("rlinf-reasoning")


def test_depends_only_on_lower_layers() -> None:
    requires = importlib.metadata.requires("rlinf-reasoning") or []
    rlinf_deps = {
        r.split(">")[0].split("=")[0].split("<")[0].strip()
        for r in requires
        if r.startswith("rlinf-")
    }
    allowed = {"rlinf-core", "rlinf-sched"} - {"rlinf-reasoning"}
    assert rlinf_deps <= allowed, rlinf_deps
