"""What the built-in backends share: the reference implementation each of them starts from.

- :mod:`.lstm_stack`: the LSTM operations of the contract — weight packing, the training
  cache's layout, the stack of layers and directions, and the threads that run two of them at
  once — on top of per-sequence kernels a backend may replace;
- :mod:`.lstm_kernels`: the step plan, the packed weights and the reference per-sequence
  kernels of BNNS's cell (the fast kernels of ``scipy_blas`` and ``numba`` replace these);
- :mod:`.lstm_general`: the kernels of the SPEC §4.1 variants (clip, projection, layer
  norm, ``input_forget``), which every backend runs;
- :mod:`.normalization_kernels`: the reference normalization kernels.

The ``numpy`` backend is these with ``numpy.matmul`` for products; a plain, readable version
of the LSTM's forward and backward passes for learners is :mod:`bnnsfw.backends.numpy.lstm_bptt`.
"""
