"""Vision-language-action policies: ``pi0`` and ``openvla`` (OpenVLA and OpenVLA-OFT).

``model_type: pi0`` (:mod:`.pi0`) runs RL on transformers' stock
``PI0ForConditionalGeneration``; ``model_type: openvla`` (:mod:`.openvla`) on an
OpenVLA port, with ``decode_mode: autoregressive`` (OpenVLA) or ``parallel``
(OpenVLA-OFT). Importing this package imports ``transformers`` and ``peft``;
:mod:`rlinf.embodied.models` itself never imports it, the policy registry imports
``pi0.policy`` or ``openvla.policy`` the first time that policy is built.

Shared modules: :mod:`.backbones` (the value head), :mod:`.statistics` (action
statistics and the normaliser), :mod:`.action_bins` + :mod:`.token_sampling`
(OpenVLA's action tokens), :mod:`.flow_sampling` (pi0's denoising math),
:mod:`.lora` (PEFT adapters, ``actor.model.lora``), :mod:`.memory`,
:mod:`.tiny_tokenizers` and :mod:`.tiny` (``make_tiny_vla`` and its CLI; not
imported here so that ``python -m rlinf.embodied.models.vla.tiny`` runs cleanly).
"""

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - the dev environment has it
    raise ImportError(
        "the VLA policies (pi0, openvla) need transformers, tokenizers, "
        "safetensors and peft: install the extra with `pip install 'rlinf-embodied[vla]'`"
    ) from exc

from rlinf.embodied.models.vla.lora import apply_lora, count_parameters

__all__ = ["apply_lora", "count_parameters"]
