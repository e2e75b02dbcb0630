"""``bnnsfw bench``: time the LSTM and normalization layers, optionally beside PyTorch and ONNX Runtime.

Each row is timed as the median and the minimum per call after a warm-up. LSTM rows also
report GFLOP/s (forward ``8·T·N·H·(I+H)`` per layer and direction, training three times that)
and the fraction of the single-precision matrix-multiply peak measured in the same run.
Every layer has had its ``parameters()`` handed out, as in a trained model (each call then
first compares the weights with those it packed); the row ``T1 N1 I4 H8`` also times a fresh
layer, and the ``step`` rows one step of ``LSTMLayer.stream()``.

``--compare torch`` runs the same work, with the same weights and thread count, through
PyTorch's CPU kernels in the same process and prints the time ratio bnnsfw / PyTorch;
``--compare onnxruntime`` the inference rows through an ONNX Runtime session of each layer
written by :func:`bnnsfw.onnx.export` (a step: the graph of T = 1 with the states passed in and
read back); ``--compare torch,onnxruntime`` both. A library's outputs must agree with bnnsfw's
before it is timed. The libraries are timed in alternating blocks of calls, never call by call:
a library's idle threads keep spinning for a while after a call and would take a core from the
others. Beside the ratio of the two medians, the quartiles of the rounds' ratios (one block of
each, within a second of each other) show how far the comparison moved while it ran.

A full run also measures, each in a fresh process, the peak memory of one training step of
the long-sequence row, the latency of the first call of the demo's model with a cold and a
warm compile cache, and, in the default ``background`` compile mode from a cold cache, every
training step of that model until its kernels are compiled and the longest of them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import attrs
import numpy as np

from ._options import backend_names, check_output_path, integer

__all__ = ["main", "run", "BenchRow", "LSTM_CASES", "STREAM_CASES", "NORMALIZATION_CASES"]


@attrs.frozen(kw_only=True)
class LSTMCase:
    name: str
    seq_len: int
    batch: int
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    #: Also measure the peak memory of one training step, in a fresh process (full runs only).
    memory: bool = False
    #: Also time the forward of a layer whose ``parameters()`` were never handed out (which
    #: skips the comparison of the weights before each call).
    fresh: bool = False

    def flops(self) -> float:
        """Forward floating-point operations: 8·T·N·H·(I_l + H) summed over layers and directions."""
        d = 2 if self.bidirectional else 1
        total = 0.0
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else d * self.hidden_size
            total += d * 8.0 * self.seq_len * self.batch * self.hidden_size * (width + self.hidden_size)
        return total

    def quick(self) -> "LSTMCase":
        if self.seq_len == 1:  # a per-call row: already tiny
            return self
        return attrs.evolve(self, seq_len=max(2, self.seq_len // 8), batch=max(1, self.batch // 8))


@attrs.frozen(kw_only=True)
class NormalizationCase:
    name: str
    kind: str
    shape: tuple[int, ...]
    groups: int = 1

    def quick(self) -> "NormalizationCase":
        n, c, *rest = self.shape
        return attrs.evolve(self, shape=(max(2, n // 8), c, *[max(2, s // 4) for s in rest]))


LSTM_CASES = (
    LSTMCase(name="S", seq_len=100, batch=1, input_size=32, hidden_size=64),
    # fewer sequences than a vector holds: the steps' products as a tile of their states as rows
    LSTMCase(name="S4", seq_len=100, batch=4, input_size=32, hidden_size=64),
    LSTMCase(name="M", seq_len=50, batch=16, input_size=128, hidden_size=128),
    LSTMCase(name="L", seq_len=64, batch=32, input_size=256, hidden_size=256),
    LSTMCase(name="XL", seq_len=32, batch=64, input_size=512, hidden_size=512),
    LSTMCase(name="M-2L-bi", seq_len=50, batch=16, input_size=128, hidden_size=128, num_layers=2,
             bidirectional=True),
    LSTMCase(name="demo", seq_len=32, batch=32, input_size=1, hidden_size=32, num_layers=2),
    LSTMCase(name="long", seq_len=2000, batch=8, input_size=256, hidden_size=256, memory=True),
    # the cost of a call itself, beside nearly no arithmetic
    LSTMCase(name="T1 N1 I4 H8", seq_len=1, batch=1, input_size=4, hidden_size=8, fresh=True),
)
#: One step of ``LSTMLayer.stream()`` (T = 1, N = 1), beside one step run with the states
#: passed in and read back by each library compared.
STREAM_CASES = (
    LSTMCase(name="I32 H64", seq_len=1, batch=1, input_size=32, hidden_size=64),
    LSTMCase(name="I32 H64 2L", seq_len=1, batch=1, input_size=32, hidden_size=64, num_layers=2),
)
NORMALIZATION_CASES = (
    NormalizationCase(name="batch", kind="batch", shape=(64, 64, 32, 32)),
    NormalizationCase(name="layer", kind="layer", shape=(64, 128, 768)),
    NormalizationCase(name="group", kind="group", shape=(32, 64, 32, 32), groups=8),
    NormalizationCase(name="instance", kind="instance", shape=(32, 64, 32, 32)),
)


@attrs.define(kw_only=True)
class BenchRow:
    """One measured piece of work."""

    name: str
    work: str
    backend: str
    median_ms: float
    min_ms: float
    gflops: float | None = None
    peak_fraction: float | None = None
    cache_bytes: int | None = None
    #: Peak memory of one training step above the process before it, and that over the
    #: training cache plus the inputs (``x`` and the output gradient).
    peak_step_bytes: int | None = None
    peak_over_cache_and_inputs: float | None = None
    torch_median_ms: float | None = None
    #: The ratio bnnsfw / PyTorch of each round's two blocks (the medians of their timed calls),
    #: as its lower quartile, median and upper quartile: the spread of a comparison on a machine
    #: whose speed drifts (each round's two blocks run within a second of each other).
    round_ratios: tuple[float, float, float] | None = None
    #: The same for ONNX Runtime (inference rows only).
    ort_median_ms: float | None = None
    ort_round_ratios: tuple[float, float, float] | None = None

    @property
    def ratio(self) -> float | None:
        """bnnsfw / PyTorch, the ratio of the two medians."""
        if self.torch_median_ms is None:
            return None
        return self.median_ms / self.torch_median_ms

    @property
    def ort_ratio(self) -> float | None:
        """bnnsfw / ONNX Runtime, the ratio of the two medians."""
        if self.ort_median_ms is None:
            return None
        return self.median_ms / self.ort_median_ms

    def add_peers(self, timing: Timing, names: Sequence[str]) -> None:
        """Record the libraries compared, ``names`` in the order of ``timing.peers``."""
        for name, peer in zip(names, timing.peers):
            if name == "torch":
                self.torch_median_ms, self.round_ratios = peer.median * 1e3, peer.round_ratios
            elif name == "onnxruntime":
                self.ort_median_ms, self.ort_round_ratios = peer.median * 1e3, peer.round_ratios
            else:
                raise ValueError(f"add_peers(names): must name libraries of {PEERS}; got {name!r}")

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["ratio"] = self.ratio
        d["ort_ratio"] = self.ort_ratio
        return d


#: Untimed calls open every block of a comparison for at least this long: a library's threads
#: keep spinning after a call, waiting for the next one (OpenBLAS's for about 0.1 s of CPU
#: time, PyTorch's about 0.03 s), and a block started right after the other library's pays
#: for it (PyTorch's L-row forward took 23 ms right after 20 ms of NumPy products, 11 ms
#: after a rest). Resting instead of calling let the machine slow down (a sleep of the same
#: length made both libraries' next blocks up to 1.6 times slower).
BLOCK_LEAD_IN_S = 0.15


def _lead_in(f: Callable[[], object]) -> None:
    """Call ``f`` untimed for :data:`BLOCK_LEAD_IN_S` seconds (at least once)."""
    end = time.perf_counter() + BLOCK_LEAD_IN_S
    f()
    while time.perf_counter() < end:
        f()


@attrs.frozen
class PeerTiming:
    """What :func:`_time` measured of one library compared: its median seconds per call, and
    the quartiles and median of the rounds' ratios ``fn`` / it (:attr:`BenchRow.round_ratios`)."""

    median: float
    round_ratios: tuple[float, float, float]


