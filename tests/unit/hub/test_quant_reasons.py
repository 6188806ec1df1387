"""Why a quant is offered, in words that match the repository: levels that are not there are
not said not to fit."""

from __future__ import annotations

from runtime.hub.quants import recommend
from tests.unit.hub.test_quants import _e


def test_a_repository_without_the_usual_levels_says_so() -> None:
    best, why = recommend([_e("F32", True, 8), _e("F16", True, 4)], "Q4_K_M")
    assert best is not None and best.quant == "F16"
    assert why.startswith("this repository has none of the usual levels (Q8_0, Q6_K,")
    assert "F16 is the smallest that fits" in why and "none of the usual levels fits" not in why


def test_usual_levels_that_are_there_but_too_big_are_said_not_to_fit() -> None:
    best, why = recommend([_e("Q8_0", False, 8), _e("F16", True, 4)], "Q4_K_M")
    assert best is not None and best.quant == "F16"
    assert why == "none of the usual levels fits; F16 is the smallest that does"
