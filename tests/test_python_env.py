"""Env workers in a second Python environment (``env.python_env``), across numpy majors.

The second environment is LIBERO's uv project (``examples/embodiment/libero``):
numpy 2.x there, 1.26 in the main lock, the same Ray, pydantic, cloudpickle and
torch. These tests skip until it is set up; ``.ci/run`` sets it up and runs them:

    uv sync --locked --project examples/embodiment/libero
    uv run pytest tests/test_python_env.py
"""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from rlinf.core.channel import Channel
from rlinf.sched import Cluster, PythonEnvConfig
from rlinf.sched.python_env import check_python_env

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "embodiment" / "libero"
PYTHON = PROJECT / ".venv" / "bin" / "python"
SETUP = "uv sync --locked --project examples/embodiment/libero"

pytestmark = pytest.mark.skipif(
    not PYTHON.exists(), reason=f"the second environment is not set up: run `{SETUP}`"
)

sys.path.insert(0, str(ROOT / "packages" / "rlinf-embodied" / "tests"))
from test_runner_e2e import SMALL, assert_same_step, launch, make_config  # noqa: E402

from rlinf.embodied.runner import EmbodiedRunner  # noqa: E402


def run_there(code: str, *args: str) -> str:
    """Runs ``code`` with the second environment's interpreter; returns its stdout."""
    done = subprocess.run(
        [str(PYTHON), "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_second_environment_has_another_numpy_major() -> None:
    theirs = run_there("import numpy; print(numpy.__version__)").strip()
    assert int(theirs.split(".")[0]) == 2
    assert int(np.__version__.split(".")[0]) == 1, "the main lock's numpy changed major"


ITEMS_CODE = """
import numpy as np, torch
def items():
    return [
        {"f32": np.arange(12, dtype=np.float32).reshape(3, 4),
         "u8": np.full((2, 5, 3), 7, np.uint8), "b": np.array([True, False]),
         "i64": np.arange(5)[::2], "f": np.asfortranarray(np.eye(3))},
        [np.float32(1.5), np.int64(-3), np.bool_(True), "text", None, 2.0],
        {"t": torch.arange(6, dtype=torch.float32).reshape(2, 3),
         "bf16": torch.ones(4, dtype=torch.bfloat16),
         "mask": torch.tensor([True, False]), "empty": torch.zeros(0, 2)},
    ]
"""


def check_items(got: list[object]) -> None:
    namespace: dict[str, object] = {}
    exec(textwrap.dedent(ITEMS_CODE), namespace)  # the same items, built with this numpy
    want = namespace["items"]()  # type: ignore[operator]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):  # type: ignore[call-overload]
        _assert_equal(g, w)


def _assert_equal(got: object, want: object) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want)
        for k in want:
            _assert_equal(got[k], want[k])
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_equal(g, w)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
        assert torch.equal(got, want)
    else:
        assert type(got) is type(want) and got == want


def test_channel_items_decode_the_same_across_numpy_majors() -> None:
    """Items go numpy 1.26 -> numpy 2 -> numpy 1.26 (decoded and re-encoded there), and
    numpy 2 builds its own; both arrive equal. numpy's own pickle would not load."""
    to_main = Channel.create("pyenv-to-main", namespace="pyenv-test")
    to_there = Channel.create("pyenv-to-there", namespace="pyenv-test")
    try:
        namespace: dict[str, object] = {}
        exec(textwrap.dedent(ITEMS_CODE), namespace)
        for item in namespace["items"]():  # type: ignore[operator]
            to_there.put(item)
        run_there(
            ITEMS_CODE
            + textwrap.dedent(
                """
                from rlinf.core.channel import Channel
                src = Channel.connect("pyenv-to-there", namespace="pyenv-test", timeout=30)
                dst = Channel.connect("pyenv-to-main", namespace="pyenv-test", timeout=30)
                for item in [src.get(timeout=30) for _ in range(3)] + items():
                    dst.put(item)
                """
            )
        )
        check_items([to_main.get(timeout=60) for _ in range(3)])  # the round trip
        check_items([to_main.get(timeout=60) for _ in range(3)])  # built with numpy 2
        with pytest.raises(ModuleNotFoundError, match=r"numpy\._core"):
            pickle.loads(_numpy2_pickle())
    finally:
        for ch in (to_main, to_there):
            ch.close()
            ch.unlink()


def _numpy2_pickle() -> bytes:
    """numpy 2's own pickle of an array, made in the second environment."""
    done = subprocess.run(
        [
            str(PYTHON),
            "-c",
            "import sys, pickle, numpy; "
            "sys.stdout.buffer.write(pickle.dumps(numpy.arange(3), protocol=5))",
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    return done.stdout


@pytest.fixture(scope="module")
def cluster() -> object:
    assert not ray.is_initialized()
    with Cluster(num_nodes=1, cluster_cfg={"cpu_slots_per_node": 3}, num_cpus=2) as c:
        yield c


def test_cartpole_env_workers_in_the_second_environment_train_bit_identically(
    cluster: Cluster, tmp_path: Path
) -> None:
    placement = {"actor": 0, "env": 1, "rollout": 2}
    steps = ["runner.max_epochs=3", "runner.val_check_interval=3", *SMALL]
    dirs = {}
    for name, extra in (("same", []), ("second", [f"+env.python_env.project={PROJECT}"])):
        cfg = make_config(tmp_path, name, [*steps, *extra], placement=placement)
        groups = launch(cluster, cfg, f"pyenv-{name}")
        try:
            actor, rollout, env = groups
            executables = ray.get(
                [a.__ray_call__.remote(lambda _self: sys.executable) for a in env._actors]
            )
            if name == "second":
                assert executables == [str(PYTHON)]
            else:
                assert executables == [sys.executable]
            with EmbodiedRunner(cfg, actor, rollout, env) as runner:
                runner.init_workers()
                runner.run()
            dirs[name] = runner.tensorboard_dir
        finally:
            for group in groups:
                group.close()
    for step in (1, 2, 3):
        keys = assert_same_step(dirs["same"], dirs["second"], step)
        assert "train/actor/policy_loss" in keys


def test_the_check_accepts_the_second_environment() -> None:
    spec = PythonEnvConfig(project=PROJECT)
    path = check_python_env(spec, "rlinf.embodied.workers.env_worker", "env.python_env")
    assert path == str(PYTHON)


def test_libero_pi0_ppo_two_steps_with_env_workers_in_libero_environment(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A tiny pi0 (main environment) trains two PPO steps on LIBERO-Spatial task 0,
    whose env workers run with LIBERO's interpreter (robosuite 1.4, numpy 2)."""
    from rlinf.embodied.models.vla.pi0.tiny import make_tiny_pi0

    instruction = (
        "pick up the black bowl between the plate and the ramekin and place it on the plate"
    )
    model = make_tiny_pi0(
        tmp_path / "libero_pi0",
        image_size=64,
        patch_size=16,
        state_dim=8,
        action_dim=7,
        chunk_size=5,
        instructions=[instruction],
    )
    overrides = [
        f"actor.model.model_path={model}",
        f"env.python_env.project={PROJECT}",
        "runner.max_epochs=2",
        "runner.val_check_interval=2",
        "runner.save_interval=-1",
        "actor.global_batch_size=4",
        "actor.micro_batch_size=2",
        "algorithm.update_epoch=1",
    ]
    for split in ("train", "eval"):
        overrides += [
            f"env.{split}.num_envs=2",
            f"env.{split}.image_size=[64,64]",
            f"++env.{split}.max_episode_steps=10",
            f"env.{split}.env_kwargs.task_ids=[0]",
            f"env.{split}.env_kwargs.init_state_ids=[0,1]",
        ]
    overrides.append("env.train.max_steps_per_rollout_epoch=10")
    placement = {"actor": 0, "env": 1, "rollout": 2}
    cfg = make_config(
        tmp_path, "libero", overrides, placement=placement, config="libero_spatial_ppo_pi0"
    )
    groups = launch(cluster, cfg, "libero")
    try:
        actor, rollout, env = groups
        with EmbodiedRunner(cfg, actor, rollout, env) as runner:
            runner.init_workers()
            metrics = runner.run()
    finally:
        for group in groups:
            group.close()
    assert runner.global_step == 2
    for key in ("train/actor/policy_loss", "train/critic/value_loss"):
        assert math.isfinite(metrics[key]), (key, metrics[key])
    assert metrics["rollout/env_steps"] == 2 * 2 * 10  # steps * envs * sub-steps
    for key in ("eval/success_once", "eval/episode_len", "env/episode_len"):
        assert key in metrics, sorted(metrics)
