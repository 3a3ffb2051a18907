"""The bare ManiSkill simulator loop of the hot-path benchmark, in four kinds of process.

``test_hot_path.py`` compares the rollout's env steps/s with this loop (one
``PickCube-v1`` state env on the CPU sim, random actions, ended episodes
reset). The loop also runs in a plain spawned process
(:class:`BareSimulatorSubprocess`) and in a plain Ray actor
(:class:`BareSimulatorProcess`), so each run shows how much of the rollout's
gap is only the simulator running in another process, or in a Ray worker; and
in the env rank's own process (:class:`EnvWorkerWithBareLoop`), which leaves
out what that process costs the simulator (a process's speed is a draw that
lasts its lifetime: see ``benchmarks/notes/embodied_hot_path.md``).

A module of its own (not a ``test_*`` file) so a spawned child can import it:
the benchmark directory is on ``sys.path`` (``conftest.py``) and spawned
children inherit that; Ray workers get it by value
(``ray.cloudpickle.register_pickle_by_value``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest
import torch

from rlinf.embodied.workers import EnvWorker

STEPS = 50
"""Env steps per round, for the rollout and for the bare simulator alike."""
CONTROL = {"control_mode": "pd_joint_delta_pos"}


def bare_env() -> Any:
    """The ManiSkill env itself (no wrapper), as the simulator's own speed."""
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the tasks)

    try:
        env = gym.make(
            "PickCube-v1",
            obs_mode="state",
            sim_backend="physx_cpu",
            render_backend="none",
            num_envs=1,
            **CONTROL,
        )
    except RuntimeError as exc:  # SAPIEN could not start on this machine
        pytest.skip(f"ManiSkill could not create PickCube-v1: {exc}")
    env.reset(seed=0)
    return env


def bare_steps(env: Any, steps: int, rng: np.random.Generator) -> Callable[[], None]:
    """One round: ``steps`` random-action steps of the bare env (resetting ended episodes)."""
    low, high = env.action_space.low, env.action_space.high

    def run() -> None:
        for _ in range(steps):
            _, _, terminated, truncated, _ = env.step(rng.uniform(low, high).astype(np.float32))
            if bool(np.asarray(terminated | truncated).any()):
                env.reset()

    return run


class BareSimulatorProcess:
    """The bare simulator loop in a plain Ray worker process (one torch thread).

    Not an rlinf worker: the same code as :func:`bare_steps`, to tell how much
    slower a simulator runs in a Ray worker process than in the driver.
    """

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.env = bare_env()
        self.run = bare_steps(self.env, STEPS, np.random.default_rng(0))

    def steps(self) -> None:
        """One round of ``STEPS`` random-action steps."""
        self.run()

    def close(self) -> None:
        self.env.close()


def _serve_rounds(conn: Connection) -> None:
    """Child of :class:`BareSimulatorSubprocess`: one round per message, until ``False``."""
    torch.set_num_threads(1)
    env = bare_env()
    run = bare_steps(env, STEPS, np.random.default_rng(0))
    conn.send("ready")
    while conn.recv():
        run()
        conn.send("done")
    env.close()


class BareSimulatorSubprocess:
    """The bare simulator loop in a plain spawned process (no Ray), driven over a pipe.

    Args:
        timeout: Seconds to wait for the child's start and for each round.
    """

    def __init__(self, timeout: float = 120.0) -> None:
        self.timeout = timeout
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(target=_serve_rounds, args=(child_conn,), daemon=True)
        self._process.start()
        self._reply()

    def _reply(self) -> None:
        if not self._conn.poll(self.timeout):
            raise TimeoutError(f"the bare simulator subprocess did not answer in {self.timeout} s")
        self._conn.recv()

    def steps(self) -> None:
        """One round of ``STEPS`` random-action steps in the child."""
        self._conn.send(True)
        self._reply()

    def close(self) -> None:
        """Ends the child (killed if it does not exit within 10 s)."""
        with contextlib.suppress(OSError):  # the child is gone already
            self._conn.send(False)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


class EnvWorkerWithBareLoop(EnvWorker):
    """The env worker, able to run the bare simulator loop in its own process too.

    Timing both in the env rank's process compares the rollout with the
    simulator on the same process draw: our own per-step cost alone.
    """

    _bare_env: Any = None
    _bare_run: Callable[[], None] | None = None

    def bare_steps(self) -> None:
        """One round of ``STEPS`` random-action steps of a bare env built in this process."""
        if self._bare_run is None:
            self._bare_env = bare_env()
            self._bare_run = bare_steps(self._bare_env, STEPS, np.random.default_rng(0))
        self._bare_run()

    def teardown(self) -> None:
        """Closes the bare env too."""
        try:
            if self._bare_env is not None:
                self._bare_env.close()
                self._bare_env, self._bare_run = None, None
        finally:
            super().teardown()
