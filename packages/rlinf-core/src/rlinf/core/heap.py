"""Keeps Python's cyclic garbage collector off the objects a run holds for good.

A training process holds a few hundred thousand objects from its start on: the
modules it imported (torch, gymnasium, ManiSkill, Ray), its envs and models.
CPython's cyclic collector walks every one of them in each full
(generation-2) pass, and such a pass comes whenever enough new objects have
survived the younger passes; each one stalls the rollout it falls in.

:func:`freeze_heap` moves every object alive into the collector's permanent
generation (:func:`gc.freeze`), so later full passes walk only
what was created since. The stdlib call is the whole mechanism; this module
only fixes when to make it (after a full collection, so no garbage is frozen)
and makes it repeatable (it unfreezes first).

What it costs: one full collection per call, and an object frozen here that
later becomes part of an unreachable reference cycle stays allocated until the
next :func:`freeze_heap` (plain reference counting still frees everything
else). So call it once set-up is done, when what is alive is what the run
keeps, and again after rebuilding large parts (envs, models).
"""

from __future__ import annotations

import atexit
import gc

__all__ = ["freeze_heap", "frozen_objects"]

_exit_thaw_registered = False


def _register_exit_thaw() -> None:
    """Unfreezes the heap at exit; registered once, by the first :func:`freeze_heap`.

    Python's last collection at exit skips frozen objects; extension types that
    count their instances (nanobind's, e.g. triton's) would report those as leaked.
    """
    global _exit_thaw_registered
    if not _exit_thaw_registered:
        _exit_thaw_registered = True
        atexit.register(gc.unfreeze)


def freeze_heap() -> int:
    """Collects garbage, then freezes every object alive out of the collector's passes.

    Objects frozen by an earlier call are unfrozen first, so those that became
    garbage since are reclaimed now.

    Returns:
        How many objects are frozen now (:func:`gc.get_freeze_count`).
    """
    _register_exit_thaw()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def frozen_objects() -> int:
    """How many objects :func:`freeze_heap` has frozen in this process (0 if none)."""
    return gc.get_freeze_count()
