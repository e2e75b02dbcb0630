import io
import json
import re

import attrs
import numpy as np
import pytest

import bnnsfw as bf
from bnnsfw.serialization import load_weights, save_weights


def test_round_trip_reproduces_outputs_exactly(tmp_path, rng, backend_name):
    fp = bf.FilterParameters(backend=backend_name)
    lstm = bf.LSTMLayer(bf.LSTMParameters.random(
        input_size=3, hidden_size=4, num_layers=2, bidirectional=True, peepholes="diagonal", seed=1,
        hidden_activation=bf.Activation.scaled_tanh(1.5, 0.8)), fp)
    norm = bf.NormalizationLayer(bf.NormalizationParameters(
        type=bf.NormalizationType.batch(moving_mean=np.zeros(8), moving_variance=np.ones(8)),
        input_shape=(8,), momentum=0.5, gamma=rng.uniform(0.5, 2, 8), beta=rng.standard_normal(8),
        activation=bf.Activation.leaky_relu(0.2)), fp)
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=8, output_size=2, seed=2), fp)
    x = rng.standard_normal((5, 3, 3)).astype(np.float32)
    features = lstm.apply(x).output[-1]
    norm.apply(features, phase="training")           # moves the moving statistics away from 0 / 1

    def predict(layers):
        h = layers["lstm"].apply(x).output[-1]
        return layers["head"].apply(layers["norm"].apply(h, phase="inference"))

    path = tmp_path / "model.npz"
    original = {"lstm": lstm, "norm": norm, "head": head}
    save_weights(path, original)
    loaded = load_weights(path, fp)
    assert {k: type(v) for k, v in loaded.items()} == {k: type(v) for k, v in original.items()}
    np.testing.assert_array_equal(predict(loaded), predict(original))
    np.testing.assert_array_equal(loaded["norm"].moving_mean, norm.moving_mean)
    assert loaded["lstm"].layer_parameters.input_gate.cell_weights.shape == (2, 2, 4)


def test_save_refuses_bad_input(tmp_path):
    with pytest.raises(bf.InvalidParameterError, match="non-empty mapping"):
        save_weights(tmp_path / "x.npz", {})
    with pytest.raises(bf.InvalidParameterError, match="a bnnsfw layer"):
        save_weights(tmp_path / "x.npz", {"a": object()})
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=2, output_size=2))
    with pytest.raises(bf.InvalidParameterError, match="without '/'"):
        save_weights(tmp_path / "x.npz", {"a/b": head})
    head.close()
    with pytest.raises(bf.FilterClosedError):
        save_weights(tmp_path / "x.npz", {"head": head})


def test_load_refuses_foreign_files(tmp_path):
    np.savez(tmp_path / "other.npz", a=np.zeros(2))
    with pytest.raises(bf.InvalidParameterError, match="a file written by save_weights"):
        load_weights(tmp_path / "other.npz")


