"""``RolloutWorker``: generates G responses per prompt with a rollout engine.

Each rank owns one engine (:func:`~rlinf.reasoning.engines.create_engine`, so
any registered backend works). In a step it takes its share of the step's
:class:`~rlinf.core.protocols.reasoning.RolloutRequest` items from the request
channel, ``rollout.groups_per_chunk`` prompts at a time, samples ``G``
responses for each with the weights of the last sync (one version for the
whole step), and puts one :class:`~rlinf.core.protocols.reasoning.RolloutResult`
per prompt group on the output channel as soon as its chunk is done.

Collocated, a rank holds the device lock while it generates and offloads its
engine afterwards (GPU); disaggregated, it just generates.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import AbstractContextManager
from typing import Any

from rlinf.core.channel import Channel
from rlinf.core.dist import select_device
from rlinf.core.protocols.reasoning import RolloutRequest, RolloutResult
from rlinf.core.seeding import derive_seed
from rlinf.core.weight_sync import WeightBucket, check_complete, receive_weights
from rlinf.reasoning.config import ReasoningConfig, SamplingConfig
from rlinf.reasoning.engines import GenerationOutput, RolloutEngine, create_engine
from rlinf.reasoning.workers.common import (
    load_tokenizer,
    setup_torch_threads,
)
from rlinf.sched import Worker

__all__ = ["RolloutWorker"]


def _seed(base: int, step: int, rank: int, chunk: int) -> int:
    """The sampling seed of one chunk of a rank's generation at a step (31 bits)."""
    return derive_seed(base, "rollout", step, rank, chunk) % (2**31 - 1)


