"""Vision-language-action policies: ``token_vla`` (OpenVLA-OFT style) and ``flow_vla`` (pi0 style).

Importing this package imports ``transformers`` and registers both model
families with ``AutoConfig``/``AutoModel`` (model types ``rlinf_token_vla`` and
``rlinf_flow_vla``), so their directories load without ``trust_remote_code``.
:mod:`rlinf.embodied.models` itself never imports it; the policy registry
imports :mod:`.policy` the first time ``token_vla`` or ``flow_vla`` is built.

Modules: :mod:`.configuration` (HF configs), :mod:`.backbones` (SigLIP, Llama,
projector, value MLP, masks), :mod:`.preprocessing`, :mod:`.instructions`,
:mod:`.statistics`, :mod:`.action_bins` + :mod:`.token_sampling` +
:mod:`.modeling_token` (token family), :mod:`.flow_sampling` +
:mod:`.modeling_flow` (flow family), :mod:`.lora` (PEFT adapters, ``actor.model.lora``),
:mod:`.policy` (``BasePolicy`` wrappers) and
:mod:`.tiny` (``make_tiny_vla`` and its CLI; not imported here so that
``python -m rlinf.embodied.models.vla.tiny`` runs cleanly).
"""

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - the dev environment has it
    raise ImportError(
        "the VLA policies (token_vla, flow_vla) need transformers, tokenizers, "
        "safetensors and peft: install the extra with `pip install 'rlinf-embodied[vla]'`"
    ) from exc

from rlinf.embodied.models.vla.configuration import FlowVLAConfig, TokenVLAConfig
from rlinf.embodied.models.vla.lora import apply_lora, count_parameters
from rlinf.embodied.models.vla.modeling_flow import FlowVLAModel, flow_matching_loss
from rlinf.embodied.models.vla.modeling_token import TokenVLAModel
from rlinf.embodied.models.vla.policy import FlowVLAPolicy, TokenVLAPolicy

__all__ = [
    "FlowVLAConfig",
    "FlowVLAModel",
    "FlowVLAPolicy",
    "TokenVLAConfig",
    "TokenVLAModel",
    "TokenVLAPolicy",
    "apply_lora",
    "count_parameters",
    "flow_matching_loss",
]