def test_saved_arrays_are_the_live_ones_the_layers_train(tmp_path):
    """Without client pointers a layer trains its own copies; those are what is saved."""
    norm_parameters = bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(3,))
    norm = bf.NormalizationLayer(norm_parameters)
    head_parameters = bf.FullyConnectedParameters.random(input_size=3, output_size=2, seed=0)
    head = bf.FullyConnectedLayer(head_parameters)
    norm.gamma -= 0.5                                  # the parameters held no gamma at all
    head.weights[...] += 1.0                           # as an optimizer updates it, in place
    save_weights(tmp_path / "m.npz", {"norm": norm, "head": head})
    loaded = load_weights(tmp_path / "m.npz")
    np.testing.assert_array_equal(loaded["norm"].gamma, [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(loaded["head"].weights, head.weights)
    assert not np.array_equal(loaded["head"].weights, head_parameters.weights)


def _first_format_file(path):
    """A weights file laid out entry by entry as format bnnsfw-weights-1 writes it."""
    rng = np.random.default_rng(5)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    arrays = {}
    for gate in ("input_gate", "forget_gate", "candidate_gate", "output_gate"):
        arrays[f"lstm/{gate}/input_weights0"] = f32(1, 4, 3)
        arrays[f"lstm/{gate}/hidden_weights"] = f32(1, 1, 4, 4)
        arrays[f"lstm/{gate}/bias"] = f32(1, 1, 4)
    arrays["lstm/forget_gate/cell_weights"] = f32(1, 1, 4)
    arrays["norm/gamma"], arrays["norm/beta"] = f32(4), f32(4)
    arrays["norm/moving_mean"], arrays["norm/moving_variance"] = f32(4), np.full(4, 2.0, np.float32)
    arrays["head/weights"] = f32(2, 4)
    layers = {
        "lstm": {"type": "lstm", "input_size": 3, "hidden_size": 4, "num_layers": 1, "bidirectional": False,
                 "batch_first": False, "dropout": 0.0, "seed": 7, "default_activations": False,
                 "hidden_activation": [5, 1.5, 0.5], "dtype": "float32",
                 "gate_activations": [None, [15, 0.2, 0.5], None, None]},
        "norm": {"type": "normalization", "kind": "batch_norm", "input_shape": [4],
                 "normalization_axis": None, "group_count": None, "momentum": 0.9, "epsilon": 0.001,
                 "activation": [0, 0.0, 0.0], "dtype": "float32"},
        "head": {"type": "fully_connected", "input_size": 4, "output_size": 2, "activation": [1, 0.0, 0.0],
                 "dtype": "float32"},
    }
    meta = json.dumps({"format": "bnnsfw-weights-1", "layers": layers})
    np.savez(path, __meta__=np.array(meta), **arrays)
    return arrays


def test_a_file_in_the_first_format_loads_and_is_written_back_the_same(tmp_path):
    arrays = _first_format_file(tmp_path / "old.npz")
    layers = load_weights(tmp_path / "old.npz")
    lstm = layers["lstm"].layer_parameters
    assert (lstm.input_size, lstm.hidden_size, lstm.seed) == (3, 4, 7)
    assert lstm.hidden_activation == bf.Activation.scaled_tanh(1.5, 0.5)
    assert lstm.forget_gate.activation == bf.Activation.hard_sigmoid(0.2, 0.5)
    assert lstm.input_gate.activation is None and lstm.input_gate.cell_weights is None
    for name, gate in zip(("input_gate", "forget_gate", "candidate_gate", "output_gate"), lstm.gates):
        np.testing.assert_array_equal(gate.input_weights[0], arrays[f"lstm/{name}/input_weights0"])
        np.testing.assert_array_equal(gate.hidden_weights, arrays[f"lstm/{name}/hidden_weights"])
        np.testing.assert_array_equal(gate.bias, arrays[f"lstm/{name}/bias"])
    np.testing.assert_array_equal(lstm.forget_gate.cell_weights, arrays["lstm/forget_gate/cell_weights"])
    norm = layers["norm"]
    assert norm.layer_parameters.type.kind is bf.FilterType.batch_norm
    assert norm.layer_parameters.epsilon == 0.001
    for key in ("gamma", "beta", "moving_mean", "moving_variance"):
        np.testing.assert_array_equal(getattr(norm, key), arrays[f"norm/{key}"])
    head = layers["head"]
    assert head.bias is None and head.activation == bf.Activation.relu()
    x = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    np.testing.assert_allclose(head.apply(x), np.maximum(x @ arrays["head/weights"].T, 0), rtol=1e-6)

    save_weights(tmp_path / "again.npz", layers)
    with np.load(tmp_path / "again.npz") as again:
        assert sorted(again.files) == sorted([*arrays, "__meta__"])
        for key, array in arrays.items():
            np.testing.assert_array_equal(again[key], array)
            assert again[key].dtype == array.dtype


@pytest.mark.parametrize("parameters", [
    bf.LSTMParameters.random(input_size=2, hidden_size=3, num_layers=2, bidirectional=True, peepholes="full",
                             seed=3, batch_first=True, dropout=0.25, dtype=np.float64),
    bf.LSTMParameters.random(input_size=2, hidden_size=3, bias=False, default_activations=True),
    bf.NormalizationParameters(
        type=bf.NormalizationType.instance(moving_mean=[0.0, 1.0], moving_variance=[1.0, 2.0]),
        input_shape=(2, 5), momentum=0.25, activation=bf.Activation.elu(0.5)),
    bf.NormalizationParameters(type=bf.NormalizationType.layer(normalization_axis=1), input_shape=(2, 5),
                               beta=np.arange(5.0)),
    bf.FullyConnectedParameters.random(input_size=3, output_size=2, bias=False, dtype=np.float64),
], ids=["lstm", "lstm-no-bias", "instance", "layer", "fully-connected"])
def test_to_state_and_from_state_round_trip(parameters):
    state = parameters.to_state()
    assert json.loads(json.dumps({k: v for k, v in state.items() if not isinstance(v, np.ndarray)}))
    again = type(parameters).from_state(state)
    assert again.to_state().keys() == state.keys()
    for key, value in again.to_state().items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, state[key])
        else:
            assert value == state[key], key


def test_from_state_names_missing_and_unexpected_keys():
    state = bf.FullyConnectedParameters.random(input_size=3, output_size=2).to_state()
    missing = r"FullyConnectedParameters.from_state\(state\) must be a state with the key 'output_size'"
    with pytest.raises(bf.InvalidParameterError, match=missing):
        bf.FullyConnectedParameters.from_state({k: v for k, v in state.items() if k != "output_size"})
    unexpected = r"only the keys to_state\(\) writes; got \"unexpected keys \['wieghts'\]\""
    with pytest.raises(bf.InvalidParameterError, match=unexpected):
        bf.FullyConnectedParameters.from_state({**state, "wieghts": state["weights"]})
    lstm = bf.LSTMParameters.random(input_size=2, hidden_size=3).to_state()
    missing = r"LSTMGateDescriptor.from_state\(state\) must be a state with the key 'hidden_weights'"
    with pytest.raises(bf.InvalidParameterError, match=missing):
        bf.LSTMParameters.from_state({k: v for k, v in lstm.items() if k != "output_gate/hidden_weights"})
    with pytest.raises(bf.InvalidParameterError, match=r"must be a list of 4"):
        bf.LSTMParameters.from_state({**lstm, "gate_activations": [None]})
    triple = r"Activation.from_state\(state\) must be \[function, alpha, beta\]"
    with pytest.raises(bf.InvalidParameterError, match=triple):
        bf.Activation.from_state([1, 0.0])
    with pytest.raises(bf.InvalidParameterError, match=r"must be a mapping from to_state\(\); got 'list'"):
        bf.NormalizationParameters.from_state([])


# ------------------------------------------------------------------------------------------
# A layer, a container or a mapping; the path rule.
# ------------------------------------------------------------------------------------------
def _model(backend_name, seed=0, head="head"):
    fp = bf.FilterParameters(backend=backend_name)
    lstm = bf.LSTMParameters.random(input_size=2, hidden_size=4, num_layers=2, seed=seed)
    norm = bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(4,))
    dense = bf.FullyConnectedParameters.random(input_size=4, output_size=3, seed=seed + 1)
    return bf.Sequential({"lstm": bf.LSTMLayer(lstm, fp), "last": bf.LastStep(),
                          "norm": bf.NormalizationLayer(norm, fp), head: bf.FullyConnectedLayer(dense, fp)})


