"""The sandbox model-written Python runs in: bubblewrap namespaces plus resource limits.

:func:`run_python` runs one program and returns what it printed. The
isolation comes from bubblewrap (``bwrap``, Debian's ``bubblewrap`` package;
a well-kept tool, preferred to hand-made namespace code), and the limits from
``prlimit`` (util-linux) before it starts:

* **Filesystem:** a fresh root holding only ``/usr`` (read-only), a private
  empty ``/work`` (the program's directory and cwd, deleted afterwards), a
  private ``/tmp``, and fresh ``/proc`` and ``/dev``. Nothing else of the host
  (``/etc``, ``/root``, home directories, the repository) exists inside.
* **Network:** a new network namespace with no interfaces up: no socket can
  reach the host or the outside, loopback included.
* **Processes:** new PID, IPC, UTS and cgroup namespaces and a new session;
  when the program ends or is killed, bubblewrap's namespace ends and the
  kernel kills every process left in it. At most ``max_processes`` processes
  (``RLIMIT_NPROC``; the sandbox runs as ``nobody`` when the caller is root,
  because the kernel does not apply that limit to root; sandboxes running at
  once share the count).
* **Resources:** ``timeout_s`` of wall time (then the whole tree is killed),
  ``cpu_s`` of CPU time, ``memory_bytes`` of address space, files of at most
  ``max_file_bytes``; stdout and stderr are each cut at ``max_output_bytes``.
* **Environment:** emptied; only ``PATH``, ``HOME``, ``LANG`` and ``PWD`` are set.

The interpreter is Debian's ``/usr/bin/python3`` (standard library only; the
program runs with ``-I -S``). Without ``bwrap``, or where the kernel refuses
the namespaces, :func:`check_sandbox` (called by :func:`run_python`) raises
:class:`SandboxUnavailable` naming why: the code is then never run.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailable", "check_sandbox", "run_python"]

PYTHON = "/usr/bin/python3"
"""The sandbox's interpreter (under the read-only ``/usr``)."""
_NOBODY = 65534


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot start on this machine (the message says why and the fix)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use.

    Attributes:
        timeout_s: Wall-clock seconds before the process tree is killed.
        cpu_s: CPU seconds (``RLIMIT_CPU``).
        memory_bytes: Address space (``RLIMIT_AS``).
        max_processes: Processes and threads of the sandbox's user (``RLIMIT_NPROC``;
            concurrent sandboxes run as one user and share it).
        max_file_bytes: Largest file the program may write (``RLIMIT_FSIZE``).
        max_output_bytes: Bytes kept of stdout and of stderr each.
    """

    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 << 20
    max_processes: int = 256
    max_file_bytes: int = 4 << 20
    max_output_bytes: int = 8 << 10


@dataclass(frozen=True)
class SandboxResult:
    """What a program did.

    Attributes:
        stdout: Its standard output (UTF-8, invalid bytes replaced), cut at the limit.
        stderr: Its standard error, likewise.
        exit_code: The program's exit status; ``128 + N`` when it died of signal
            ``N`` (e.g. 137: killed at the CPU limit), ``-9`` when the sandbox was
            killed at ``timeout_s``.
        timed_out: It ran past ``timeout_s`` and was killed.
        truncated: stdout or stderr was longer than ``max_output_bytes``.
        seconds: Wall time.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    truncated: bool
    seconds: float

    @property
    def ok(self) -> bool:
        """Exited 0 within the time limit."""
        return self.exit_code == 0 and not self.timed_out


def _bwrap_args(workdir: Path) -> list[str]:
    return [
        "bwrap",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin",
        "--bind", str(workdir), "/work",
        "--tmpfs", "/tmp",
        "--proc", "/proc",
        "--dev", "/dev",
        "--chdir", "/work",
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", "/work",
        "--setenv", "LANG", "C.UTF-8",
    ]  # fmt: skip


def _prlimit_args(limits: SandboxLimits) -> list[str]:
    """``prlimit`` (util-linux) setting the limits on itself, then exec'ing the sandbox.

    The limits are set by a program rather than by a ``preexec_fn``: tools run
    on the threads of a tool executor, and Python code between fork and exec
    is unsafe in a threaded process.
    """
    return [
        "prlimit",
        f"--cpu={limits.cpu_s}",
        f"--as={limits.memory_bytes}",
        f"--nproc={limits.max_processes}",
        f"--fsize={limits.max_file_bytes}",
        "--core=0",
        "--",
    ]


