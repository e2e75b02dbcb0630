"""Learning-rate schedules: values against hand arithmetic (and PyTorch when installed), the
optimizer's learning rate they set, state, copies and errors."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.optimizers import SGD, Adam
from bnnsfw.schedules import CosineAnnealing, LinearWarmup, SequentialSchedule, StepDecay


def rates(schedule, epochs):
    """The optimizer's learning rate at creation, then after each of ``epochs - 1`` steps."""
    seen = [schedule.optimizer.learning_rate]
    for _ in range(epochs - 1):
        assert schedule.step() == schedule.optimizer.learning_rate
        seen.append(schedule.optimizer.learning_rate)
    return seen


def test_step_decay_by_hand():
    assert rates(StepDecay(SGD(lr=0.8), step_size=3, gamma=0.5), 8) == [0.8] * 3 + [0.4] * 3 + [0.2] * 2


def test_cosine_annealing_by_hand_and_past_t_max():
    schedule = CosineAnnealing(Adam(lr=0.3), t_max=4, eta_min=0.1)
    half = math.sqrt(0.5) / 2  # (1 + cos(π/4)) / 2 = 0.5 + half
    down, up = 0.1 + 0.2 * (0.5 + half), 0.1 + 0.2 * (0.5 - half)
    expected = [0.3, down, 0.2, up, 0.1, up, 0.2]
    np.testing.assert_allclose(rates(schedule, 7), expected, rtol=1e-15)
    assert CosineAnnealing(SGD(lr=1.0), t_max=2).learning_rate_at(2) == 0.0  # the optimizer takes 0


def test_linear_warmup_by_hand():
    assert rates(LinearWarmup(SGD(lr=2.0), start_factor=0.25, end_factor=1.0, total_steps=3), 5) == [
        0.5, 1.0, 1.5, 2.0, 2.0]
    np.testing.assert_allclose(rates(LinearWarmup(SGD(lr=1.0), 1.0, 0.5, total_steps=2), 4),
                               [1.0, 0.75, 0.5, 0.5], rtol=1e-15)


def test_warmup_then_cosine():
    opt = SGD(lr=1.0)
    warmup = LinearWarmup(opt, start_factor=0.5, total_steps=2)
    assert opt.learning_rate == 0.5
    cosine = CosineAnnealing(opt, t_max=2)  # created after the warm-up lowered the rate
    schedule = SequentialSchedule(opt, [warmup, cosine], milestones=[2])
    assert schedule.base_learning_rate == cosine.base_learning_rate == 1.0
    np.testing.assert_allclose(rates(schedule, 6), [0.5, 0.75, 1.0, 0.5, 0.0, 0.5], rtol=1e-15)


def test_state_dict_pickle_and_deepcopy_carry_the_epoch():
    opt = SGD(lr=1.0)
    schedule = SequentialSchedule(opt, [LinearWarmup(opt, total_steps=2), StepDecay(opt, 2, 0.5)], [2])
    for _ in range(3):
        schedule.step()
    state = schedule.state_dict()
    assert state == {"epoch": 3, "base_learning_rate": 1.0}
    other_opt = SGD(lr=1.0)
    parts = [LinearWarmup(other_opt, total_steps=2), StepDecay(other_opt, 2, 0.5)]
    other = SequentialSchedule(other_opt, parts, [2])
    other.load_state_dict(state)
    assert other_opt.learning_rate == opt.learning_rate == 1.0
    assert rates(other, 4)[1:] == [0.5, 0.5, 0.25]
    for copied in (copy.deepcopy(schedule), pickle.loads(pickle.dumps(schedule))):
        assert copied.optimizer is not opt and copied.optimizer.learning_rate == opt.learning_rate
        assert rates(copied, 4)[1:] == [0.5, 0.5, 0.25]
    assert repr(schedule).startswith("SequentialSchedule(schedules=[LinearWarmup(")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda o: StepDecay(o, 0), r"StepDecay.step_size must be an integer >= 1"),
        (lambda o: StepDecay(o, 2, gamma=float("nan")), r"StepDecay.gamma must be finite"),
        (lambda o: CosineAnnealing(o, 2.5), r"CosineAnnealing.t_max must be an integer >= 1"),
        (lambda o: CosineAnnealing(o, 3, eta_min=-1.0), r"CosineAnnealing.eta_min must be in \[0.0"),
        (lambda o: LinearWarmup(o, start_factor=0.0), r"LinearWarmup.start_factor must be in \(0, 1\]"),
        (lambda o: LinearWarmup(o, end_factor=1.5), r"LinearWarmup.end_factor must be in \[0.0, 1.0\]"),
        (lambda o: StepDecay("adam", 2), r"StepDecay\(optimizer\) must be a bnnsfw optimizer"),
        (lambda o: SequentialSchedule(o, [], []),
         r"SequentialSchedule\(schedules\) must be a non-empty list"),
        (lambda o: SequentialSchedule(o, [StepDecay(o, 1), StepDecay(o, 1)], [0]),
         r"SequentialSchedule\(milestones\[0\]\) must be an integer >= 1"),
        (lambda o: SequentialSchedule(o, [StepDecay(o, 1), StepDecay(o, 1)], [2, 3]),
         r"SequentialSchedule\(milestones\) must be 1 increasing epochs"),
        (lambda o: SequentialSchedule(o, [StepDecay(SGD(lr=1.0), 1)], []),
         r"SequentialSchedule\(schedules\[0\]\).optimizer must be the optimizer given"),
        (lambda o: StepDecay(o, 1).load_state_dict({"epoch": -1, "base_learning_rate": 1.0}),
         r"StepDecay.load_state_dict\(state\)\['epoch'\] must be an integer >= 0"),
        (lambda o: StepDecay(o, 1).load_state_dict({"epoch": 1}),
         r"StepDecay.load_state_dict\(state\) must be a mapping with the keys"),
        (lambda o: StepDecay(o, 1).learning_rate_at(1.5),
         r"StepDecay.learning_rate_at\(epoch\) must be an integer"),
    ],
)
def test_bad_arguments_are_refused_naming_them(make, match):
    with pytest.raises(bf.InvalidParameterError, match=match):
        make(SGD(lr=1.0))


def test_values_match_torch():
    torch = pytest.importorskip("torch")

    def torch_rates(make, epochs):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        scheduler = make(opt)
        seen = []
        for _ in range(epochs):
            seen.append(opt.param_groups[0]["lr"])
            opt.step()
            scheduler.step()
        return seen

    lr = torch.optim.lr_scheduler
    cases = [
        (lambda o: lr.StepLR(o, step_size=3, gamma=0.3), lambda o: StepDecay(o, 3, 0.3)),
        (lambda o: lr.CosineAnnealingLR(o, T_max=7, eta_min=0.01), lambda o: CosineAnnealing(o, 7, 0.01)),
        (lambda o: lr.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=4),
         lambda o: LinearWarmup(o, 0.1, 0.9, total_steps=4)),
        (lambda o: lr.SequentialLR(o, [lr.LinearLR(o, 0.2, total_iters=3), lr.CosineAnnealingLR(o, 6)],
                                   milestones=[3]),
         lambda o: SequentialSchedule(o, [LinearWarmup(o, 0.2, total_steps=3), CosineAnnealing(o, 6)], [3])),
    ]
    for make_torch, make_ours in cases:
        np.testing.assert_allclose(rates(make_ours(SGD(lr=0.1)), 16), torch_rates(make_torch, 16),
                                   rtol=1e-12, atol=1e-15)