def test_a_container_comes_back_as_a_container(tmp_path, rng, backend_name):
    x = rng.standard_normal((6, 5, 2)).astype(np.float32)
    model = _model(backend_name)
    for array in model.parameters().values():   # trained: the live arrays are what is saved
        array *= 1.25
    save_weights(tmp_path / "model", model)
    loaded = load_weights(tmp_path / "model", bf.FilterParameters(backend=backend_name))
    assert isinstance(loaded, bf.Sequential)
    assert [(name, type(layer)) for name, layer in loaded.layers.items()] == [
        (name, type(layer)) for name, layer in model.layers.items()]
    np.testing.assert_array_equal(loaded(x), model(x))
    loaded.close()
    model.close()


def test_a_single_layer_comes_back_as_a_layer(tmp_path, rng):
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=3, output_size=2, seed=4))
    save_weights(tmp_path / "head.npz", head)
    loaded = load_weights(tmp_path / "head.npz")
    assert isinstance(loaded, bf.FullyConnectedLayer)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), head(x))


@pytest.mark.parametrize("name", ["m2", "m2.npz", "m2.safetensors", "dir.with.dots/m2", "m2.weights"])
def test_the_path_rule_is_symmetric(tmp_path, name):
    (tmp_path / "dir.with.dots").mkdir()
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=2, output_size=2))
    save_weights(tmp_path / name, head)
    written = bf.serialization.weights_path(name)
    assert written == (name if name.endswith((".npz", ".safetensors")) else name + ".safetensors")
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.*") if p.is_file())
    assert files == [written]
    np.testing.assert_array_equal(load_weights(tmp_path / name).weights, head.weights)
    np.testing.assert_array_equal(load_weights(str(tmp_path / name)).weights, head.weights)
    np.testing.assert_array_equal(load_weights(tmp_path / written).weights, head.weights)


def test_a_bare_name_finds_the_npz_file_an_earlier_version_wrote(tmp_path):
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=2, output_size=2))
    save_weights(tmp_path / "old.npz", head)  # what save_weights(tmp_path / "old") used to write
    np.testing.assert_array_equal(load_weights(tmp_path / "old").weights, head.weights)
    with pytest.raises(FileNotFoundError, match=r"missing\.safetensors"):
        load_weights(tmp_path / "missing")


def test_open_files_are_read_and_written_as_they_are(rng):
    buffer = io.BytesIO()
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=2, output_size=2))
    save_weights(buffer, head)
    buffer.seek(0)
    np.testing.assert_array_equal(load_weights(buffer).weights, head.weights)


def test_load_into_an_existing_model(tmp_path, rng, backend_name):
    x = rng.standard_normal((6, 5, 2)).astype(np.float32)
    trained, fresh = _model(backend_name, seed=0), _model(backend_name, seed=7)
    save_weights(tmp_path / "trained", trained)
    assert load_weights(tmp_path / "trained", into=fresh) is fresh
    np.testing.assert_array_equal(fresh(x), trained(x))
    # A mapping saved by name loads into a container whose layers have those names, and back.
    layers = {name: layer for name, layer in trained.layers.items() if isinstance(layer, bf.Filter)}
    save_weights(tmp_path / "layers", layers)
    other = _model(backend_name, seed=9)
    load_weights(tmp_path / "layers", into=other)
    np.testing.assert_array_equal(other(x), trained(x))
    target = {name: layer for name, layer in _model(backend_name, seed=3).layers.items()
              if isinstance(layer, bf.Filter)}
    load_weights(tmp_path / "trained", into=target)
    np.testing.assert_array_equal(target["head"].weights, trained.layers["head"].weights)


def test_load_into_refuses_a_model_with_other_names_or_shapes(tmp_path, backend_name):
    save_weights(tmp_path / "trained", _model(backend_name))
    renamed = _model(backend_name, head="dense")
    with pytest.raises(bf.InvalidParameterError, match=r"missing names \['dense.weights', 'dense.bias'\], "
                                                       r"unexpected names \['head.weights', 'head.bias'\]"):
        load_weights(tmp_path / "trained", into=renamed)
    layers = {name: layer for name, layer in _model(backend_name, head="dense").layers.items()
              if isinstance(layer, bf.Filter)}
    with pytest.raises(bf.InvalidParameterError,
                       match=r"load_weights\(into\) with the saved arrays must be a state with exactly the "
                             r"names of state_dict\(\); got \"missing names \['dense.weights'"):
        load_weights(tmp_path / "trained", into=layers)
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=4, output_size=5))
    other = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=4, output_size=3))
    save_weights(tmp_path / "head", other)
    with pytest.raises(bf.InvalidParameterError, match=r"the model's output_size must be 3, as in the file"):
        load_weights(tmp_path / "head", into=head)
    with pytest.raises(bf.ShapeError,      # a size ignored: the arrays' shapes still have to fit
                       match=r"load_state_dict\(state\)\['weights'\] must be of shape \(5, 4\)"):
        load_weights(tmp_path / "head", into=head, ignore=("output_size",))
    with pytest.raises(bf.InvalidParameterError,
                       match=r"load_weights\(filter_parameters\) must be None when into"):
        load_weights(tmp_path / "head", bf.FilterParameters(), into=head)
    with pytest.raises(bf.InvalidParameterError,
                       match=r"save_weights\(model\) must be a layer, a Sequential or a mapping of name to "
                             r"layer; got 'int'"):
        save_weights(tmp_path / "x", 3)


