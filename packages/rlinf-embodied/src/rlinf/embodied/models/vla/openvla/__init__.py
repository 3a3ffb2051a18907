"""OpenVLA-format models (``model_type: openvla``): OpenVLA and OpenVLA-OFT.

OpenVLA decodes its action tokens autoregressively, OpenVLA-OFT in parallel.

A directory laid out like ``openvla/openvla-7b`` on the Hugging Face hub
(``config.json`` with ``model_type: openvla``, weights under the ``prismatic``
port's key names, a Llama 2 tokenizer, ``preprocessor_config.json``, action
statistics) loads through stock ``transformers`` classes plus the small timm-named
ViT of :mod:`.vision`; no ``trust_remote_code``.

Modules: :mod:`.configuration` (``OpenVLAConfig``, registered with ``AutoConfig``),
:mod:`.vision` (the DINOv2 + SigLIP featurizers under timm key names, and the
image processor), :mod:`.modeling` (``OpenVLAModel``, registered with ``AutoModel``),
:mod:`.action_tokenizer` (OpenVLA's bins and token ids), :mod:`.policy`
(``@register_policy("openvla")``) and :mod:`.tiny` (``make_tiny_openvla``; not
imported here).
"""

from rlinf.embodied.models.vla.openvla.action_tokenizer import OpenVLAActionTokenizer
from rlinf.embodied.models.vla.openvla.configuration import OpenVLAConfig
from rlinf.embodied.models.vla.openvla.modeling import OpenVLAModel

__all__ = ["OpenVLAActionTokenizer", "OpenVLAConfig", "OpenVLAModel"]
