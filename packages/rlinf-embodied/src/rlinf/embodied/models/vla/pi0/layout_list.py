"""The full-size pi0 checkpoint's tensor names and shapes, computed without allocating memory.

``python -m rlinf.embodied.models.vla.pi0.layout_list`` rewrites
``models/vla/layouts/pi0_base_lerobot.json``: ``PI0ForConditionalGeneration``
built from the default ``PI0Config`` (PaliGemma 3B: Gemma 2B + SigLIP so400m/14 at
224 px; Gemma 300M expert; 32-dim state and actions, 50-step chunks) on the meta
device, renamed into lerobot's layout (``lerobot/pi0_base``). The list is generated
from transformers' architecture and the layout map, not read from a downloaded
file; a test rebuilds it and compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import PI0Config, PI0ForConditionalGeneration

from rlinf.embodied.models.vla.pi0.checkpoint import to_layout

__all__ = ["LAYOUT_FILE", "full_size_layout"]

LAYOUT_FILE = Path(__file__).resolve().parents[1] / "layouts" / "pi0_base_lerobot.json"


def full_size_layout() -> dict[str, list[int]]:
    """``{lerobot tensor name: shape}`` of the default-size pi0, built on the meta device."""
    with torch.device("meta"):
        model = PI0ForConditionalGeneration(PI0Config())
    shapes = {name: tensor for name, tensor in model.state_dict().items()}
    return {name: list(t.shape) for name, t in sorted(to_layout(shapes, "lerobot").items())}


def main() -> int:
    """Writes :data:`LAYOUT_FILE`."""
    layout = full_size_layout()
    total = sum(int(torch.Size(shape).numel()) for shape in layout.values())
    source = (
        "generated: transformers PI0ForConditionalGeneration(PI0Config()) on the meta device, "
        "renamed to lerobot's layout (not read from a downloaded checkpoint)"
    )
    rows = ",\n".join(
        f"  {json.dumps(name)}: {json.dumps(shape)}" for name, shape in layout.items()
    )
    text = (
        f'{{\n "source": {json.dumps(source)},\n "parameters": {total},\n'
        f' "tensors": {{\n{rows}\n }}\n}}\n'
    )
    LAYOUT_FILE.parent.mkdir(parents=True, exist_ok=True)
    LAYOUT_FILE.write_text(text)
    print(f"wrote {LAYOUT_FILE}: {len(layout)} tensors, {total / 1e9:.2f} B parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