# ------------------------------------------------------------------------------------------
# Sizes the metadata declares: checked against the arrays, limited where none confirms them.
# ------------------------------------------------------------------------------------------
def _normalization_entry(kind="layer_norm", input_shape=(2**20, 2**20), **options):
    return {"type": "normalization", "kind": kind, "input_shape": list(input_shape),
            "normalization_axis": 0 if kind == "layer_norm" else None, "group_count": None,
            "momentum": 0.0, "epsilon": 1e-5, "activation": [0, 0.0, 0.0], "dtype": "float32", **options}


def _write(path, layers, arrays=None, kind="layers"):
    """A weights file of ``layers`` (metadata entries) and ``arrays``, in the form its name says."""
    header = json.dumps({"format": "bnnsfw-weights-1", "kind": kind, "layers": layers})
    if str(path).endswith(".npz"):
        np.savez(path, __meta__=np.array(header), **(arrays or {}))
    else:
        from safetensors.numpy import save_file

        save_file(arrays or {}, str(path), metadata={"bnnsfw": header})
    return path


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_a_declared_shape_no_array_confirms_is_limited_before_anything_is_allocated(tmp_path, suffix):
    import tracemalloc

    path = _write(tmp_path / f"ln{suffix}", {"layer": _normalization_entry()}, kind="layer")
    message = (rf"load_weights\('{path}'\): layer 'layer': input_shape must be a shape of at most "
               r"268435456 elements when no array in the file has it \(load_weights\(max_elements=\.\.\.\) "
               r"sets the limit, 268435456, for all such shapes of a file together\); "
               r"got '\(1048576, 1048576\): 1099511627776 elements'\.$")
    tracemalloc.start()
    try:
        with pytest.raises(bf.InvalidParameterError, match=message):
            load_weights(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
    # Batch norm without gamma, beta or moving statistics: nothing confirms C either.
    path = _write(tmp_path / f"bn{suffix}", {"norm": _normalization_entry("batch_norm", (2**40,))})
    with pytest.raises(bf.InvalidParameterError, match=r"layer 'norm': input_shape must be a shape of at"):
        load_weights(path)


def test_max_elements_sets_the_limit_and_an_array_of_the_shape_confirms_it(tmp_path):
    path = _write(tmp_path / "ln.safetensors", {"layer": _normalization_entry(input_shape=(64, 64))},
                  kind="layer")
    assert load_weights(path).gamma.shape == (64, 64)                # 4096 elements: within the default
    with pytest.raises(bf.InvalidParameterError, match=r"at most 4095 elements .*; got '\(64, 64\): 4096"):
        load_weights(path, max_elements=4095)
    assert load_weights(path, max_elements=4096).gamma.shape == (64, 64)
    # The limit is for every such shape of the file together.
    path = _write(tmp_path / "two.safetensors", {name: _normalization_entry(input_shape=(64, 64))
                                                 for name in ("first", "second")})
    assert load_weights(path, max_elements=8192)["second"].gamma.shape == (64, 64)
    together = (r"layer 'second': input_shape must be a shape of at most 3904 elements .* sets the limit, "
                r"8000, for all such shapes of a file together; the layers before it take 4096\); "
                r"got '\(64, 64\): 4096 elements'")
    with pytest.raises(bf.InvalidParameterError, match=together):
        load_weights(path, max_elements=8000)
    # A gamma (or beta, or moving statistic) of the whole shape confirms it: no limit then.
    path = _write(tmp_path / "with_gamma.safetensors", {"layer": _normalization_entry(input_shape=(64, 64))},
                  {"layer/gamma": np.full((64, 64), 2.0, np.float32)}, kind="layer")
    np.testing.assert_array_equal(load_weights(path, max_elements=1).gamma, 2.0)
    # A gamma of part of the shape does not confirm the rest.
    entry = _normalization_entry(input_shape=(64, 64), normalization_axis=1)
    path = _write(tmp_path / "axis1.safetensors", {"layer": entry}, {"layer/gamma": np.ones(64, np.float32)},
                  kind="layer")
    with pytest.raises(bf.InvalidParameterError, match=r"input_shape must be a shape of at most 100 elem"):
        load_weights(path, max_elements=100)
    for bad in (0, -1, True, 2.5, "many", None):
        with pytest.raises(bf.InvalidParameterError, match=r"load_weights\(max_elements\) must be an int"):
            load_weights(path, max_elements=bad)


def test_declared_sizes_are_checked_against_the_arrays(tmp_path):
    """An LSTM's or a fully connected layer's sizes are carried by arrays they require: a size
    that disagrees with them is refused naming the layer and the field, whatever its value."""
    lstm = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4, seed=0))
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=4, output_size=2, seed=0))
    save_weights(tmp_path / "m.npz", {"lstm": lstm, "head": head})
    with np.load(tmp_path / "m.npz") as data:
        arrays = {key: data[key] for key in data.files if key != "__meta__"}
        meta = json.loads(str(data["__meta__"]))
    gate = r"layer 'lstm': LSTMParameters.input_gate"
    for layer, key, match in [
        ("lstm", "hidden_size", gate + r".input_weights\[0\] must be of shape \(1, 1099511627776, 3\)"),
        ("lstm", "input_size", gate + r".input_weights\[0\] must be of shape \(1, 4, 1099511627776\)"),
        ("lstm", "num_layers", gate + r".input_weights\[1\] must be an array"),
        ("head", "output_size", r"layer 'head': FullyConnectedParameters.weights must be of shape "
                                r"\(1099511627776, 4\)"),
    ]:
        layers = json.loads(json.dumps(meta["layers"]))
        layers[layer][key] = 2**40
        path = _write(tmp_path / f"{layer}-{key}.safetensors", layers, arrays)
        with pytest.raises(bf.ShapeError, match=match):
            load_weights(path)


