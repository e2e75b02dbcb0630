"""Every sample runs (in its quick mode) and exits 0."""

import subprocess
import sys
from pathlib import Path

import pytest

SAMPLES = sorted((Path(__file__).resolve().parent.parent / "samples").glob("*.py"))


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_sample_runs(sample):
    done = subprocess.run([sys.executable, str(sample), "--quick"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip()


def test_the_scanner_finds_the_c_style_sample(capsys):
    from bnnsfw.cli.deprecations import main

    samples = str(SAMPLES[0].parent)
    assert main(["--scan", samples, "--check"]) == 1
    out = capsys.readouterr().out
    for name in ("BNNSDirectApplyLSTMBatchTrainingCaching", "BNNSDirectApplyLSTMBatchBackward",
                 "BNNSComputeLSTMTrainingCacheCapacity", "BNNSLayerParametersLSTM"):
        assert name in out