@functools.cache
def check_sandbox() -> None:
    """Raises :class:`SandboxUnavailable` unless a trivial program runs in the sandbox."""
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "the code sandbox needs bubblewrap (bwrap), which is not installed: "
            "apt-get install bubblewrap (.ci/system-deps installs it)"
        )
    if shutil.which("prlimit") is None:
        raise SandboxUnavailable(
            "the code sandbox needs prlimit, which is not installed: apt-get install util-linux"
        )
    if not os.access(PYTHON, os.X_OK):
        raise SandboxUnavailable(
            f"the code sandbox runs {PYTHON}, which does not exist: apt-get install python3"
        )
    result = _run("print(6 * 7)", SandboxLimits(timeout_s=30.0, cpu_s=10))
    if result.stdout.strip() != "42":
        raise SandboxUnavailable(
            "bubblewrap could not start the sandbox (exit "
            f"{result.exit_code}): {result.stderr.strip()[-400:]}. It needs user, network and "
            "PID namespaces (on Debian/Ubuntu: sysctl kernel.unprivileged_userns_clone=1; in "
            "a container, one that allows unshare)"
        )


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Runs ``code`` as a Python program in the sandbox (see the module docstring).

    Args:
        code: The program's source.
        limits: What it may use; default :class:`SandboxLimits`.

    Returns:
        What it printed and how it ended; a program that fails is a result, not an error.

    Raises:
        SandboxUnavailable: The sandbox cannot run here (the code was not run).
    """
    check_sandbox()
    return _run(code, limits or SandboxLimits())


def _work_parent() -> str:
    """Where the program's directory goes: the temp dir, if others may pass through it.

    Under root the sandbox runs as ``nobody``, which must reach its directory;
    a private ``TMPDIR`` (mode 700) would hide it, so then ``/tmp`` is used.
    """
    parent = Path(tempfile.gettempdir()).resolve()
    for part in (parent, *parent.parents):
        if not part.stat().st_mode & stat.S_IXOTH:
            return "/tmp"
    return str(parent)


def _run(code: str, limits: SandboxLimits) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="rlinf-sandbox-", dir=_work_parent()) as tmp:
        workdir = Path(tmp)
        (workdir / "main.py").write_text(code, encoding="utf-8")
        os.chmod(workdir, 0o777)  # the sandbox's user (nobody under root) writes here
        started = time.monotonic()
        as_root = os.geteuid() == 0  # then run as nobody: RLIMIT_NPROC does not bind root
        proc = subprocess.Popen(
            [*_prlimit_args(limits), *_bwrap_args(workdir), PYTHON, "-I", "-S", "/work/main.py"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            user=_NOBODY if as_root else None,
            group=_NOBODY if as_root else None,
            extra_groups=[] if as_root else None,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        out, err = _Capped(proc.stdout, limits), _Capped(proc.stderr, limits)
        try:
            proc.wait(timeout=limits.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # bwrap and its namespace: the kernel kills the rest
            proc.wait()
            timed_out = True
        out.join()
        err.join()
        return SandboxResult(
            stdout=out.text(),
            stderr=err.text(),
            exit_code=proc.returncode,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
            seconds=time.monotonic() - started,
        )


class _Capped:
    """Drains a pipe in a thread, keeping its first ``max_output_bytes`` bytes."""

    def __init__(self, pipe: IO[bytes] | None, limits: SandboxLimits) -> None:
        assert pipe is not None
        self._pipe, self._limit = pipe, limits.max_output_bytes
        self._kept = bytearray()
        self.truncated = False
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with self._pipe:
            while chunk := self._pipe.read1(1 << 16):  # type: ignore[attr-defined]
                room = self._limit - len(self._kept)
                if len(chunk) > room:
                    self.truncated = True
                self._kept += chunk[: max(room, 0)]

    def join(self) -> None:
        self._thread.join(timeout=10)

    def text(self) -> str:
        return self._kept.decode("utf-8", errors="replace")
