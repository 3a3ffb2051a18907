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

Asynchronous GRPO (``algorithm.max_staleness`` > 0) runs :meth:`RolloutWorker.generate_stream`
instead: one long call that answers requests chunk by chunk until the runner
stops it, while weight syncs arrive on another thread of the same worker: a
sync receives every bucket first and then loads them between two chunks (under
the engine lock), so generation pauses only for the load, and each group
carries the version of the weights that generated it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from rlinf.core.channel import Channel
from rlinf.core.dist import select_device
from rlinf.core.protocols.reasoning import RolloutRequest, RolloutResult
from rlinf.core.seeding import derive_seed
from rlinf.core.weight_sync import WeightBucket, check_complete, receive_weights
from rlinf.reasoning.agent.executor import ChannelToolExecutor, LocalToolExecutor
from rlinf.reasoning.agent.loop import AgentLoop, AgentRunStats
from rlinf.reasoning.config import ReasoningConfig, SamplingConfig
from rlinf.reasoning.engines import GenerationOutput, RolloutEngine, SamplingParams, create_engine
from rlinf.reasoning.engines.vllm_engine import vllm_logprobs_mode
from rlinf.reasoning.tools.factory import build_registry
from rlinf.reasoning.workers.batch import group_key, response_logprobs
from rlinf.reasoning.workers.common import load_tokenizer, setup_torch_threads
from rlinf.sched import Worker

__all__ = ["RolloutWorker"]


_POLL_S = 0.5
"""How often a waiting :meth:`RolloutWorker.generate_stream` checks for a stop."""


def _seed(base: int, step: int, rank: int, chunk: int) -> int:
    """The sampling seed of one chunk of a rank's generation at a step (31 bits)."""
    return derive_seed(base, "rollout", step, rank, chunk) % (2**31 - 1)


class _BucketLoader:
    """Loads weight buckets into an engine; on a checked sync, tracks the largest difference.

    Engines that cannot read their weights back (vLLM prepacks them) are not
    compared; their names are checked against the model directory instead.
    """

    def __init__(self, worker: RolloutWorker, engine: RolloutEngine, check: bool) -> None:
        self.worker, self.engine = worker, engine
        self.compare = check and getattr(engine, "weights_readable", True)
        self.dtype = getattr(engine, "dtype", None)
        self.worst = 0.0  # largest |engine - actor| after loading (compared syncs)

    def __call__(self, bucket: WeightBucket) -> None:
        self.engine.load_weights(bucket.tensors, version=bucket.version)
        self.worker.load_calls += 1
        if self.compare:
            dtype = self.dtype
            cast = [(n, t.to(dtype) if dtype is not None else t) for n, t in bucket.tensors]
            self.worst = max(self.worst, self.engine.weights_max_abs_diff(cast))


