"""Math prompt data: the ``data`` config, the dataset, left-padded collation, the sampler.

Example::

    cfg = DataConfig(train_files=["train.jsonl"], max_prompt_length=512)
    ds = MathDataset.from_config(cfg, tokenizer)
    sampler = ResumableSampler(len(ds), shuffle=cfg.shuffle, seed=cfg.seed)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, collate_fn=ds.collate)
    ...
    checkpoint["sampler"] = sampler.state_dict()  # resume: sampler.load_state_dict(...)
"""

from rlinf.reasoning.data.config import DataConfig
from rlinf.reasoning.data.math_dataset import (
    DatasetError,
    MathBatch,
    MathDataset,
    MathItem,
    collate_left_padded,
)
from rlinf.reasoning.data.sampler import ResumableSampler

__all__ = [
    "DataConfig",
    "DatasetError",
    "MathBatch",
    "MathDataset",
    "MathItem",
    "ResumableSampler",
    "collate_left_padded",
]
