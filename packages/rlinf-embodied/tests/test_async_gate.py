"""The async runner's back-pressure rule: the env waits only while the actor lags, never
while the actor waits for the env (no deadlock), and never without ``max_update_lag``."""

from __future__ import annotations

import itertools
import math

from rlinf.embodied.async_runner import env_gated, update_lag_bound


def test_no_bound_never_gates_and_small_bounds_are_raised() -> None:
    assert update_lag_bound(None, 50, 1.0, 100) is None
    assert not env_gated(
        env_steps=10**6,
        epoch_env_steps=100,
        updates=0,
        warmup_steps=0,
        replay_ratio=1.0,
        bound=None,
    )
    assert update_lag_bound(0, 50, 1.0, 100) == 150.0
    assert update_lag_bound(1000, 50, 0.5, 100) == 1000.0


def test_env_waits_while_the_actor_lags() -> None:
    bound = update_lag_bound(0, 50, 1.0, 100)
    kwargs = {"epoch_env_steps": 100, "warmup_steps": 1000, "replay_ratio": 1.0, "bound": bound}
    assert not env_gated(env_steps=900, updates=0, **kwargs)  # warm-up: never
    assert not env_gated(env_steps=1050, updates=0, **kwargs)  # 150 due, bound 150
    assert env_gated(env_steps=1100, updates=0, **kwargs)  # 200 due
    assert not env_gated(env_steps=1100, updates=50, **kwargs)


def test_the_env_is_never_held_while_the_actor_waits_for_it() -> None:
    for k, ratio, epoch, warmup, lag in itertools.product(
        (1, 50), (0.1, 1.0, 4.0), (1, 100, 800), (0, 1000), (0, 10, None)
    ):
        bound = update_lag_bound(lag, k, ratio, epoch)
        for updates in range(0, 400, max(k, 7)):
            # The actor's next step needs this many env steps (EmbodiedSACActor).
            need = warmup + math.ceil((updates + k) / ratio - 1e-9)
            for env_steps in range(0, need, max(1, need // 20)):
                assert not env_gated(
                    env_steps=env_steps,
                    epoch_env_steps=epoch,
                    updates=updates,
                    warmup_steps=warmup,
                    replay_ratio=ratio,
                    bound=bound,
                ), (k, ratio, epoch, warmup, lag, updates, env_steps)
