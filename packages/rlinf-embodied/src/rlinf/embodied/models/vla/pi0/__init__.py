"""``model_type: pi0``: RL on transformers' stock ``PI0ForConditionalGeneration``.

Modules: :mod:`.checkpoint` (transformers, lerobot and openpi layouts, lerobot
config translation), :mod:`.images` (resize-with-pad preprocessing),
:mod:`.normalization` (openpi ``norm_stats.json`` or ``dataset_statistics.json``),
:mod:`.prompts` (PaliGemma prompt and cache), :mod:`.sampling` (prefix KV cache,
samplers, re-scoring, flow-matching loss), :mod:`.policy` (the
:class:`~rlinf.embodied.models.base.BasePolicy`), :mod:`.tiny`
(``make_tiny_pi0``) and :mod:`.layout_list` (the full-size key list). Nothing is
imported here, so ``python -m rlinf.embodied.models.vla.pi0.layout_list`` runs cleanly.
"""
