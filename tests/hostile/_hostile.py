"""The hostile-input harness: every input is tried, classified and counted.

An input ends in one of five ways:

- **answered**: the call returned, and the test checked the result against an independent
  reference (a float64 computation, the object API, a hand-made expectation);
- **refused**: the call raised a bnnsfw error (``BNNSError``) whose message names the
  argument, the rule and the value (the project's template "``<where>`` must be ``<rule>``;
  got ``<value>``."), or, for the C-style API, returned Apple's failure value and logged
  such an error;
- **unclear**: anything else raised or logged (a bare ``ValueError``, ``AttributeError``,
  a message without the template) — a failure of the test;
- **wrong**: a result that disagrees with the reference, or an input accepted that should
  have been refused — a failure of the test;
- a **crash** or a **hang** ends the run (hangs are bounded by timeouts in the tests).

``TALLY`` counts them per family; ``conftest.py`` prints the table at the end of the run.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter, defaultdict
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, settings

from bnnsfw import BNNSError, FilterClosedError

#: The families of the issue, in report order, with the part of the surface each covers.
FAMILIES = {
    "c-memory": "C-style API: strides, sizes and buffers",
    "c-types": "C-style API: Apple's declared argument types",
    "scanner": "deprecation scanner and command line",
    "caches": "LSTM training caches",
    "threads": "threads: close() and thread limits",
    "errors": "object API: clear errors",
    "weights": "weight files",
    "numerics": "large finite values",
}

TALLY: defaultdict[str, Counter[str]] = defaultdict(Counter)

#: Settings of every hostile property: reproducible (derandomized), no example database,
#: no deadline (the first call of a compiled kernel takes longer).
HOSTILE = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.function_scoped_fixture])

_TEMPLATE = re.compile(r"^\S.*? must be .+; got .+\.$", re.S)


def is_clear(exc: BaseException) -> bool:
    """A bnnsfw error whose message names the argument, the rule and the value."""
    if isinstance(exc, FilterClosedError):
        return "after close()" in str(exc) and "create a new" in str(exc)
    return isinstance(exc, BNNSError) and _TEMPLATE.match(str(exc)) is not None


def count(family: str, outcome: str) -> None:
    assert family in FAMILIES, family
    TALLY[family]["tried"] += 1
    TALLY[family][outcome] += 1


def answered(family: str) -> None:
    """Count an input whose result the caller has checked against its reference."""
    count(family, "answered")


def wrong(family: str, what: str) -> AssertionError:
    count(family, "wrong")
    return AssertionError(f"[{family}] silent wrong answer: {what}")


def refused(family: str, call: Callable[..., Any], *args: Any, match: str | None = None,
            **kwargs: Any) -> BNNSError:
    """Run a call that must be refused with a clear error (whose message matches ``match``)."""
    try:
        result = call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - classifying every exception is the point
        _classify(family, exc, match)
        assert isinstance(exc, BNNSError)
        return exc
    raise wrong(family, f"accepted and returned {_short(result)}")


def attempt(family: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """Run a call that may be answered or refused: ``(True, result)`` for the caller to check
    (and count with :func:`answered` or :func:`wrong`), ``(False, error)`` when refused clearly."""
    try:
        return True, call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        _classify(family, exc, None)
        return False, exc


def _classify(family: str, exc: BaseException, match: str | None) -> None:
    if is_clear(exc) and (match is None or re.search(match, str(exc))):
        count(family, "refused")
        return
    count(family, "unclear")
    raise AssertionError(f"[{family}] unclear error: {type(exc).__name__}: {exc}") from exc


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) < 200 else text[:200] + "…"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def bnnsfw_log() -> Iterator[list[logging.LogRecord]]:
    """The error records the ``bnnsfw`` logger emits inside the block."""
    logger = logging.getLogger("bnnsfw")
    handler = _Records()
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


def c_call(family: str, call: Callable[..., Any], *args: Any, failure: Any = -1,
           match: str | None = None) -> tuple[bool, Any]:
    """Run a C-style entry point: ``(True, result)`` when it succeeded (for the caller to
    check), ``(False, error)`` when it returned ``failure`` having logged a clear error."""
    with bnnsfw_log() as records:
        result = call(*args)
    if result is failure or (failure == -1 and isinstance(result, int) and result == -1):
        errors = [getattr(r, "bnnsfw_error", None) for r in records]
        if not errors or errors[-1] is None:
            count(family, "unclear")
            raise AssertionError(f"[{family}] failed without a logged reason")
        _classify(family, errors[-1], match)
        return False, errors[-1]
    if records:
        count(family, "unclear")
        raise AssertionError(f"[{family}] succeeded but logged {records[-1].getMessage()}")
    return True, result


def c_refused(family: str, call: Callable[..., Any], *args: Any, failure: Any = -1,
              match: str | None = None) -> BNNSError:
    """A C-style call that must fail with a clear logged reason."""
    ok, value = c_call(family, call, *args, failure=failure, match=match)
    if ok:
        raise wrong(family, f"accepted and returned {_short(value)}")
    return value