@attrs.frozen
class Timing:
    """What :func:`_time` measured, in seconds per call."""

    median: float
    minimum: float
    #: One per library compared, in the order they were given.
    peers: tuple[PeerTiming, ...] = ()


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile (one value: itself three times)."""
    if len(values) < 2:
        return (values[0],) * 3
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _time(fn: Callable[[], object], *, warmup: int, repeats: int, budget: float,
          others: Sequence[Callable[[], object]] = ()) -> Timing:
    """Median and minimum seconds per call of ``fn`` (and the median of each of ``others``,
    the same work in the libraries compared, and the spread of the rounds' ratios).

    After ``warmup`` calls of each, they are run in alternating blocks of calls, each block
    long enough (about 20 ms) that the switch between libraries is a small part of it; the
    first call of every block is left out of the figures. In a comparison every block opens
    with :data:`BLOCK_LEAD_IN_S` seconds of untimed calls (:func:`_lead_in`), so that the other
    libraries' waiting threads have gone quiet. Rounds go on until each function has at least
    ``repeats`` timed calls and, within ``budget`` seconds, up to 50. A round is one block of
    each; its ratio to a library compared is that of ``fn``'s block's median to its block's.
    """
    functions = [fn, *others]
    for f in functions:
        for _ in range(warmup):
            f()
    blocks = []
    for f in functions:
        t0 = time.perf_counter()
        f()
        blocks.append(max(2, min(50, math.ceil(0.02 / max(time.perf_counter() - t0, 1e-6)))))
    times: list[list[float]] = [[] for _ in functions]
    rounds: list[list[float]] = [[] for _ in others]
    start = time.perf_counter()
    while (min(len(t) for t in times) < repeats
           or (time.perf_counter() - start < budget and min(len(t) for t in times) < 50)):
        medians = []
        for f, block, bucket in zip(functions, blocks, times):
            if others:
                _lead_in(f)
            timed = []
            for k in range(block):
                t0 = time.perf_counter()
                f()
                if k:
                    timed.append(time.perf_counter() - t0)
            bucket += timed
            medians.append(statistics.median(timed))
        for bucket, median in zip(rounds, medians[1:]):
            bucket.append(medians[0] / median)
    peers = tuple(PeerTiming(statistics.median(t), _quartiles(r)) for t, r in zip(times[1:], rounds))
    return Timing(statistics.median(times[0]), min(times[0]), peers)


def measure_peak(*, quick: bool = False) -> float:
    """Single-precision matrix-multiply GFLOP/s of this machine (a square sgemm through NumPy)."""
    n = 512 if quick else 1536
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), np.float32)
    best = _time(lambda: np.matmul(a, b, out=out), warmup=1, repeats=3 if quick else 5, budget=0.0).minimum
    return 2.0 * n**3 / best / 1e9


def blas_libraries() -> list[dict[str, Any]]:
    """The BLAS libraries loaded in this process, as threadpoolctl reports them: the package
    each came with (the folder that holds it, ``scipy.libs`` read as ``scipy``), the
    implementation, its version and the kernels it runs (OpenBLAS's name for them, chosen for
    the CPU when the library was loaded, or by ``OPENBLAS_CORETYPE``)."""
    from .._threadpool import blas_controller

    libraries = []
    for info in blas_controller().select(user_api="blas").info():
        folder = os.path.basename(os.path.dirname(info.get("filepath") or ""))
        libraries.append({"package": folder.removesuffix(".libs"), "implementation": info.get("internal_api"),
                          "version": info.get("version"), "kernels": info.get("architecture")})
    return libraries


def describe_blas(libraries: Sequence[dict[str, Any]], coretype: str | None) -> str:
    """One line naming :func:`blas_libraries`, and ``OPENBLAS_CORETYPE`` when it is set: it
    overrides OpenBLAS's choice of kernels for the CPU, which moves every BLAS figure."""
    names = ", ".join(f"{lib['implementation']} {lib['version']} from {lib['package']}"
                      + (f" ({lib['kernels']} kernels)" if lib["kernels"] else "") for lib in libraries)
    line = f"BLAS: {names or 'none found'}"
    if coretype is not None:
        line += f"; OPENBLAS_CORETYPE={coretype} is set: OpenBLAS runs those kernels whatever the CPU"
    return line


# ---------------------------------------------------------------- LSTM ---------------


def _lstm_layer(case: LSTMCase, backend: str | None, threads: int):
    import bnnsfw as bf

    params = bf.LSTMParameters.random(
        input_size=case.input_size, hidden_size=case.hidden_size, num_layers=case.num_layers,
        bidirectional=case.bidirectional, bias=True, seed=0, dtype=np.float32,
    )
    return params, bf.LSTMLayer(params, bf.FilterParameters(backend=backend, n_threads=threads))


def _torch_lstm(case: LSTMCase, params: Any):
    """A ``torch.nn.LSTM`` holding the same weights (gate order i, f, g, o in both)."""
    import torch

    lstm = torch.nn.LSTM(case.input_size, case.hidden_size, num_layers=case.num_layers,
                         bidirectional=case.bidirectional)
    gates = (params.input_gate, params.forget_gate, params.candidate_gate, params.output_gate)
    with torch.no_grad():
        for layer in range(case.num_layers):
            for direction in range(2 if case.bidirectional else 1):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                if layer == 0:
                    w_ih = np.concatenate([g.input_weights[0][direction] for g in gates])
                else:
                    w_ih = np.concatenate([g.input_weights[1][layer - 1, direction] for g in gates])
                w_hh = np.concatenate([g.hidden_weights[layer, direction] for g in gates])
                bias = np.concatenate([g.bias[layer, direction] for g in gates])
                getattr(lstm, "weight_ih" + suffix).copy_(torch.from_numpy(w_ih))
                getattr(lstm, "weight_hh" + suffix).copy_(torch.from_numpy(w_hh))
                getattr(lstm, "bias_ih" + suffix).copy_(torch.from_numpy(bias))
                getattr(lstm, "bias_hh" + suffix).zero_()
    return lstm


def _ort_session(ort: Any, layer: Any, threads: int, *, initial_states: bool = False) -> Any:
    """An ONNX Runtime session of ``layer`` exported by :func:`bnnsfw.onnx.export`, on the
    bench's thread count (``intra_op_num_threads``; one inter-op thread, run sequentially)."""
    from ..onnx import export

    options = ort.SessionOptions()
    options.intra_op_num_threads = _thread_count(threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    model = export(layer, initial_states=initial_states, check=False)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class ComparisonMismatch(Exception):
    """A library compared computed something else than bnnsfw: its figures would be worthless."""


#: How close a library compared must come to bnnsfw's float32 outputs before it is timed:
#: ``|theirs - ours| <= ATOL + RTOL·|ours|`` elementwise.
AGREEMENT_RTOL, AGREEMENT_ATOL = 1e-3, 1e-4


def _check_agreement(row: str, library: str, theirs: Any, ours: np.ndarray) -> None:
    theirs = np.asarray(theirs, dtype=np.float64).reshape(ours.shape)
    excess = np.abs(theirs - ours) - (AGREEMENT_ATOL + AGREEMENT_RTOL * np.abs(ours))
    if excess.max() > 0:
        worst = np.abs(theirs - ours).max()
        raise ComparisonMismatch(f"{row}: {library}'s output differs from bnnsfw's by up to {worst:.3g} "
                                 f"(allowed {AGREEMENT_ATOL} + {AGREEMENT_RTOL}·|bnnsfw's|); not timed")


def _bench_lstm(case: LSTMCase, opts: argparse.Namespace, peak: float, peers: Peers) -> list[BenchRow]:
    rng = np.random.default_rng(1)
    d = 2 if case.bidirectional else 1
    x = rng.standard_normal((case.seq_len, case.batch, case.input_size), dtype=np.float32)
    dy = rng.standard_normal((case.seq_len, case.batch, d * case.hidden_size), dtype=np.float32)
    params, layer = _lstm_layer(case, opts.backend, opts.threads)
    fresh = _lstm_layer(case, opts.backend, opts.threads)[1] if case.fresh else None
    layer.parameters()  # handed out, as in a trained model: each call first compares the weights
    cache_bytes = layer.training_cache_capacity(batch_size=case.batch, seq_len=case.seq_len)
    cache = np.empty(cache_bytes, np.uint8)
    name = f"lstm {case.name}"
    expected = layer.apply(x).output

    def forward() -> None:
        layer.apply(x)

    def train() -> None:
        layer.apply(x, training=True, training_cache=cache)
        layer.apply_backward(x, dy, training_cache=cache)

    inference: dict[str, Callable[[], object]] = {}
    training: dict[str, Callable[[], object]] = {}
    if peers.torch is not None:
        torch = peers.torch
        lstm = _torch_lstm(case, params)
        tx = torch.from_numpy(x)
        tdy = torch.from_numpy(dy)

        def t_forward() -> Any:
            with torch.no_grad():
                return lstm(tx)[0]

        def t_train() -> None:
            xr = tx.detach().requires_grad_(True)
            out, _ = lstm(xr)
            out.backward(tdy)

        _check_agreement(name, "PyTorch", t_forward().numpy(), expected)
        inference["torch"], training["torch"] = t_forward, t_train
    if peers.ort is not None:
        session = _ort_session(peers.ort, layer, opts.threads)
        feed = {"input": x}

        def o_forward() -> Any:
            return session.run(["output"], feed)[0]

        _check_agreement(name, "ONNX Runtime", o_forward(), expected)
        inference["onnxruntime"] = o_forward
    rows = []
    works = [("fwd", forward, case.flops(), inference), ("fwd+bwd", train, 3 * case.flops(), training)]
    if fresh is not None:
        works.insert(1, ("fwd, fresh", lambda: fresh.apply(x), case.flops(), {}))
    for work, fn, flops, theirs in works:
        timing = _time(fn, warmup=1, repeats=opts.repeats, budget=opts.budget, others=list(theirs.values()))
        gflops = flops / timing.median / 1e9
        row = BenchRow(name=name, work=work, backend=layer.backend.name,
                       median_ms=timing.median * 1e3, min_ms=timing.minimum * 1e3, gflops=gflops,
                       peak_fraction=gflops / peak, cache_bytes=cache_bytes if work == "fwd+bwd" else None)
        row.add_peers(timing, list(theirs))
        rows.append(row)
    layer.close()
    if fresh is not None:
        fresh.close()
    if case.memory and not opts.quick:
        figures = peak_training_memory(case, opts.backend)
        rows[-1].peak_step_bytes = figures["step_bytes"]
        rows[-1].peak_over_cache_and_inputs = figures["step_bytes"] / figures["cache_and_inputs_bytes"]
    return rows


def _bench_stream(case: LSTMCase, opts: argparse.Namespace, peak: float, peers: Peers) -> BenchRow:
    """One step of a stream (the layer's ``parameters()`` handed out), and one step with the
    states passed in and read back in each library compared."""
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((8, case.batch, case.input_size), dtype=np.float32)
    params, layer = _lstm_layer(case, opts.backend, opts.threads)
    layer.parameters()
    stream = layer.stream(batch_size=case.batch)
    expected = np.stack([stream.step(x) for x in xs])  # from zero states
    stream.reset()
    out = np.empty((case.batch, case.hidden_size), np.float32)
    name = f"lstm step {case.name}"

    def step() -> None:
        stream.step(xs[0], out=out)

    theirs: dict[str, Callable[[], object]] = {}
    zeros = np.zeros((case.num_layers, case.batch, case.hidden_size), np.float32)
    if peers.torch is not None:
        torch = peers.torch
        lstm = _torch_lstm(case, params)
        tx = torch.from_numpy(xs)
        t_state = [torch.from_numpy(zeros), torch.from_numpy(zeros)]

        def t_step(t: int = 0) -> Any:
            with torch.no_grad():
                y, (t_state[0], t_state[1]) = lstm(tx[t:t + 1], (t_state[0], t_state[1]))
            return y

        _check_agreement(name, "PyTorch", np.stack([t_step(t).numpy() for t in range(len(xs))]), expected)
        t_state[:] = [torch.from_numpy(zeros), torch.from_numpy(zeros)]
        theirs["torch"] = t_step
    if peers.ort is not None:
        session = _ort_session(peers.ort, layer, opts.threads, initial_states=True)
        feed = {"input": xs[:1], "initial_hidden": zeros, "initial_cell": zeros}

        def o_step(t: int = 0) -> Any:
            feed["input"] = xs[t:t + 1]
            y, feed["initial_hidden"], feed["initial_cell"] = session.run(None, feed)
            return y

        _check_agreement(name, "ONNX Runtime", np.stack([o_step(t) for t in range(len(xs))]), expected)
        feed.update(initial_hidden=zeros, initial_cell=zeros)
        theirs["onnxruntime"] = o_step
    timing = _time(step, warmup=1, repeats=opts.repeats, budget=opts.budget, others=list(theirs.values()))
    gflops = case.flops() / timing.median / 1e9
    row = BenchRow(name=name, work="step", backend=layer.backend.name, median_ms=timing.median * 1e3,
                   min_ms=timing.minimum * 1e3, gflops=gflops, peak_fraction=gflops / peak)
    row.add_peers(timing, list(theirs))
    layer.close()
    return row


# ---------------------------------------------------------------- fresh processes -------
_MEMORY_PROBE = """
import json, sys
import numpy as np
from bnnsfw.cli.bench import LSTMCase, _lstm_layer, _rss
case, backend = LSTMCase(**json.loads(sys.argv[1])), sys.argv[2]
params, layer = _lstm_layer(case, backend, 0)
small = np.zeros((2, 2, case.input_size), np.float32)  # compile (or load) the kernels first
out = layer.apply(small, training=True)
layer.apply_backward(small, np.ones_like(out.output), training_cache=out.training_cache)
del out
before = _rss(reset_peak=True)
d = 2 if case.bidirectional else 1
rng = np.random.default_rng(1)
x = rng.standard_normal((case.seq_len, case.batch, case.input_size), dtype=np.float32)
dy = rng.standard_normal((case.seq_len, case.batch, d * case.hidden_size), dtype=np.float32)
cache = np.empty(layer.training_cache_capacity(batch_size=case.batch, seq_len=case.seq_len), np.uint8)
cache.fill(0)
layer.apply(x, training=True, training_cache=cache)
grads = layer.apply_backward(x, dy, training_cache=cache)
peak = _rss(peak=True)
inputs = cache.nbytes + x.nbytes + dy.nbytes
print(json.dumps({"step_bytes": peak - before, "cache_and_inputs_bytes": inputs}))
"""


def _rss(*, reset_peak: bool = False, peak: bool = False) -> int:
    """This process's resident memory in bytes (Linux ``/proc``; ``getrusage`` elsewhere):
    the current one, or with ``peak`` the highest since the last ``reset_peak``."""
    try:
        if reset_peak:
            with open("/proc/self/clear_refs", "w") as fh:  # resets VmHWM (Linux ≥ 4.0)
                fh.write("5")
        with open("/proc/self/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["VmHWM" if peak else "VmRSS"].split()[0]) * 1024
    except OSError:  # pragma: no cover - not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_training_memory(case: LSTMCase, backend: str) -> dict[str, int]:
    """In a fresh process: the peak resident memory of one training step (forward with a cache,
    backward) above the process before it, beside the size of the cache plus ``x`` and ``dy``
    (both in bytes). The step's own arrays (inputs, cache, results, scratch) are all counted."""
    fields = {f.name: getattr(case, f.name) for f in attrs.fields(LSTMCase)}
    done = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, json.dumps(fields), backend],
                          capture_output=True, text=True, check=True)
    figures: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


_LATENCY_PROBE = """
import time
start = time.perf_counter()
import numpy as np
import bnnsfw as bf
imported = time.perf_counter()
import sys
from bnnsfw.cli.bench import LSTMCase, _lstm_layer
case = LSTMCase(name="demo", seq_len=32, batch=32, input_size=1, hidden_size=32, num_layers=2)
params, layer = _lstm_layer(case, sys.argv[1], 0)
x = np.zeros((case.seq_len, case.batch, 1), np.float32)
out = layer.apply(x, training=True)
layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
print(imported - start, time.perf_counter() - imported)
"""


def first_call_latency(backend: str, cache_dir: str | None) -> tuple[float, float]:
    """In a fresh process: seconds to import bnnsfw, and to create the demo's model and run its
    first training step (forward and backward). With ``cache_dir`` the compiled kernels are
    kept there (``NUMBA_CACHE_DIR``), so the first run into an empty folder compiles them."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    done = subprocess.run([sys.executable, "-c", _LATENCY_PROBE, backend], capture_output=True, text=True,
                          check=True, env=env)
    imported, first = map(float, done.stdout.split())
    return imported, first


_SWITCH_PROBE = """
import os, sys, time
os.environ["BNNSFW_COMPILE"] = sys.argv[2]
import numpy as np
from bnnsfw.cli.bench import LSTMCase, _lstm_layer
case = LSTMCase(name="demo", seq_len=32, batch=32, input_size=1, hidden_size=32, num_layers=2)
params, layer = _lstm_layer(case, sys.argv[1], 0)
x = np.zeros((case.seq_len, case.batch, 1), np.float32)
status = getattr(layer.backend, "compile_status", None)
limit, after = float(sys.argv[3]), int(sys.argv[4])
steps, ready_at, asked = [], None, 0.0
start = time.perf_counter()
while (ready_at is None or len(steps) < ready_at + after) and time.perf_counter() - start < limit:
    begun = time.perf_counter()
    out = layer.apply(x, training=True)
    layer.apply_backward(x, np.ones_like(out.output), training_cache=out.training_cache)
    steps.append(time.perf_counter() - begun)
    if ready_at is None and time.perf_counter() - asked > 0.5:
        asked = time.perf_counter()
        if status is None or not status().pending:
            ready_at = len(steps)
print(" ".join(map(repr, steps)), "|", ready_at, time.perf_counter() - start)
"""


@attrs.frozen
class SwitchOver:
    """What :func:`switch_over` saw of the demo's model's training steps in a fresh process."""

    steps: tuple[float, ...]  #: seconds of each training step (forward and backward), in order
    ready_after: int | None  #: steps run before no compile was under way (None: not within the limit)
    seconds: float  #: the whole loop

    @property
    def longest(self) -> float:
        return max(self.steps)

    def median(self, part: slice) -> float | None:
        steps = self.steps[part]
        return statistics.median(steps) if steps else None


def switch_over(backend: str, cache_dir: str, *, mode: str = "background", limit: float = 600.0,
                after: int = 20) -> SwitchOver:
    """In a fresh process with the compile cache in ``cache_dir`` and the compile mode ``mode``:
    the demo's model's training steps, one after another, until ``after`` steps have run since
    no compile was under way (asked every half second), or ``limit`` seconds. From a cold cache
    in ``background`` mode, the steps before the switch run without the compiler, and the
    longest step shows how long any call waited (the first compiled step loads the kernels
    from disk)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    done = subprocess.run([sys.executable, "-c", _SWITCH_PROBE, backend, mode, repr(limit), str(after)],
                          capture_output=True, text=True, check=True, env=env)
    steps, tail = done.stdout.split("|")
    ready, seconds = tail.split()
    return SwitchOver(steps=tuple(map(float, steps.split())),
                      ready_after=None if ready == "None" else int(ready), seconds=float(seconds))


# ---------------------------------------------------------------- normalization ------


def _norm_layer(case: NormalizationCase, backend: str | None, threads: int):
    import bnnsfw as bf

    per_sample = case.shape[1:]
    channels = per_sample[0]
    if case.kind == "batch":
        kind = bf.NormalizationType.batch(moving_mean=np.zeros(channels, np.float32),
                                          moving_variance=np.ones(channels, np.float32))
    elif case.kind == "instance":
        kind = bf.NormalizationType.instance()
    elif case.kind == "layer":
        kind = bf.NormalizationType.layer(normalization_axis=len(per_sample) - 1)
    else:
        kind = bf.NormalizationType.group(group_count=case.groups)
    params = bf.NormalizationParameters(type=kind, input_shape=per_sample, momentum=0.9, epsilon=1e-5,
                                        dtype=np.float32)
    return bf.NormalizationLayer(params, bf.FilterParameters(backend=backend, n_threads=threads))


def _bench_normalization(case: NormalizationCase, opts: argparse.Namespace, peers: Peers) -> list[BenchRow]:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(case.shape, dtype=np.float32)
    dy = rng.standard_normal(case.shape, dtype=np.float32)
    layer = _norm_layer(case, opts.backend, opts.threads)
    layer.parameters()  # handed out, as in a trained model
    y = np.empty_like(x)

    def train() -> None:
        layer.apply(x, phase="training", output=y)
        layer.apply_backward(x, dy, output=y, phase="training")

    theirs: dict[str, Callable[[], object]] = {}
    if peers.torch is not None:
        torch = peers.torch
        F = torch.nn.functional
        tx, tdy = torch.from_numpy(x), torch.from_numpy(dy)
        channels = case.shape[1]
        weight = torch.ones(channels, requires_grad=True)
        bias = torch.zeros(channels, requires_grad=True)
        running_mean, running_var = torch.zeros(channels), torch.ones(channels)
        if case.kind == "layer":
            weight = torch.ones(case.shape[-1], requires_grad=True)
            bias = torch.zeros(case.shape[-1], requires_grad=True)

        def forward(xr: Any) -> Any:
            if case.kind == "batch":
                return F.batch_norm(xr, running_mean, running_var, weight, bias, training=True,
                                    momentum=0.1, eps=1e-5)
            if case.kind == "instance":
                return F.instance_norm(xr, weight=weight, bias=bias, eps=1e-5)
            if case.kind == "layer":
                return F.layer_norm(xr, (case.shape[-1],), weight, bias, eps=1e-5)
            return F.group_norm(xr, case.groups, weight, bias, eps=1e-5)

        def t_train() -> None:
            xr = tx.detach().requires_grad_(True)
            forward(xr).backward(tdy)

        theirs["torch"] = t_train
    timing = _time(train, warmup=1, repeats=opts.repeats, budget=opts.budget, others=list(theirs.values()))
    row = BenchRow(name=f"norm {case.name} {'x'.join(map(str, case.shape))}", work="fwd+bwd",
                   backend=layer.backend.name, median_ms=timing.median * 1e3, min_ms=timing.minimum * 1e3)
    row.add_peers(timing, list(theirs))
    layer.close()
    return [row]


# ---------------------------------------------------------------- driver -------------


#: The libraries ``--compare`` takes, as it spells them.
PEERS = ("torch", "onnxruntime")


@attrs.frozen
class Peers:
    """The libraries compared in this run (their modules), ``None`` where not compared."""

    torch: Any = None
    ort: Any = None


def _thread_count(threads: int) -> int:
    """The thread count the libraries compared run on: ``--threads``, or every core for 0."""
    return threads if threads > 0 else (os.cpu_count() or 1)


def _load_torch(threads: int) -> Any:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(_thread_count(threads))
    return torch


def _load_onnxruntime() -> tuple[Any, str | None]:
    """ONNX Runtime, or ``None`` and what is missing (the layers reach it through
    :func:`bnnsfw.onnx.export`, which needs the ``onnx`` package)."""
    try:
        import onnxruntime
    except ImportError:
        return None, "ONNX Runtime is not installed"
    try:
        import onnx  # noqa: F401
    except ImportError:
        return None, "the onnx package, which exports the layers to it, is not installed"
    return onnxruntime, None


def compare_option(text: str) -> tuple[str, ...]:
    """An argparse ``type`` for ``--compare``: libraries from :data:`PEERS`, separated by commas."""
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",")))
    wrong = [name for name in names if name not in PEERS]
    if wrong or not names:
        raise argparse.ArgumentTypeError(f"must be {', '.join(PEERS)} or several separated by commas; "
                                         f"got {text!r}")
    return names


