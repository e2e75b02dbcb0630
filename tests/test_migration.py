"""`bnnsfw deprecations` points from BNNSGraph deprecations to the export path."""

from __future__ import annotations

from bnnsfw.cli.deprecations import main
from bnnsfw.deprecation import lookup


def test_describe_points_to_the_core_ml_export_where_apple_names_bnnsgraph():
    text = lookup("BNNSDirectApplyLSTMBatchBackward").describe()
    assert "Use BNNSGraph* APIs" in text
    assert "to BNNSGraph:" in text and "bnnsfw.coreml.export" in text
    renamed = lookup("BNNSFilterCreateConvolutionLayer").describe()   # Apple names no BNNSGraph here
    assert "bnnsfw.coreml.export" not in renamed


def test_scan_report_carries_the_pointer_once(tmp_path, capsys):
    (tmp_path / "a.c").write_text("BNNSFilterApply(f, in, out);\nBNNSFilterDestroy(f);\n")
    assert main(["--scan", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("bnnsfw.coreml.export") == 1
    assert out.rstrip().endswith("2 findings (2 deprecated) in 1 file.")
