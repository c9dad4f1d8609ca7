"""kernels.testing.exercise, the notebooks' exercise check: a stub is 'not attempted yet', a right answer 'correct',
a wrong one fails with the checks' own message."""
import numpy as np
import pytest

from seqmix.kernels.testing import REFERENCE_BUDGET, check, exercise


def squares(x):
    raise NotImplementedError("Exercise: return x squared")


def checks_of(student):
    def checks():
        x = np.linspace(-2.0, 2.0, 9)
        check("squares", student(x), x * x, REFERENCE_BUDGET)
    return checks


def test_a_stub_is_not_attempted(capsys):
    assert exercise("Exercise 1", checks_of(squares)) is None
    assert capsys.readouterr().out == ("Exercise 1: not attempted yet (fill in the cell above, run it, then run this "
                                       "cell again)\n")


def test_a_right_answer_is_correct(capsys):
    assert exercise("Exercise 1", checks_of(lambda x: x ** 2)) is None
    assert capsys.readouterr().out.splitlines()[-1] == "Exercise 1: correct"


def test_a_wrong_answer_fails_with_the_checks_message():
    with pytest.raises(AssertionError, match="squares: relative RMS error"):
        exercise("Exercise 1", checks_of(lambda x: x ** 3))


def test_other_errors_are_not_taken_for_a_stub():
    """Only NotImplementedError means 'not attempted': a student's bug (here a TypeError) surfaces as itself."""
    with pytest.raises(TypeError):
        exercise("Exercise 1", checks_of(lambda x: x + "1"))