# ------------------------------------------------------------------------------------------
# load_weights(into=): the model's configuration must be the file's, unless ignored.
# ------------------------------------------------------------------------------------------
def test_load_into_refuses_another_layout_naming_the_field_and_both_values(tmp_path, rng):
    """A file saved from a batch-first LSTM does not load into a time-first one, which would read
    (N, T, I) as (T, N, I); ignore=("batch_first",) loads the arrays anyway."""
    saved = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4, batch_first=True, seed=0))
    save_weights(tmp_path / "m", saved)
    target = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4, seed=1))
    before = target.state_dict()
    message = re.escape(f"load_weights({str(tmp_path / 'm.safetensors')!r}): the model's batch_first must be "
                        "True, as in the file (ignore=('batch_first',) loads its arrays anyway); got False.")
    with pytest.raises(bf.InvalidParameterError, match=f"^{message}$"):
        load_weights(tmp_path / "m", into=target)
    for key, array in target.state_dict().items():        # refused before anything was written
        np.testing.assert_array_equal(array, before[key])
    assert load_weights(tmp_path / "m", into=target, ignore=("batch_first",)) is target
    assert not target.layer_parameters.batch_first          # the model keeps its own setting
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)   # (N, T, I) for the saved layer
    np.testing.assert_array_equal(target.apply(x.transpose(1, 0, 2)).output.transpose(1, 0, 2),
                                  saved.apply(x).output)


_LSTM_SETTINGS = [
    ("bidirectional", dict(bidirectional=True), {}, "True.*got False"),
    ("reverse", dict(reverse=True), {}, "True.*got False"),
    ("hidden_size", dict(hidden_size=5), {}, "5.*got 4"),
    ("dtype", dict(dtype=np.float64), {}, "'float64'.*got 'float32'"),
    ("clip", dict(clip=2.0), {}, "2.0.*got None"),
    ("dropout", dict(num_layers=2, dropout=0.5), dict(num_layers=2), "0.5.*got 0.0"),
    ("hidden_activation", dict(hidden_activation=bf.Activation.relu()), {},
     r"Activation\(function=<ActivationFunction.relu: 1>.*got None"),
]


@pytest.mark.parametrize("field, saved, model, shown", _LSTM_SETTINGS, ids=[c[0] for c in _LSTM_SETTINGS])
def test_load_into_compares_every_lstm_setting(tmp_path, field, saved, model, shown):
    def lstm(**options):
        return bf.LSTMLayer(bf.LSTMParameters.random(**{"input_size": 3, "hidden_size": 4, "seed": 0,
                                                        **options}))

    save_weights(tmp_path / "m", lstm(**saved))
    with pytest.raises(bf.InvalidParameterError, match=rf"the model's {field} must be {shown}\.$"):
        load_weights(tmp_path / "m", into=lstm(**model))


def test_load_into_compares_settings_by_what_they_compute(tmp_path, rng):
    """Settings written differently that compute the same are not differences: an activation
    given as its default, dropout with one layer, momentum without moving statistics, the seed."""
    explicit = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4, seed=1,
                                                     hidden_activation=bf.Activation.tanh(), dropout=0.0))
    save_weights(tmp_path / "lstm", bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4,
                                                                          seed=0)))
    load_weights(tmp_path / "lstm", into=explicit)
    defaults = bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=4, seed=2,
                                                     default_activations=True))
    load_weights(tmp_path / "lstm", into=defaults)
    norm = bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(4,), momentum=0.25)
    save_weights(tmp_path / "norm", bf.NormalizationLayer(norm))
    load_weights(tmp_path / "norm", into=bf.NormalizationLayer(attrs.evolve(norm, momentum=0.5)))
    with pytest.raises(bf.InvalidParameterError, match=r"the model's epsilon must be 1e-05, as in the file "
                                                       r"\(ignore=\('epsilon', 'activation'\) loads"):
        load_weights(tmp_path / "norm", into=bf.NormalizationLayer(attrs.evolve(
            norm, epsilon=1e-3, activation=bf.Activation.relu())))
    moving = bf.NormalizationParameters(type=bf.NormalizationType.batch(moving_mean=np.zeros(4),
                                                                        moving_variance=np.ones(4)),
                                        input_shape=(4,), momentum=0.25)
    save_weights(tmp_path / "bn", bf.NormalizationLayer(moving))
    with pytest.raises(bf.InvalidParameterError, match=r"the model's momentum must be 0.25, as in the file"):
        load_weights(tmp_path / "bn", into=bf.NormalizationLayer(attrs.evolve(moving, momentum=0.5)))