def load_peers(compare: Sequence[str], threads: int, out: Any) -> Peers:
    """The libraries ``compare`` names that are installed; a line for each that is not."""
    torch_mod = ort_mod = None
    if "torch" in compare:
        torch_mod = _load_torch(threads)
        if torch_mod is None:
            print("--compare torch: PyTorch is not installed; carrying on without it.", file=out)
    if "onnxruntime" in compare:
        ort_mod, missing = _load_onnxruntime()
        if ort_mod is None:
            print(f"--compare onnxruntime: {missing}; carrying on without it.", file=out)
    return Peers(torch=torch_mod, ort=ort_mod)


def run(opts: argparse.Namespace, *, out: Any = None) -> dict[str, Any]:
    """Run every row and print the table; return the figures as a JSON-ready dict."""
    out = sys.stdout if out is None else out
    import bnnsfw as bf

    # Every row runs compiled from its first call, compiling in this process (and in the
    # first-call probes it starts) where it must: the figures are the compiled kernels'.
    os.environ["BNNSFW_COMPILE"] = "wait"
    backend = bf.get_backend(opts.backend).name
    peers = load_peers(opts.compare or (), opts.threads, out)
    peak = measure_peak(quick=opts.quick)
    threads = opts.threads or "default"
    print(f"bnnsfw {bf.__version__} bench: backend {backend}, threads {threads}, "
          f"{os.cpu_count()} cores, float32; sgemm peak {peak:.1f} GFLOP/s"
          + (f"; PyTorch {peers.torch.__version__}" if peers.torch is not None else "")
          + (f"; ONNX Runtime {peers.ort.__version__}" if peers.ort is not None else ""), file=out)
    blas, coretype = blas_libraries(), os.environ.get("OPENBLAS_CORETYPE")
    print(describe_blas(blas, coretype), file=out)
    rows: list[BenchRow] = []
    lstm_cases = [c.quick() for c in LSTM_CASES] if opts.quick else list(LSTM_CASES)
    norm_cases = [c.quick() for c in NORMALIZATION_CASES] if opts.quick else list(NORMALIZATION_CASES)
    for lstm_case in lstm_cases:
        rows += _bench_lstm(lstm_case, opts, peak, peers)
    for stream_case in STREAM_CASES:
        rows.append(_bench_stream(stream_case, opts, peak, peers))
    for norm_case in norm_cases:
        rows += _bench_normalization(norm_case, opts, peers)
    print(format_table(rows, with_torch=peers.torch is not None, with_ort=peers.ort is not None), file=out)
    latency: dict[str, dict[str, Any]] | None = None
    if not opts.quick:
        with tempfile.TemporaryDirectory(prefix="bnnsfw-bench-cache-") as cache_dir:
            cold = first_call_latency(opts.backend, cache_dir)
            warm = first_call_latency(opts.backend, cache_dir)
        latency = {"cold": {"import_s": cold[0], "first_step_s": cold[1]},
                   "warm": {"import_s": warm[0], "first_step_s": warm[1]}}
        print(f"first call of the demo's model in a fresh process (import + first training step): "
              f"cold compile cache {cold[0]:.2f} s + {cold[1]:.2f} s, warm {warm[0]:.2f} s + {warm[1]:.2f} s",
              file=out)
        with tempfile.TemporaryDirectory(prefix="bnnsfw-bench-cache-") as cache_dir:
            seen = switch_over(opts.backend, cache_dir)
        before, after = seen.median(slice(0, seen.ready_after)), seen.median(slice(seen.ready_after, None))
        latency["background"] = {"steps_s": list(seen.steps), "ready_after_steps": seen.ready_after,
                                  "longest_step_s": seen.longest}
        print(f"the same in the default compile mode (background), cold cache: first training step "
              f"{seen.steps[0]:.3f} s, longest {seen.longest:.3f} s; "
              + (f"compiled after {seen.ready_after} steps ({sum(seen.steps[:seen.ready_after]):.1f} s), "
                 f"median step {before * 1e3:.1f} ms before, {after * 1e3:.1f} ms after"
                 if seen.ready_after is not None and before is not None and after is not None
                 else f"still compiling after {seen.seconds:.0f} s"), file=out)
    for row in rows:
        if row.peak_step_bytes is not None:
            print(f"peak memory of one training step, {row.name} (fresh process): "
                  f"{row.peak_step_bytes / 2**20:.0f} MiB, {row.peak_over_cache_and_inputs:.2f}x the "
                  f"training cache plus the inputs", file=out)
    return {
        "bnnsfw": bf.__version__,
        "backend": backend,
        "threads": opts.threads,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "numpy": np.__version__,
        "torch": getattr(peers.torch, "__version__", None),
        "onnxruntime": getattr(peers.ort, "__version__", None),
        "quick": opts.quick,
        "sgemm_peak_gflops": peak,
        "blas": blas,
        "openblas_coretype": coretype,
        "first_call": latency,
        "rows": [r.as_dict() for r in rows],
    }


