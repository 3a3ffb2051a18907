"""Megatron-core GPT models built from Hugging Face checkpoints (the ``megatron`` extra).

Needs ``rlinf-reasoning[megatron]`` (megatron-core 0.16.1; apex and
transformer-engine are optional: without transformer-engine, or without
CUDA, Megatron's local layer spec is used; the transformer-engine spec is
unchecked). Importing this
package imports nothing heavy; its modules import megatron-core.

* :mod:`~rlinf.reasoning.megatron.cpu_shims`: the patches that run megatron-core
  on the CPU (gloo), applied only where there is no CUDA.
* :mod:`~rlinf.reasoning.megatron.hf_config`: Qwen2 ``config.json`` -> Megatron
  config and layer spec; unsupported keys are refused by name.
* :mod:`~rlinf.reasoning.megatron.hf_layout`: Megatron <-> HF parameter names and
  their tensor-parallel layouts.
* :mod:`~rlinf.reasoning.megatron.hf_load`: safetensors straight into this rank's shards.
* :mod:`~rlinf.reasoning.megatron.hf_export`: TP all-gather by bucket, HF names
  (weight sync, tests).
* :mod:`~rlinf.reasoning.megatron.model`: process groups, and this rank's model.
* :mod:`~rlinf.reasoning.megatron.forward`: padded batches and vocab-parallel
  token logprobs (the convention of :mod:`rlinf.reasoning.models.logprobs`).
* :mod:`~rlinf.reasoning.megatron.dist_optimizer`: Megatron's DDP wrapper and
  distributed optimizer, the actor's training path on GPUs.
"""
