"""The code sandbox: programs run and print, and every escape attempt fails or is killed.

Each escape test runs a real program in the real sandbox (bubblewrap plus
resource limits) and checks from the outside that nothing got through and no
process is left behind. Without bubblewrap, or where the kernel refuses its
namespaces, the sandbox refuses to start and these tests skip with its reason.
"""

from __future__ import annotations

import os
import socket
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from rlinf.reasoning.tools.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    check_sandbox,
    run_python,
)

try:
    check_sandbox()
except SandboxUnavailable as exc:
    pytest.skip(f"the sandbox cannot run here: {exc}", allow_module_level=True)

REPO = Path(__file__).resolve().parents[3]


def run(code: str, **limits: float) -> SandboxResult:
    """Runs ``code``; a generous wall-time limit unless the test is about that limit."""
    limits.setdefault("timeout_s", 60.0)  # a busy machine starts Python slowly
    return run_python(textwrap.dedent(code), SandboxLimits(**limits))  # type: ignore[arg-type]


def processes_with(marker: str, wait_s: float = 60.0) -> list[int]:
    """Host processes whose command line mentions ``marker``, once none is left or after
    ``wait_s`` (the kernel ends a PID namespace's processes asynchronously)."""
    deadline = time.monotonic() + wait_s
    while (found := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_program_runs_prints_and_fails_as_a_result() -> None:
    ok = run("import math\nprint(math.factorial(20))")
    assert ok.ok and ok.stdout == "2432902008176640000\n" and not ok.truncated
    bad = run("raise ValueError('boom')")
    assert bad.exit_code == 1 and not bad.ok and "ValueError: boom" in bad.stderr


def test_files_outside_its_directory_do_not_exist_inside() -> None:
    targets = ["/etc/passwd", "/etc/hostname", "/root", str(REPO / "README.md"), str(Path.home())]
    result = run(
        f"""
        import os
        for path in {targets!r}:
            try:
                with open(path, "rb") as f:
                    print("GOT-CONTENT", path, len(f.read()))
            except OSError as e:
                print("refused", path, type(e).__name__)
        print("root:", sorted(os.listdir("/")))
        print("pids:", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        """
    )
    assert result.ok, result.stderr
    assert "GOT-CONTENT" not in result.stdout, result.stdout
    assert result.stdout.count("refused") == 5
    assert "root: ['bin', 'dev', 'lib', 'lib64', 'proc', 'tmp', 'usr', 'work']" in result.stdout
    # /proc is the sandbox's own (a new PID namespace): bubblewrap's init and the program.
    assert "pids: [1, 2]" in result.stdout


def test_the_system_is_read_only_and_big_files_are_refused() -> None:
    result = run(
        """
        import os
        for path in ("/usr/evil", "/bin/evil"):
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as e:
                print("refused", path, e.errno)
        with open("big", "wb") as f:
            f.write(b"x" * (8 << 20))
        """,
        max_file_bytes=1 << 20,
    )
    assert "WROTE" not in result.stdout
    assert not result.ok  # SIGXFSZ or "File too large" at the 1 MiB file limit
    assert not Path("/usr/evil").exists()


def test_no_socket_reaches_the_host_or_the_outside() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        result = run(
            f"""
            import socket
            for host, port in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 53)):
                try:
                    socket.create_connection((host, port), timeout=2)
                    print("CONNECTED", host)
                except OSError as e:
                    print("refused", host, e.errno)
            """,
        )
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing connected to the host's listener
    finally:
        listener.close()
    assert result.ok, result.stderr
    assert "CONNECTED" not in result.stdout and result.stdout.count("refused") == 3


def test_the_host_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLINF_CHANNEL_SECRET", "do-not-leak")
    result = run("import os; print(sorted(os.environ))")
    assert "RLINF_CHANNEL_SECRET" not in result.stdout
    assert result.stdout.strip() == "['HOME', 'LANG', 'PATH', 'PWD']"


def test_a_fork_bomb_is_stopped_and_leaves_no_process() -> None:
    marker = f"forkbomb-{uuid.uuid4().hex}"
    result = run(
        f"""
        import os, time
        marker = "{marker}"
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(3600)
                    os._exit(0)
                children += 1
        except OSError as e:
            print("fork refused after", children, e.errno, flush=True)
        time.sleep(3600)
        """,
        timeout_s=10,
        max_processes=16,
    )
    assert result.timed_out and "fork refused after" in result.stdout
    assert int(result.stdout.split()[3]) < 16
    assert processes_with(marker) == []


def test_a_program_that_sleeps_forever_is_killed_with_its_children() -> None:
    marker = f"sleeper-{uuid.uuid4().hex}"
    result = run(
        f"""
        import os, subprocess, time
        subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(3600) # {marker}"])
        print("started", flush=True)
        time.sleep(3600)
        """,
        timeout_s=10,
    )
    assert result.timed_out and result.exit_code == -9 and "started" in result.stdout
    assert processes_with(marker) == []


def test_memory_cpu_and_output_limits() -> None:
    memory = run("x = bytearray(2 << 30)", memory_bytes=256 << 20)
    assert not memory.ok and "MemoryError" in memory.stderr
    cpu = run("while True: pass", cpu_s=1)
    # Killed by the kernel at the CPU limit (SIGKILL or SIGXCPU: 128 + N), not the timeout.
    assert not cpu.timed_out and cpu.exit_code in (128 + 9, 128 + 24)
    loud = run("print('x' * 100_000)", max_output_bytes=1000)
    assert loud.ok and loud.truncated and len(loud.stdout) == 1000
