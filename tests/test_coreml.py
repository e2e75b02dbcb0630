"""bnnsfw.coreml: the ML Program written, loaded back and inspected (predictions need macOS)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

import bnnsfw as bf

with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    ct = pytest.importorskip("coremltools")

import bnnsfw.coreml as bc  # noqa: E402


def _program(path):
    """The saved package's MIL program, with its weights read from the package."""
    from coremltools.converters.mil.frontend.milproto.load import load

    model = ct.models.MLModel(str(path), skip_model_load=True)
    spec = model.get_spec()
    assert spec.WhichOneof("Type") == "mlProgram"
    return spec, load(spec, spec.specificationVersion, file_weights_dir=model.weights_dir)


def _ops(program, op_type):
    return [op for op in program.functions["main"].operations if op.op_type == op_type]


def _value(op, name):
    return np.asarray(op.inputs[name].val)


def _model(dtype=np.float32):
    rng = np.random.default_rng(0)
    lstm = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4, num_layers=2,
                                                 bidirectional=True,
                                                 peepholes="diagonal", batch_first=True, seed=1, dtype=dtype))
    norm = bf.NormalizationLayer(bf.NormalizationParameters(
        type=bf.NormalizationType.layer(), input_shape=(8,), gamma=rng.uniform(0.5, 1.5, 8),
        beta=rng.uniform(-1, 1, 8), dtype=dtype))
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(
        input_size=8, output_size=6, seed=2, activation=bf.Activation.relu(), dtype=dtype))
    batch = bf.NormalizationLayer(bf.NormalizationParameters(
        type=bf.NormalizationType.batch(moving_mean=rng.uniform(-1, 1, 6), moving_variance=rng.uniform(0.5,
                                                                                                       2, 6)),
        input_shape=(6,), gamma=rng.uniform(0.5, 1.5, 6), beta=rng.uniform(-1, 1, 6), dtype=dtype))
    group = bf.NormalizationLayer(bf.NormalizationParameters(
        type=bf.NormalizationType.group(group_count=2), input_shape=(6,), gamma=rng.uniform(0.5, 1.5, 6),
        beta=rng.uniform(-1, 1, 6), activation=bf.Activation.tanh(), dtype=dtype))
    return [lstm, norm, head, batch, group]


def test_the_program_has_the_layers_ops_shapes_and_weights(tmp_path):
    layers = _model()
    lstm, norm, head, batch, group = layers
    report = bc.export(layers, tmp_path / "model")
    assert report.path.endswith("model.mlpackage")
    spec, program = _program(report.path)
    (given,) = spec.description.input
    assert given.name == "input"
    ranges = [(r.lowerBound, r.upperBound) for r in given.type.multiArrayType.shapeRange.sizeRanges]
    assert ranges == [(1, bc.MAX_EXTENT), (1, bc.MAX_EXTENT), (3, 3)]
    assert [o.name for o in spec.description.output] == ["output"]
    kinds = [op.op_type for op in program.functions["main"].operations if op.op_type != "const"]
    assert kinds.count("lstm") == 2 and kinds.count("layer_norm") == 2 and "batch_norm" in kinds
    assert kinds.index("lstm") < kinds.index("linear") < kinds.index("batch_norm")
    assert report.operations == tuple(k for k in kinds if k != "identity")

    # LSTM weights, in Core ML's gate order i, f, o, z and with the backward direction apart.
    p = lstm.layer_parameters
    order = (p.input_gate, p.forget_gate, p.output_gate, p.candidate_gate)
    for index, op in enumerate(_ops(program, "lstm")):
        assert str(_value(op, "direction")) == "bidirectional"
        assert str(_value(op, "recurrent_activation")) == "sigmoid"
        for k, suffix in enumerate(("", "_back")):
            iw = [g.input_weights[0][k] if index == 0 else g.input_weights[1][index - 1, k] for g in order]
            np.testing.assert_array_equal(_value(op, f"weight_ih{suffix}"), np.concatenate(iw))
            np.testing.assert_array_equal(_value(op, f"weight_hh{suffix}"),
                                          np.concatenate([g.hidden_weights[index, k] for g in order]))
            np.testing.assert_array_equal(_value(op, f"bias{suffix}"),
                                          np.concatenate([g.bias[index, k] for g in order]))
            np.testing.assert_array_equal(_value(op, f"peephole{suffix}"),
                                          np.concatenate([g.cell_weights[index, k] for g in order[:3]]))
    first_norm = _ops(program, "layer_norm")[0]
    np.testing.assert_array_equal(_value(first_norm, "gamma"), norm.gamma)
    np.testing.assert_array_equal(_value(first_norm, "beta"), norm.beta)
    (linear,) = _ops(program, "linear")
    np.testing.assert_array_equal(_value(linear, "weight"), head.weights)
    np.testing.assert_array_equal(_value(linear, "bias"), head.bias)
    (bn,) = _ops(program, "batch_norm")
    np.testing.assert_array_equal(_value(bn, "mean"), batch.moving_mean)
    np.testing.assert_array_equal(_value(bn, "variance"), batch.moving_variance)
    np.testing.assert_array_equal(_value(bn, "gamma"), batch.gamma)
    assert tuple(_ops(program, "linear")[0].outputs[0].shape)[-1] == 6

    lost = {(f.layer, f.feature) for f in report.lost}
    assert ("model", "training") in lost
    assert ("layer[0] LSTMLayer", "sequence_lengths") in lost
    assert ("layer[3] NormalizationLayer", "moving-statistics updates") in lost
    assert "does not survive" in str(report) and "float64" not in str(report)