def _ms_text(ms: float) -> str:
    """Milliseconds with two decimals, or three significant digits below 0.1 ms (a per-call row)."""
    return f"{ms:.3g}" if ms < 0.1 else f"{ms:.2f}"


def _peer_cells(median_ms: float | None, ratio: float | None,
                round_ratios: tuple[float, float, float] | None) -> list[str]:
    if median_ms is None or ratio is None or round_ratios is None:
        return ["—", "", ""]
    return [_ms_text(median_ms), f"{ratio:.2f}", f"{round_ratios[0]:.2f}-{round_ratios[2]:.2f}"]


def format_table(rows: Sequence[BenchRow], *, with_torch: bool, with_ort: bool = False) -> str:
    """The rows as an aligned text table; a library compared has "—" where it has no figure."""
    header = ["row", "work", "backend", "median ms", "min ms", "GFLOP/s", "% peak", "cache MB", "peak MB"]
    if with_torch:
        header += ["torch ms", "ratio", "rounds q1-q3"]
    if with_ort:
        header += ["ORT ms", "ratio", "rounds q1-q3"]
    lines = [header]
    for r in rows:
        cells = [
            r.name, r.work, r.backend, _ms_text(r.median_ms), _ms_text(r.min_ms),
            "" if r.gflops is None else f"{r.gflops:.1f}",
            "" if r.peak_fraction is None else f"{100 * r.peak_fraction:.0f}%",
            "" if r.cache_bytes is None else f"{r.cache_bytes / 2**20:.1f}",
            "" if r.peak_step_bytes is None else f"{r.peak_step_bytes / 2**20:.0f}",
        ]
        if with_torch:
            cells += _peer_cells(r.torch_median_ms, r.ratio, r.round_ratios)
        if with_ort:
            cells += _peer_cells(r.ort_median_ms, r.ort_ratio, r.ort_round_ratios)
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = []
    for i, line in enumerate(lines):
        padded = (c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths)))
        text.append("  ".join(padded))
        if i == 0:
            text.append("  ".join("-" * w for w in widths))
    return "\n".join(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bnnsfw bench", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 when the figures were printed, 1 when a library "
                                       "compared computed something else than bnnsfw, 2 for a usage error.")
    p.add_argument("--compare", type=compare_option, metavar="LIBRARIES",
                   help="also time the same work in torch (PyTorch's CPU kernels), onnxruntime (ONNX "
                        "Runtime, the inference rows: each layer exported by bnnsfw.onnx.export) or both "
                        "(torch,onnxruntime), and print the ratios bnnsfw / them; one not installed is "
                        "left out with a message")
    p.add_argument("--backend", choices=backend_names(), default="auto",
                   help="bnnsfw backend (default: auto)")
    p.add_argument("--threads", type=integer(0), default=0,
                   help="threads of BLAS, PyTorch and ONNX Runtime, an integer >= 0; 0: bnnsfw's default, "
                        "one a CPU for the others")
    p.add_argument("--quick", action="store_true", help="small shapes and few repeats (a few seconds)")
    p.add_argument("--repeats", type=integer(1), default=None,
                   help="minimum timed repeats per row, an integer >= 1 (default: 7, 2 with --quick)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bnnsfw bench``; returns the exit status (usage errors exit with status 2)."""
    p = parser()
    opts = p.parse_args(argv)
    if opts.json:
        check_output_path(p, "--json", opts.json)
    if opts.repeats is None:
        opts.repeats = 2 if opts.quick else 7
    opts.budget = 0.0 if opts.quick else 1.0
    try:
        figures = run(opts)
    except ComparisonMismatch as exc:
        print(f"bnnsfw bench: error: {exc}", file=sys.stderr)
        return 1
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)
        print(f"figures written to {opts.json}")
    return 0