def test_load_into_a_container_names_the_layer_and_compares_its_elements(tmp_path, backend_name):
    save_weights(tmp_path / "trained", _model(backend_name))
    fp = bf.FilterParameters(backend=backend_name)
    other = _model(backend_name)
    relu = bf.FullyConnectedParameters.random(input_size=4, output_size=3, activation=bf.Activation.relu())
    changed = bf.Sequential({**other.layers, "head": bf.FullyConnectedLayer(relu, fp)})
    message = re.escape("the model's layer 'head' activation must be Activation(function="
                        "<ActivationFunction.identity: 0>, alpha=0.0, beta=0.0), as in the file "
                        "(ignore=('activation',) loads its arrays anyway); got Activation(function="
                        "<ActivationFunction.relu: 1>, alpha=0.0, beta=0.0).")
    with pytest.raises(bf.InvalidParameterError, match=f"{message}$"):
        load_weights(tmp_path / "trained", into=changed)
    load_weights(tmp_path / "trained", into=changed, ignore=["activation"])
    # Without its LastStep (same arrays), or with its elements in another order: refused.
    layers = dict(other.layers)
    without = bf.Sequential({name: layer for name, layer in layers.items() if name != "last"})
    message = re.escape("the model's elements must be ['lstm', 'last', 'norm', 'head'] in this order "
                        "(LastStep elements included), as in the file; got ['lstm', 'norm', 'head'].")
    with pytest.raises(bf.InvalidParameterError, match=f"{message}$"):
        load_weights(tmp_path / "trained", into=without)
    norm = bf.NormalizationParameters(type=bf.NormalizationType.layer(), input_shape=(4,))
    rebuilt = bf.Sequential({"lstm": layers["lstm"], "last": bf.LastStep(),
                             "norm": bf.NormalizationLayer(norm, fp), "head": layers["head"]})
    load_weights(tmp_path / "trained", into=rebuilt)
    as_dict = {"lstm": layers["lstm"], "norm": layers["head"], "head": layers["norm"]}
    with pytest.raises(bf.InvalidParameterError,
                       match=r"the model's layer 'norm' must be of type NormalizationLayer, as in the file; "
                             r"got 'FullyConnectedLayer'"):
        load_weights(tmp_path / "trained", into=as_dict)


def test_load_weights_ignore_is_checked():
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=2, output_size=2))
    for bad, match in [
        ("batch_first", r"load_weights\(ignore\) must be a tuple of configuration field names, e\.g\. "
                        r"\('batch_first',\); got 'batch_first'\."),
        ((1,), r"must be a tuple of configuration field names"),
        (("batch_first",), r"load_weights\(ignore\) must be configuration fields of the model's layers "
                           r"\(activation, dtype, input_size, output_size\); got 'batch_first'\."),
        (("seed", "dtype", "x"), r"got \['seed', 'x'\]\."),
    ]:
        with pytest.raises(bf.InvalidParameterError, match=match):
            load_weights("never-read", into=head, ignore=bad)
    with pytest.raises(bf.InvalidParameterError, match=r"load_weights\(ignore\) must be empty unless into="):
        load_weights("never-read", ignore=("dtype",))


def test_every_setting_a_state_holds_is_a_configuration_field_ignore_takes():
    """The table of configuration fields covers every entry of every state that is not an array."""
    from bnnsfw.serialization import _CONFIGURATION, _NOT_CONFIGURATION

    lstm = bf.LSTMParameters.random(input_size=2, hidden_size=3, num_layers=2, bidirectional=True,
                                    projection_size=2, layer_norm=True, seed=0)
    variants = attrs.evolve(lstm, clip=1.0, cell_clip=2.0, projection_clip=3.0, input_forget=True,
                            direction_activations=(bf.LSTMActivations(),) * 2)
    reverse = bf.LSTMParameters.random(input_size=2, hidden_size=3, reverse=True)
    rms = bf.NormalizationParameters(type=bf.NormalizationType.rms(), input_shape=(3,))
    for type_name, parameters in [("lstm", variants), ("lstm", reverse), ("normalization", rms),
                                  ("fully_connected", bf.FullyConnectedParameters.random(input_size=2,
                                                                                         output_size=2))]:
        settings = {key for key, value in parameters.to_state().items()
                    if not isinstance(value, np.ndarray) and not (value is None and (
                        key.startswith(("input_gate/", "forget_gate/", "candidate_gate/", "output_gate/"))
                        or key in ("bias", "beta", "gamma", "moving_mean", "moving_variance")))}
        assert settings - set(_NOT_CONFIGURATION) <= set(_CONFIGURATION[type_name]), type_name


def test_final_state_and_softmax_elements_come_back(tmp_path, rng):
    lstm = bf.LSTMParameters.random(input_size=2, hidden_size=3, bidirectional=True, batch_first=True, seed=2)
    dense = bf.FullyConnectedParameters.random(input_size=6, output_size=3, seed=3)
    model = bf.Sequential({"bi": bf.LSTMLayer(lstm), "bi:last": bf.FinalState(2),
                           "head": bf.FullyConnectedLayer(dense), "head:softmax": bf.Softmax()})
    save_weights(tmp_path / "model", model)
    loaded = load_weights(tmp_path / "model")
    kept = {name: repr(element) for name, element in loaded.layers.items()
            if not isinstance(element, bf.Filter)}
    assert kept == {"bi:last": "FinalState(num_directions=2)", "head:softmax": "Softmax()"}
    x = rng.standard_normal((2, 4, 2)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x), model(x))
    load_weights(tmp_path / "model", into=model)


