"""The math verifier: a table of (response, reference, expected), plus extraction rules."""

from __future__ import annotations

import pytest

from rlinf.reasoning.reward import (
    extract_boxed_answer,
    is_equiv,
    math_verifier,
    normalize_answer,
    reference_answer,
    verify,
)

DEEP = 3000
PMAT = r"\begin{pmatrix}1&2\\3&4\end{pmatrix}"

# (id, response, reference, expected)
CASES: list[tuple[str, str, str, bool]] = [
    # fractions
    ("frac-vs-decimal", r"\boxed{\frac{1}{2}}", "0.5", True),
    ("dfrac-vs-short-frac", r"\boxed{\dfrac{1}{2}}", r"\frac12", True),
    ("tfrac-vs-slash", r"\boxed{\tfrac{3}{4}}", "3/4", True),
    ("slash-vs-frac", r"\boxed{1/3}", r"\frac{1}{3}", True),
    ("unreduced-frac", r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", True),
    ("negative-frac", r"\boxed{-\frac{3}{2}}", "-1.5", True),
    ("frac-vs-rounded-decimal", r"\boxed{\frac{1}{3}}", "0.33", False),
    # decimals and integers
    ("trailing-zeros", r"\boxed{0.50}", ".5", True),
    ("two-point-zero", r"\boxed{2.0}", "2", True),
    ("thousands-separator", r"\boxed{1,000}", "1000", True),
    ("within-tolerance", r"\boxed{1.0000000001}", "1", True),
    ("outside-tolerance", r"\boxed{1.001}", "1", False),
    ("integers-exact", r"\boxed{1000001}", "1000000", False),
    ("wrong-integer", r"\boxed{41}", "42", False),
    # percentages: a percent sign may be dropped or mean /100; no sign means the number
    ("percent-vs-fraction", r"\boxed{50\%}", "0.5", True),
    ("percent-vs-number", r"\boxed{50\%}", "50", True),
    ("number-vs-fraction-no-percent", r"\boxed{50}", "0.5", False),
    ("decimal-percent", r"\boxed{12.5\%}", r"\frac{1}{8}", True),
    # intervals and tuples
    ("interval-same", r"\boxed{(1,2]}", "(1,2]", True),
    ("interval-other-bracket", r"\boxed{(1, 2]}", "[1,2]", False),
    ("interval-infinity", r"\boxed{(-\infty, 3)}", r"(-\infty,3)", True),
    ("interval-frac-endpoint", r"\boxed{[0, \frac{1}{2})}", "[0,0.5)", True),
    ("interval-union", r"\boxed{(1,2) \cup (3,4)}", r"(1,2)\cup(3,4)", True),
    ("tuple-elementwise", r"\boxed{(\frac{1}{2}, 3)}", "(0.5,3)", True),
    ("tuple-order-matters", r"\boxed{(3, 1)}", "(1,3)", False),
    # equations
    ("assignment-vs-value", r"\boxed{x=3}", "3", True),
    ("line-vs-expression", r"\boxed{y = 2x + 1}", "2x+1", True),
    ("assignment-wrong-value", r"\boxed{x=4}", "3", False),
    ("symbolic-expansion", r"\boxed{x^2+2x+1}", "(x+1)^2", True),
    # matrices
    ("bmatrix-vs-pmatrix", r"\boxed{\begin{bmatrix}1 & 2 \\ 3 & 4\end{bmatrix}}", PMAT, True),
    (
        "matrix-cells-numeric",
        r"\boxed{\begin{pmatrix}0.5&2\\3&4\end{pmatrix}}",
        r"\begin{pmatrix}\frac{1}{2}&2\\3&4\end{pmatrix}",
        True,
    ),
    ("matrix-wrong-cell", r"\boxed{\begin{pmatrix}1&2\\3&5\end{pmatrix}}", PMAT, False),
    ("matrix-wrong-shape", r"\boxed{\begin{pmatrix}1&2&3&4\end{pmatrix}}", PMAT, False),
    # units and decorations
    ("text-unit", r"\boxed{10 \text{ cm}}", "10", True),
    ("squared-unit", r"\boxed{10\text{ cm}^2}", "10", True),
    ("bare-unit-word", r"\boxed{10 meters}", "10", True),
    ("degrees", r"\boxed{30^\circ}", "30", True),
    ("dollars", r"\boxed{\$5.00}", "5", True),
    ("left-right", r"\boxed{\left( 1, 2 \right)}", "(1,2)", True),
    # text answers
    ("text-yes", r"\boxed{\text{yes}}", "yes", True),
    ("text-case", r"\boxed{\text{Yes}}", "yes", True),
    ("text-wrong", r"\boxed{\text{no}}", "yes", False),
    ("choice-letter", r"\boxed{(B)}", "B", True),
    ("choice-in-text", r"\boxed{\text{(C)}}", "C", True),
    # multiple boxes: the last one wins
    ("last-box-wins", r"First \boxed{1}, then corrected: \boxed{2}", "2", True),
    ("earlier-box-ignored", r"First \boxed{1}, then corrected: \boxed{2}", "1", False),
    ("fbox", r"so \fbox{7}", "7", True),
    ("boxed-without-braces", r"hence $\boxed 7$.", "7", True),
    # no box: phrase, then last number
    ("answer-is-phrase", "The answer is 42.", "42", True),
    (
        "minerva-phrase",
        r"Final Answer: The final answer is $\frac{3}{4}$. I hope it is correct.",
        "0.75",
        True,
    ),
    ("last-number", "so we have 7 apples left", "7", True),
    ("last-number-wrong", "between 3 and 5 apples", "3", False),
    ("nothing-to-extract", "I cannot solve this.", "3", False),
    # malformed
    ("unclosed-box", r"\boxed{12", "12", False),
    ("unclosed-frac-box", r"\boxed{\frac{1}{2}", r"\frac{1}{2}", False),
    ("extra-closing-brace", r"\boxed{5}}", "5", True),
    ("empty-box", r"\boxed{}", "0", False),
    # symbolic
    ("sqrt-simplify", r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    ("commuted-product", r"\boxed{\pi r^2}", r"r^2\pi", True),
    ("set-order", r"\boxed{\{1,2\}}", r"\{2,1\}", True),
    ("infinity-word", r"\boxed{\infty}", "infinity", True),
    ("boxed-reference", r"\boxed{5}", r"\boxed{5}", True),
    # adversarial: must answer quickly, without evaluating the monsters
    ("deep-nesting", r"\boxed{" + "{" * DEEP + "1" + "}" * DEEP + "}", "1", False),
    ("shallow-nesting", r"\boxed{" + "{" * 20 + "1" + "}" * 20 + "}", "1", True),
    ("power-tower", r"\boxed{10^{10^{10}}}", "10", False),
    ("power-tower-same-string", r"\boxed{10^{10^{10}}}", r"10^{10^{10}}", True),
    ("huge-exponent", r"\boxed{2^{100000000}}", "2", False),
    ("huge-factorial", r"\boxed{100000000!}", "1", False),
    ("many-unclosed-boxes", r"\boxed{" * 5000, "1", False),
    ("long-response", "word " * 50_000 + r"\boxed{1}", "1", True),
]


# The adversarial rows of CASES: answered by the linear steps, never by sympy.
ADVERSARIAL_IDS = {
    "deep-nesting",
    "shallow-nesting",
    "power-tower",
    "power-tower-same-string",
    "huge-exponent",
    "huge-factorial",
    "many-unclosed-boxes",
    "long-response",
}


@pytest.fixture
def symbolic_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Records every (pred, ref) pair that reaches the symbolic (sympy) step."""
    calls: list[tuple[str, str]] = []
    real = math_verifier._symbolic_equal

    def spy(pred: str, ref: str) -> bool:
        calls.append((pred, ref))
        return real(pred, ref)

    monkeypatch.setattr(math_verifier, "_symbolic_equal", spy)
    return calls


@pytest.mark.parametrize(
    ("case_id", "response", "reference", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_verify_table(
    case_id: str,
    response: str,
    reference: str,
    expected: bool,
    symbolic_calls: list[tuple[str, str]],
) -> None:
    assert verify(response, [reference]) is expected
    if case_id in ADVERSARIAL_IDS:
        # Quick because the monsters never reach sympy (every other step is linear).
        assert symbolic_calls == []


def test_table_is_big_and_ids_unique() -> None:
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)
    assert ADVERSARIAL_IDS.issubset(c[0] for c in CASES)


ADVERSARIAL = [
    r"\boxed{10^{10^{10}}}",
    r"\boxed{10^{10^{10^{10}}}}",
    r"\boxed{9^{9^{9}}}",
    r"\boxed{2^{100000000}}",
    r"\boxed{10**10**10}",
    r"\boxed{(10^{8})!}",
    r"\boxed{\binom{1000000000}{500000000}}",
    r"\boxed{" + "{" * DEEP + "1" + "}" * DEEP + "}",
    r"\boxed{" + r"\frac{" * 200 + "1" + "}{2}" * 200 + "}",
    r"\boxed{" * 5000,
    "(" * 10_000 + "1" + ")" * 10_000,
]


@pytest.mark.parametrize("response", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_are_fast_in_process(
    response: str, symbolic_calls: list[tuple[str, str]]
) -> None:
    assert verify(response, ["3"]) is False
    # Fast because the guard keeps them away from sympy: the only step that is
    # not linear in the input (see the math_verifier docstring).
    assert symbolic_calls == []


def test_any_reference_matches() -> None:
    assert verify(r"\boxed{9}", ["nine?", "10", "9"])
    assert not verify(r"\boxed{9}", ["8", "10"])
    assert not verify(r"\boxed{9}", [])
    with pytest.raises(TypeError, match="list of strings"):
        verify(r"\boxed{9}", "9")


def test_extract_boxed_answer() -> None:
    assert extract_boxed_answer(r"a \boxed{\frac{1}{2}} b") == r"\frac{1}{2}"
    assert extract_boxed_answer(r"\boxed{\{1,2\}}") == r"\{1,2\}"  # escaped braces
    assert extract_boxed_answer(r"\boxed{a} \boxed{b}") == "b"
    assert extract_boxed_answer(r"\boxed{\boxed{3}}") == "3"
    assert extract_boxed_answer(r"\boxed{1} then \boxed{2") is None  # the last box is unfinished
    assert extract_boxed_answer("The answer is 3.5.") == "3.5"
    assert extract_boxed_answer("the answer is: $x+1$ because") == "x+1"
    assert extract_boxed_answer("we get 3 and then 1,234.5") == "1,234.5"
    assert extract_boxed_answer("we get 3", use_last_number=False) is None
    assert extract_boxed_answer("no digits") is None
    # Linear even on a pathological line: 2 MB of spaces take milliseconds, while
    # a quadratic scan of them would run far past the suite's timeout (a hang).
    assert extract_boxed_answer("The answer is" + " " * 2_000_000 + "x") == "x"


def test_reference_answer() -> None:
    assert reference_answer(r"\boxed{5}") == "5"
    assert reference_answer(" 1,2 ") == "1,2"  # never a "last number"


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        (r"$\dfrac{1}{2}$.", r"\frac{1}{2}"),
        (r"\tfrac12", r"\frac{1}{2}"),
        (r"\frac1{2}", r"\frac{1}{2}"),
        ("3/4", r"\frac{3}{4}"),
        ("2.50", "2.5"),
        (".5", "0.5"),
        ("1,000", "1000"),
        (r"1{,}000", "1000"),
        (r"50\%", "50%"),
        (r"\pi r^2", r"\pi r^2"),
        ("five", "5"),
        (r"\text{ Five }", "5"),
        ("{{7}}", "7"),
        (r"\$ 5 \,", "5"),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


# Rules our normaliser had before math-verify's own normalisation took them over: the
# same answers, checked end to end (equal to the first reference, not to the second).
@pytest.mark.parametrize(
    ("answer", "reference", "other"),
    [
        (r"$x = \dfrac12$.", r"\frac{1}{2}", "2"),
        (r"\left[ 1, 2 \right)", "[1,2)", "[1,2]"),
        (r"10\text{ cm}", "10", "11"),
        (r"\text{ yes }", "yes", "no"),
        (r"\sqrt2", r"\sqrt{2}", "2"),
        (r"x \leq 3", r"x\le3", r"x\ge3"),
        (r"\begin{bmatrix}1\\2\end{bmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", "(1,2)"),
        ("10 square feet", "10", "100"),
        ("5 m", "5", "6"),
        (r"x \in (1, 2)", "(1,2)", "[1,2]"),
    ],
)
def test_normalisation_left_to_math_verify(answer: str, reference: str, other: str) -> None:
    assert verify(rf"\boxed{{{answer}}}", [reference])
    assert not verify(rf"\boxed{{{answer}}}", [other])
    assert is_equiv(answer, reference)


def test_is_equiv_tolerance_and_none() -> None:
    assert is_equiv("1.001", "1", tolerance=1e-2)
    assert not is_equiv("1.001", "1")
    assert is_equiv("0.0000001", "0")  # absolute below magnitude 1
    assert not is_equiv(None, "1")
    assert not is_equiv("", "")
