"""A real-time loop: an LSTM fed one audio frame at a time, as a keyword spotter runs.

Three microphones each deliver a frame of 13 features every 10 ms. The LSTM steps all three
streams together (``layer.stream(batch_size=3)``), writing into one preallocated buffer, and a
linear read-out turns the top layer's output into a score per stream. When one utterance ends
its stream starts again (``reset(rows=...)``) while the others carry on. The weights are
random: the loop is the point, not the score. At the end the steps are checked against one
``apply`` over the same frames.

Usage: ``python samples/stream_keyword_spotting.py [--quick]``.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import bnnsfw as bf

FEATURES, HIDDEN, STREAMS = 13, 32, 3


def microphone(rng: np.random.Generator, frames: int) -> np.ndarray:
    """Frames of ``STREAMS`` microphones, ``(frames, STREAMS, FEATURES)`` float32."""
    return rng.standard_normal((frames, STREAMS, FEATURES)).astype(np.float32)


def main(quick: bool = False) -> int:
    rng = np.random.default_rng(0)
    params = bf.LSTMParameters.random(input_size=FEATURES, hidden_size=HIDDEN, num_layers=2, seed=0)
    readout = rng.standard_normal(HIDDEN).astype(np.float32) / np.sqrt(HIDDEN)
    frames = microphone(rng, 40 if quick else 400)
    utterance_ends = {len(frames) // 2: [1]}             # microphone 1's speaker stops halfway

    with bf.LSTMLayer(params) as layer:
        stream = layer.stream(batch_size=STREAMS)
        top = np.empty((STREAMS, HIDDEN), np.float32)    # written by every step: no allocation
        latencies = []
        for t, frame in enumerate(frames):               # as each frame arrives
            start = time.perf_counter()
            stream.step(frame, out=top)
            scores = top @ readout
            latencies.append(time.perf_counter() - start)
            if t % (len(frames) // 4) == 0:
                print(f"frame {t:4d}: scores {np.array2string(scores, precision=3)}")
            for row in utterance_ends.get(t, []):
                stream.reset(rows=[row])                 # a new utterance on this microphone
                print(f"frame {t:4d}: microphone {row} starts again")
        per_step = 1e6 * np.median(latencies)
        print(f"median time per frame (3 streams, 2 layers, H={HIDDEN}): {per_step:.0f} µs "
              f"(budget per frame: 10 000 µs)")

        # The same frames in one call: what the stream gave for the microphones never reset.
        whole = layer.apply(frames).output[-1]
        same = np.allclose(whole[[0, 2]], top[[0, 2]], rtol=2e-4, atol=2e-5)
        print(f"steps agree with one apply over the sequence: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))