# Checkpoints: optimizers, schedules, dropout generators and the caller's metadata in the same file.
def _recurrent_model(seed, backend_name="numpy"):
    options = bf.FilterParameters(backend=backend_name)
    return bf.Sequential({
        "lstm": bf.LSTMLayer(bf.LSTMParameters.random(input_size=2, hidden_size=3, num_layers=2, dropout=0.5,
                                                      seed=seed, dtype=np.float64), options),
        "last": bf.LastStep(),
        "head": bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(
            input_size=3, output_size=1, seed=seed + 1, dtype=np.float64), options),
    })


def _training(optimizer=None):
    """An Adam driven by a warm-up then a cosine, the checkpoint's training objects by name."""
    optimizer = optimizer or bf.optimizers.Adam(lr=0.05)
    schedule = bf.SequentialSchedule(optimizer, [bf.LinearWarmup(optimizer, 0.5, total_steps=2),
                                                 bf.CosineAnnealing(optimizer, t_max=3)], milestones=[2])
    return {"optimizer": optimizer, "schedule": schedule}


def _train(model, training, x, steps):
    for _ in range(steps):  # the loss ½‖y‖², one "epoch" per step
        grads = model.apply_backward(model.apply(x, training=True))
        training["optimizer"].step(model.parameters(), grads.parameters())
        training["schedule"].step()


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_a_checkpoint_resumes_bit_for_bit(tmp_path, backend_name, suffix):
    x = np.random.default_rng(3).standard_normal((4, 2, 2))
    model, training = _recurrent_model(0, backend_name), _training()
    _train(model, training, x, 2)
    path = tmp_path / f"checkpoint{suffix}"
    save_weights(path, model, training=training, metadata={"epoch": 2})
    _train(model, training, x, 2)

    fresh, fresh_training = _recurrent_model(7, backend_name), _training(bf.optimizers.Adam(lr=0.9))
    _, metadata = load_weights(path, into=fresh, training=fresh_training, return_metadata=True)
    assert metadata == {"epoch": 2}
    assert fresh_training["optimizer"].step_count == 2 and fresh_training["schedule"].epoch == 2
    _train(fresh, fresh_training, x, 2)
    rebuilt_training = _training()
    rebuilt = load_weights(path, bf.FilterParameters(backend=backend_name), training=rebuilt_training)
    _train(rebuilt, rebuilt_training, x, 2)
    for resumed, resumed_training in ((fresh, fresh_training), (rebuilt, rebuilt_training)):
        assert resumed_training["optimizer"].learning_rate == training["optimizer"].learning_rate
        assert resumed_training["optimizer"].state_dict().keys() == training["optimizer"].state_dict().keys()
        for name, array in model.parameters().items():  # the same code on both sides: bitwise
            np.testing.assert_array_equal(resumed.parameters()[name], array, err_msg=name)
        resumed.close()
    model.close()


def test_checkpoint_metadata_is_plain_json_and_the_rest_is_refused_naming_where(tmp_path):
    head = bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=2, output_size=1))
    kept = {"epoch": 3, "loss": 0.25, "note": "ok", "flags": [True, None], "shape": (2, 3),
            "nested": {"a": {}}}
    save_weights(tmp_path / "m", head, metadata=kept)
    layer, metadata = load_weights(tmp_path / "m", return_metadata=True)
    assert metadata == {**kept, "shape": [2, 3]}
    layer.close()
    save_weights(tmp_path / "plain", head)
    assert load_weights(tmp_path / "plain", return_metadata=True)[1] == {}
    for bad, match in [
        ({"loss": np.float32(0.5)},
         r"save_weights\(metadata\)\['loss'\] must be a dict, list, tuple, str, int, finite float, bool or "
         r"None \(convert NumPy values"),
        ({"loss": float("nan")}, r"save_weights\(metadata\)\['loss'\] must be a finite number"),
        ({"runs": [1, {2: "x"}]}, r"save_weights\(metadata\)\['runs'\]\[1\] keys must be str"),
        ({"tags": {"a", "b"}}, r"save_weights\(metadata\)\['tags'\] must be a dict, .*got 'set'"),
        ([("epoch", 1)], r"save_weights\(metadata\) must be a dict of JSON-able values; got 'list'"),
    ]:
        with pytest.raises(bf.InvalidParameterError, match=match):
            save_weights(tmp_path / "bad", head, metadata=bad)
    assert not (tmp_path / "bad.safetensors").exists()
    head.close()


def test_checkpoint_training_objects_are_checked_on_save_and_load(tmp_path):
    model, training = _recurrent_model(0), _training()
    x = np.random.default_rng(3).standard_normal((4, 2, 2))
    _train(model, training, x, 1)
    for bad, match in [({"lstm": training["optimizer"]}, r"keys must be names other than the model's layer"),
                       ({"a/b": training["optimizer"]}, "without '/'"),
                       ({"loss": bf.losses.MeanSquaredError()}, r"\['loss'\] must be a bnnsfw optimizer or")]:
        with pytest.raises(bf.InvalidParameterError, match=match):
            save_weights(tmp_path / "c", model, training=bad)
    save_weights(tmp_path / "plain", model)
    match = r"plain.safetensors'\): training keys must be names the file holds \(none: it is no checkpoint\)"
    with pytest.raises(bf.InvalidParameterError, match=match):
        load_weights(tmp_path / "plain", into=model, training={"optimizer": bf.optimizers.Adam()})
    save_weights(tmp_path / "c", model, training=training)
    sgd = bf.optimizers.SGD(lr=0.1)
    match = r"training\['optimizer'\] must be the state of a SGD, as the optimizer given; got 'Adam'"
    with pytest.raises(bf.InvalidParameterError, match=match):
        load_weights(tmp_path / "c", into=model, training={"optimizer": sgd})
    other = bf.optimizers.Adam()
    other_schedule = bf.StepDecay(other, 2)
    match = r"training\['schedule'\] must be a schedule like the one given"
    with pytest.raises(bf.InvalidParameterError, match=match):
        load_weights(tmp_path / "c", into=model, training={"optimizer": other, "schedule": other_schedule})
    assert other.step_count == 0 and sgd.step_count == 0  # nothing was loaded
    model.close()


