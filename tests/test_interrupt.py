"""Ctrl-C during a run: one line naming the step and the newest checkpoint, exit 130, no leftovers.

Each example main runs as a user would start it, in its own session; once its
step-2 checkpoint is complete the test sends SIGINT to the whole process group,
as a terminal's Ctrl-C does (Ray's processes and the workers get it too). The
program must exit with 130, print no traceback, end stderr with the
``interrupted (Ctrl-C) ...`` line, and leave no process of its session and no
shared-memory segment of its channel namespace behind.

The run starts its own Ray (a private ``TMPDIR`` keeps it from attaching to a
cluster another test left running).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHM = Path("/dev/shm")


def _session_processes(sid: int) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (ProcessLookupError, psutil.Error, PermissionError):
            pass
    return out


def _alive(pids: list[int]) -> list[psutil.Process]:
    """The processes of ``pids`` that still run (not exited, not zombies)."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_after_checkpoint(cmd: list[str], checkpoint: Path, tmp_path: Path) -> str:
    """Runs ``cmd``, sends Ctrl-C once ``checkpoint`` is complete; returns stderr."""
    namespace = f"ctrlc{os.getpid()}"
    # Short: Ray's socket paths under it must fit in 107 bytes.
    private_tmp = Path(tempfile.mkdtemp(prefix="rlinf-ctrlc-", dir="/tmp"))
    env = dict(
        os.environ,
        RLINF_CHANNEL_NAMESPACE=namespace,
        TMPDIR=str(private_tmp),
        PYTHONUNBUFFERED="1",
    )
    env.pop("RAY_ADDRESS", None)
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
            # As from a terminal: a shell without job control starts background jobs
            # (a CI script's, say) with SIGINT ignored, and children inherit that.
            preexec_fn=_default_sigint,
        )
        try:
            deadline = time.monotonic() + 600
            while not (checkpoint / "COMPLETE").exists():
                assert proc.poll() is None, stderr_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no checkpoint within 600 s"
                time.sleep(0.05)
            started = [p.pid for p in _session_processes(proc.pid)]
            assert len(started) > 3, "the run's worker processes were not found"
            os.killpg(proc.pid, signal.SIGINT)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            shutil.rmtree(private_tmp, ignore_errors=True)
    text = stderr_path.read_text()
    assert rc == 130, f"exit status {rc}:\n{text[-3000:]}"
    assert "Traceback" not in text, text[-5000:]
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert re.fullmatch(
        r"interrupted \(Ctrl-C\) at step \d+ of \d+; newest checkpoint: \S+global_step_\d+ "
        r"\(resume with runner\.resume_dir=auto\)",
        last,
    ), last
    newest = Path(re.search(r"newest checkpoint: (\S+)", last).group(1))  # type: ignore[union-attr]
    assert (newest / "COMPLETE").is_file()
    # Nothing left: no process of the run's session, no segment of its namespace.
    # (The bound only has to outlast Ray's own teardown on a busy machine.)
    # A started process that left the session counts too; one that exited and waits to
    # be reaped by init (a zombie) does not: it holds nothing but its pid.
    deadline = time.monotonic() + 120
    escaped: list[psutil.Process] = []
    while (
        (left := _session_processes(proc.pid))
        or (escaped := [p for p in _alive(started) if p.pid != proc.pid])
    ) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [p.cmdline()[:3] for p in left]
    assert not escaped, [(p.pid, p.status(), p.cmdline()[:3]) for p in escaped]
    assert not sorted(SHM.glob(f"rlinf.{namespace}.*"))
    return text


def assert_progress_lines(text: str, groups: list[str], eval_ran: bool) -> None:
    """The long waits of a run say what they wait for (Ray, each launch, first sync and eval)."""
    patterns = [
        r"starting a local Ray \(\S+ CPUs\) \.\.\.",
        r"Ray started in [\d.]+ s",
        r"first weight sync \(actor -> (rollout|env).*\) \.\.\.",
        r"first weight sync done in [\d.]+ s",
    ]
    for group in groups:
        patterns += [rf"launching {group} x\d+ \.\.\.", rf"{group}: (\d+)/\1 ready in [\d.]+ s"]
    if eval_ran:
        patterns += [r"first eval \(step \d+\) \.\.\.", r"first eval done in [\d.]+ s"]
    for pattern in patterns:
        assert re.search(rf"INFO {pattern}$", text, re.MULTILINE), (pattern, text[-5000:])


def test_ctrl_c_stops_the_embodied_example_cleanly(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "examples/embodiment/train_embodied_agent.py",
        "--config-name",
        "cartpole_ppo_mlp",
        f"runner.logger.log_path={logs}",
        "runner.logger.experiment_name=ctrlc",
        "runner.save_interval=2",
        "runner.val_check_interval=2",
    ]
    checkpoint = logs / "ctrlc" / "checkpoints" / "global_step_2"
    text = interrupt_after_checkpoint(cmd, checkpoint, tmp_path)
    # rollout.in_env_process: true runs the policy in the env worker: no rollout group.
    assert_progress_lines(text, ["ActorGroup", "EnvGroup"], eval_ran=True)
    assert "launching RolloutGroup" not in text
    assert "rollout.in_env_process=true: the env workers run the policy" in text


@pytest.mark.slow  # ~25 s; the sync Ctrl-C test covers the shared path in the default tier
def test_ctrl_c_stops_the_async_sac_example_cleanly(tmp_path: Path) -> None:
    """The async runner is interrupted with rollout epochs and actor steps in flight."""
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "examples/embodiment/train_embodied_agent.py",
        "--config-name",
        "pendulum_sac_mlp",
        f"runner.logger.log_path={logs}",
        "runner.logger.experiment_name=ctrlc",
        "runner.save_interval=2",
        "runner.val_check_interval=2",
        "algorithm.warmup_steps=200",
        "actor.model.hidden_dims=[32,32]",
    ]
    checkpoint = logs / "ctrlc" / "checkpoints" / "global_step_2"
    text = interrupt_after_checkpoint(cmd, checkpoint, tmp_path)
    assert_progress_lines(text, ["ActorGroup", "RolloutGroup", "EnvGroup"], eval_ran=True)


@pytest.fixture
def tiny_reasoning_task(tmp_path: Path) -> Path:
    from rlinf.reasoning.toy_task import make_smoke_task

    return make_smoke_task(tmp_path / "task")


def test_ctrl_c_stops_the_reasoning_example_cleanly(
    tiny_reasoning_task: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "examples/reasoning/main_grpo.py",
        "--config-name",
        "toy_grpo_cpu",
        f"runner.logger.log_path={logs}",
        "runner.logger.experiment_name=ctrlc",
        "runner.max_steps=1000",
        "runner.save_interval=2",
        "runner.val_check_interval=-1",
        "runner.val_before_train=false",
        f"actor.model_path={tiny_reasoning_task / 'model'}",
        f"data.train_files=[{tiny_reasoning_task / 'train.jsonl'}]",
        "data.val_files=[]",
        "algorithm.rollout_batch_size=4",
        "algorithm.group_size=4",
        "algorithm.n_minibatches=1",
        "algorithm.sampling_params.max_new_tokens=4",
        "actor.micro_batch_size=8",
    ]
    checkpoint = logs / "ctrlc" / "checkpoints" / "global_step_2"
    text = interrupt_after_checkpoint(cmd, checkpoint, tmp_path)
    assert_progress_lines(text, ["ActorGroup", "RolloutGroup", "RewardGroup"], eval_ran=False)