def _check_first_sync(
    engine: RolloutEngine, received: set[str], version: int, worst: float
) -> None:
    """After the first sync: every engine parameter was received and equals the actor's.

    Raises:
        RuntimeError: If a name is missing or a value differs (says which).
    """
    model = getattr(engine, "model", None)
    expected = getattr(engine, "expected_weight_names", None)
    names = (
        (n for n, _ in model.named_parameters())
        if model is not None
        else expected()
        if expected is not None
        else None
    )
    if names is not None:
        check_complete(
            names,
            received,
            version,
            "actor and rollout must load the same architecture (check "
            "rollout.model_path vs actor.model_path)",
        )
    if worst != 0.0:
        raise RuntimeError(
            f"weight sync v{version}: engine weights differ from the actor's by up to "
            f"{worst:g} after loading; the engine's load_weights is broken"
        )


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
        self._engine_lock = threading.Lock()  # generation vs weight loads (async mode)
        self._stop = threading.Event()  # ends generate_stream
        self._stream_chunks = 0  # chunks generated by generate_stream (seeds)
        # Async mode with proximal scoring: the stream's groups since the last load.
        self._unscored: list[RolloutResult] = []
        self._proximal: tuple[Channel, int] | None = None  # (channel, actor ranks)
        self.agent: AgentLoop | None = None  # multi-turn rollouts (agent section)
        self.agent_timing: list[AgentRunStats] = []

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
        if cfg.rollout.engine == "vllm":  # the one mode that reports every sampling's logprobs
            options["logprobs_mode"] = vllm_logprobs_mode(cfg.algorithm.sampling_by_key)
        self.engine = create_engine(
            cfg.rollout.engine,
            model_path=cfg.rollout_model_path,
            dtype=cfg.rollout.dtype,
            device=device,
            **options,
        )
        self.tokenizer = tokenizer
        self.agent = None
        if cfg.agent is not None and not cfg.places_tool_workers:  # tools run in this worker
            executor = LocalToolExecutor(build_registry(cfg.agent), cfg.agent.tool_concurrency)
            self.agent = AgentLoop(self.engine, tokenizer, cfg.agent, executor, self.stop_ids)
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

    def attach_tool_workers(self, requests: Channel, replies: Channel) -> None:
        """Sends this rank's tool calls to the tool worker group (``tool`` is placed).

        Args:
            requests: The tool workers' request channel.
            replies: Answers, keyed by this rank.
        """
        cfg = self.cfg
        if cfg.agent is None:
            raise RuntimeError("attach_tool_workers needs an agent section in the config")
        executor = ChannelToolExecutor(requests, replies, self.rank, cfg.runner.channel_timeout_s)
        self.agent = AgentLoop(self._engine(), self.tokenizer, cfg.agent, executor, self.stop_ids)

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

        Async mode, when :meth:`generate_stream` got a ``proximal`` channel:
        right after the load (before generation goes on) it scores the stream's
        groups of the previous version under the new weights and puts
        ``{"version", "groups": {group_key: logprobs}}`` there once per actor rank
        (key: the rank), so the actor takes its proximal logprobs from there
        instead of recomputing them.

        Args:
            actor_group: The actor group's name.

        Returns:
            ``{"version", "num_buckets", "load_calls", "max_abs_diff", "seconds"}``.

        Raises:
            RuntimeError: If the first-sync check fails (names what differs).
        """
        engine = self._engine()
        start = time.perf_counter()
        check = self.num_syncs == 0 and self.cfg.rollout.validate_weight_first_sync
        load = _BucketLoader(self, engine, check)
        receive = partial(self._receive_bucket, actor_group)
        finish = getattr(engine, "finish_weight_sync", None)
        if self.cfg.algorithm.is_async:
            # Receive everything first, so generation pauses only for the load.
            buffered: list[WeightBucket] = []
            version, buckets, received = receive_weights(receive, buffered.append)
            with self._engine_lock:
                for bucket in buffered:
                    load(bucket)
                if finish is not None:
                    finish()
                if self._proximal is not None:
                    self._post_proximal(version, *self._proximal)
        else:
            with self._engine_lock:
                version, buckets, received = receive_weights(receive, load)
                if finish is not None:
                    finish()  # vLLM: no incomplete fused group; SGLang: closes its session
        if check:
            _check_first_sync(engine, received, version, load.worst)
        self.num_syncs += 1
        return {
            "version": version,
            "num_buckets": buckets,
            "load_calls": self.load_calls,
            "max_abs_diff": load.worst,
            "seconds": time.perf_counter() - start,
        }

    def _receive_bucket(self, actor_group: str) -> WeightBucket:
        """The next weight bucket, broadcast by actor rank 0 to every rollout rank."""
        groups: list[tuple[str, int | list[int]]] = [
            (actor_group, 0),
            (self.group_name, list(range(self.world_size))),
        ]
        timeout = self.cfg.runner.channel_timeout_s
        bucket: WeightBucket = self.broadcast(None, groups, src=(actor_group, 0), timeout=timeout)
        return bucket

    def _post_proximal(self, version: int, channel: Channel, actor_world_size: int) -> None:
        """Scores the kept groups of version ``version - 1`` under the loaded weights."""
        groups = [r for r in self._unscored if r.version == version - 1]
        self._unscored = []
        model = getattr(self._engine(), "model", None)
        scores: dict[tuple[int, int], list[Any]] = {}
        if model is not None and groups:
            pairs = [(r.prompt_ids, ids) for r in groups for ids in r.response_ids]
            masks = [
                None if r.generated_masks is None else r.generated_masks[k]
                for r in groups
                for k in range(r.group_size)
            ]
            pad = int(getattr(self._engine(), "pad_token_id", 0) or 0)
            temperature = self.cfg.algorithm.sampling_params.temperature
            micro = self.cfg.actor.logprob_micro_batch_size or self.cfg.actor.micro_batch_size
            flat = response_logprobs(model, pairs, pad, temperature, micro, masks)
            for k, r in enumerate(groups):
                scores[group_key(r)] = flat[k * r.group_size : (k + 1) * r.group_size]
        message = {"version": version, "groups": scores}
        for rank in range(actor_world_size):
            channel.put(message, key=str(rank), timeout=self.cfg.runner.channel_timeout_s)

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
        if self.cfg.agent is not None:
            return self._generate_trajectories(requests, params)
        with self._engine_lock:  # one weight version for the whole chunk
            outs = engine.generate([r.prompt_ids for r in requests], g, params)
            version = engine.version
        return self._results(requests, outs, version)

    def _generate_trajectories(
        self, requests: list[RolloutRequest], params: SamplingParams
    ) -> list[RolloutResult]:
        """Multi-turn groups with tool calls (``agent`` section), one per request."""
        if self.agent is None:
            raise RuntimeError(
                "the tool group is placed but attach_tool_workers() was not called; "
                "run through ReasoningRunner, which attaches it in init_workers()"
            )
        g = requests[0].group_size
        with self._engine_lock:  # one weight version for the whole chunk
            trajectories, timing = self.agent.run([r.prompt_ids for r in requests], g, params)
            version = self._engine().version
        self.agent_timing.append(timing)
        results = []
        for k, req in enumerate(requests):
            group = trajectories[k * g : (k + 1) * g]
            self.generated_tokens += sum(sum(t.generated) for t in group)
            results.append(
                RolloutResult(
                    prompt_ids=list(req.prompt_ids),
                    answers=list(req.answers),
                    response_ids=[t.tokens for t in group],
                    rollout_logprobs=[t.logprobs for t in group],
                    is_end=[t.is_end for t in group],
                    version=version,
                    index=req.index,
                    step=req.step,
                    generated_masks=[t.generated for t in group],
                    trajectory_stats=[t.stats() for t in group],
                )
            )
        return results

    def agent_time_report(self) -> dict[str, float]:
        """Generation and tool-wait seconds of the agent runs since the last report (then reset).

        Returns:
            ``{"seconds", "generate_s", "tool_wait_s", "engine_calls"}`` summed over runs.
        """
        runs, self.agent_timing = self.agent_timing, []
        return {
            "seconds": sum(r.seconds for r in runs),
            "generate_s": sum(r.generate_s for r in runs),
            "tool_wait_s": sum(r.tool_wait_s for r in runs),
            "engine_calls": float(sum(r.engine_calls for r in runs)),
        }

    def _results(
        self, requests: list[RolloutRequest], outs: list[GenerationOutput], version: int
    ) -> list[RolloutResult]:
        """One :class:`RolloutResult` per request from the engine's outputs."""
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
                    version=version,
                    index=req.index,
                    step=req.step,
                )
            )
        return results

    def teardown(self) -> None:
        """Stops the tool threads of a local tool executor, then releases the worker."""
        if self.agent is not None:
            self.agent.executor.close()
        super().teardown()

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
                    tokens += result.num_generated_tokens
                done += len(batch)
                chunk_index += 1
        self._stage_times.append(
            {"step": float(step), "generate_start": first_start, "generate_end": last_end}
        )
        report = {
            "groups": done,
            "tokens": tokens,
            "busy_s": busy,
            "version": self._engine().version,
        }
        if self.agent is not None:
            report.update({f"agent_{k}": v for k, v in self.agent_time_report().items()})
        return report

    def generate_stream(
        self,
        requests: Channel,
        results: Channel,
        proximal: Channel | None = None,
        actor_world_size: int = 1,
    ) -> dict[str, Any]:
        """Async mode: answers requests chunk by chunk until :meth:`stop_stream` or ``None``.

        Takes up to ``rollout.groups_per_chunk`` requests at a time (whatever is
        queued, at least one), generates them with the engine's current weights
        and puts one :class:`RolloutResult` per prompt on ``results``. Weight
        syncs (another thread) load between chunks.

        Args:
            requests: Channel of :class:`RolloutRequest` items (``None`` ends the call).
            results: Channel that receives the generated groups.
            proximal: Where every later weight load puts the proximal logprobs of
                the stream's groups of the previous version, scored under the new
                weights, once per actor rank (see :meth:`sync_model_from_actor`).
            actor_world_size: The actor ranks (keys ``"0"``...) of ``proximal``.

        Returns:
            ``{"groups", "tokens", "busy_s", "chunks", "version"}``.
        """
        cfg = self.cfg
        chunk_size = cfg.rollout.groups_per_chunk
        done = tokens = chunks = 0
        busy = 0.0
        self._stop.clear()
        with self._engine_lock:
            self._unscored = []
            self._proximal = None if proximal is None else (proximal, actor_world_size)
        ended = False
        while not ended and not self._stop.is_set():
            try:
                first: RolloutRequest | None = requests.get(timeout=_POLL_S)
            except TimeoutError:
                continue
            batch: list[RolloutRequest] = []
            item = first
            while item is not None:
                batch.append(item)
                if len(batch) >= chunk_size:
                    break
                try:
                    item = requests.get_nowait()
                except asyncio.QueueEmpty:
                    break
            ended = item is None
            if not batch:
                break
            t0 = time.perf_counter()
            seed = _seed(cfg.runner.seed, -2, self.rank, self._stream_chunks)
            self._stream_chunks += 1
            out = self._generate(batch, cfg.algorithm.sampling_params, seed)
            busy += time.perf_counter() - t0
            if proximal is not None:  # scored under the next weights (sync_model_from_actor)
                with self._engine_lock:
                    self._unscored.extend(out)
            for result in out:
                results.put(result, timeout=cfg.runner.channel_timeout_s)
                tokens += result.num_generated_tokens
            done += len(batch)
            chunks += 1
        with self._engine_lock:  # later loads score nothing
            self._proximal, self._unscored = None, []
        return {
            "groups": done,
            "tokens": tokens,
            "busy_s": busy,
            "chunks": chunks,
            "version": self._engine().version,
        }

    def stop_stream(self) -> None:
        """Ends a running :meth:`generate_stream` after its current chunk."""
        self._stop.set()

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
