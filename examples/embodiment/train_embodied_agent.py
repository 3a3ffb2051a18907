"""Train an embodied agent: env, rollout and actor groups driven by an embodied runner.

``runner.mode: sync`` (PPO/GRPO) uses the EmbodiedRunner and the FSDP actor;
``runner.mode: async`` with ``algorithm.loss_type: sac`` the AsyncEmbodiedRunner and
the SAC actor with its replay buffer; ``runner.mode: async`` with PPO/GRPO the
AsyncPPORunner (generation of the next batch overlaps training) and the FSDP actor.

Examples:
    uv run python examples/embodiment/train_embodied_agent.py --config-name cartpole_ppo_mlp
    uv run python examples/embodiment/train_embodied_agent.py --config-name pendulum_sac_mlp
    uv run python examples/embodiment/train_embodied_agent.py --config-name cartpole_ppo_mlp \
        runner.max_epochs=10 'cluster.component_placement={actor,env,rollout: 0-1}'
    uv run python examples/embodiment/train_embodied_agent.py --config-name cartpole_ppo_mlp \
        runner.mode=async 'cluster.component_placement={actor: 0, env: 1, rollout: 1}'
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlinf.core import startup
from rlinf.core.config import ConfigError, add_config_arguments, config_from_args
from rlinf.core.interrupt import EXIT_INTERRUPTED, interrupted_message, interrupts_ignored
from rlinf.core.logging import get_logger, setup_logging
from rlinf.embodied.async_ppo_runner import AsyncPPORunner
from rlinf.embodied.async_runner import AsyncEmbodiedRunner
from rlinf.embodied.autoplace_profile import embodied_actor_strategy
from rlinf.embodied.config import EmbodiedConfig
from rlinf.embodied.runner import EmbodiedRunner
from rlinf.embodied.workers import (
    EmbodiedFSDPActor,
    EmbodiedSACActor,
    EnvWorker,
    MultiStepRolloutWorker,
)
from rlinf.sched import Cluster, HybridComponentPlacement, WorkerGroup, launch_groups

CONFIG_DIR = Path(__file__).resolve().parent / "config"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Train an embodied agent (PPO/GRPO, or SAC with runner.mode: async) with "
        "env, rollout and actor groups.",
        epilog="Configs: " + ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))),
    )
    add_config_arguments(parser, str(CONFIG_DIR), "cartpole_ppo_mlp")
    args = parser.parse_args(argv)
    setup_logging()
    startup.mark("imports")
    try:
        cfg = config_from_args(args, schema=EmbodiedConfig)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2

    off_policy = cfg.algorithm.loss_type == "sac"
    actor_cls = EmbodiedSACActor if off_policy else EmbodiedFSDPActor
    runner_cls: type[EmbodiedRunner] = (
        AsyncEmbodiedRunner
        if off_policy
        else AsyncPPORunner
        if cfg.runner.mode == "async"
        else EmbodiedRunner
    )
    groups: list[WorkerGroup] = []
    runner = None
    interrupted: str | None = None
    cluster = None
    try:
        cluster = Cluster(num_nodes=cfg.cluster.num_nodes, cluster_cfg=cfg.cluster)
        startup.mark("ray")
        try:
            placement = HybridComponentPlacement(cfg.cluster.component_placement, cluster.info)
        except ValueError as exc:
            print(f"cannot place the run on this cluster: {exc}", file=sys.stderr)
            return 2
        # With runner.online_scaling the actor also gets ranks on the rollout's resources.
        try:
            actor_strategy, actor_args = embodied_actor_strategy(cfg, placement)
        except ValueError as exc:
            print(f"cannot place the run on this cluster: {exc}", file=sys.stderr)
            return 2
        # The three groups start at once; if one fails, none is left running.
        to_launch = {
            "ActorGroup": (actor_cls.create_group(cfg, **actor_args), actor_strategy),
            "EnvGroup": (EnvWorker.create_group(cfg), placement.get_strategy("env")),
        }
        if cfg.rollout.in_env_process:
            get_logger("rlinf.embodied").info(
                "rollout.in_env_process=true: the env workers run the policy (no rollout group)"
            )
        else:
            to_launch["RolloutGroup"] = (
                MultiStepRolloutWorker.create_group(cfg),
                placement.get_strategy("rollout"),
            )
        launched = launch_groups(cluster, to_launch)
        groups = list(launched.values())
        startup.mark("groups")
        actor, env = launched["ActorGroup"], launched["EnvGroup"]
        rollout = launched.get("RolloutGroup")

        runner = runner_cls(cfg=cfg, actor=actor, rollout=rollout, env=env)
        print(
            f"TensorBoard logs: {runner.tensorboard_dir.resolve()}\n"
            f"  view them with: tensorboard --logdir {runner.tensorboard_dir.resolve()}",
            flush=True,
        )
        runner.init_workers()
        metrics = runner.run()
        summary = {k: v for k, v in metrics.items() if k.startswith(("eval/", "env/"))}
        print("final metrics:", {k: round(v, 4) for k, v in sorted(summary.items())}, flush=True)
        print(f"TensorBoard logs: {runner.tensorboard_dir.resolve()}", flush=True)
    except KeyboardInterrupt:
        step = runner.global_step if runner is not None else None
        checkpoints = cfg.runner.logger.experiment_dir / "checkpoints"
        interrupted = interrupted_message(step, cfg.runner.total_steps, checkpoints)
    finally:
        with interrupts_ignored():  # a second Ctrl-C must not cut the clean-up short
            if runner is not None:
                runner.close()
            for group in reversed(groups):
                group.close()
            if cluster is not None:
                cluster.close()
    if interrupted is not None:  # printed last: after the workers' forwarded output
        print("\n" + interrupted, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
