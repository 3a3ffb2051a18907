import importlib.metadata

import rlinf.embodied


def test_version_matches_distribution_metadata() -> None:
    assert rlinf.embodied.__version__ == importlib.metadata.version("rlinf-embodied")


def test_depends_only_on_lower_layers() -> None:
    requires = importlib.metadata.requires("rlinf-embodied") or []
    rlinf_deps = {
        r.split(">")[0].split("=")[0].split("<")[0].strip()
        for r in requires
        if r.startswith("rlinf-")
    }
    allowed = {"rlinf-core", "rlinf-sched"} - {"rlinf-embodied"}
    assert rlinf_deps <= allowed, rlinf_deps