def test_an_optimizer_state_over_other_parameters_is_refused_naming_them(tmp_path):
    model = _recurrent_model(0)
    named = {f"renamed.{key}": array for key, array in model.parameters().items() if key.startswith("head.")}
    elsewhere = bf.optimizers.Adam()
    elsewhere.step(named, {key: np.ones_like(a) for key, a in named.items()})
    save_weights(tmp_path / "c", model, training={"optimizer": elsewhere})
    fresh = bf.optimizers.Adam()
    match = (r"training\['optimizer'\] must be an optimizer state over the model's parameters \(some or all "
             r"of them\); got \"names the model does not have: "
             r"\['renamed.head.weights', 'renamed.head.bias'\]")
    with pytest.raises(bf.InvalidParameterError, match=match):
        load_weights(tmp_path / "c", into=model, training={"optimizer": fresh})
    single = {"head.weights": model.parameters()["head.weights"].astype(np.float32)}
    in_float32 = bf.optimizers.Adam()
    in_float32.step(single, {"head.weights": np.ones_like(single["head.weights"])})
    save_weights(tmp_path / "c", model, training={"optimizer": in_float32})
    match = (r"state of 'head.weights' must be of the model's shape \(1, 3\) and dtype float64; "
             r"got 'shape \(1, 3\) float32")
    with pytest.raises(bf.InvalidParameterError, match=match):
        load_weights(tmp_path / "c", into=model, training={"optimizer": fresh})
    assert fresh.step_count == 0
    model.close()


def _optimizer(meta):
    return meta["training"]["optimizer"]


def _tampered(tmp_path, change):
    """A checkpoint (``.npz``) whose metadata ``change`` edited."""
    model, training = _recurrent_model(0), _training()
    x = np.random.default_rng(3).standard_normal((4, 2, 2))
    _train(model, training, x, 1)
    save_weights(tmp_path / "c.npz", model, training=training)
    model.close()
    with np.load(tmp_path / "c.npz") as data:
        arrays = {key: data[key] for key in data.files}
    meta = json.loads(str(arrays.pop("__meta__")))
    change(meta, arrays)
    np.savez(tmp_path / "bad.npz", __meta__=np.array(json.dumps(meta)), **arrays)
    return tmp_path / "bad.npz"


@pytest.mark.parametrize("change, match", [
    (lambda m, a: _optimizer(m).update(shapes="lots"), r"training\['optimizer'\] shapes must be a list"),
    (lambda m, a: _optimizer(m).update(step_count=-1), r"\['step_count'\] must be an integer >= 0"),
    (lambda m, a: _optimizer(m).update(parameter_names=[1, 2]), r"parameter_names must be None or"),
    (lambda m, a: _optimizer(m).update(learning_rate=-1.0), r"learning_rate must be a finite number >= 0"),
    (lambda m, a: _optimizer(m).update(learning_rate="fast"), r"learning_rate must be a number"),
    (lambda m, a: m["training"]["schedule"].update(epoch=1.5), r"\['epoch'\] must be an integer >= 0"),
    (lambda m, a: m["training"].update(optimizer=[]), r"training\['optimizer'\] must be a JSON object"),
    (lambda m, a: a.update({"optimizer/shape.0": np.zeros(1, np.int64)}),
     r"arrays must be state arrays only"),
    (lambda m, a: a.update({"optimizer/exp_avg.0": np.zeros(1)}), r"\['exp_avg.0'\] must be of shape"),
    (lambda m, a: a.pop("optimizer/exp_avg_sq.1"), r"missing keys \['exp_avg_sq.1'\]"),
    (lambda m, a: m["random"]["lstm"].update(dropout_generator={"bit_generator": "MT19937"}),
     r"random\['lstm'\]\['dropout_generator'\] must be a random generator state"),
    (lambda m, a: m["random"].update(head={"x": 1}),
     r"random\['head'\] must be the random state of the model's"),
    (lambda m, a: m.update(random=[]), r"random must be a JSON object by the file's layer names"),
    (lambda m, a: m.update(metadata=[1]), r"metadata must be a JSON object"),
])
def test_a_tampered_checkpoint_is_refused_and_changes_nothing(tmp_path, change, match):
    path = _tampered(tmp_path, change)
    model, training = _recurrent_model(5), _training()
    before = {key: array.copy() for key, array in model.state_dict().items()}
    generator = model.layers["lstm"]._runtime_state()
    with pytest.raises(bf.BNNSError, match=match):  # InvalidParameterError, ShapeError or DTypeError
        load_weights(path, into=model, training=training, return_metadata=True)
    assert training["optimizer"].step_count == 0 and training["optimizer"].learning_rate == 0.025
    assert training["schedule"].epoch == 0 and model.layers["lstm"]._runtime_state() == generator
    for key, array in model.state_dict().items():
        np.testing.assert_array_equal(array, before[key])
    model.close()
