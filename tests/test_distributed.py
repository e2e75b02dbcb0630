"""Scoring sequences of unequal lengths on a Dask cluster of worker processes, the recipe of
docs/scaling.md: the same numbers as one process scoring the same chunks. Skipped where Dask's
distributed scheduler is not installed (pip install -e '.[distributed]')."""

from __future__ import annotations

import numpy as np
import pytest

import bnnsfw as bf

distributed = pytest.importorskip("distributed")


def test_a_dask_cluster_scores_the_chunks_as_one_process_does():
    # Local functions: Dask sends them by value, so the workers need not import this module.
    def pad(chunk):
        """Sequences of shape (T_i, F) as one zero-padded (max T_i, N, F) batch, and the T_i."""
        lengths = np.array([len(s) for s in chunk])
        x = np.zeros((lengths.max(), len(chunk), chunk[0].shape[1]), dtype=np.float32)
        for n, sequence in enumerate(chunk):
            x[:len(sequence), n] = sequence
        return x, lengths

    def score(chunk, model):
        lstm, head = model
        x, lengths = pad(chunk)
        last = lstm(x, sequence_lengths=lengths).hidden[-1]  # each sequence's state at its own end
        return head(last)[:, 0]

    def threads_seen():
        import numba

        return numba.config.NUMBA_NUM_THREADS, numba.get_num_threads()

    rng = np.random.default_rng(7)
    sequences = [rng.standard_normal((int(t), 3)).astype(np.float32) for t in rng.integers(1, 10, size=24)]
    chunks = [sequences[i:i + 8] for i in range(0, len(sequences), 8)]
    one_thread = bf.FilterParameters(n_threads=1)  # the same thread counts here and in the workers
    model = (bf.LSTMLayer(bf.LSTMParameters.random(input_size=3, hidden_size=8, seed=0), one_thread),
             bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(input_size=8, output_size=1, seed=1),
                                    one_thread))
    expected = [score(chunk, model) for chunk in chunks]  # also loads the kernels the workers find on disk

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, env=bf.worker_environment(1))
    with cluster, distributed.Client(cluster) as client:
        remote_model = client.scatter(model, broadcast=True)  # sent once to every worker
        scores = client.gather(client.map(score, chunks, model=remote_model))
        threads = client.run(threads_seen)

    assert len(threads) == 2 and set(threads.values()) == {(1, 1)}
    for got, want in zip(scores, expected):
        np.testing.assert_array_equal(got, want)  # the same kernels on the same thread counts
    whole = score(sequences, model)  # one batch of all: other kernels' blocking, the same model
    np.testing.assert_allclose(np.concatenate(scores), whole, rtol=1e-5, atol=1e-6)
    for sequence, value in zip(sequences[:3], np.concatenate(scores)):  # padding changes nothing
        np.testing.assert_allclose(score([sequence], model), [value], rtol=1e-5, atol=1e-6)
