"""``derive_seed``: one seed per random stream, derived from the run seed and the stream's name.

Every seeded stream of both stacks (a rollout rank's sampling at a step, an
actor's minibatch shuffle at an epoch, ...) takes ``derive_seed(run_seed,
*what_identifies_it)``: streams never collide by arithmetic accident (as
``seed * A + step * B + rank`` can) and are the same in every process, so a
resumed run draws what the uninterrupted one would have.

Example:
    >>> derive_seed(1, "rollout", 3) == derive_seed(1, "rollout", 3)
    True
"""

from __future__ import annotations

import hashlib

__all__ = ["derive_seed"]


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from a tuple of ints and strings (stable across processes and runs).

    Args:
        *parts: What identifies the stream: the run seed first, then e.g. a name,
            the step, the rank.

    Returns:
        A seed in ``[0, 2**63)``; take ``% 2**31`` where an API wants 32 bits.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
