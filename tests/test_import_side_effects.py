"""Importing the rlinf packages registers nothing to run at interpreter exit.

A library that registers exit hooks at import makes every program that merely
imports it pay for them (and run them in each forked child). The hooks rlinf
needs are registered on first use instead: the channel's name release when the
process first makes a channel handle, the heap thaw with the first
``freeze_heap()``.
"""

from __future__ import annotations

import json
import subprocess
import sys

# The packages and the modules a run imports: runners, workers, channel, heap.
MODULES = (
    "rlinf.core",
    "rlinf.core.channel",
    "rlinf.core.heap",
    "rlinf.core.checkpoint",
    "rlinf.core.dist",
    "rlinf.core.weight_sync",
    "rlinf.core.logging",
    "rlinf.core.metrics",
    "rlinf.core.progress",
    "rlinf.sched",
    "rlinf.sched.cluster",
    "rlinf.sched.worker",
    "rlinf.embodied",
    "rlinf.embodied.runner",
    "rlinf.embodied.async_runner",
    "rlinf.embodied.async_ppo_runner",
    "rlinf.embodied.workers",
    "rlinf.embodied.envs",
    "rlinf.reasoning",
    "rlinf.reasoning.runner",
    "rlinf.reasoning.async_grpo",
    "rlinf.reasoning.workers",
)

# Records every atexit.register call: the callback's module and the caller's module
# (so ``atexit.register(gc.unfreeze)`` made by an rlinf module counts as well).
_PROBE = """
import atexit, importlib, json, sys

registered = []
_register = atexit.register

def recording_register(func, *args, **kwargs):
    caller = sys._getframe(1).f_globals.get("__name__", "")
    registered.append([getattr(func, "__module__", None) or "", caller, repr(func)])
    return _register(func, *args, **kwargs)

atexit.register = recording_register
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(registered))
"""


def _registered_at_import(modules: tuple[str, ...]) -> list[list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(modules))],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    registered: list[list[str]] = json.loads(out.strip().splitlines()[-1])
    return registered


def _from_rlinf(entry: list[str]) -> bool:
    callback_module, caller, _ = entry
    return callback_module.startswith("rlinf") or caller.startswith("rlinf")


def test_importing_the_packages_registers_no_exit_hook() -> None:
    registered = _registered_at_import(MODULES)
    assert not [e for e in registered if _from_rlinf(e)], registered


def test_the_probe_sees_a_hook_registered_at_first_use() -> None:
    """The probe itself can fail: making a channel registers the release hook."""
    probe_with_use = _PROBE.replace(
        "print(json.dumps(registered))",
        "from rlinf.core.channel import Channel\n"
        "ch = Channel.create('import_probe_' + str(__import__('os').getpid()))\n"
        "ch.unlink()\n"
        "print(json.dumps(registered))",
    )
    out = subprocess.run(
        [sys.executable, "-c", probe_with_use, json.dumps(["rlinf.core.channel"])],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    registered = json.loads(out.strip().splitlines()[-1])
    assert any(e[2].startswith("<function _release_at_exit") for e in registered), registered
    assert all(_from_rlinf(e) for e in registered if "_release_at_exit" in e[2])
