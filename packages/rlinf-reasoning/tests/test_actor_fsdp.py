"""The FSDP2 actor in this process (world size 1, gloo): logprobs, training, checkpoints.

The actor is a :class:`rlinf.sched.Worker`; here it is built directly with the
environment the scheduler would set (no Ray), and the cluster-directory
lookup is stubbed out so no Ray instance starts.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import rlinf.sched.worker.worker as worker_module
from rlinf.core.config import ConfigError, validate_config
from rlinf.core.protocols.reasoning import RolloutResult
from rlinf.reasoning.config import ReasoningConfig
from rlinf.reasoning.engines import HFEngine, SamplingParams
from rlinf.reasoning.toy_task import ToyTaskConfig, build_tokenizer, make_toy_task
from rlinf.reasoning.workers import FSDPActor, pack_samples
from rlinf.reasoning.workers.actor import _has_dropout
from rlinf.reasoning.workers.batch import group_key, response_logprobs
from rlinf.sched.worker.group import _free_port  # outside the ephemeral range

PROMPTS = ["12+7=", "3-28=", "1+1=", "29-29=", "7+15="]


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("toy")
    cfg = ToyTaskConfig(num_train=400, num_test=50, max_operand=29, sft_steps=60, batch_size=64)
    make_toy_task(out, cfg)
    torch.set_num_threads(before)
    return out


def _cfg(toy: Path, **algorithm: Any) -> ReasoningConfig:
    return validate_config(
        {
            "cluster": {"component_placement": {"actor": 0, "rollout": 0, "reward": 0}},
            "runner": {"val_before_train": False, "logger": {"logger_backends": []}},
            "data": {
                "train_files": [str(toy / "train.jsonl")],
                "prompt_key": "problem",
                "answer_key": "answer",
                "max_prompt_length": 16,
            },
            "algorithm": {
                "group_size": 4,
                "rollout_batch_size": 4,
                "sampling_params": {"max_new_tokens": 8},
                **algorithm,
            },
            "actor": {
                "model_path": str(toy / "warmstart"),
                "micro_batch_size": 8,
                "sync_bucket_mb": 0.1,
                "optim": {"lr": 1e-3},
            },
        },
        ReasoningConfig,
    )


@pytest.fixture
def make_actor(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(worker_module, "install_resolver", lambda *a, **k: None)
    monkeypatch.setenv("GROUP_NAME", "InProcessActor")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    made: list[FSDPActor] = []

    def make(cfg: ReasoningConfig, total_steps: int = 4) -> FSDPActor:
        actor = FSDPActor(cfg)
        made.append(actor)
        actor.init_worker(total_steps)
        return actor

    yield make
    for actor in made:
        actor.teardown()


def _groups(
    toy: Path, temperature: float, seed: int = 0, older: float = 0.0
) -> list[RolloutResult]:
    """Groups sampled from the warm-start model (``older`` > 0: its weights plus noise).

    With ``older`` the engine stands for weights a few versions old: its
    (behaviour) logprobs differ from those of the warm-start weights.
    """
    tok = build_tokenizer()
    engine = HFEngine(toy / "warmstart", dtype="float32", device="cpu")
    if older > 0:
        gen = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            for p in engine.model.parameters():
                p.add_(older * torch.randn(p.shape, generator=gen))
    prompts = [tok.encode(p) for p in PROMPTS]
    outs = engine.generate(
        prompts, 4, SamplingParams(temperature=temperature, max_new_tokens=8, seed=seed)
    )
    groups = []
    for i, prompt in enumerate(prompts):
        g = sorted((o for o in outs if o.prompt_index == i), key=lambda o: o.sample_index)
        groups.append(
            RolloutResult(
                prompt_ids=prompt,
                answers=["0"],
                response_ids=[o.output_ids for o in g],
                rollout_logprobs=[o.logprobs for o in g],
                is_end=[o.is_end for o in g],
                version=0,
                index=i,
                rewards=[float(k % 2) for k in range(4)],
            )
        )
    return groups


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_and_fsdp_actor_logprobs_agree(
    toy: Path, make_actor: Any, temperature: float
) -> None:
    actor = make_actor(_cfg(toy, sampling_params={"temperature": temperature, "max_new_tokens": 8}))
    groups = _groups(toy, temperature)
    recomputed = actor.recompute_logprobs(groups)
    engine_lps = [lp for g in groups for lp in g.rollout_logprobs]
    assert len(recomputed) == len(engine_lps) == 20
    worst = max(
        abs(a - b)
        for x, y in zip(engine_lps, recomputed, strict=True)
        for a, b in zip(x, y, strict=True)
    )
    print(f"\nT={temperature}: max |engine - FSDP actor| logprob difference = {worst:.2e}")
    assert worst < 1e-4
    # A wrong temperature is visibly different, so the check has teeth.
    other = make_actor(
        _cfg(toy, sampling_params={"temperature": temperature + 0.5, "max_new_tokens": 8})
    )
    wrong = other.recompute_logprobs(groups)
    assert (
        max(
            abs(a - b)
            for x, y in zip(engine_lps, wrong, strict=True)
            for a, b in zip(x, y, strict=True)
        )
        > 1e-2
    )


def test_pack_samples_layout() -> None:
    packed = pack_samples([([1, 5, 6], [7, 2]), ([1, 9], [8, 8, 2])], pad_token_id=0)
    assert packed.response_start == 3
    assert packed.input_ids.tolist() == [[1, 5, 6, 7, 2, 0], [0, 1, 9, 8, 8, 2]]
    assert packed.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]]
    assert packed.response_mask.tolist() == [[True, True, False], [True, True, True]]
    with pytest.raises(ValueError, match="empty list"):
        pack_samples([], 0)


class _ListChannel:
    """The two channel methods the actor uses, over a list (no shared memory needed)."""

    def __init__(self, items: list[RolloutResult]) -> None:
        self.items = list(items)

    def get(self, timeout: float | None = None) -> RolloutResult:
        return self.items.pop(0)


def test_training_step_checkpoint_and_restore(toy: Path, make_actor: Any, tmp_path: Path) -> None:
    cfg = _cfg(toy, rollout_batch_size=4, n_minibatches=2, group_size=4)
    actor = make_actor(cfg)
    groups = _groups(toy, 1.0)[:4]
    before = actor.state_summary()
    out = actor.run_training(_ListChannel(groups), 0)
    after = actor.state_summary()
    assert after["optim_steps"] == 2 and after["checksum"] != before["checksum"]
    train = out["train"]
    for key in (
        "actor/ratio",
        "actor/clip_fraction",
        "actor/approx_kl",
        "actor/policy_loss",
        "actor/grad_norm",
        "actor/lr",
        "actor/rollout_train_kl",
    ):
        assert key in train, key
    assert train["actor/skipped_steps"] == 0.0  # a count: both minibatch steps were taken
    assert train["actor/logprob_diff_max"] < 1e-4  # recomputed == engine logprobs (step start)
    assert out["rollout"]["count"] == 16 and out["versions"] == [0]
    assert sorted(out["indices"]) == [0, 1, 2, 3]

    actor.save_checkpoint(str(tmp_path / "global_step_1"), 1)
    hf = tmp_path / "global_step_1" / "actor" / "huggingface"
    assert (hf / "config.json").is_file() and (hf / "model.safetensors").is_file()
    saved = actor.state_summary()
    actor.run_training(_ListChannel(groups), 1)  # move away from the checkpoint
    assert actor.state_summary()["checksum"] != saved["checksum"]
    assert actor.load_checkpoint(str(tmp_path / "global_step_1")) == 1
    restored = actor.state_summary()
    assert restored["checksum"] == pytest.approx(saved["checksum"], abs=1e-9)
    assert restored["optim_steps"] == saved["optim_steps"] and restored["lr"] == saved["lr"]
    # The exported weights load as a plain Hugging Face model with the same values.
    engine = HFEngine(hf, dtype="float32", device="cpu")
    assert engine.weights_max_abs_diff(actor.full_weights()) == 0.0


@pytest.mark.parametrize(
    "algorithm",
    [
        {
            "kl_beta": 0.1,
            "kl_penalty": "k3",
            "entropy_bonus": 0.01,
            "shuffle_rollout": True,
            "clip_ratio_c": 3.0,
            "clip_ratio_high": 0.28,
            "loss_agg_mode": "seq-mean-token-mean",
        },
        {"adv_type": "reinforce_plus_plus", "reinpp_kl_beta": 0.05, "use_reinpp_baseline": True},
        {"normalize_advantages": True, "update_epoch": 2},
    ],
    ids=["kl-entropy-shuffle-dualclip", "reinforce++", "whiten-2epochs"],
)
def test_loss_options_train(toy: Path, make_actor: Any, algorithm: dict[str, Any]) -> None:
    cfg = _cfg(toy, rollout_batch_size=4, n_minibatches=2, group_size=4, **algorithm)
    actor = make_actor(cfg)
    out = actor.run_training(_ListChannel(_groups(toy, 1.0)[:4]), 0)
    train = out["train"]
    assert all(v == v and abs(v) < 1e6 for v in train.values()), train  # finite
    if algorithm.get("kl_beta"):
        assert "actor/kl_loss" in train and "actor/entropy_loss" in train
    epochs = algorithm.get("update_epoch", 1)
    assert actor.state_summary()["optim_steps"] == 2 * epochs
    # The first minibatch starts from the sampling weights: ratio 1 before any update.
    assert train["actor/logprob_diff_max"] < 1e-4


def _shift_rollout_logprobs(groups: list[RolloutResult], delta: float) -> list[RolloutResult]:
    """The same groups as if the engine had reported logprobs ``delta`` higher."""
    for g in groups:
        g.rollout_logprobs = [[lp + delta for lp in row] for row in g.rollout_logprobs]
    return groups


def test_truncated_importance_sampling_weights(toy: Path, make_actor: Any) -> None:
    cfg = _cfg(toy, importance_sampling_fix=True, importance_sampling_clip=2.0)
    actor = make_actor(cfg)
    # At the step's start the recomputed logprobs equal the engine's (to 1e-6). An engine
    # that under-reports by 1 nat (groups 0-1, micro-batch 0) gives weights exp(1) = 2.72,
    # truncated to 2; by 0.25 nat (groups 2-3, micro-batch 1) exp(0.25), untruncated.
    groups = _groups(toy, 1.0)[:4]
    _shift_rollout_logprobs(groups[:2], -1.0)
    _shift_rollout_logprobs(groups[2:], -0.25)
    train = actor.run_training(_ListChannel(groups), 0)["train"]
    expected = (2.0 + math.exp(0.25)) / 2  # mean of the two micro-batch means
    assert train["actor/is_weight_mean"] == pytest.approx(expected, abs=1e-5)
    raw = cfg.model_dump(mode="json")
    raw["actor"]["recompute_logprobs"] = False
    with pytest.raises(ConfigError, match=r"actor\.recompute_logprobs: true"):
        validate_config(raw, ReasoningConfig)


def test_early_stop_drops_microbatches_whose_ratio_drifted(toy: Path, make_actor: Any) -> None:
    # Without recompute the ratio is taken against the engine's logprobs; an engine that
    # under-reports by 1 nat makes every ratio e = 2.72 > 2: no micro-batch is trained on.
    cfg = _cfg(toy, early_stop_imp_ratio=2.0)
    cfg.actor.recompute_logprobs = False
    actor = make_actor(cfg)
    shifted = _shift_rollout_logprobs(_groups(toy, 1.0)[:4], -1.0)
    train = actor.run_training(_ListChannel(shifted), 0)["train"]
    assert train["actor/early_stopped"] == 1.0 and train["actor/grad_norm"] == 0.0
    # Engine logprobs as reported: ratio 1 on the first minibatch, trained normally.
    train = actor.run_training(_ListChannel(_groups(toy, 1.0)[:4]), 1)["train"]
    assert train["actor/early_stopped"] == 0.0 and train["actor/grad_norm"] > 0.0


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`:UserWarning")
def test_valid_token_scale_makes_the_update_independent_of_micro_batching(
    toy: Path, make_actor: Any
) -> None:
    """DAPO token-level loss: the minibatch gradient is the mean over all its valid tokens.

    Plain SGD (linear in the gradient) replaces AdamW so updates can be compared.
    One micro-batch of 16 and four of 4 with the valid-token scale give the same
    weights; four of 4 without it weight short and long micro-batches alike.
    """
    groups = _groups(toy, 1.0)[:4]
    lengths = [len(ids) for g in groups for ids in g.response_ids]
    per_micro = [sum(lengths[i : i + 4]) for i in range(0, 16, 4)]
    assert len(set(per_micro)) > 1, per_micro  # otherwise every variant agrees

    def weights_after(micro: int, scale: bool) -> dict[str, torch.Tensor]:
        cfg = _cfg(toy, use_valid_token_scale=scale)
        cfg.actor.micro_batch_size = micro
        actor = make_actor(cfg)
        actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=0.1)
        actor.run_training(_ListChannel(copy.deepcopy(groups)), 0)
        return {name: t.clone() for name, t in actor.full_weights()}

    def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    whole = weights_after(16, scale=False)
    scaled = weights_after(4, scale=True)
    unscaled = weights_after(4, scale=False)
    assert max_diff(whole, scaled) < 1e-6
    assert max_diff(whole, unscaled) > 1e-5
    bad = _cfg(toy).model_dump(mode="json")
    bad["algorithm"].update(use_valid_token_scale=True, loss_agg_mode="seq-mean-token-sum")
    with pytest.raises(ConfigError, match=r"loss_agg_mode: token-mean"):
        validate_config(bad, ReasoningConfig)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`:UserWarning")
def _count_recomputed(actor: Any) -> list[int]:
    """Counts the samples ``actor`` recomputes with a no-grad forward (``[count]``, live)."""
    count = [0]
    real = actor._no_grad_logprobs

    def counting(model: Any, samples: list[Any]) -> list[torch.Tensor]:
        count[0] += len(samples)
        return real(model, samples)

    actor._no_grad_logprobs = counting
    return count


@pytest.mark.parametrize("shuffle", [False, True], ids=["stream", "shuffle"])
def test_first_minibatch_logprobs_come_from_its_training_forward(
    toy: Path, make_actor: Any, shuffle: bool
) -> None:
    """The first minibatch's old logprobs are its training forward's (no no-grad pass).

    The update (plain SGD, so updates compare) is the one a separate
    recomputation of every sample gives, and only the other minibatches are
    recomputed.
    """
    groups = _groups(toy, 1.0)[:4]

    def run(fuse: bool) -> tuple[dict[str, torch.Tensor], dict[str, float], int]:
        cfg = _cfg(toy, n_minibatches=2, update_epoch=2, shuffle_rollout=shuffle)
        cfg.actor.micro_batch_size = 4
        actor = make_actor(cfg)
        assert actor._fuses_first_minibatch()  # the toy model has no dropout
        if not fuse:
            actor._fuses_first_minibatch = lambda: False
        actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=0.1)
        recomputed = _count_recomputed(actor)
        out = actor.run_training(_ListChannel(copy.deepcopy(groups)), 0)
        return {n: t.clone() for n, t in actor.full_weights()}, out["train"], recomputed[0]

    fused_w, fused_m, fused_n = run(True)
    plain_w, plain_m, plain_n = run(False)
    assert (fused_n, plain_n) == (8, 16)  # minibatch 0 (2 groups of 4) is not recomputed
    assert max(float((fused_w[k] - plain_w[k]).abs().max()) for k in fused_w) < 1e-6
    for key in ("actor/policy_loss", "actor/ratio", "actor/logprob_diff_max"):
        assert fused_m[key] == pytest.approx(plain_m[key], abs=1e-5), key


class _KeyedChannel:
    """A keyed channel over a list: ``get(key=...)`` pops the oldest item put under ``key``."""

    def __init__(self, items: list[tuple[str, Any]]) -> None:
        self.items = list(items)

    def get(self, key: str = "", timeout: float | None = None) -> Any:
        i = next(i for i, (k, _) in enumerate(self.items) if k == key)
        return self.items.pop(i)[1]

    def get_nowait(self, key: str = "") -> Any:
        if all(k != key for k, _ in self.items):
            raise asyncio.QueueEmpty
        return self.get(key)


@pytest.mark.parametrize("shuffle", [False, True], ids=["stream", "shuffle"])
def test_proximal_logprobs_scored_by_the_rollout_replace_the_recompute(
    toy: Path, make_actor: Any, shuffle: bool
) -> None:
    """Async GRPO: the rollout's proximal logprobs (``response_logprobs`` on the engine's
    model, the actor's weights) stand in for the actor's no-grad recompute.

    The groups are one version old at step 1: sampled with older weights, so
    their behaviour logprobs differ from the proximal ones. Given the rollout's
    scores (after an older message it must skip; two rollout ranks send one
    message each), the actor recomputes nothing beyond the fused first
    minibatch, and its update (plain SGD) equals the one of its own
    recomputation and differs from the one with the behaviour logprobs as old
    logprobs; a group the rollout did not score is recomputed locally.

    Two of the groups share a prompt index (prefetch across an epoch boundary
    or a regenerated stale group): each still gets its own scores.
    """
    groups = _groups(toy, 1.0, older=0.02)[:4]
    assert groups[0].response_ids != groups[1].response_ids
    groups[1].index = groups[0].index
    engine = HFEngine(toy / "warmstart", dtype="float32", device="cpu")
    pairs = [(g.prompt_ids, ids) for g in groups for ids in g.response_ids]
    flat = response_logprobs(engine.model, pairs, engine.pad_token_id, 1.0, 5)
    scores = {group_key(g): flat[4 * k : 4 * k + 4] for k, g in enumerate(groups)}
    behaviour = [torch.tensor(row) for g in groups for row in g.rollout_logprobs]
    gap = max(float((b - p).abs().max()) for b, p in zip(behaviour, flat, strict=True))
    assert gap > 1e-2  # behaviour and proximal logprobs differ

    def run(
        proximal: Any, recompute: bool = True
    ) -> tuple[dict[str, torch.Tensor], dict[str, float], int]:
        cfg = _cfg(toy, n_minibatches=2, max_staleness=1, shuffle_rollout=shuffle)
        cfg.actor.micro_batch_size = 4
        cfg.actor.recompute_logprobs = recompute
        actor = make_actor(cfg)
        actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=0.1)
        recomputed = _count_recomputed(actor)
        out = actor.run_training(_ListChannel(copy.deepcopy(groups)), 1, proximal=proximal)
        assert out["dropped"] == 0 and out["versions"] == [0]
        return {n: t.clone() for n, t in actor.full_weights()}, out["train"], recomputed[0]

    own_w, own_m, own_n = run(None)
    older = {"version": 0, "groups": {}}
    # Two rollout ranks, each with the scores of its own groups.
    keys = list(scores)
    ranks = [{"version": 1, "groups": {k: scores[k] for k in keys[r::2]}} for r in range(2)]
    rollout_w, rollout_m, rollout_n = run(
        _KeyedChannel([("0", older), ("0", ranks[0]), ("0", ranks[1])])
    )
    assert (own_n, rollout_n) == (8, 0)  # minibatch 0 is fused; the rest came from the rollout
    assert own_m["actor/proximal_from_rollout"] == 0.0
    assert rollout_m["actor/proximal_from_rollout"] == 0.5
    assert max(float((own_w[k] - rollout_w[k]).abs().max()) for k in own_w) < 1e-5
    for key in ("actor/policy_loss", "actor/ratio"):
        assert own_m[key] == pytest.approx(rollout_m[key], abs=1e-5), key
    # The behaviour logprobs as old logprobs give another update.
    behaviour_w, _, _ = run(None, recompute=False)
    assert max(float((behaviour_w[k] - rollout_w[k]).abs().max()) for k in own_w) > 1e-4
    missing = {key: v for key, v in scores.items() if key != group_key(groups[-1])}
    _, _, partial_n = run(_KeyedChannel([("0", {"version": 1, "groups": missing})]))
    assert 0 < partial_n < own_n  # the unscored group's samples outside minibatch 0


def test_dropout_turns_the_fused_first_minibatch_off(toy: Path, make_actor: Any) -> None:
    # A training-mode forward with dropout is not the no-grad one: recompute them all.
    actor = make_actor(_cfg(toy))
    assert not _has_dropout(actor.model)
    actor.model.config.attention_dropout = 0.1
    assert _has_dropout(actor.model) and not actor._fuses_first_minibatch()
    actor.model.config.attention_dropout = 0.0
    actor.model.model.layers[0].mlp.add_module("drop", torch.nn.Dropout(0.1))
    assert _has_dropout(actor.model)


def test_fsdp_units_and_resharding_shape_the_wrapping_not_the_update(
    toy: Path, make_actor: Any
) -> None:
    """``actor.fsdp_units`` decides which modules are FSDP2 units; the update stays the same.

    ``layers`` makes each decoder layer a unit of its own beside the root;
    ``model`` only the root (one all-gather per forward). With either, and with
    the gathered parameters kept from forward to backward or not, one training
    step (two micro-batches per minibatch: gradients reduced after the last)
    gives the same weights (plain SGD, so updates compare).
    """
    from torch.distributed.fsdp import FSDPModule

    groups = _groups(toy, 1.0)[:4]
    weights: dict[tuple[str, bool], dict[str, torch.Tensor]] = {}
    for units, reshard in (("layers", True), ("model", True), ("model", False), ("layers", False)):
        cfg = _cfg(toy, n_minibatches=2)
        cfg.actor.micro_batch_size = 4
        cfg.actor.fsdp_units = units  # type: ignore[assignment]
        cfg.actor.reshard_after_forward = reshard
        actor = make_actor(cfg)
        layers = actor.model.model.layers
        assert isinstance(actor.model, FSDPModule)
        assert all(isinstance(layer, FSDPModule) == (units == "layers") for layer in layers)
        # plain SGD: AdamW's first step turns rounding-level gradients into +-lr moves
        actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=0.1)
        actor.run_training(_ListChannel(copy.deepcopy(groups)), 0)
        weights[units, reshard] = {n: t.clone() for n, t in actor.full_weights()}
    first = weights["layers", True]
    for key, other in weights.items():
        assert max(float((first[k] - other[k]).abs().max()) for k in first) < 1e-6, key
    start = make_actor(_cfg(toy)).full_weights()
    assert max(float((first[n] - t).abs().max()) for n, t in start) > 1e-4, "training moved"
