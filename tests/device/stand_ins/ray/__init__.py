"""A stand-in for the ``ray`` package on the GPU check machine, which cannot install Ray.

Only ``tests/device/megatron_cuda.sh`` puts this directory on ``PYTHONPATH``.
Importing ``ray`` or any ``ray.*`` module gives a module whose attributes are
inert placeholder classes: nothing of Ray runs. It lets ``rlinf.sched`` import
so that tests which build workers in-process without a cluster (as the CPU
tests of the Megatron actor do, with ``install_resolver`` patched out) run on
that machine. A test that needs a real Ray cluster fails under it.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (_Dummy,), {})

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls


class _Dummy(Exception, metaclass=_Meta):
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Dummy()

    def __getattr__(self, name):
        return _Dummy()

    def __class_getitem__(cls, item):
        return cls

    def __or__(self, other):
        return self

    def __ror__(self, other):
        return self


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        d = _Meta(name, (_Dummy,), {})
        setattr(self, name, d)
        return d


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("ray."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Meta(name, (_Dummy,), {})
