"""The SAC example main end to end: HalfCheetah-v5 for 2 steps, then nothing left behind.

The run starts its own Ray in its own session (a private ``TMPDIR`` and channel
namespace), as a user would start it; after it exits 0, no process of its
session and no ``/dev/shm`` segment of its namespace may remain.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import ray

ROOT = Path(__file__).resolve().parents[3]
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


def test_halfcheetah_example_runs_two_steps_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """The example main with halfcheetah_sac_mlp: 2 steps (eval and save), exit 0, clean."""
    pytest.importorskip("mujoco")
    if ray.is_initialized():  # the module's cluster must not be joined
        pytest.skip("a Ray cluster is running in this process")
    namespace = f"sacmain{os.getpid()}"
    private_tmp = Path(tempfile.mkdtemp(prefix="rlinf-sac-", dir="/tmp"))
    env = dict(
        os.environ, RLINF_CHANNEL_NAMESPACE=namespace, TMPDIR=str(private_tmp), PYTHONUNBUFFERED="1"
    )
    env.pop("RAY_ADDRESS", None)
    cmd = [
        sys.executable,
        "examples/embodiment/train_embodied_agent.py",
        "--config-name",
        "halfcheetah_sac_mlp",
        f"runner.logger.log_path={tmp_path}",
        "runner.max_epochs=2",
        "runner.val_check_interval=2",
        "runner.save_interval=2",
        "algorithm.warmup_steps=100",
        "algorithm.updates_per_step=5",
        "env.eval.num_envs=1",
        "env.eval.max_episode_steps=50",
        "actor.model.hidden_dims=[32,32]",
        "actor.global_batch_size=32",
        "actor.micro_batch_size=32",
    ]
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        assert proc.returncode == 0, output[-4000:]
        assert "eval/return" in output
        checkpoint = tmp_path / "halfcheetah_sac_mlp" / "checkpoints" / "global_step_2"
        assert (checkpoint / "COMPLETE").exists()
        # Nothing left: no process of the run's session, no segment of its namespace.
        deadline = time.monotonic() + 120
        while (left := _session_processes(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, [p.cmdline()[:3] for p in left]
        assert not sorted(SHM.glob(f"rlinf.{namespace}.*"))
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)