def test_float64_layers_are_reported_as_float32(tmp_path):
    report = bc.export(_model(np.float64)[1:3], tmp_path / "model.mlpackage")
    assert ("model", "float64") in {(f.layer, f.feature) for f in report.lost}
    _, program = _program(report.path)
    (linear,) = _ops(program, "linear")
    assert _value(linear, "weight").dtype == np.float32


def test_what_would_change_the_values_is_refused(tmp_path):
    import attrs

    full = bf.LSTMLayer(bf.LSTMParameters.random(input_size=2, hidden_size=2, peepholes="full"))
    with pytest.raises(bf.UnsupportedError, match="full peephole"):
        bc.export(full, tmp_path / "a")
    params = bf.LSTMParameters.random(input_size=2, hidden_size=2)
    mixed = bf.LSTMLayer(attrs.evolve(params, output_gate=attrs.evolve(params.output_gate,
                                                                       activation=bf.Activation.tanh())))
    with pytest.raises(bf.UnsupportedError, match="recurrent_activation"):
        bc.export(mixed, tmp_path / "b")
    softsign = bf.LSTMLayer(attrs.evolve(params, hidden_activation=bf.Activation.softsign()))
    with pytest.raises(bf.UnsupportedError, match="softsign"):
        bc.export(softsign, tmp_path / "c")
    no_stats = bf.NormalizationLayer(bf.NormalizationParameters(type=bf.NormalizationType.batch(),
                                                                input_shape=(3,)))
    with pytest.raises(bf.UnsupportedError, match="moving statistics"):
        bc.export(no_stats, tmp_path / "d")
    with pytest.raises(bf.ShapeError, match="last extent"):
        bc.export([bf.LSTMLayer(params), no_stats], tmp_path / "e")
    with pytest.raises(bf.InvalidParameterError, match="at least one layer"):
        bc.export([], tmp_path / "f")


def test_reverse_lstm_and_rms_normalization_survive(tmp_path):
    """A reverse-only LSTM is Core ML's direction="reverse"; RMS normalization is written as
    x · rsqrt(mean(x²) + ε) · γ over its axes (Core ML has no RMS operation)."""
    rng = np.random.default_rng(3)
    lstm = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4, reverse=True, seed=4))
    same = bf.LSTMActivations.onnx(["Sigmoid", "Relu", "Tanh"] * 2)
    both = bf.LSTMLayer(bf.LSTMParameters.random(input_size=4, hidden_size=2, bidirectional=True,
                                                 direction_activations=same, seed=5))
    rms = bf.NormalizationLayer(bf.NormalizationParameters(
        type=bf.NormalizationType.rms(), input_shape=(4,), gamma=rng.uniform(0.5, 1.5, 4), epsilon=0.125))
    report = bc.export([lstm, both, rms], tmp_path / "model")
    _, program = _program(report.path)
    first, second = _ops(program, "lstm")
    assert str(_value(first, "direction")) == "reverse"
    assert str(_value(second, "direction")) == "bidirectional"
    assert str(_value(second, "cell_activation")) == "relu"
    (mean,) = _ops(program, "reduce_mean")
    assert list(_value(mean, "axes")) == [-1]
    (rsqrt,) = _ops(program, "rsqrt")
    assert float(_value(rsqrt, "epsilon")) == 0.125
    assert any(np.array_equal(np.asarray(op.inputs["y"].val), rms.gamma.astype(np.float32))
               for op in _ops(program, "mul") if op.inputs["y"].val is not None)
    assert "layer_norm" not in report.operations


def test_lstm_variants_core_ml_cannot_express_are_refused_by_name(tmp_path):
    two = bf.LSTMActivations.onnx(["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "Tanh"])
    cases = {"clip": {"clip": 2.0}, "cell_clip": {"cell_clip": 2.0}, "input_forget": {"input_forget": True},
             "projection_size": {"projection_size": 1}, "layer_norm": {"layer_norm": True},
             "direction_activations": {"bidirectional": True, "direction_activations": two}}
    for index, (name, options) in enumerate(cases.items()):
        with bf.LSTMLayer(bf.LSTMParameters.random(input_size=2, hidden_size=2, **options)) as layer:
            with pytest.raises(bf.UnsupportedError, match=name):
                bc.export(layer, tmp_path / f"v{index}")
