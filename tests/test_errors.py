import pytest

import bnnsfw
from bnnsfw.errors import must_be


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (bnnsfw.InvalidParameterError, ValueError),
        (bnnsfw.ShapeError, ValueError),
        (bnnsfw.DTypeError, TypeError),
        (bnnsfw.FilterClosedError, ValueError),
        (bnnsfw.UnknownBackendError, ValueError),
        (bnnsfw.UnknownNameError, LookupError),
    ],
)
def test_every_error_is_a_bnns_error_and_a_builtin(cls, builtin):
    assert issubclass(cls, bnnsfw.BNNSError)
    with pytest.raises(builtin):
        raise cls("x")


def test_message_template_names_where_rule_and_value():
    assert must_be("NormalizationParameters.momentum", "in [0, 1]", 1.5) == (
        "NormalizationParameters.momentum must be in [0, 1]; got 1.5."
    )
