"""rlinf.core.fsdp_scaling's phase and state checks: the errors actors raise, by name."""

from __future__ import annotations

import pytest

from rlinf.core.fsdp_scaling import check_phase, require_state


def test_check_phase_allows_scale_up_then_scale_down_only_with_scaling() -> None:
    check_phase("scale_up", 1, scaling=True, grown=False)
    check_phase("scale_down", 1, scaling=True, grown=True)
    with pytest.raises(RuntimeError, match=r"^scale_up\(\) on actor rank 1: already grown$"):
        check_phase("scale_up", 1, scaling=True, grown=True)
    with pytest.raises(RuntimeError, match=r"^scale_down\(\) on actor rank 0: not grown$"):
        check_phase("scale_down", 0, scaling=True, grown=False)
    for method, grown in (("scale_up", False), ("scale_down", True)):
        with pytest.raises(RuntimeError, match=r"runner\.online_scaling is off"):
            check_phase(method, 0, scaling=False, grown=grown)


def test_require_state_names_the_call_the_rank_and_the_base_ranks() -> None:
    require_state("save_checkpoint", 2, 2, holds=True, what="model")
    with pytest.raises(RuntimeError) as err:
        require_state("save_checkpoint", 2, 2, holds=False, what="policy")
    assert str(err.value) == (
        "save_checkpoint() on extra actor rank 2: with runner.online_scaling only the base "
        "ranks 0..1 hold the policy between training phases; call it on those "
        "(WorkerGroup.execute_on) or after scale_up()"
    )
