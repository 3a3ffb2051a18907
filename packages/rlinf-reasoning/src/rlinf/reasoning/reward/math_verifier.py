r"""Math answer checking: our extraction and fast checks, then math-verify's symbolic step.

Ours in front of math-verify: alone it fails our table (last box, percent, ...) and hangs on some.

The pipeline for one response is::

    extract_boxed_answer(response)  ->  normalize_answer(...)  ->  is_equiv(pred, ref)

and :func:`verify` accepts a response when it matches *any* of its references.

What is ours and why: run alone (``math_verify.parse`` on the response and on ``$ref$``,
then ``math_verify.verify``) on the table of ``tests/test_reward_verifier.py``,
`math-verify <https://github.com/huggingface/Math-Verify>`_ 0.9 gets these cases wrong,
and only the code for them is kept here; everything else (units, ``\text{}``, ``x=3``,
``\dfrac``, matrices, tuples, intervals, sets, symbolic equality) is math-verify's:

* ``last-box-wins`` (it reads every box as a set), ``fbox``, ``unclosed-frac-box``: our
  extraction (:func:`extract_boxed_answer`);
* ``percent-vs-fraction``, ``percent-vs-number``, ``decimal-percent`` (it does not parse
  ``\boxed{50\%}``, and reads ``$50\%$`` as ``50`` only), ``within-tolerance``
  (``1.0000000001`` vs ``1``) and the number word ``five``: our numeric step;
* ``deep-nesting``, ``shallow-nesting``, ``power-tower``, ``huge-factorial`` and the
  adversarial inputs: its latex-to-sympy conversion runs for minutes (or forever) on
  them; our guard keeps them away from it, and our extraction is string-only, since
  ``math_verify.parse`` converts every candidate to sympy while it extracts.

Extraction (:func:`extract_boxed_answer`), in order:

1. the content of the **last** ``\boxed{...}`` or ``\fbox{...}``, with brace matching
   (``\boxed 5`` without braces also works, up to ``$`` or the end of the line). When
   that last box is never closed (a truncated response) the result is ``None``: the
   response did not finish its answer, and no fallback is tried;
2. otherwise the text after the last "final answer is" / "the answer is" /
   "answer:" (up to the end of its sentence; a ``$...$`` right after it wins), which
   also covers Minerva's "Final Answer: The final answer is $X$. I hope it is correct.";
3. otherwise (``use_last_number=True``, the default) the last number in the text
   (``-3``, ``1,000``, ``2.5``, ``3/4``);
4. otherwise ``None``, which is never correct.

A reference is read the same way when it holds a ``\boxed{}``; otherwise the whole
reference string is the answer (never a "last number").

Normalisation (:func:`normalize_answer`) only prepares the two fast steps below: it
drops ``$``, ``\(``/``\)``, latex spacing, whitespace (a space that ends a command name,
as in ``\pi r``, is kept), a trailing "." and redundant outer braces, and rewrites
``\dfrac``/``\tfrac`` to ``\frac``, ``\%`` to ``%``, ``1,000`` to ``1000``, ``.5`` to
``0.5``, ``2.50`` to ``2.5``, ``a/b`` (integers) and ``\frac12`` to ``\frac{a}{b}``, and the
number words "zero" to "twenty" (also in a ``\text{}``) to digits.

Equivalence (:func:`is_equiv`), in order:

1. equality of the normalised strings;
2. numbers: exact for two integers written without a decimal point; otherwise
   ``|a - b| <= tolerance * max(1, |a|, |b|)`` (relative, absolute near zero). A number
   with a percent sign may be read as itself or divided by 100, so ``50\%`` equals both
   ``50`` and ``0.5``; without a percent sign ``50`` does not equal ``0.5``;
3. math-verify on the two extracted answers (its own normalisation, then sympy).

Adversarial input: every step is linear in the input except step 3, which is skipped
(the pair is "not equal" unless an earlier step matched) for answers over
400 characters, nested deeper than 16 levels, with a numeric power tower
(``10^{10^{10}}``), a numeric exponent over 10,000, or a factorial or binomial of a
large number. These guards are heuristics;
:class:`~rlinf.reasoning.reward.MathRewardScorer` adds a hard timeout in a separate
process. Answers over 1,000 characters are compared as whitespace-stripped strings only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "extract_boxed_answer",
    "is_equiv",
    "normalize_answer",
    "reference_answer",
    "verify",
]

_MAX_ANSWER_CHARS = 1000
"""Longer answers are compared as stripped strings only (no normalisation, no math)."""

_MAX_SYMBOLIC_CHARS = 400
"""Longer answers skip the symbolic (math-verify) step."""

_MAX_SYMBOLIC_DEPTH = 16
"""Answers nested deeper (braces, brackets, parentheses) skip the symbolic step."""

_MAX_NUMERIC_EXPONENT = 10_000
"""A numeric exponent above this (``2^{100000}``) makes the symbolic step skip the answer."""

_MAX_DECIMAL_EXPONENT = 400  # 1e400 or 10^{400} is still parsed as an exact number

# ---------------------------------------------------------------------------
# extraction

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)
_PHRASE_RE = re.compile(
    r"final answer is|the answer is|final answer\s*:|answer\s*:|答案是", re.IGNORECASE
)
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - keep the last match
        pass
    return last


def _match_brace(text: str, open_idx: int) -> int | None:
    r"""Index of the ``}`` closing the ``{`` at ``open_idx``, or ``None`` when unbalanced.

    Escaped braces (``\{``, ``\}``) and ``\\`` are skipped; linear in the text.
    """
    depth = 0
    for tok in _BRACE_TOKEN_RE.finditer(text, open_idx):
        t = tok.group()
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if depth == 0:
                return tok.start()
    return None


def _box_content(text: str, start: int) -> str | None:
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _match_brace(text, i)
        if end is None:
            return None
        content = text[i + 1 : end].strip()
        return content or None
    # "\boxed 5$": up to a dollar sign or the end of the line.
    m = re.match(r"[^$\n]*", text[i:])
    content = m.group().strip().rstrip(".") if m else ""
    return content or None


def _phrase_answer(text: str) -> str | None:
    last = _last_match(_PHRASE_RE, text)
    if last is None:
        return None
    line_end = text.find("\n", last.end())
    rest = text[last.end() : line_end if line_end >= 0 else len(text)].strip(" \t:")
    if rest.startswith("$"):
        close = rest.find("$", 1)
        inner = rest[1:close] if close > 0 else rest[1:]
        inner = inner.strip().strip("$").strip()
        return inner or None
    # Up to the end of the sentence: a period followed by a space or the end.
    end = re.search(r"\.(?=\s|$)", rest)
    answer = (rest[: end.start()] if end else rest).strip().strip("$").strip()
    return answer or None


def extract_boxed_answer(text: str, *, use_last_number: bool = True) -> str | None:
    r"""Extract the final answer from a model response.

    Args:
        text: The response.
        use_last_number: Fall back to the last number in the text when there is no box
            and no "the answer is" phrase.

    Returns:
        The content of the last ``\boxed{}``/``\fbox{}``; else the text after the last
        "final answer is" / "the answer is" / "answer:" phrase; else (when
        ``use_last_number``) the last number; else ``None``. ``None`` also when the last
        box is never closed (see the module docstring).

    Example:
        >>> extract_boxed_answer(r"so \boxed{1} or rather \boxed{\frac{1}{2}}.")
        '\\frac{1}{2}'
        >>> extract_boxed_answer("The answer is 42.")
        '42'
    """
    last_box = _last_match(_BOX_RE, text)
    if last_box is not None:
        return _box_content(text, last_box.end())
    phrase = _phrase_answer(text)
    if phrase is not None:
        return phrase
    last_num = _last_match(_NUMBER_RE, text) if use_last_number else None
    return last_num.group() if last_num is not None else None


def reference_answer(reference: str) -> str:
    r"""The answer held by a reference: the last ``\boxed{}`` content if any, else the string.

    Args:
        reference: A gold answer such as ``"\\frac{1}{2}"`` or ``"\\boxed{\\frac{1}{2}}"``.

    Returns:
        The answer to compare against (the stripped reference when it has no box).
    """
    if _BOX_RE.search(reference):
        boxed = extract_boxed_answer(reference, use_last_number=False)
        if boxed is not None:
            return boxed
    return reference.strip()


# ---------------------------------------------------------------------------
# normalisation (for the string and numeric steps only; math-verify normalises its input)

_SPACING_RE = re.compile(r"\\[!,;:> ]|\\q?quad(?![A-Za-z])|\\displaystyle(?![A-Za-z])|~")
_NUMBER_WORDS = {
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "eleven": "11",
    "twelve": "12",
    "thirteen": "13",
    "fourteen": "14",
    "fifteen": "15",
    "sixteen": "16",
    "seventeen": "17",
    "eighteen": "18",
    "nineteen": "19",
    "twenty": "20",
}


def _strip_outer_braces(s: str) -> str:
    """Remove braces that wrap the whole string (``{{5}}`` -> ``5``)."""
    while len(s) >= 2 and s[0] == "{" and _match_brace(s, 0) == len(s) - 1:
        s = s[1:-1].strip()
    return s


def _collapse_spaces(s: str) -> str:
    r"""Drop whitespace, keeping one space where it ends a command name (``\pi r``)."""
    s = re.sub(r"\s+", " ", s)
    s = re.sub(r"(\\[A-Za-z]+) (?=[A-Za-z])", "\\1\x00", s)
    return s.replace(" ", "").replace("\x00", " ")


def _normalize_numbers(s: str) -> str:
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?", s):
        s = s.replace(",", "")
    s = s.replace("{,}", "")
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)

    def _trim(m: re.Match[str]) -> str:
        frac = m.group(2).rstrip("0")
        return m.group(1) + ("." + frac if frac else "")

    s = re.sub(r"(?<![\d.])(\d+)\.(\d*)(?![\d.])", _trim, s)
    m = re.fullmatch(r"([-+]?)(\d+)/(\d+)", s)
    if m:
        s = f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    return _NUMBER_WORDS.get(s.lower(), s)


_WRAPPED_TEXT_RE = re.compile(r"\\(?:text|textrm|mbox|mathrm)\{([^{}]*)\}")


def normalize_answer(answer: str) -> str:
    r"""Normalise an answer for the string and numeric steps (see the module docstring).

    Args:
        answer: An extracted answer, e.g. ``"$\\dfrac{1}{2}$."``.

    Returns:
        The canonical form, e.g. ``"\\frac{1}{2}"``. Answers longer than
        1,000 characters are only stripped of surrounding whitespace.

    Example:
        >>> normalize_answer(r"$\dfrac{1}{2}$.")
        '\\frac{1}{2}'
    """
    s = answer.strip()
    if len(s) > _MAX_ANSWER_CHARS:
        return s
    # Latex spacing (\, \! \quad ...), keeping "\\" row breaks intact.
    s = _SPACING_RE.sub(" ", s.replace("\\\\", "\x01")).replace("\x01", "\\\\")
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\[()\[\]]", "", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = s.replace("\\%", "%")
    s = _collapse_spaces(s.strip())
    while s.endswith("."):
        s = s[:-1]
    s = _strip_outer_braces(s)
    # "\frac12" for the numeric step ("50\%" vs "\frac12": math-verify reads "50\%" as
    # 50 only); "\text{five}" for the number words.
    s = re.sub(r"\\frac(?![A-Za-z{])(\d)", r"\\frac{\1}", s)
    s = re.sub(r"(\\frac\{[^{}]*\})(\d)", r"\1{\2}", s)
    m = _WRAPPED_TEXT_RE.fullmatch(s)
    return _normalize_numbers(m.group(1).strip() if m else s)


# ---------------------------------------------------------------------------
# equivalence


@dataclass(frozen=True)
class _Number:
    value: Fraction
    integer_literal: bool  # written as an integer: compared exactly
    percent: bool  # carried a percent sign: may also mean value / 100


_DECIMAL = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN_NUMBER_RE = re.compile(rf"({_DECIMAL})(?:[eE]([-+]?\d+))?")
_FRAC_NUMBER_RE = re.compile(rf"([-+]?)\\frac\{{({_DECIMAL})\}}\{{({_DECIMAL})\}}")
_POW10_NUMBER_RE = re.compile(
    rf"(?:({_DECIMAL})(?:\\times|\\cdot|\*))?10\^(?:\{{([-+]?\d+)\}}|(\d))"
)


def _parse_number(s: str) -> _Number | None:
    r"""Read a plain number, a numeric ``\frac``, or ``a\times10^{b}``; else ``None``."""
    percent = s.endswith("%")
    body = s[:-1] if percent else s
    if not body or len(body) > 200:
        return None
    try:
        m = _PLAIN_NUMBER_RE.fullmatch(body)
        if m:
            exponent = int(m.group(2)) if m.group(2) else 0
            if abs(exponent) > _MAX_DECIMAL_EXPONENT:
                return None
            value = Fraction(m.group(1)) * Fraction(10) ** exponent
            literal = m.group(2) is None and "." not in m.group(1) and not percent
            return _Number(value, literal, percent)
        m = _FRAC_NUMBER_RE.fullmatch(body)
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return _Number(-value if m.group(1) == "-" else value, False, percent)
        m = _POW10_NUMBER_RE.fullmatch(body)
        if m:
            exponent = int(m.group(2) or m.group(3))
            if abs(exponent) > _MAX_DECIMAL_EXPONENT:
                return None
            mantissa = Fraction(m.group(1)) if m.group(1) else Fraction(1)
            return _Number(mantissa * Fraction(10) ** exponent, False, percent)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _numbers_equal(a: _Number, b: _Number, tolerance: float) -> bool:
    if a.integer_literal and b.integer_literal:
        return a.value == b.value
    tol = Fraction(tolerance)
    values_a = [a.value, a.value / 100] if a.percent else [a.value]
    values_b = [b.value, b.value / 100] if b.percent else [b.value]
    return any(
        abs(x - y) <= tol * max(Fraction(1), abs(x), abs(y)) for x in values_a for y in values_b
    )


def _max_depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


def _exponent_at(s: str, i: int) -> tuple[str, int]:
    """The exponent that starts at ``s[i]`` (after ``^``) and the index after it."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] == "{":
        close = _match_brace(s, i)
        if close is None:
            return s[i + 1 :], len(s)
        return s[i + 1 : close], close + 1
    m = re.compile(r"\\[A-Za-z]+|[-+]?\d+(?:\.\d+)?|.").match(s, i)
    if m is None:
        return "", i
    return m.group(), m.end()


_NUMERIC_OPERATORS_RE = re.compile(r"\\(?:cdot|times|frac|left|right|div)(?![A-Za-z])")


def _symbolic_safe(s: str) -> bool:
    """Whether sympy may see ``s`` without risk of a huge evaluation (a heuristic)."""
    if len(s) > _MAX_SYMBOLIC_CHARS or _max_depth(s) > _MAX_SYMBOLIC_DEPTH:
        return False
    for m in re.finditer(r"\^|\*\*", s):
        exponent, after = _exponent_at(s, m.end())
        if re.search(r"[A-Za-z]", _NUMERIC_OPERATORS_RE.sub("", exponent)):
            continue  # a symbolic exponent (x^{n+1}, e^{-x^2}) is not evaluated to a number
        if "^" in exponent or "**" in exponent or re.match(r"\s*(?:\^|\*\*)", s[after:]):
            return False  # a numeric power tower: 10^{10^{10}}
        product = 1
        for digits in re.findall(r"\d+", exponent):
            product *= max(int(digits), 1)
            if product > _MAX_NUMERIC_EXPONENT:
                return False
    for m in re.finditer(r"(\d+)\s*!", s):
        if len(m.group(1)) > 4 or int(m.group(1)) > 1000:
            return False
    if re.search(r"[)}\]]\s*!", s):
        return False
    big_binomial = re.search(r"binom|choose", s) is not None and any(
        len(d) > 4 for d in re.findall(r"\d+", s)
    )
    return not big_binomial


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its signal timeout is off; ours is the worker's."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_math_verify_ready = False


def _ensure_math_verify() -> None:
    global _math_verify_ready
    if not _math_verify_ready:
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
        _math_verify_ready = True


def _symbolic_equal(pred: str, ref: str) -> bool:
    """math-verify on ``$pred$`` and ``$ref$`` (see :func:`_for_latex`); no signal timeouts."""
    from math_verify import (  # type: ignore[import-untyped]
        LatexExtractionConfig,
        parse,
    )
    from math_verify import verify as mv_verify

    _ensure_math_verify()
    try:
        config = [LatexExtractionConfig()]
        gold = parse(f"${ref}$", extraction_config=config, parsing_timeout=None)
        target = parse(f"${pred}$", extraction_config=config, parsing_timeout=None)
        if not gold or not target:
            return False
        return bool(mv_verify(gold, target, timeout_seconds=None))
    except Exception:  # a parser or sympy failure means "not shown equal"
        return False


def _for_latex(s: str) -> str:
    """The answer as math-verify's input: no ``$`` (we add our own) or final ".", ``%`` escaped."""
    s = s.replace("\\$", "").replace("$", "").strip().rstrip(".").rstrip()
    return re.sub(r"(?<!\\)%", r"\\%", s)


def _equiv(
    pred: str, pred_norm: str, ref: str, ref_norm: str, tolerance: float, guard: bool
) -> bool:
    if not pred_norm or not ref_norm:
        return False
    if pred_norm == ref_norm:
        return True
    if max(len(pred_norm), len(ref_norm)) > _MAX_ANSWER_CHARS:
        return False
    num_pred, num_ref = _parse_number(pred_norm), _parse_number(ref_norm)
    if num_pred is not None and num_ref is not None:
        return _numbers_equal(num_pred, num_ref, tolerance)
    a, b = _for_latex(pred), _for_latex(ref)
    if guard and not (_symbolic_safe(a) and _symbolic_safe(b)):
        return False
    return _symbolic_equal(a, b)


def is_equiv(pred: str | None, ref: str, tolerance: float = 1e-6, *, guard: bool = True) -> bool:
    r"""Whether two extracted answers are equal (see the module docstring for the steps).

    Args:
        pred: The predicted answer (already extracted, e.g. a box's content), or ``None``.
        ref: The reference answer (already extracted).
        tolerance: Relative tolerance of the numeric step (absolute below magnitude 1).
        guard: Skip the symbolic step for inputs that could make sympy run for a very
            long time or exhaust memory (a heuristic; see the module docstring). Turn it
            off only where a hard timeout protects the caller.

    Returns:
        ``True`` when the answers are shown equal; ``False`` otherwise, including when
        ``pred`` is ``None`` or empty.

    Example:
        >>> is_equiv(r"\dfrac{1}{2}", "0.5")
        True
        >>> is_equiv(r"50\%", "0.5")
        True
    """
    if pred is None:
        return False
    return _equiv(pred, normalize_answer(pred), ref, normalize_answer(ref), tolerance, guard)


def verify(
    response: str,
    references: Sequence[str],
    *,
    tolerance: float = 1e-6,
    use_last_number: bool = True,
    guard: bool = True,
) -> bool:
    r"""Whether a response's final answer matches any of the references.

    Runs in the calling thread, without a timeout of its own (the ``guard`` heuristics
    keep known-pathological inputs away from sympy); use
    :class:`~rlinf.reasoning.reward.MathRewardScorer` for a hard timeout.

    Args:
        response: The full model response.
        references: Gold answers, plain (``"\\frac{1}{2}"``) or boxed
            (``"\\boxed{\\frac{1}{2}}"``).
        tolerance: Relative tolerance of the numeric step.
        use_last_number: Let :func:`extract_boxed_answer` fall back to the last number.
        guard: See :func:`is_equiv`.

    Returns:
        ``True`` if the extracted answer is equivalent to at least one reference.

    Raises:
        TypeError: If ``references`` is a string instead of a list of strings.

    Example:
        >>> verify(r"... so the answer is \boxed{\frac{1}{2}}.", ["0.5"])
        True
    """
    if isinstance(references, str):
        raise TypeError("references must be a list of strings, not a string; wrap it: [reference]")
    pred = extract_boxed_answer(response, use_last_number=use_last_number)
    if pred is None:
        return False
    pred_norm = normalize_answer(pred)
    for reference in references:
        ref = reference_answer(reference)
        if _equiv(pred, pred_norm, ref, normalize_answer(ref), tolerance, guard):
            return True
    return False
