"""Model helpers shared by the rollout engines and the actor.

* :mod:`rlinf.reasoning.models.logprobs`: the single definition of a token's
  log-probability (``log_softmax(logits / temperature)`` in float32), used both
  at generation time and by the actor's recomputation (the entropy is
  :func:`rlinf.core.algorithms.entropy_from_logits`).
* :mod:`rlinf.reasoning.models.loading`: loading a local Hugging Face causal LM
  with errors that name the path, dtype/device parsing, and the
  parameter names a checkpoint directory holds.
"""

from rlinf.reasoning.models.loading import (
    checkpoint_weight_names,
    load_causal_lm,
    resolve_device,
    resolve_dtype,
)
from rlinf.reasoning.models.logprobs import (
    compute_token_logprobs,
    compute_token_logprobs_and_entropy,
    position_ids_from_attention_mask,
    token_logprobs_from_logits,
)

__all__ = [
    "checkpoint_weight_names",
    "compute_token_logprobs",
    "compute_token_logprobs_and_entropy",
    "load_causal_lm",
    "position_ids_from_attention_mask",
    "resolve_device",
    "resolve_dtype",
    "token_logprobs_from_logits",
]
