"""Per-group Python environments: run one worker group with another environment's interpreter.

A simulator whose pins clash with the trainer's (LIBERO needs robosuite 1.4,
the main lock has 1.5) gets its own environment, usually a uv project. Its
workers start with that environment's interpreter (Ray's ``py_executable``)
and exchange data with the rest of the run only through the channel, whose
encoding does not depend on the numpy or torch version on either end.

Config (``env.python_env`` in the embodied schema; any group through
:meth:`rlinf.sched.WorkerGroup.use_python_env`)::

    python_env:
      project: examples/embodiment/libero     # a uv project: runs PROJECT/.venv/bin/python
      # or: interpreter: /opt/venvs/libero/bin/python

Before any worker starts, :func:`check_python_env` runs the interpreter once
(``python -c``): it must exist, import the worker's module, and have the
driver's Python minor version and the driver's versions of the packages whose
objects cross between the two processes (Ray, pydantic, cloudpickle).
Anything else fails at launch with an error naming the config key, the path
and the fix, never as a hang. The path must be the same on every node the
group uses; the check runs on the driver's node.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from rlinf.core.config import RLinfModel

__all__ = ["SHARED_PACKAGES", "PythonEnvConfig", "PythonEnvError", "check_python_env"]

SHARED_PACKAGES = ("ray", "pydantic", "cloudpickle")
"""Packages whose objects cross between interpreters; their versions must be equal."""

_CHECK_TIMEOUT_S = 180.0
"""Seconds the check may take (importing torch on a loaded machine takes a while)."""

_PROBE = """
import json, sys
from importlib.metadata import version, PackageNotFoundError
versions = {}
for name in sys.argv[2].split(","):
    try:
        versions[name] = version(name)
    except PackageNotFoundError:
        versions[name] = None
import importlib
importlib.import_module(sys.argv[1])
print("RLINF_PYENV " + json.dumps({"python": list(sys.version_info[:2]), "versions": versions}))
"""


class PythonEnvError(RuntimeError):
    """A worker group's Python environment is missing or does not fit the driver's."""


class PythonEnvConfig(RLinfModel):
    """Which Python environment a worker group runs in: a uv project or an interpreter.

    Attributes:
        project: A uv project directory; its workers run ``PROJECT/.venv/bin/python``
            (set it up with ``uv sync --locked --project PROJECT``).
        interpreter: Any Python interpreter path (a venv's ``bin/python``).
    """

    project: Path | None = Field(
        None, description="uv project dir; the workers run PROJECT/.venv/bin/python."
    )
    interpreter: Path | None = Field(None, description="Path of a Python interpreter.")

    @model_validator(mode="after")
    def _exactly_one(self) -> PythonEnvConfig:
        if (self.project is None) == (self.interpreter is None):
            raise ValueError(
                "give exactly one of project (a uv project dir) or interpreter "
                f"(a python path); got project={self.project}, interpreter={self.interpreter}"
            )
        return self

    def interpreter_path(self) -> Path:
        """The interpreter the workers run (absolute; not checked: see :func:`check_python_env`)."""
        if self.interpreter is not None:
            return Path(os.path.abspath(self.interpreter))
        assert self.project is not None
        return Path(os.path.abspath(self.project)) / ".venv" / "bin" / "python"


def check_python_env(spec: PythonEnvConfig, module: str, key: str) -> str:
    """Checks that ``spec``'s interpreter can run workers of ``module``; returns its path.

    Args:
        spec: The environment.
        module: The worker class's module, imported by the check.
        key: The config key ``spec`` came from, for error messages.

    Raises:
        PythonEnvError: Missing interpreter, a failed import, another Python
            minor version or another version of a package in :data:`SHARED_PACKAGES`.
    """
    path = spec.interpreter_path()
    return _check(str(path), str(spec.project) if spec.project else None, module, key)


@functools.cache
def _check(path: str, project: str | None, module: str, key: str) -> str:
    where = f"{key}.project = {project}" if project else f"{key}.interpreter = {path}"
    setup = (
        f"run `uv sync --locked --project {project}`"
        if project
        else "create that environment or point the key at an existing interpreter"
    )
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise PythonEnvError(f"{where}: no Python interpreter at {path}; {setup}")
    try:
        done = subprocess.run(
            [path, "-c", _PROBE, module, ",".join(SHARED_PACKAGES)],
            capture_output=True,
            text=True,
            timeout=_CHECK_TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        )
    except subprocess.TimeoutExpired as e:
        raise PythonEnvError(
            f"{where}: {path} did not import {module} within {_CHECK_TIMEOUT_S:.0f} s"
        ) from e
    found = [line for line in done.stdout.splitlines() if line.startswith("RLINF_PYENV ")]
    if done.returncode != 0 or not found:
        tail = "\n".join(done.stderr.strip().splitlines()[-6:])
        raise PythonEnvError(
            f"{where}: {path} cannot import {module} (exit {done.returncode}):\n{tail}\n"
            "The environment needs rlinf-core, rlinf-sched and the package of the worker "
            f"(for env workers: rlinf-embodied without extras) besides the simulator; {setup}"
        )
    probe = json.loads(found[-1].removeprefix("RLINF_PYENV "))
    _compare(where, path, probe)
    return path


def _compare(where: str, path: str, probe: dict[str, Any]) -> None:
    """Raises unless ``probe`` (what the interpreter reported) fits the driver."""
    theirs_py = tuple(probe["python"])
    ours_py = tuple(sys.version_info[:2])
    if theirs_py != ours_py:
        raise PythonEnvError(
            f"{where}: {path} is Python {'.'.join(map(str, theirs_py))}, the driver "
            f"{'.'.join(map(str, ours_py))}; Ray needs the same minor version on both: "
            f"recreate it with Python {'.'.join(map(str, ours_py))} "
            f'(uv: requires-python = "=={".".join(map(str, ours_py))}.*")'
        )
    theirs: dict[str, str | None] = probe["versions"]
    for name in SHARED_PACKAGES:
        try:
            ours: str | None = version(name)
        except PackageNotFoundError:  # pragma: no cover - ray and pydantic are dependencies
            ours = None
        if theirs.get(name) != ours:
            raise PythonEnvError(
                f"{where}: {path} has {name} {theirs.get(name)}, the driver {ours}; "
                f"objects of {name} cross between the two, so pin {name}=={ours} there"
            )