class RolloutWorker(Worker):
    """Generation with a rollout engine; receives weights from the actor in buckets.

    Args:
        cfg: The validated run config.
        collocated: Whether the rollout shares its devices with the actor.
    """

    def __init__(self, cfg: ReasoningConfig, collocated: bool = False) -> None:
        super().__init__()
        setup_torch_threads(cfg.cluster.torch_threads)
        self.cfg = cfg
        self.collocated = collocated
        self.engine: RolloutEngine | None = None
        self.num_syncs = 0
        self.load_calls = 0
        self.generated_tokens = 0
        self._stage_times: deque[dict[str, float]] = deque(maxlen=1024)

    def init_worker(self) -> dict[str, Any]:
        """Builds the engine on this rank's device.

        Returns:
            ``{"device", "engine"}``.

        Raises:
            FileNotFoundError: If the model directory does not exist.
        """
        cfg = self.cfg
        device = select_device()
        tokenizer = load_tokenizer(cfg.actor.tokenizer_dir)
        eos = tokenizer.eos_token_id
        self.stop_ids: tuple[int, ...] = (int(eos),) if isinstance(eos, int) else ()
        options: dict[str, Any] = {}
        if cfg.rollout.max_batch_size is not None:
            options["max_batch_size"] = cfg.rollout.max_batch_size
        typed = {"vllm": cfg.rollout.vllm, "sglang": cfg.rollout.sglang}.get(cfg.rollout.engine)
        if typed is not None:  # the engine's own sub-section (rollout.vllm, rollout.sglang)
            options.update(typed.model_dump())
            options["seed"] = derive_seed(cfg.runner.seed, "rollout", self.rank) % 2**31
        self.engine = create_engine(
            cfg.rollout.engine,
            model_path=cfg.rollout_model_path,
            dtype=cfg.rollout.dtype,
            device=device,
            **options,
        )
        self.num_syncs = 0  # a new engine is validated again at its first sync
        if self._offload_enabled:
            self.engine.offload()
        return {"device": str(device), "engine": type(self.engine).__name__}

    @property
    def _offload_enabled(self) -> bool:
        flag = self.cfg.rollout.enable_offload
        if flag is None:
            return self.collocated and select_device().type != "cpu"
        return flag

    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError("call init_worker() before using the rollout worker")
        return self.engine

    # ------------------------------------------------------------------ weights
    def sync_model_from_actor(self, actor_group: str) -> dict[str, Any]:
        """Receives one weight sync (all its buckets) from actor rank 0 and loads it.

        After the first sync (with ``rollout.validate_weight_first_sync``) it
        checks that every engine parameter was received and now equals the
        actor's value exactly (compared in the engine's dtype).

        Args:
            actor_group: The actor group's name.

        Returns:
            ``{"version", "num_buckets", "load_calls", "max_abs_diff", "seconds"}``.

        Raises:
            RuntimeError: If the first-sync check fails (names what differs).
        """
        engine = self._engine()
        start = time.perf_counter()
        groups: list[tuple[str, int | list[int]]] = [
            (actor_group, 0),
            (self.group_name, list(range(self.world_size))),
        ]
        check = self.num_syncs == 0 and self.cfg.rollout.validate_weight_first_sync
        # Engines that cannot read their weights back (vLLM prepacks them) get the
        # names checked against their model directory instead of the values.
        readable = getattr(engine, "weights_readable", True)
        dtype = getattr(engine, "dtype", None)
        worst = 0.0

        def receive() -> WeightBucket:
            timeout = self.cfg.runner.channel_timeout_s
            bucket: WeightBucket = self.broadcast(
                None, groups, src=(actor_group, 0), timeout=timeout
            )
            return bucket

        def load(bucket: WeightBucket) -> None:
            nonlocal worst
            engine.load_weights(bucket.tensors, version=bucket.version)
            self.load_calls += 1
            if check and readable:
                cast = [(n, t.to(dtype) if dtype is not None else t) for n, t in bucket.tensors]
                worst = max(worst, engine.weights_max_abs_diff(cast))

        version, buckets, received = receive_weights(receive, load)
        finish = getattr(engine, "finish_weight_sync", None)
        if finish is not None:
            finish()  # vLLM: no incomplete fused group; SGLang: closes its update session
        model = getattr(engine, "model", None)
        expected = getattr(engine, "expected_weight_names", None)
        names = (
            (n for n, _ in model.named_parameters())
            if model is not None
            else expected()
            if expected is not None
            else None
        )
        if check and names is not None:
            check_complete(
                names,
                received,
                version,
                "actor and rollout must load the same architecture (check "
                "rollout.model_path vs actor.model_path)",
            )
        if check and worst != 0.0:
            raise RuntimeError(
                f"weight sync v{version}: engine weights differ from the actor's by up to "
                f"{worst:g} after loading; the engine's load_weights is broken"
            )
        self.num_syncs += 1
        return {
            "version": version,
            "num_buckets": buckets,
            "load_calls": self.load_calls,
            "max_abs_diff": worst,
            "seconds": time.perf_counter() - start,
        }

    def weights_max_abs_diff(self, named: list[tuple[str, Any]]) -> float:
        """Largest difference between the engine's weights and ``named`` (tests)."""
        return self._engine().weights_max_abs_diff(named)

    def stage_times(self) -> list[dict[str, float]]:
        """When each recent :meth:`generate` call generated (tests and debugging).

        Returns:
            One ``{"step", "generate_start", "generate_end"}`` per call, oldest
            first (the last 1024): when its first generation started and its
            last one ended, in ``time.time()`` seconds (comparable across the
            processes of one node).
        """
        return list(self._stage_times)

    def stats(self) -> dict[str, Any]:
        """Syncs, engine load calls, weight version and generated tokens so far."""
        return {
            "num_syncs": self.num_syncs,
            "load_calls": self.load_calls,
            "version": self._engine().version,
            "generated_tokens": self.generated_tokens,
        }

    # --------------------------------------------------------------- generation
    def _generate(
        self, requests: list[RolloutRequest], sampling: SamplingConfig, seed: int | None
    ) -> list[RolloutResult]:
        engine = self._engine()
        g = requests[0].group_size
        if any(r.group_size != g for r in requests):
            raise ValueError("requests of one generate call must share group_size")
        params = sampling.to_params(seed=seed, stop_token_ids=self.stop_ids)
        outs = engine.generate([r.prompt_ids for r in requests], g, params)
        by_prompt: list[list[GenerationOutput]] = [[] for _ in requests]
        for out in outs:
            by_prompt[out.prompt_index].append(out)
        results = []
        for req, group in zip(requests, by_prompt, strict=True):
            group.sort(key=lambda o: o.sample_index)
            self.generated_tokens += sum(o.num_tokens for o in group)
            results.append(
                RolloutResult(
                    prompt_ids=list(req.prompt_ids),
                    answers=list(req.answers),
                    response_ids=[list(o.output_ids) for o in group],
                    rollout_logprobs=[list(o.logprobs) for o in group],
                    is_end=[o.is_end for o in group],
                    version=engine.version,
                    index=req.index,
                    step=req.step,
                )
            )
        return results

    def offload(self) -> None:
        """Frees the engine's device memory (a no-op before :meth:`init_worker`)."""
        if self.engine is not None:
            self.engine.offload()

    def onload(self) -> None:
        """Restores the engine's weights to its device."""
        self._engine().onload()

    def _phase(self) -> AbstractContextManager[None]:
        """Lock (collocated), onload, the block, offload (when enabled), release."""
        return self.device_phase(
            lock=self.collocated,
            offload=self._offload_enabled,
            timeout=self.cfg.runner.step_timeout_s,
        )

    def generate(self, requests: Channel, results: Channel, step: int) -> dict[str, Any]:
        """Answers this rank's share of step ``step``'s requests, streaming groups out.

        Args:
            requests: Channel with the step's :class:`RolloutRequest` items.
            results: Channel that receives one :class:`RolloutResult` per prompt.
            step: The global step (seeds the sampler).

        Returns:
            ``{"groups", "tokens", "busy_s", "version"}``.
        """
        cfg = self.cfg
        share = cfg.algorithm.rollout_batch_size // self.world_size
        chunk_size = cfg.rollout.groups_per_chunk
        timeout = cfg.runner.channel_timeout_s
        done = tokens = 0
        busy = 0.0
        chunk_index = 0
        first_start = last_end = float("nan")
        with self._phase():
            while done < share:
                batch: list[RolloutRequest] = [requests.get(timeout=timeout)]
                while len(batch) < min(chunk_size, share - done):
                    try:
                        batch.append(requests.get_nowait())
                    except asyncio.QueueEmpty:
                        break
                if chunk_index == 0:
                    first_start = time.time()
                t0 = time.perf_counter()
                seed = _seed(cfg.runner.seed, step, self.rank, chunk_index)
                out = self._generate(batch, cfg.algorithm.sampling_params, seed)
                busy += time.perf_counter() - t0
                last_end = time.time()
                for result in out:
                    results.put(result, timeout=timeout)
                    tokens += result.num_tokens
                done += len(batch)
                chunk_index += 1
        self._stage_times.append(
            {"step": float(step), "generate_start": first_start, "generate_end": last_end}
        )
        return {"groups": done, "tokens": tokens, "busy_s": busy, "version": self._engine().version}

    def generate_eval(
        self, requests: list[RolloutRequest], sampling: SamplingConfig
    ) -> list[RolloutResult]:
        """Generates for held-out prompts (no channels; the runner splits the set).

        Args:
            requests: The prompts (``group_size`` samples each).
            sampling: Eval sampling parameters.

        Returns:
            One result per request, in order.
        """
        if not requests:
            return []
        with self._phase():
            out: list[RolloutResult] = []
            size = max(self.cfg.rollout.groups_per_chunk, 64)
            for i in range(0, len(requests), size):
                seed = _seed(self.cfg.runner.seed, -1, self.rank, i)
                out += self._generate(requests[i : i + size], sampling, seed)
            return out

    def generate_requests(self, requests: list[RolloutRequest], step: int) -> list[RolloutResult]:
        """Generates training-style samples for ``requests`` directly (tests and tools).

        Args:
            requests: The prompts.
            step: Seeds the sampler like :meth:`generate`.

        Returns:
            One result per request.
        """
        with self._phase():
            seed = _seed(self.cfg.runner.seed, step, self.rank, 0)
            return self._generate(requests, self.cfg.algorithm.sampling_params, seed)
