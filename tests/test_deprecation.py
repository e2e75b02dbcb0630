"""Tests for bnnsfw.deprecation: the registry's facts, queries, scanner, warnings and CLI."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pathlib
import re

import attrs
import pytest

from bnnsfw import deprecation
from bnnsfw.deprecation import (
    DeprecationRecord,
    Finding,
    entries,
    is_deprecated,
    lookup,
    markdown_table,
    scan,
    warn_deprecated,
)
from bnnsfw.cli.deprecations import main
from bnnsfw.errors import BNNSError, InvalidParameterError, UnknownNameError

# --------------------------------------------------------------------------- expected facts
# Written out by hand from the project's BNNS deprecation facts (not parsed at run time).

WAVE2 = {
    "macOS": "15.0",
    "iOS": "18.0",
    "iPadOS": "18.0",
    "Mac Catalyst": "18.0",
    "tvOS": "18.0",
    "watchOS": "11.0",
    "visionOS": "2.0",
}
GRAPH = "Use BNNSGraph* APIs"
CLASSIC = {"macOS": "11.0", "iOS": "14.0"}
CLASSIC_ALL = {"macOS": "11.0", "iOS": "14.0", "watchOS": "7.0", "tvOS": "14.0"}

# name: (introduced, deprecated, Apple's replacement)
FIRST_WAVE = {
    "BNNSFilterCreateConvolutionLayer": (
        {"macOS": "10.12"},
        CLASSIC_ALL,
        "BNNSFilterCreateLayerConvolution",
    ),
    "BNNSFilterCreateFullyConnectedLayer": (
        {"macOS": "10.12"},
        CLASSIC,
        "BNNSFilterCreateLayerFullyConnected",
    ),
    "BNNSFilterCreatePoolingLayer": ({"macOS": "10.12"}, CLASSIC, "BNNSFilterCreateLayerPooling"),
    "BNNSFilterCreateVectorActivationLayer": (
        {"macOS": "10.13", "iOS": "11.0"},
        CLASSIC_ALL,
        "BNNSFilterCreateLayerActivation",
    ),
    "BNNSConvolutionLayerParameters": ({}, CLASSIC, "BNNSLayerParametersConvolution"),
    "BNNSFullyConnectedLayerParameters": ({}, CLASSIC, "BNNSLayerParametersFullyConnected"),
    "BNNSPoolingLayerParameters": ({}, CLASSIC, "BNNSLayerParametersPooling"),
    "BNNSImageStackDescriptor": ({}, CLASSIC, "BNNSNDArrayDescriptor"),
    "BNNSVectorDescriptor": ({}, CLASSIC, "BNNSNDArrayDescriptor"),
    "BNNSLayerData": ({}, CLASSIC, "BNNSNDArrayDescriptor"),
    "BNNSPoolingFunctionAverage": (
        {"macOS": "10.12"},
        CLASSIC,
        "BNNSPoolingFunctionAverageCountIncludePadding",
    ),
    "BNNSDirectApplyBroadcastMatMul": (
        {"macOS": "11.0"},
        {"macOS": "13.0", "iOS": "16.0", "watchOS": "9.0", "tvOS": "16.0"},
        "BNNSMatMul (with BNNSMatMulWorkspaceSize)",
    ),
    # Swift convenience members of the old structs (documentation pages: 10.12-12.0 etc.).
    "BNNSLayerData.zero": ({"macOS": "10.12"}, {"macOS": "12.0"}, ""),
    "BNNSImageStackDescriptor.init": ({"macOS": "10.12"}, {"macOS": "12.0"}, ""),
    "BNNSPoolingFunction.average": (
        {"macOS": "10.15"},
        {"macOS": "12.0"},
        "BNNSPoolingFunctionAverageCountIncludePadding",
    ),
}

_CREATE = [
    "Convolution", "TransposedConvolution", "FullyConnected", "Pooling", "Activation", "Loss",
    "Normalization", "Arithmetic", "Permute", "Dropout", "Padding", "BroadcastMatMul",
    "TensorContraction", "Gram", "Resize", "MultiheadAttention", "Reduction",
]  # fmt: skip
_LAYER_PARAMETERS = [
    "Convolution", "FullyConnected", "Pooling", "Activation", "LossBase",
    "LossSoftmaxCrossEntropy", "LossSigmoidCrossEntropy", "LossHuber", "LossYolo",
    "Normalization", "Dropout", "LSTM", "Arithmetic", "Permute", "TensorContraction", "Gram",
    "Resize", "BroadcastMatMul", "MultiheadAttention", "Padding",
]  # fmt: skip
_OPTIMIZERS = ["SGDMomentum", "Adam", "RMSProp"]

# macOS version introduced: names (all deprecated with WAVE2, replacement GRAPH).
SECOND_WAVE = {
    "10.12": ["BNNSFilter", "BNNSFilterApply", "BNNSFilterApplyBatch", "BNNSFilterDestroy"],
    "11.0": [
        *(f"BNNSFilterCreateLayer{name}" for name in _CREATE),
        "BNNSFilterCreateFusedLayer",
        "BNNSPoolingFilterApplyBatch",
        "BNNSFilterApplyTwoInput",
        "BNNSFilterApplyTwoInputBatch",
        "BNNSNormalizationFilterApplyBatch",
        "BNNSFusedFilterApplyBatch",
        "BNNSArithmeticFilterApplyBatch",
        "BNNSApplyMultiheadAttention",
        "BNNSLossFilterApplyBatch",
        "BNNSFilterApplyBackwardBatch",
        "BNNSPoolingFilterApplyBackwardBatch",
        "BNNSFilterApplyBackwardTwoInputBatch",
        "BNNSNormalizationFilterApplyBackwardBatch",
        "BNNSFusedFilterApplyBackwardBatch",
        "BNNSArithmeticFilterApplyBackwardBatch",
        "BNNSPermuteFilterApplyBackwardBatch",
        "BNNSLossFilterApplyBackwardBatch",
        "BNNSApplyMultiheadAttentionBackward",
        "BNNSComputeLSTMTrainingCacheCapacity",
        "BNNSDirectApplyLSTMBatchTrainingCaching",
        "BNNSDirectApplyLSTMBatchBackward",
        "BNNSDirectApplyActivationBatch",
        "BNNSCompareTensor",
        "BNNSGetPointer",
        "BNNSOptimizerStep",
        *(f"BNNSLayerParameters{name}" for name in _LAYER_PARAMETERS),
        "BNNSLSTMGateDescriptor",
        "BNNSLSTMDataDescriptor",
        "BNNSArithmeticUnary",
        "BNNSArithmeticBinary",
        "BNNSArithmeticTernary",
        *(f"BNNSOptimizer{name}Fields" for name in _OPTIMIZERS),
        *(f"BNNSOptimizer{name}WithClippingFields" for name in _OPTIMIZERS),
    ],
    "12.0": [
        "BNNSFilterCreateLayerEmbedding",
        "BNNSFusedFilterApplyMultiInputBatch",
        "BNNSDirectApplyQuantizer",
        "BNNSFusedFilterApplyBackwardMultiInputBatch",
        "BNNSClipByValue",
        "BNNSClipByNorm",
        "BNNSClipByGlobalNorm",
        "BNNSComputeNorm",
        "BNNSComputeNormBackward",
        "BNNSLayerParametersEmbedding",
        "BNNSLayerParametersQuantization",
    ],
    "13.0": [
        "BNNSPoolingFilterApplyBatchEx",
        "BNNSPoolingFilterApplyBackwardBatchEx",
        "BNNSMatMul",
        "BNNSMatMulWorkspaceSize",
        "BNNSTile",
        "BNNSTileBackward",
        "BNNSGather",
        "BNNSScatter",
        "BNNSGatherND",
        "BNNSScatterND",
        "BNNSShuffle",
        "BNNSBandPart",
        "BNNSCropResize",
        "BNNSCropResizeBackward",
        "BNNSNDArrayFullyConnectedSparsifySparseCOO",
        "BNNSNDArrayFullyConnectedSparsifySparseCSR",
        "BNNSLayerParametersCropResize",
    ],
}
SECOND_WAVE_NAMES = [name for names in SECOND_WAVE.values() for name in names]

SWIFT_OVERLAY = {
    "swift-class": [
        "BNNS.Layer",
        "BNNS.UnaryLayer",
        "BNNS.BinaryLayer",
        "BNNS.NormalizationLayer",
        "BNNS.ActivationLayer",
        "BNNS.ConvolutionLayer",
        "BNNS.FullyConnectedLayer",
        "BNNS.PoolingLayer",
        "BNNS.LossLayer",
    ],
    "swift-enum": ["BNNS.NormalizationType", "BNNS.LearningPhase", "BNNS.ActivationFunction"],
    "swift-function": ["BNNS.applyActivation", "BNNS.compare", "BNNS.gather"],
    "swift-member": ["BNNSActivationFunction.sigmoid"],
}
SWIFT_OVERLAY_NAMES = [name for names in SWIFT_OVERLAY.values() for name in names]

RENAMED = {
    "BNNSActivationFunctionSigmoid": "BNNSActivationFunction.sigmoid",
    "BNNSFlagsUseClientPtr": "BNNSFlags.useClientPointer",
}

AVAILABLE_STATED = [
    "BNNSCopy",
    "BNNSTranspose",
    "BNNSDirectApplyReduction",
    "BNNSDirectApplyTopK",
    "BNNSDirectApplyInTopK",
    "BNNSCreateRandomGenerator",
    "BNNSCreateRandomGeneratorWithSeed",
    "BNNSDestroyRandomGenerator",
    "BNNSRandomGeneratorGetState",
    "BNNSRandomGeneratorSetState",
    "BNNSRandomGeneratorStateSize",
    "BNNSCreateNearestNeighbors",
    "BNNSNDArrayGetDataSize",
    "BNNSTensorGetAllocationSize",
    "BNNSDataLayoutGetRank",
    "BNNSNDArrayDescriptor",
    "BNNSActivation",
    "BNNSFilterParameters",
    "BNNSLayerParametersReduction",
    "BNNSMHAProjectionParameters",
]
# Named by the facts as replacements (or as a Swift spelling); not deprecated by inference.
AVAILABLE_INFERRED = [
    "BNNSPoolingFunctionAverageCountIncludePadding",
    "BNNSFlags.useClientPointer",
    "BNNSGraphCompileFromFile",
    "BNNSGraphContextMake",
    "BNNSGraphContextExecute",
    "BNNSGraph",
]

ALL_NAMES = [
    *FIRST_WAVE,
    *SECOND_WAVE_NAMES,
    *SWIFT_OVERLAY_NAMES,
    *RENAMED,
    *AVAILABLE_STATED,
    *AVAILABLE_INFERRED,
]

BNNSFW_REPLACEMENTS = {
    "BNNSFilterCreateLayerNormalization": "bnnsfw.NormalizationLayer",
    "BNNSNormalizationFilterApplyBatch": "bnnsfw.NormalizationLayer.apply",
    "BNNSNormalizationFilterApplyBackwardBatch": "bnnsfw.NormalizationLayer.apply_backward",
    "BNNSFilterDestroy": "bnnsfw.Filter.close",
    "BNNSComputeLSTMTrainingCacheCapacity": "bnnsfw.LSTMLayer.training_cache_capacity",
    "BNNSDirectApplyLSTMBatchTrainingCaching": "bnnsfw.LSTMLayer.apply",
    "BNNSDirectApplyLSTMBatchBackward": "bnnsfw.LSTMLayer.apply_backward",
    "BNNSLayerParametersLSTM": "bnnsfw.LSTMParameters",
    "BNNSLSTMGateDescriptor": "bnnsfw.LSTMGateDescriptor",
    "BNNSLayerParametersNormalization": "bnnsfw.NormalizationParameters",
    "BNNSFilterCreateLayerFullyConnected": "bnnsfw.FullyConnectedLayer",
    "BNNSLayerParametersFullyConnected": "bnnsfw.FullyConnectedParameters",
    "BNNS.NormalizationLayer": "bnnsfw.NormalizationLayer",
    "BNNS.FullyConnectedLayer": "bnnsfw.FullyConnectedLayer",
    "BNNS.NormalizationType": "bnnsfw.NormalizationType",
    "BNNS.ActivationFunction": "bnnsfw.ActivationFunction",
    "BNNS.LearningPhase": "bnnsfw.LearningPhase",
    "BNNSDirectApplyActivationBatch": "bnnsfw.Activation.forward",
}


# --------------------------------------------------------------------------- the registry


def test_registry_holds_exactly_the_names_of_the_facts():
    names = [record.name for record in entries()]
    assert len(names) == len(set(names)), "a name is listed twice"
    assert len(ALL_NAMES) == len(set(ALL_NAMES))
    assert set(names) == set(ALL_NAMES)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_name_can_be_looked_up(name):
    record = lookup(name)
    assert isinstance(record, DeprecationRecord)
    assert record.name == name


def test_record_counts_by_status():
    counts = {status: len(entries(status=status)) for status in deprecation.STATUSES}
    deprecated = len(FIRST_WAVE) + len(SECOND_WAVE_NAMES) + len(SWIFT_OVERLAY_NAMES)
    assert counts == {
        "deprecated": deprecated,
        "renamed": len(RENAMED),
        "available": len(AVAILABLE_STATED) + len(AVAILABLE_INFERRED),
    }


@pytest.mark.parametrize("name", list(FIRST_WAVE))
def test_first_wave_versions_and_replacements(name):
    introduced, deprecated, replacement = FIRST_WAVE[name]
    record = lookup(name)
    assert record.status == "deprecated"
    assert dict(record.introduced) == introduced
    assert dict(record.deprecated) == deprecated
    assert record.apple_replacement == replacement
    assert not record.inferred


def test_broadcast_matmul_was_deprecated_in_macos_13_for_bnnsmatmul():
    record = lookup("BNNSDirectApplyBroadcastMatMul")
    assert record.kind == "function"
    assert record.deprecated["macOS"] == "13.0"
    assert record.deprecated["iOS"] == "16.0"
    assert record.apple_replacement.split()[0] == "BNNSMatMul"
    assert "BNNSMatMulWorkspaceSize" in record.apple_replacement
    # The replacement was itself deprecated in the second wave; describe() says so.
    assert "BNNSMatMul is itself deprecated since macOS 15.0" in record.describe()


def test_fully_connected_replacement_follows_the_header_not_the_doc_page():
    record = lookup("BNNSFilterCreateFullyConnectedLayer")
    assert record.apple_replacement == "BNNSFilterCreateLayerFullyConnected"
    assert dict(record.deprecated) == {"macOS": "11.0", "iOS": "14.0"}
    assert "wrongly" in record.note
    assert "header is authoritative" in record.note


def test_first_wave_kinds():
    assert lookup("BNNSPoolingFunctionAverage").kind == "enum-value"
    assert lookup("BNNSConvolutionLayerParameters").kind == "struct"
    assert lookup("BNNSLayerData").kind == "struct"
    assert lookup("BNNSLayerData.zero").kind == "swift-member"
    assert lookup("BNNSImageStackDescriptor.init").kind == "swift-initializer"
    assert "switched to new Layer Parameters" in lookup("BNNSVectorDescriptor").note


@pytest.mark.parametrize(
    ("introduced", "name"),
    [(version, name) for version, names in SECOND_WAVE.items() for name in names],
)
def test_second_wave_versions_and_replacement(introduced, name):
    record = lookup(name)
    assert record.status == "deprecated"
    assert dict(record.introduced) == {"macOS": introduced}
    assert dict(record.deprecated) == WAVE2
    assert list(record.deprecated) == list(WAVE2)  # platforms in the documented order
    assert record.apple_replacement == GRAPH
    assert not record.inferred


def test_second_wave_kinds():
    assert lookup("BNNSFilter").kind == "typedef"
    assert lookup("BNNSFilterCreateLayerTransposedConvolution").kind == "function"
    assert lookup("BNNSLayerParametersLSTM").kind == "struct"
    assert lookup("BNNSOptimizerRMSPropWithClippingFields").kind == "struct"
    assert lookup("BNNSArithmeticTernary").kind == "struct"


@pytest.mark.parametrize(
    ("kind", "name"),
    [(kind, name) for kind, names in SWIFT_OVERLAY.items() for name in names],
)
def test_swift_overlay_is_deprecated_with_inferred_versions(kind, name):
    record = lookup(name)
    assert record.kind == kind
    assert record.status == "deprecated"
    assert record.inferred
    assert dict(record.deprecated) == {"macOS": "15.0", "iOS": "18.0"}
    assert record.apple_replacement == "Use the BNNSGraph API instead"
    assert "inferred" in record.describe()


@pytest.mark.parametrize("name", list(RENAMED))
def test_swift_renames_of_c_constants(name):
    record = lookup(name)
    assert record.status == "renamed"
    assert record.kind == "constant"
    assert record.apple_replacement == RENAMED[name]
    assert not is_deprecated(name)
    assert "renamed in Swift" in record.describe()


@pytest.mark.parametrize("name", AVAILABLE_STATED + AVAILABLE_INFERRED)
def test_not_deprecated_names_are_available(name):
    record = lookup(name)
    assert record.status == "available"
    assert dict(record.deprecated) == {}
    assert not is_deprecated(name)
    assert record.inferred == (name in AVAILABLE_INFERRED)
    assert f"{name} ({record.kind}): available" in record.describe()


def test_is_deprecated():
    assert is_deprecated("BNNSFilterApply")
    assert is_deprecated("BNNS.NormalizationLayer")
    assert not is_deprecated("BNNSCopy")
    with pytest.raises(UnknownNameError):
        is_deprecated("NotABNNSName")


def test_bnnsfw_replacements_are_exactly_the_expected_targets():
    mapped = {
        record.name: record.bnnsfw_replacement
        for record in entries()
        if record.bnnsfw_replacement
    }
    assert mapped == BNNSFW_REPLACEMENTS


# Every bnnsfw replacement the registry names must exist.
@pytest.mark.parametrize("target", sorted(set(BNNSFW_REPLACEMENTS.values())))
def test_bnnsfw_replacement_resolves(target):
    obj = importlib.import_module("bnnsfw")
    for part in target.split(".")[1:]:
        obj = getattr(obj, part)
    assert obj is not None


def test_names_are_unique_ignoring_case():
    folded = [record.name.casefold() for record in entries()]
    assert len(folded) == len(set(folded))


# --------------------------------------------------------------------------- records


def test_record_is_frozen_hashable_and_read_only():
    record = lookup("BNNSFilterApply")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.status = "available"  # type: ignore[misc]
    with pytest.raises(TypeError):
        record.deprecated["macOS"] = "16.0"  # type: ignore[index]
    assert hash(record) == hash(lookup("BNNSFilterApply"))
    assert record == lookup("BNNSFilterApply")


@pytest.mark.parametrize(
    "changes",
    [
        {"kind": "macro"},
        {"status": "gone"},
        {"name": "not a name"},
        {"deprecated": {"Linux": "1.0"}},
        {"deprecated": {"macOS": "fifteen"}},
        {"deprecated": {}},  # a deprecated name needs versions
        {"bnnsfw_replacement": "numpy.mean"},
        {"status": "available"},  # an available name carries no deprecation versions
    ],
)
def test_record_validation(changes):
    with pytest.raises(InvalidParameterError):
        attrs.evolve(lookup("BNNSFilterApply"), **changes)


def test_describe_is_readable():
    text = lookup("BNNSFilterCreateLayerNormalization").describe()
    lines = text.splitlines()
    assert lines[0] == "BNNSFilterCreateLayerNormalization (function): deprecated"
    assert "  introduced:         macOS 11.0" in lines
    assert any(line.startswith("  deprecated:") and "visionOS 2.0" in line for line in lines)
    assert "  Apple replacement:  Use BNNSGraph* APIs" in lines
    assert "  bnnsfw replacement: bnnsfw.NormalizationLayer" in lines


def test_to_dict_is_json_ready():
    data = json.loads(json.dumps(lookup("BNNSLayerParametersLSTM").to_dict()))
    assert data["deprecated"] == WAVE2
    assert data["bnnsfw_replacement"] == "bnnsfw.LSTMParameters"


# --------------------------------------------------------------------------- queries


def test_lookup_ignores_case_when_there_is_no_exact_match():
    assert lookup("bnnsfilterapply") is lookup("BNNSFilterApply")
    assert lookup("BNNSFILTERAPPLYBATCH").name == "BNNSFilterApplyBatch"
    assert lookup("bnns.normalizationlayer").name == "BNNS.NormalizationLayer"


def test_unknown_name_suggests_close_names():
    with pytest.raises(UnknownNameError) as caught:
        lookup("BNNSFilterAply")
    message = str(caught.value)
    assert message.startswith(
        "name must be a BNNS name in the deprecation registry; got 'BNNSFilterAply'."
    )
    assert "Did you mean 'BNNSFilterApply'" in message
    assert message.endswith("?")
    assert isinstance(caught.value, (BNNSError, ValueError, LookupError))


def test_unknown_name_without_close_names_points_at_the_list():
    with pytest.raises(UnknownNameError, match="--list"):
        lookup("xyzzy")


def test_lookup_refuses_non_strings():
    with pytest.raises(UnknownNameError, match="must be a str"):
        lookup(42)  # type: ignore[arg-type]


def test_entries_filters():
    assert [record.name for record in entries(status="renamed")] == list(RENAMED)
    enums = {record.name for record in entries(kind="swift-enum")}
    assert enums == set(SWIFT_OVERLAY["swift-enum"])
    both = entries(status="available", kind="swift-type")
    assert [record.name for record in both] == ["BNNSGraph"]
    assert entries()[0].name == "BNNSFilterCreateConvolutionLayer"  # table order


@pytest.mark.parametrize("bad", [{"status": "obsolete"}, {"kind": "class"}])
def test_entries_refuses_unknown_filters(bad):
    with pytest.raises(InvalidParameterError, match="must be None or one of"):
        entries(**bad)


# --------------------------------------------------------------------------- scanning


def _write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="")
    return path


def _positions(findings):
    return [(pathlib.Path(f.path).name, f.line, f.column, f.name) for f in findings]


def test_scan_c_matches_whole_words_only(tmp_path):
    source = _write(
        tmp_path / "filter.c",
        "#include <Accelerate/Accelerate.h>\n"
        "// BNNSFilterApplyBatch is not BNNSFilterApply\n"
        "int run(BNNSFilter f, BNNSFilterParameters *p) {\n"
        "\tMyBNNSFilterApply(f); BNNSFilterApply_x(f); xBNNSFilterApply(f);\n"
        "    return BNNSFilterApply(f, in, out);\n"
        "}\n"
        "BNNSFlagsUseClientPtr;\n",  # a Swift rename: still fine in C
    )
    findings = scan([source])
    assert _positions(findings) == [
        ("filter.c", 2, 4, "BNNSFilterApplyBatch"),
        ("filter.c", 2, 32, "BNNSFilterApply"),
        ("filter.c", 3, 9, "BNNSFilter"),
        ("filter.c", 5, 12, "BNNSFilterApply"),
    ]
    assert all(isinstance(finding, Finding) for finding in findings)
    assert findings[0].status == "deprecated"
    assert findings[0].replacement == "Use BNNSGraph* APIs"
    assert findings[0].path == str(source)
    assert findings[0].location == f"{source}:2:4"


def test_scan_swift_dotted_names_and_renames(tmp_path):
    source = _write(
        tmp_path / "Model.swift",
        "import Accelerate\n"
        "let norm = BNNS.NormalizationLayer(type: .batchNorm)\n"
        "let other = BNNS.NormalizationLayerX()\n"
        "let phase: BNNS.LearningPhase = .training\n"
        "let flags = BNNSFlagsUseClientPtr\n"
        "let d = BNNSImageStackDescriptor.init(width: 1)\n"
        "let f = BNNS.ActivationFunction.sigmoid\n",
    )
    findings = scan(source)  # a single path needs no list
    assert _positions(findings) == [
        ("Model.swift", 2, 12, "BNNS.NormalizationLayer"),
        ("Model.swift", 4, 12, "BNNS.LearningPhase"),
        ("Model.swift", 5, 13, "BNNSFlagsUseClientPtr"),
        ("Model.swift", 6, 9, "BNNSImageStackDescriptor.init"),
        ("Model.swift", 7, 9, "BNNS.ActivationFunction"),
    ]
    assert findings[0].replacement == (
        "Use the BNNSGraph API instead; bnnsfw: bnnsfw.NormalizationLayer"
    )
    assert findings[2].status == "renamed"
    assert findings[2].replacement == "BNNSFlags.useClientPointer"


def test_scan_objective_c_and_python(tmp_path):
    _write(
        tmp_path / "src" / "Net.m",
        "- (void)build {\n"
        "    _f = BNNSFilterCreateLayerNormalization(&p, NULL);\n"
        "    [self copy:BNNSCopy]; BNNSFilterDestroy(_f);\n"
        "}\n",
    )
    _write(
        tmp_path / "src" / "train.py",
        "from bnnsfw import bnns\n"
        "cap = bnns.BNNSComputeLSTMTrainingCacheCapacity(params)\n"
        'name = "BNNSLayerParametersLSTM"  # strings count too\n',
    )
    findings = scan([tmp_path / "src"])
    assert _positions(findings) == [
        ("Net.m", 2, 10, "BNNSFilterCreateLayerNormalization"),
        ("Net.m", 3, 27, "BNNSFilterDestroy"),
        ("train.py", 2, 12, "BNNSComputeLSTMTrainingCacheCapacity"),
        ("train.py", 3, 9, "BNNSLayerParametersLSTM"),
    ]
    assert findings[1].replacement == "Use BNNSGraph* APIs; bnnsfw: bnnsfw.Filter.close"


def test_scan_walks_directories_by_suffix_and_skips_binary_files(tmp_path):
    _write(tmp_path / "b" / "deep" / "x.hpp", "BNNSMatMul(a, b);\n")
    _write(tmp_path / "a.cc", "BNNSTile(x);\n")
    _write(tmp_path / "notes.txt", "BNNSFilterApply\n")  # not a source suffix
    (tmp_path / "blob.h").write_bytes(b"\x00\x01BNNSFilterApply\n")  # binary
    findings = scan(str(tmp_path))
    assert _positions(findings) == [("a.cc", 1, 1, "BNNSTile"), ("x.hpp", 1, 1, "BNNSMatMul")]
    # A file named explicitly is read whatever its suffix.
    assert _positions(scan([tmp_path / "notes.txt"])) == [("notes.txt", 1, 1, "BNNSFilterApply")]


def test_scan_skips_unreadable_files(tmp_path, monkeypatch):
    bad = _write(tmp_path / "bad.c", "BNNSFilterApply\n")
    good = _write(tmp_path / "good.c", "BNNSFilterApply\n")
    original = os.open

    def fake_open(path, flags, *args):
        if os.fspath(path).endswith(bad.name):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return original(path, flags, *args)

    monkeypatch.setattr(os, "open", fake_open)
    skipped = []
    assert [f.path for f in scan(tmp_path, on_skip=lambda p, why: skipped.append((p, why)))] == [str(good)]
    assert skipped == [(str(bad), "cannot be read (Permission denied)")]


def test_scan_positions_with_crlf_and_non_ascii(tmp_path):
    source = _write(tmp_path / "w.c", "/* é */\r\n// ü BNNSGather\r\nBNNSScatter\r\n")
    assert _positions(scan(source)) == [("w.c", 2, 6, "BNNSGather"), ("w.c", 3, 1, "BNNSScatter")]


def test_scan_missing_path_names_the_path(tmp_path):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(FileNotFoundError, match="no-such-dir") as caught:
        scan([tmp_path, missing])
    assert caught.value.filename == str(missing)


def test_scan_ignores_available_names(tmp_path):
    source = _write(tmp_path / "ok.c", "BNNSCopy(d, s, NULL); BNNSNDArrayDescriptor a;\n")
    assert scan(source) == []


# --------------------------------------------------------------------------- warnings


def _bnns_style_function():
    warn_deprecated("BNNSFilterCreateLayerNormalization")


def _inner_helper():
    warn_deprecated("BNNSFilterDestroy", stacklevel=3)


def _outer_helper():
    _inner_helper()


def test_warning_names_versions_and_replacements():
    with pytest.warns(DeprecationWarning) as caught:
        _bnns_style_function()
    message = str(caught[0].message)
    assert message.startswith("BNNSFilterCreateLayerNormalization is deprecated")
    assert "macOS 15.0" in message and "iOS 18.0" in message
    assert "Use BNNSGraph* APIs" in message
    assert "bnnsfw.NormalizationLayer" in message


def test_default_stacklevel_points_at_the_caller_of_the_bnns_function():
    with pytest.warns(DeprecationWarning) as caught:
        line = inspect.currentframe().f_lineno + 1
        _bnns_style_function()
    assert caught[0].filename == __file__
    assert caught[0].lineno == line


def test_stacklevel_three_from_a_helper_two_frames_deep():
    with pytest.warns(DeprecationWarning, match="BNNSFilterDestroy") as caught:
        line = inspect.currentframe().f_lineno + 1
        _outer_helper()
    assert caught[0].filename == __file__
    assert caught[0].lineno == line
    assert "bnnsfw.Filter.close" in str(caught[0].message)


def test_first_wave_warning_names_apple_replacement():
    with pytest.warns(DeprecationWarning, match=r"since macOS 11\.0 and iOS 14\.0") as caught:
        warn_deprecated("BNNSFilterCreateConvolutionLayer")
    assert "Use BNNSFilterCreateLayerConvolution instead" in str(caught[0].message)


def test_renamed_names_warn_with_the_swift_spelling():
    with pytest.warns(DeprecationWarning, match="renamed in Swift: use BNNSFlags.useClientPointer"):
        warn_deprecated("BNNSFlagsUseClientPtr")


def test_warn_deprecated_refuses_available_and_unknown_names():
    with pytest.raises(InvalidParameterError, match="deprecated or renamed"):
        warn_deprecated("BNNSCopy")
    with pytest.raises(UnknownNameError):
        warn_deprecated("BNNSNothing")
    with pytest.raises(InvalidParameterError, match="stacklevel"):
        warn_deprecated("BNNSFilterApply", stacklevel=0)


# --------------------------------------------------------------------------- command line


@pytest.fixture
def sources(tmp_path):
    _write(tmp_path / "uses.c", "void f(void) { BNNSFilterApply(f, i, o); }\n")
    _write(tmp_path / "clean" / "ok.c", "void g(void) { BNNSCopy(d, s, 0); }\n")
    return tmp_path


def test_main_check_exit_status(sources, capsys):
    assert main(["--scan", str(sources), "--check"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"uses\.c:1:16\s+BNNSFilterApply\s+Use BNNSGraph\* APIs", out)
    assert out.rstrip().endswith("1 finding (1 deprecated) in 1 file.")
    assert main(["--scan", str(sources / "clean"), "--check"]) == 0
    assert "No deprecated or renamed BNNS names found." in capsys.readouterr().out
    assert main(["--scan", str(sources)]) == 0  # findings without --check still succeed


def test_main_json_is_parseable(sources, capsys):
    assert main(["--scan", str(sources), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == [
        {
            "path": str(sources / "uses.c"),
            "line": 1,
            "column": 16,
            "name": "BNNSFilterApply",
            "status": "deprecated",
            "replacement": "Use BNNSGraph* APIs",
        }
    ]


def test_main_describes_names(capsys):
    assert main(["BNNSFilterDestroy", "bnnscopy"]) == 0
    out = capsys.readouterr().out
    assert "BNNSFilterDestroy (function): deprecated" in out
    assert "BNNSCopy (function): available" in out


def test_main_unknown_name_exits_2(capsys):
    assert main(["BNNSFilterApply", "BNNSFilterAply"]) == 2
    captured = capsys.readouterr()
    assert "Did you mean 'BNNSFilterApply'" in captured.err
    assert "BNNSFilterApply (function): deprecated" in captured.out


def test_main_list_with_status(capsys):
    assert main(["--list", "--status", "renamed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(RENAMED)
    assert main(["--list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == len(ALL_NAMES)


@pytest.mark.parametrize(
    "argv",
    [[], ["--check"], ["--list", "BNNSFilterApply"], ["BNNSFilterApply", "--status", "renamed"]],
)
def test_main_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "usage: bnnsfw deprecations" in capsys.readouterr().err


def test_main_missing_scan_path_exits_2(tmp_path, capsys):
    assert main(["--scan", str(tmp_path / "absent")]) == 2
    assert "absent" in capsys.readouterr().err


# --------------------------------------------------------------------------- documentation


def test_markdown_table_has_one_row_per_record():
    lines = markdown_table().splitlines()
    assert lines[0].startswith("| Name | Kind | Status |")
    assert len(lines) == 2 + len(entries())
    assert "| `BNNSFilterDestroy` | function | deprecated | macOS 10.12 |" in markdown_table()


def test_docs_page_embeds_the_current_table():
    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "deprecations.md"
    text = page.read_text(encoding="utf-8")
    start, end = "<!-- registry-table:start -->", "<!-- registry-table:end -->"
    assert text.count(start) == 1 and text.count(end) == 1
    embedded = text.split(start, 1)[1].split(end, 1)[0]
    assert embedded.strip("\n") == markdown_table(), (
        "docs/deprecations.md is stale: paste bnnsfw.deprecation.markdown_table() "
        "between the markers"
    )
