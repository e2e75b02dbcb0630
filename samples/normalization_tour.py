"""The four normalization types on the same data: what each one averages over, and how
training differs from inference when moving statistics are kept.

Usage: ``python samples/normalization_tour.py``.
"""

from __future__ import annotations

import sys

import numpy as np

import bnnsfw as bf

np.set_printoptions(precision=3, suppress=True)


def main(quick: bool = False) -> int:
    rng = np.random.default_rng(0)
    n, c, h, w = 4, 4, 2, 3
    # each channel gets its own offset and scale, each sample its own shift
    x = (rng.standard_normal((n, c, h, w)) * np.arange(1, c + 1)[None, :, None, None]
         + 10 * np.arange(c)[None, :, None, None] + rng.standard_normal((n, 1, 1, 1))).astype(np.float32)
    shape = (c, h, w)
    kinds = {
        "batch    (per channel, over N, H, W)": bf.NormalizationType.batch(),
        "instance (per sample and channel)   ": bf.NormalizationType.instance(),
        "layer    (per sample, over C, H, W) ": bf.NormalizationType.layer(normalization_axis=0),
        "group    (per sample, 2 groups)     ": bf.NormalizationType.group(group_count=2),
    }
    print("mean / standard deviation of the output per channel (averaged over the batch):")
    for label, kind in kinds.items():
        with bf.NormalizationLayer(bf.NormalizationParameters(type=kind, input_shape=shape)) as layer:
            y = layer.apply(x, phase="training")
        print(f"  {label}  mean {y.mean(axis=(0, 2, 3))}  std {y.std(axis=(0, 2, 3))}")

    print("\nbatch norm with moving statistics (momentum 0.9 weighs the old value):")
    params = bf.NormalizationParameters(
        type=bf.NormalizationType.batch(moving_mean=np.zeros(c), moving_variance=np.ones(c)),
        input_shape=shape, momentum=0.9)
    layer = bf.NormalizationLayer(params)
    for step in range(1, 4 if quick else 31):
        layer.apply(x, phase="training")             # moving = 0.9·moving + 0.1·batch statistic
        if step in (1, 2, 3, 10, 30):
            print(f"  after {step:2d} training batches: moving mean {layer.moving_mean}")
    print(f"  batch mean of the data:            {x.mean(axis=(0, 2, 3))}")
    single = x[:1]
    y_train = layer.apply(single, phase="training")   # one sample's own statistics
    y_infer = layer.apply(single, phase="inference")  # the moving statistics
    print(f"  one sample, training phase : channel means {y_train.mean(axis=(0, 2, 3))}")
    print(f"  one sample, inference phase: channel means {y_infer.mean(axis=(0, 2, 3))}")
    layer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv[1:]))
