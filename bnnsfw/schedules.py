"""Learning-rate schedules: step decay, cosine annealing, linear warm-up, and one after another.

A schedule drives one optimizer's ``learning_rate``. A training loop calls :meth:`~
LearningRateSchedule.step` once per epoch (or once per batch, as it chooses), after the
optimizer's steps of that epoch::

    optimizer = bnnsfw.optimizers.Adam(lr=1e-2)
    schedule = StepDecay(optimizer, step_size=10, gamma=0.5)
    for epoch in range(30):
        ...                      # optimizer.step(...) for every batch
        schedule.step()          # learning rate for the next epoch

The values are PyTorch's (``torch.optim.lr_scheduler``): creating a schedule sets the
optimizer's learning rate to the schedule's value at epoch 0, and after ``e`` calls of
:meth:`~LearningRateSchedule.step` it is the value at epoch ``e``:

- :class:`StepDecay` (``StepLR``): ``base · gamma ** (e // step_size)``;
- :class:`CosineAnnealing` (``CosineAnnealingLR``): ``eta_min + (base − eta_min) ·
  (1 + cos(π · e / t_max)) / 2``, which goes on as a cosine after ``t_max``;
- :class:`LinearWarmup` (``LinearLR``): ``base · (start_factor + (end_factor − start_factor) ·
  min(e, total_steps) / total_steps)``;
- :class:`SequentialSchedule` (``SequentialLR``): its schedules one after the other, each
  starting again from its epoch 0 at its milestone.

``base`` is the optimizer's learning rate when the schedule is created. Each value comes from
the formula (PyTorch's closed forms; its own ``step()`` computes most of them step by step,
which can differ in the last bits), so a learning rate assigned between two steps is replaced
at the next one. A schedule's state is its epoch and its base (:meth:`~LearningRateSchedule.
state_dict`); it pickles and deep-copies with its optimizer, and :func:`bnnsfw.save_weights`
keeps it in a checkpoint (``training=``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ._validation import finite_float, positive_int
from .errors import InvalidParameterError, must_be
from .optimizers import Optimizer, _count, _step_size

__all__ = ["LearningRateSchedule", "StepDecay", "CosineAnnealing", "LinearWarmup", "SequentialSchedule"]


class LearningRateSchedule:
    """Base class: the optimizer driven, the base learning rate, the epoch count.

    A subclass sets its own hyperparameters, then calls ``super().__init__(optimizer)``, and
    gives its values by :meth:`learning_rate_at`.
    """

    def __init__(self, optimizer: Optimizer) -> None:
        if not isinstance(optimizer, Optimizer):
            rule = "a bnnsfw optimizer (bnnsfw.optimizers.SGD, Adam or RMSProp)"
            raise InvalidParameterError(must_be(f"{type(self).__name__}(optimizer)", rule,
                                                type(optimizer).__name__))
        self._optimizer = optimizer
        self._base = optimizer.learning_rate
        self._epoch = 0
        optimizer.learning_rate = self.learning_rate_at(0)

    @property
    def optimizer(self) -> Optimizer:
        """The optimizer whose ``learning_rate`` the schedule sets."""
        return self._optimizer

    @property
    def base_learning_rate(self) -> float:
        """The optimizer's learning rate when the schedule was created (PyTorch's ``initial_lr``)."""
        return self._base

    @property
    def epoch(self) -> int:
        """How many times :meth:`step` was called (PyTorch's ``last_epoch``)."""
        return self._epoch

    @property
    def learning_rate(self) -> float:
        """The learning rate at the current epoch (the one the optimizer was given)."""
        return self.learning_rate_at(self._epoch)

    def learning_rate_at(self, epoch: int) -> float:
        """The schedule's learning rate after ``epoch`` calls of :meth:`step` (``epoch`` >= 0)."""
        return self._value(_count(f"{type(self).__name__}.learning_rate_at(epoch)", epoch))

    def step(self) -> float:
        """Move to the next epoch: set the optimizer's learning rate to its value there and
        return it."""
        self._epoch += 1
        rate = self.learning_rate_at(self._epoch)
        self._optimizer.learning_rate = rate
        return rate

    def state_dict(self) -> dict[str, Any]:
        """The schedule's state: ``{"epoch": int, "base_learning_rate": float}``."""
        return {"epoch": self._epoch, "base_learning_rate": self._base}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (of a schedule of this kind and hyperparameters), and set
        the optimizer's learning rate to the schedule's value at that epoch. Checked before
        anything changes."""
        where = f"{type(self).__name__}.load_state_dict(state)"
        expected = {"epoch", "base_learning_rate"}
        if not isinstance(state, Mapping) or set(state) != expected:
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidParameterError(must_be(where, f"a mapping with the keys {sorted(expected)}", got))
        epoch = _count(f"{where}['epoch']", state["epoch"])
        base = _step_size(f"{where}['base_learning_rate']", state["base_learning_rate"])
        self._set_base(base)
        self._epoch = epoch
        self._optimizer.learning_rate = self.learning_rate_at(epoch)

    def __repr__(self) -> str:
        options = ", ".join(f"{name}={value!r}" for name, value in self._options().items())
        return (f"{type(self).__name__}({options}; epoch={self._epoch}, "
                f"base_learning_rate={self._base!r})")

    # Hooks.
    def _value(self, epoch: int) -> float:
        raise NotImplementedError

    def _options(self) -> dict[str, object]:
        return {}

    def _set_base(self, base: float) -> None:
        self._base = base


class StepDecay(LearningRateSchedule):
    """Multiply the learning rate by ``gamma`` every ``step_size`` epochs (PyTorch's ``StepLR``).

    Parameters
    ----------
    optimizer : Optimizer
        Its learning rate at creation is the base.
    step_size : int
        Epochs between two decays, >= 1.
    gamma : float
        The factor, finite and >= 0 (default 0.1).

    Examples
    --------
    >>> from bnnsfw.optimizers import SGD
    >>> schedule = StepDecay(SGD(lr=1.0), step_size=2, gamma=0.5)
    >>> [schedule.learning_rate_at(e) for e in range(6)]
    [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1) -> None:
        self.step_size = positive_int("StepDecay.step_size", step_size)
        self.gamma = finite_float("StepDecay.gamma", gamma, low=0.0)
        super().__init__(optimizer)

    def _value(self, epoch: int) -> float:
        return self._base * self.gamma ** (epoch // self.step_size)

    def _options(self) -> dict[str, object]:
        return {"step_size": self.step_size, "gamma": self.gamma}


class CosineAnnealing(LearningRateSchedule):
    """From the base learning rate down to ``eta_min`` along half a cosine over ``t_max``
    epochs (PyTorch's ``CosineAnnealingLR``, without restarts).

    After ``t_max`` the cosine goes on (back up over the next ``t_max`` epochs), as in
    PyTorch; stop stepping, or follow it with another schedule in a
    :class:`SequentialSchedule`, to stay at ``eta_min``.

    Parameters
    ----------
    optimizer : Optimizer
        Its learning rate at creation is the base.
    t_max : int
        Epochs from the base to ``eta_min``, >= 1.
    eta_min : float
        The lowest learning rate, finite and >= 0 (default 0).

    Examples
    --------
    >>> from bnnsfw.optimizers import SGD
    >>> schedule = CosineAnnealing(SGD(lr=1.0), t_max=4, eta_min=0.2)
    >>> [round(schedule.learning_rate_at(e), 4) for e in range(5)]
    [1.0, 0.8828, 0.6, 0.3172, 0.2]
    """

    def __init__(self, optimizer: Optimizer, t_max: int, eta_min: float = 0.0) -> None:
        self.t_max = positive_int("CosineAnnealing.t_max", t_max)
        self.eta_min = finite_float("CosineAnnealing.eta_min", eta_min, low=0.0)
        super().__init__(optimizer)

    def _value(self, epoch: int) -> float:
        cosine = math.cos(math.pi * epoch / self.t_max)
        return self.eta_min + (self._base - self.eta_min) * (1.0 + cosine) / 2.0

    def _options(self) -> dict[str, object]:
        return {"t_max": self.t_max, "eta_min": self.eta_min}


class LinearWarmup(LearningRateSchedule):
    """Scale the learning rate by a factor going linearly from ``start_factor`` to
    ``end_factor`` over ``total_steps`` epochs, then staying there (PyTorch's ``LinearLR``).

    Parameters
    ----------
    optimizer : Optimizer
        Its learning rate at creation is the base.
    start_factor : float
        The factor at epoch 0, in (0, 1] (default 1/3, as PyTorch).
    end_factor : float
        The factor from epoch ``total_steps`` on, in [0, 1] (default 1).
    total_steps : int
        Epochs of the ramp, >= 1 (default 5).

    Examples
    --------
    >>> from bnnsfw.optimizers import SGD
    >>> schedule = LinearWarmup(SGD(lr=1.0), start_factor=0.25, total_steps=3)
    >>> [schedule.learning_rate_at(e) for e in range(5)]
    [0.25, 0.5, 0.75, 1.0, 1.0]
    """

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3.0, end_factor: float = 1.0,
                 total_steps: int = 5) -> None:
        self.start_factor = finite_float("LinearWarmup.start_factor", start_factor, low=0.0, high=1.0)
        if self.start_factor == 0.0:
            raise InvalidParameterError(must_be("LinearWarmup.start_factor", "in (0, 1]", start_factor))
        self.end_factor = finite_float("LinearWarmup.end_factor", end_factor, low=0.0, high=1.0)
        self.total_steps = positive_int("LinearWarmup.total_steps", total_steps)
        super().__init__(optimizer)

    def _value(self, epoch: int) -> float:
        progress = min(epoch, self.total_steps) / self.total_steps
        return self._base * (self.start_factor + (self.end_factor - self.start_factor) * progress)

    def _options(self) -> dict[str, object]:
        return {"start_factor": self.start_factor, "end_factor": self.end_factor,
                "total_steps": self.total_steps}


class SequentialSchedule(LearningRateSchedule):
    """Schedules one after the other (PyTorch's ``SequentialLR``): warm-up, then cosine.

    Schedule ``i`` gives the learning rate from epoch ``milestones[i - 1]`` (0 for the first)
    until the next milestone, counting its own epochs from 0 there. Every schedule drives the
    same optimizer and starts from the same base: the learning rate that the optimizer had when
    the first of them was created. Step only the :class:`SequentialSchedule`.

    Parameters
    ----------
    optimizer : Optimizer
        The optimizer of every schedule.
    schedules : sequence of LearningRateSchedule
        At least one.
    milestones : sequence of int
        ``len(schedules) - 1`` epochs, increasing, each >= 1.

    Examples
    --------
    >>> from bnnsfw.optimizers import SGD
    >>> opt = SGD(lr=1.0)
    >>> warmup = LinearWarmup(opt, start_factor=0.5, total_steps=2)
    >>> schedule = SequentialSchedule(opt, [warmup, CosineAnnealing(opt, t_max=2)], milestones=[2])
    >>> [schedule.learning_rate_at(e) for e in range(5)], opt.learning_rate
    ([0.5, 0.75, 1.0, 0.5, 0.0], 0.5)
    """

    def __init__(self, optimizer: Optimizer, schedules: Sequence[LearningRateSchedule],
                 milestones: Sequence[int]) -> None:
        where = "SequentialSchedule"
        if not isinstance(schedules, Sequence) or not schedules or not all(
                isinstance(s, LearningRateSchedule) for s in schedules):
            rule = "a non-empty list of learning-rate schedules"
            raise InvalidParameterError(must_be(f"{where}(schedules)", rule, schedules))
        for i, schedule in enumerate(schedules):
            if schedule.optimizer is not optimizer:
                rule = "the optimizer given to SequentialSchedule"
                raise InvalidParameterError(must_be(f"{where}(schedules[{i}]).optimizer", rule,
                                                    schedule.optimizer))
        if not isinstance(milestones, Sequence) or isinstance(milestones, str):
            raise InvalidParameterError(must_be(f"{where}(milestones)", "a list of epochs", milestones))
        points = [positive_int(f"{where}(milestones[{i}])", m) for i, m in enumerate(milestones)]
        if len(points) != len(schedules) - 1 or any(a >= b for a, b in zip(points, points[1:])):
            rule = f"{len(schedules) - 1} increasing epochs (one fewer than the schedules)"
            raise InvalidParameterError(must_be(f"{where}(milestones)", rule, list(milestones)))
        self.schedules = tuple(schedules)
        self.milestones = tuple(points)
        base = schedules[0].base_learning_rate
        for schedule in schedules:
            schedule._set_base(base)
        optimizer.learning_rate = base
        super().__init__(optimizer)

    def _value(self, epoch: int) -> float:
        index = bisect.bisect_right(self.milestones, epoch)
        start = self.milestones[index - 1] if index else 0
        return self.schedules[index]._value(epoch - start)

    def _set_base(self, base: float) -> None:
        self._base = base
        for schedule in self.schedules:
            schedule._set_base(base)

    def _options(self) -> dict[str, object]:
        return {"schedules": list(self.schedules), "milestones": list(self.milestones)}
