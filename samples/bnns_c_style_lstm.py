"""An LSTM through the BNNS C-style API, step by step as a BNNS program would do it.

1. describe the layer: sizes, flags, the data descriptors and one gate descriptor per gate;
2. ask for the training-cache capacity;
3. allocate the cache;
4. run the forward pass, filling the cache;
5. run the backward pass, reading the output deltas and writing input and weight deltas.

Every call here carries Apple's deprecation (macOS 15 / iOS 18); the warnings name the
bnnsfw object API that replaces each one. Run ``bnnsfw deprecations --scan samples/`` to list
them. Usage: ``python samples/bnns_c_style_lstm.py [--quick]``.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from bnnsfw.bnns import (
    BNNSComputeLSTMTrainingCacheCapacity,
    BNNSDirectApplyLSTMBatchBackward,
    BNNSDirectApplyLSTMBatchTrainingCaching,
    BNNSLayerParametersLSTM,
    BNNSLSTMDataDescriptor,
    BNNSLSTMGateDescriptor,
    BNNSNDArrayDescriptor,
)
from bnnsfw.enums import DataLayout, LayerFlags

GATES = ("input_gate", "forget_gate", "candidate_gate", "output_gate")


def described(array: np.ndarray, layout: DataLayout | None = None) -> BNNSNDArrayDescriptor:
    """A descriptor of a dense float32 array (sizes listed fastest dimension first)."""
    return BNNSNDArrayDescriptor.from_array(array, layout)


def main(quick: bool = False) -> int:
    rng = np.random.default_rng(0)
    seq_len, batch, input_size, hidden = (4, 2, 3, 5) if quick else (20, 8, 16, 32)
    layers, directions = 2, 2
    bound = 1 / np.sqrt(hidden)

    def weights(*shape: int) -> np.ndarray:
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    # 1. Describe the layer. Input and output in the SNE layout: (T, N, features) in NumPy order.
    x = rng.standard_normal((seq_len, batch, input_size)).astype(np.float32)
    y = np.zeros((seq_len, batch, directions * hidden), np.float32)
    states = (layers * directions, batch, hidden)
    h_t, c_t = np.zeros(states, np.float32), np.zeros(states, np.float32)
    gates = {
        name: BNNSLSTMGateDescriptor(
            iw_desc=(described(weights(directions, hidden, input_size)),
                     described(weights(layers - 1, directions, hidden, directions * hidden))),
            hw_desc=described(weights(layers, directions, hidden, hidden)),
            b_desc=described(weights(layers, directions, hidden)),
        )
        for name in GATES
    }
    params = BNNSLayerParametersLSTM(
        input_size=input_size, hidden_size=hidden, batch_size=batch, num_layers=layers, seq_len=seq_len,
        lstm_flags=LayerFlags.lstm_bidirectional | LayerFlags.lstm_default_activations,
        input_descriptor=BNNSLSTMDataDescriptor(data_desc=described(x, DataLayout.sne)),
        output_descriptor=BNNSLSTMDataDescriptor(data_desc=described(y, DataLayout.sne),
                                                 hidden_desc=described(h_t), cell_state_desc=described(c_t)),
        **gates,
    )

    # 2. and 3. Query the training-cache capacity and allocate the cache.
    capacity = BNNSComputeLSTMTrainingCacheCapacity(params)
    if capacity < 0:
        print("capacity query failed (see the log)")
        return 1
    cache = np.empty(capacity, np.uint8)
    print(f"training cache: {capacity} bytes for T={seq_len}, N={batch}, "
          f"{layers} layers x {directions} directions")

    # 4. Forward, filling the cache.
    if BNNSDirectApplyLSTMBatchTrainingCaching(params, None, cache, capacity) != 0:
        print("forward failed (see the log)")
        return 1
    print(f"forward: output {y.shape}, |y| mean {np.abs(y).mean():.4f}, final hidden {h_t.shape}")

    # 5. Backward. The delta parameters hold dL/dy in their output descriptor and receive
    # dL/dx and every gate's weight deltas.
    dy = (y - 0.5).astype(np.float32)                       # gradient of 0.5·|y − 0.5|²
    dx = np.zeros_like(x)
    delta_gates = {
        name: BNNSLSTMGateDescriptor(
            iw_desc=(described(np.zeros((directions, hidden, input_size), np.float32)),
                     described(np.zeros((layers - 1, directions, hidden, directions * hidden), np.float32))),
            hw_desc=described(np.zeros((layers, directions, hidden, hidden), np.float32)),
            b_desc=described(np.zeros((layers, directions, hidden), np.float32)),
        )
        for name in GATES
    }
    delta = BNNSLayerParametersLSTM(
        input_size=input_size, hidden_size=hidden, batch_size=batch, num_layers=layers, seq_len=seq_len,
        lstm_flags=params.lstm_flags,
        input_descriptor=BNNSLSTMDataDescriptor(data_desc=described(dx, DataLayout.sne)),
        output_descriptor=BNNSLSTMDataDescriptor(data_desc=described(dy, DataLayout.sne)),
        **delta_gates,
    )
    if BNNSDirectApplyLSTMBatchBackward(params, delta, None, cache, capacity) != 0:
        print("backward failed (see the log)")
        return 1
    forget_bias_delta = delta_gates["forget_gate"].b_desc.data
    print(f"backward: |dL/dx| mean {np.abs(dx).mean():.4f}, forget-gate bias delta norm "
          f"{np.linalg.norm(forget_bias_delta):.4f}")
    return 0


if __name__ == "__main__":
    with warnings.catch_warnings():
        # Each deprecation is reported once per call site; that is the point of the sample.
        warnings.simplefilter("default", DeprecationWarning)
        sys.exit(main(quick="--quick" in sys.argv[1:]))
