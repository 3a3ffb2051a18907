"""``vla-memory``: per-GPU memory of full-size VLAs from their meta-device parameter counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlinf.embodied.models.vla.memory import (
    ParameterCounts,
    count_parameters,
    estimate,
    main,
    table,
)
from rlinf.embodied.models.vla.pi0.layout_list import LAYOUT_FILE

pytestmark = pytest.mark.usefixtures("vla_offline")

DOCS = Path(__file__).resolve().parents[3] / "docs" / "vla.md"


def test_estimate_follows_the_documented_byte_counts() -> None:
    counts = ParameterCounts(total=1000, trained_with_lora=100, adapter=10, unused=50)
    full = estimate(counts, lora=False, actor_gpus=1)
    assert full.actor == 1000 * 2 + 3 * 950 * 2  # bf16 weights + grads and 2 AdamW moments
    assert full.rollout == 2000 and full.collocated == full.actor + 2000
    assert full.collocated_offload == max(full.actor, full.rollout)
    lora = estimate(counts, lora=True, actor_gpus=2, precision="fp32")
    assert lora.actor == (1010 * 4 + 3 * 110 * 4) // 2
    with pytest.raises(ValueError, match="precision"):
        estimate(counts, lora=False, actor_gpus=1, precision="fp8")


def test_pi0_counts_match_the_checked_in_layout_and_a_hand_count_of_adapters() -> None:
    counts = count_parameters("pi0", lora_rank=32)
    assert counts.total == json.loads(LAYOUT_FILE.read_text())["parameters"]
    gemma = 18 * (  # q, k (1 KV head of 256), v, o, gate, up, down of Gemma 2B
        (2048 + 2048) + (2048 + 256) * 2 + (2048 + 2048) + (2048 + 16384) * 2 + (16384 + 2048)
    )
    siglip = 27 * ((1152 + 1152) * 4 + (1152 + 4304) * 2)  # q, k, v, out_proj, fc1, fc2
    assert counts.adapter == 32 * (gemma + siglip)
    assert counts.unused == 257152 * 1024  # the expert's unused vocabulary embedding


def test_the_docs_table_is_the_commands_output(capsys: pytest.CaptureFixture[str]) -> None:
    text = DOCS.read_text()
    match = re.search(r"<!-- vla-memory: begin.*?-->\n(.*?)<!-- vla-memory: end -->", text, re.S)
    assert match, "docs/vla.md lost its vla-memory block"
    expected = "\n\n".join(table(model, [1, 4], 32, "bf16") for model in ("pi0", "openvla"))
    assert match.group(1).strip() == expected.strip()
    assert main(["--model", "pi0", "--gpus", "1", "4"]) == 0
    assert capsys.readouterr().out.strip() == table("pi0", [1, 4], 32, "bf16")
