"""Imported by the ``forkserver`` server process only: load and warm the verifier once.

Workers forked from that server then start with sympy, math-verify and their parser
caches ready, so replacing a killed worker takes milliseconds instead of seconds.
"""

from rlinf.reasoning.reward.math_verifier import verify

verify(r"\boxed{x+\frac{1}{2}}", ["0.5+x"])
