"""``ModelParallelComponentPlacement``: collocated / disaggregated reasoning layouts.

Components: ``actor``, ``rollout`` and ``reward`` are required; ``inference``
(or its alias ``actor_inference``), ``critic`` and ``critic_inference`` are
optional. Each component's resources must be one contiguous range of one node
selection, the same for all of them. The mode is:

* :attr:`PlacementMode.AUTO` when ``auto_scheduler=True``; this also needs a
  disaggregated layout ordered actor -> rollout [-> inference] from resource 0
  to the last resource, and no critic.
* :attr:`PlacementMode.COLLOCATED` when actor and rollout use the same
  resources (no dedicated inference allowed).
* :attr:`PlacementMode.DISAGGREGATED` when actor, rollout and inference are
  pairwise disjoint.
* anything else is a ``ValueError``.

The parsed strategies are then replaced with :class:`PackedPlacementStrategy`:

* collocated: actor one resource per process; rollout ``rollout_tp_size``
  resources per process with ``stride = actor_tp_size / rollout_tp_size`` so a
  rollout TP group lies inside one actor TP group;
* disaggregated: rollout ``rollout_tp_size * rollout_pp_size`` resources per
  process (one per DP replica), the others one per process;
* auto: actor over **all** resources, rollout as disaggregated;
* reward, critic and critic_inference: one resource per process.

Left out (Megatron / algorithm specifics of the reference): reading TP/PP sizes
from the model config (they are constructor arguments here), the
``algorithm.recompute_logprobs`` requirement for a dedicated inference
component, ``use_pre_process_policy`` in AUTO mode, expert/context parallel
sizes, and the eval and multi-agent variants.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from rlinf.sched.cluster_info import ClusterInfo
from rlinf.sched.placement.component import ComponentPlacement, PlacementMode
from rlinf.sched.placement.packed import PackedPlacementStrategy
from rlinf.sched.placement.resources import ResourceSpace
from rlinf.sched.placement.strategy import check_int

_REQUIRED = ("actor", "rollout", "reward")
_INFERENCE_NAMES = ("inference", "actor_inference")


class RolloutSyncMode(Enum):
    """Whether the rollout shares the actor's devices when weights are synced.

    A label of the layout; the transfer is the same in both modes: the actor
    ranks gather the full tensors, actor rank 0 copies them to host memory and
    broadcasts them to every rollout rank over the scheduler's point-to-point
    channels (shared memory on a node, TCP across nodes). There is no CUDA IPC
    or NCCL path between actor and rollout in this release.
    """

    COLLOCATED = "collocated"
    """Same devices: the reasoning actor takes the device lock (and onloads) to send."""
    DISAGGREGATED = "disaggregated"
    """Different devices: no device lock is taken for the sync."""


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if ranks else "none"


class ModelParallelComponentPlacement(ComponentPlacement):
    """Placement for model-parallel reasoning (actor / rollout / reward ...).

    Args:
        config_placement: The ``component_placement`` mapping.
        cluster: The cluster snapshot.
        actor_tp_size: Actor tensor-parallel size.
        actor_pp_size: Actor pipeline-parallel size.
        rollout_tp_size: Rollout tensor-parallel size.
        rollout_pp_size: Rollout pipeline-parallel size.
        inference_tp_size: Dedicated-inference tensor-parallel size.
        inference_pp_size: Dedicated-inference pipeline-parallel size.
        critic_tp_size: Critic tensor-parallel size.
        critic_pp_size: Critic pipeline-parallel size.
        auto_scheduler: Whether to use AUTO mode (no shipped config sets it).

    Raises:
        ValueError: On a missing component, a non-contiguous or mixed-group
            range, an unsupported layout, or parallel sizes that do not fit.
    """

    def __init__(
        self,
        config_placement: Mapping[str, Any],
        cluster: ClusterInfo,
        *,
        actor_tp_size: int = 1,
        actor_pp_size: int = 1,
        rollout_tp_size: int = 1,
        rollout_pp_size: int = 1,
        inference_tp_size: int = 1,
        inference_pp_size: int = 1,
        critic_tp_size: int = 1,
        critic_pp_size: int = 1,
        auto_scheduler: bool = False,
    ) -> None:
        super().__init__(config_placement, cluster)
        self._tp_pp = {
            "actor": (
                check_int("actor_tp_size", actor_tp_size, 1),
                check_int("actor_pp_size", actor_pp_size, 1),
            ),
            "rollout": (
                check_int("rollout_tp_size", rollout_tp_size, 1),
                check_int("rollout_pp_size", rollout_pp_size, 1),
            ),
            "inference": (
                check_int("inference_tp_size", inference_tp_size, 1),
                check_int("inference_pp_size", inference_pp_size, 1),
            ),
            "critic": (
                check_int("critic_tp_size", critic_tp_size, 1),
                check_int("critic_pp_size", critic_pp_size, 1),
            ),
        }
        missing = [c for c in _REQUIRED if not self.has_component(c)]
        if missing:
            raise ValueError(
                f"ModelParallelComponentPlacement needs components {list(_REQUIRED)}; "
                f"missing {missing} (have {self.components})"
            )
        present = [n for n in _INFERENCE_NAMES if self.has_component(n)]
        if len(present) > 1:
            raise ValueError(
                f"components {present} are aliases of the dedicated inference; place only one"
            )
        self._inference: str | None = present[0] if present else None
        self._gpus: dict[str, list[int]] = {}
        self._validate_ranges()
        self._mode = self._detect_mode(auto_scheduler)
        self.placement_mode = self._mode
        self._repack()

    # ----------------------------------------------------------------- checks
    def _mp_components(self) -> list[str]:
        names = [*_REQUIRED, "critic", "critic_inference"]
        if self._inference:
            names.append(self._inference)
        return [n for n in names if self.has_component(n)]

    def _validate_ranges(self) -> None:
        actor_groups = self.get_node_groups("actor")
        self._space = ResourceSpace(self.cluster, actor_groups)
        if not self._space.has_hardware:
            raise ValueError(
                f"ModelParallelComponentPlacement: node group(s) {list(actor_groups)} count "
                "whole nodes; model-parallel components need accelerators or CPU slots"
            )
        for name in self._mp_components():
            if self.get_node_groups(name) != actor_groups:
                raise ValueError(
                    f"component {name!r} is on node group(s) {list(self.get_node_groups(name))} "
                    f"but actor is on {list(actor_groups)}; model-parallel components must "
                    "share one node-group selection"
                )
            ranks = self.get_hardware_ranks(name)
            if ranks != list(range(ranks[0], ranks[-1] + 1)):
                raise ValueError(
                    f"component {name!r} uses resource ranks {ranks}, which are not "
                    "contiguous; give each model-parallel component one range 'a-b'"
                )
            self._gpus[name] = ranks
        checked = ["actor", "rollout", "critic"] + ([self._inference] if self._inference else [])
        for name in checked:
            if name not in self._gpus:
                continue
            tp, pp = self._sizes(name)
            n = len(self._gpus[name])
            if n % (tp * pp):
                raise ValueError(
                    f"component {name!r} has {n} resource(s) ({_span(self._gpus[name])}), not a "
                    f"multiple of its tp_size * pp_size = {tp} * {pp} = {tp * pp}"
                )

    def _sizes(self, name: str) -> tuple[int, int]:
        key = "inference" if name in _INFERENCE_NAMES else name
        return self._tp_pp[key]

    def _detect_mode(self, auto_scheduler: bool) -> PlacementMode:
        actor, rollout = set(self._gpus["actor"]), set(self._gpus["rollout"])
        inference_ranks = self._gpus[self._inference] if self._inference else []
        inference = set(inference_ranks)
        spans = f"actor={_span(self._gpus['actor'])}, rollout={_span(self._gpus['rollout'])}"
        if self._inference:
            spans += f", {self._inference}={_span(inference_ranks)}"
        if actor == rollout:
            if self._inference:
                raise ValueError(
                    f"collocated placement ({spans}) may not have a dedicated "
                    f"{self._inference!r} component; remove it or disaggregate"
                )
            mode = PlacementMode.COLLOCATED
        elif not (actor & rollout) and not (actor & inference) and not (rollout & inference):
            mode = PlacementMode.DISAGGREGATED
        else:
            raise ValueError(
                f"unsupported placement ({spans}): actor and rollout must use the same "
                "resources (collocated) or actor, rollout and inference must be pairwise "
                "disjoint (disaggregated)"
            )
        if not auto_scheduler:
            return mode
        if mode is not PlacementMode.DISAGGREGATED:
            raise ValueError(f"auto_scheduler needs a disaggregated placement, got {spans}")
        if self.has_component("critic"):
            raise ValueError("auto_scheduler does not support a 'critic' component")
        order = ["actor", "rollout"] + ([self._inference] if self._inference else [])
        expected = 0
        for name in order:
            if self._gpus[name][0] != expected:
                raise ValueError(
                    f"auto_scheduler needs {' -> '.join(order)} back to back from resource 0 "
                    f"to {self._space.size - 1}; got {spans}"
                )
            expected = self._gpus[name][-1] + 1
        if expected != self._space.size:
            raise ValueError(
                f"auto_scheduler needs {' -> '.join(order)} to end at the last resource "
                f"{self._space.size - 1}; got {spans}"
            )
        return PlacementMode.AUTO

    # ---------------------------------------------------------------- repack
    def _packed(self, name: str, per_process: int = 1, stride: int = 1) -> None:
        ranks = self._gpus[name]
        self._replace_strategy(
            name,
            PackedPlacementStrategy(
                ranks[0], ranks[-1], per_process, stride, self.get_node_groups(name)
            ),
        )

    def _repack(self) -> None:
        actor_tp = self._tp_pp["actor"][0]
        rollout_tp, rollout_pp = self._tp_pp["rollout"]
        if self._mode is PlacementMode.COLLOCATED:
            if actor_tp % rollout_tp:
                raise ValueError(
                    f"collocated placement needs actor_tp_size ({actor_tp}) to be a multiple "
                    f"of rollout_tp_size ({rollout_tp})"
                )
            self._packed("actor")
            self._packed("rollout", rollout_tp, actor_tp // rollout_tp)
        else:
            if self._mode is PlacementMode.AUTO:
                groups = self.get_node_groups("actor")
                self._replace_strategy(
                    "actor", PackedPlacementStrategy(0, self._space.size - 1, 1, 1, groups)
                )
            else:
                self._packed("actor")
            self._packed("rollout", rollout_tp * rollout_pp)
            if self._inference:
                self._packed(self._inference)
        for name in ("reward", "critic", "critic_inference"):
            if name in self._gpus:
                self._packed(name)

    # ------------------------------------------------------------ properties
    @property
    def is_collocated(self) -> bool:
        """Actor and rollout share resources."""
        return self._mode is PlacementMode.COLLOCATED

    @property
    def is_disaggregated(self) -> bool:
        """Actor, rollout and inference are on disjoint resources."""
        return self._mode is PlacementMode.DISAGGREGATED

    @property
    def is_auto(self) -> bool:
        """The auto scheduler may move resources between components."""
        return self._mode is PlacementMode.AUTO

    @property
    def is_pipeline(self) -> bool:
        """Stages run concurrently (disaggregated or auto)."""
        return self._mode in (PlacementMode.DISAGGREGATED, PlacementMode.AUTO)

    @property
    def has_dedicated_inference(self) -> bool:
        """An ``inference`` / ``actor_inference`` component is placed."""
        return self._inference is not None

    @property
    def rollout_sync_mode(self) -> RolloutSyncMode:
        """Whether actor and rollout share devices during weight sync (:class:`RolloutSyncMode`)."""
        if self.is_collocated:
            return RolloutSyncMode.COLLOCATED
        return RolloutSyncMode.DISAGGREGATED

    def _dp(self, name: str | None) -> int:
        if name is None or name not in self._gpus:
            return 0
        tp, pp = self._sizes(name)
        return len(self._gpus[name]) // (tp * pp)

    def _ws(self, name: str | None) -> int:
        return self.get_world_size(name) if name and self.has_component(name) else 0

    @property
    def actor_tp_size(self) -> int:
        """Actor tensor-parallel size."""
        return self._tp_pp["actor"][0]

    @property
    def actor_pp_size(self) -> int:
        """Actor pipeline-parallel size."""
        return self._tp_pp["actor"][1]

    @property
    def actor_dp_size(self) -> int:
        """Actor data-parallel size over its configured resources."""
        return self._dp("actor")

    @property
    def actor_world_size(self) -> int:
        """Actor processes (all resources in AUTO mode)."""
        return self._ws("actor")

    @property
    def rollout_tp_size(self) -> int:
        """Rollout tensor-parallel size."""
        return self._tp_pp["rollout"][0]

    @property
    def rollout_pp_size(self) -> int:
        """Rollout pipeline-parallel size."""
        return self._tp_pp["rollout"][1]

    @property
    def rollout_dp_size(self) -> int:
        """Rollout data-parallel size (engine replicas)."""
        return self._dp("rollout")

    @property
    def rollout_world_size(self) -> int:
        """Rollout processes."""
        return self._ws("rollout")

    @property
    def inference_tp_size(self) -> int:
        """Dedicated-inference tensor-parallel size."""
        return self._tp_pp["inference"][0]

    @property
    def inference_pp_size(self) -> int:
        """Dedicated-inference pipeline-parallel size."""
        return self._tp_pp["inference"][1]

    @property
    def inference_dp_size(self) -> int:
        """Dedicated-inference data-parallel size (0 without inference)."""
        return self._dp(self._inference)

    @property
    def inference_world_size(self) -> int:
        """Dedicated-inference processes (0 without inference)."""
        return self._ws(self._inference)

    @property
    def critic_tp_size(self) -> int:
        """Critic tensor-parallel size."""
        return self._tp_pp["critic"][0]

    @property
    def critic_pp_size(self) -> int:
        """Critic pipeline-parallel size."""
        return self._tp_pp["critic"][1]

    @property
    def critic_dp_size(self) -> int:
        """Critic data-parallel size (0 without critic)."""
        return self._dp("critic")

    @property
    def critic_world_size(self) -> int:
        """Critic processes (0 without critic)."""
        return self._ws("critic")

    @property
    def reward_world_size(self) -> int:
        """Reward processes."""
        return self._ws("reward")
