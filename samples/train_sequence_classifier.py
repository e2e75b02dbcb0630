"""A sequence classifier trained the way a real training script is: padded sequences of
unequal lengths, an LSTM that reads each one only up to its length, dropout, a learning-rate
warm-up then a cosine, gradient clipping with the norm logged, early stopping that keeps the
best checkpoint, and a final evaluation of that checkpoint on held-out data.

The task: each sequence is a noisy sine of one of three frequencies, 8 to 32 steps long;
the class is the frequency. Usage: ``python samples/train_sequence_classifier.py [--quick]``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import bnnsfw as bf

CLASSES = 3


def make_sequences(n: int, max_length: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` padded sequences ``(T, N, 1)`` float32, their lengths ``(N,)`` and labels ``(N,)``."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    lengths = rng.integers(max_length // 4, max_length + 1, n)
    x = np.zeros((max_length, n, 1), np.float32)                       # padding is zeros
    for i, (label, length) in enumerate(zip(labels, lengths)):
        t = np.arange(length)
        phase = rng.uniform(0, 2 * np.pi)
        signal = np.sin(2 * np.pi * (label + 3) / 32 * t + phase) + 0.8 * rng.standard_normal(length)
        x[:length, i, 0] = signal
    return x, lengths, labels


def accuracy(model: bf.Sequential, x: np.ndarray, lengths: np.ndarray, labels: np.ndarray) -> float:
    logits = model(x, sequence_lengths=lengths)                         # inference: no dropout
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def main(quick: bool = False) -> int:
    epochs, hidden, n_train, patience = (4, 8, 96, 2) if quick else (40, 32, 1536, 6)
    batch_size, max_length = 32, 32
    x_train, len_train, y_train = make_sequences(n_train, max_length, seed=0)
    x_val, len_val, y_val = make_sequences(n_train // 4, max_length, seed=1)
    x_test, len_test, y_test = make_sequences(n_train // 4, max_length, seed=2)

    model = bf.Sequential({
        "lstm": bf.LSTMLayer(bf.LSTMParameters.random(input_size=1, hidden_size=hidden, seed=0)),
        "last": bf.LastStep(),                          # with lengths: each sequence's last valid step
        "dropout": bf.Dropout(0.2, seed=0),
        "head": bf.FullyConnectedLayer(bf.FullyConnectedParameters.random(
            input_size=hidden, output_size=CLASSES, seed=1)),
    })
    loss = bf.losses.SoftmaxCrossEntropy()              # takes the head's logits
    optimizer = bf.optimizers.Adam(lr=1e-2)
    warmup = 2 if quick else 5
    schedule = bf.SequentialSchedule(optimizer, [
        bf.LinearWarmup(optimizer, start_factor=0.1, total_steps=warmup),
        bf.CosineAnnealing(optimizer, t_max=epochs - warmup, eta_min=1e-4),
    ], milestones=[warmup])

    checkpoint = Path(tempfile.mkdtemp()) / "best"
    best, waited = -1.0, 0
    rng = np.random.default_rng(0)
    for epoch in range(1, epochs + 1):
        order = rng.permutation(n_train)
        norms = []
        for start in range(0, n_train, batch_size):
            idx = order[start:start + batch_size]
            logits = model.apply(x_train[:, idx], training=True, sequence_lengths=len_train[idx])
            result = loss.apply(logits, y_train[idx])
            grads = model.apply_backward(result.gradient).parameters()
            norms.append(bf.clip_gradients(grads, max_norm=1.0))        # the norm before clipping
            optimizer.step(model.parameters(), grads)
        val = accuracy(model, x_val, len_val, y_val)
        print(f"epoch {epoch:2d}: lr {optimizer.learning_rate:.4f}  gradient norm "
              f"{np.median(norms):.3f} (median)  validation accuracy {val:.3f}")
        schedule.step()
        if val > best:
            best, waited = val, 0
            bf.save_weights(checkpoint, model, training={"optimizer": optimizer, "schedule": schedule},
                            metadata={"epoch": epoch, "validation_accuracy": val})
        else:
            waited += 1
            if waited == patience:
                print(f"no better validation accuracy for {patience} epochs: stopping")
                break
    model.close()

    best_model, metadata = bf.load_weights(checkpoint, return_metadata=True)
    test = accuracy(best_model, x_test, len_test, y_test)
    print(f"best checkpoint: epoch {metadata['epoch']}, validation accuracy "
          f"{metadata['validation_accuracy']:.3f}; test accuracy {test:.3f} (chance {1 / CLASSES:.3f})")
    best_model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))
