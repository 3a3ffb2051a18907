"""GRPO training of a reasoning LLM with RLinf.

    # the CPU toy task (generate its data, tokenizer and warm start first):
    uv run python examples/reasoning/make_toy_task.py --out /tmp/rlinf-toy
    uv run python examples/reasoning/main_grpo.py --config-name toy_grpo_cpu

    # any config, with overrides:
    uv run python examples/reasoning/main_grpo.py --config-path examples/reasoning/config \
        --config-name toy_grpo_cpu runner.max_steps=20 algorithm.group_size=4

The program is the usual RLinf flow: build a Cluster, place and launch the
rollout, reward and actor groups from cluster.component_placement, hand them to
the ReasoningRunner and run it. The same config runs collocated
('actor,rollout,reward: all') or disaggregated (actor: 0, rollout: 1,
reward: 1) just by changing the placement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlinf.core import startup
from rlinf.core.config import ConfigError, add_config_arguments, config_from_args
from rlinf.core.interrupt import EXIT_INTERRUPTED, interrupted_message, interrupts_ignored
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.runner import ReasoningRunner, launch_reasoning_groups, launch_tool_group
from rlinf.sched import Cluster

CONFIG_DIR = Path(__file__).resolve().parent / "config"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="GRPO for reasoning LLMs (rollout -> math reward -> FSDP actor).",
        epilog="Overrides follow Hydra: KEY=VALUE changes a key, +KEY=VALUE adds one, ~KEY "
        "deletes one. Example: runner.max_steps=10 cluster.component_placement.actor=0",
    )
    add_config_arguments(parser, str(CONFIG_DIR), "toy_grpo_cpu")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    startup.mark("imports")
    try:
        cfg = config_from_args(args, ReasoningConfig)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    cluster = None
    runner = None
    interrupted: str | None = None
    try:
        cluster = Cluster(num_nodes=cfg.cluster.num_nodes, cluster_cfg=cfg.cluster)
        startup.mark("ray")
        try:
            placement, actor, rollout, reward = launch_reasoning_groups(cfg, cluster)
            tool = launch_tool_group(cfg, cluster)  # agentic runs placing `tool`; else None
        except ValueError as err:  # the placement or world sizes do not fit this cluster
            print(f"cannot place the run on this cluster: {err}", file=sys.stderr)
            return 2
        startup.mark("groups")
        runner = ReasoningRunner(
            cfg, actor, rollout, reward, collocated=placement.is_collocated, tool=tool
        )
        runner.init_workers()
        last = runner.run()
    except KeyboardInterrupt:
        step = runner.global_step if runner is not None else None
        total = getattr(runner, "total_steps", None)
        checkpoints = cfg.runner.logger.experiment_dir / "checkpoints"
        interrupted = interrupted_message(step, total, checkpoints)
    finally:
        with interrupts_ignored():  # a second Ctrl-C must not cut the clean-up short
            if runner is not None:
                runner.close(groups=True)
            if cluster is not None:
                cluster.close()
    if interrupted is not None:  # printed last: after the workers' forwarded output
        print("\n" + interrupted, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    if "eval/accuracy" in last:
        print(f"final eval/accuracy: {last['eval/accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
