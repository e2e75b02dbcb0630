"""The facts behind :mod:`bnnsfw.deprecation`: every BNNS name it knows, in one table.

This module is data only; :mod:`bnnsfw.deprecation.records` parses :data:`TABLE` once, at
import, into :class:`~bnnsfw.deprecation.DeprecationRecord` objects and validates every cell.

Format of :data:`TABLE`
-----------------------
- One BNNS name per line, eight cells separated by ``|``::

      name | kind | status | inferred | introduced | deprecated | apple replacement | bnnsfw replacement

- ``-`` is an empty cell. ``inferred`` is ``yes`` when the facts mark the row as inferred
  (or when the row follows from the facts rather than being stated by them).
- ``introduced`` and ``deprecated`` list ``<platform> <version>`` pairs separated by commas,
  for example ``macOS 10.13, iOS 11.0``.
- A cell that is exactly a key of :data:`ALIASES` (``@wave2``, ``@graph``, ...) stands for
  that key's text; the aliases only spell out values that dozens of rows share.
- A line starting with ``+`` continues the note of the row above it (several ``+`` lines
  are joined with spaces).
- Lines starting with ``#`` are comments; blank lines are ignored.

Sources: Apple's SDK headers (``bnns.h``, ``bnns_structures.h``, ``bnns_constants.h``) and
developer documentation, as collected for the project. Names that the sources only summarise
("``Fused*Layer``", "``BNNSRandomFill*``", "optimizers", "...") are not listed one by one,
because listing them would mean inventing names.
"""

# The table reads best unwrapped.
# ruff: noqa: E501

from __future__ import annotations

__all__ = ["ALIASES", "TABLE"]

#: Cell values shared by many rows, by the token that stands for them in :data:`TABLE`.
ALIASES: dict[str, str] = {
    # The second wave: every filter-based API, deprecated together.
    "@wave2": "macOS 15.0, iOS 18.0, iPadOS 18.0, Mac Catalyst 18.0, tvOS 18.0, watchOS 11.0, visionOS 2.0",
    "@graph": "Use BNNSGraph* APIs",
    # The Swift overlay: the documentation gives no end version; SDK 15 / 18 is inferred.
    "@swift-sdk": "macOS 15.0, iOS 18.0",
    "@swift-graph": "Use the BNNSGraph API instead",
}

#: The registry, one BNNS name per line (format in the module docstring).
TABLE = """
# name | kind | status | inferred | introduced | deprecated | apple replacement | bnnsfw replacement
#     + note

# 5.1 First wave: the classic API, replaced in macOS 11 / iOS 14.
# Declared with __API_DEPRECATED_WITH_REPLACEMENT unless a note says otherwise.
BNNSFilterCreateConvolutionLayer      | function   | deprecated | - | macOS 10.12           | macOS 11.0, iOS 14.0, watchOS 7.0, tvOS 14.0 | BNNSFilterCreateLayerConvolution              | -
BNNSFilterCreateFullyConnectedLayer   | function   | deprecated | - | macOS 10.12           | macOS 11.0, iOS 14.0                         | BNNSFilterCreateLayerFullyConnected           | -
    + Apple's documentation page wrongly says "Use BNNSFilterCreateFullyConnectedLayer instead"; the
    + header is authoritative.
BNNSFilterCreatePoolingLayer          | function   | deprecated | - | macOS 10.12           | macOS 11.0, iOS 14.0                         | BNNSFilterCreateLayerPooling                  | -
BNNSFilterCreateVectorActivationLayer | function   | deprecated | - | macOS 10.13, iOS 11.0 | macOS 11.0, iOS 14.0, watchOS 7.0, tvOS 14.0 | BNNSFilterCreateLayerActivation               | -
BNNSConvolutionLayerParameters        | struct     | deprecated | - | -                     | macOS 11.0, iOS 14.0                         | BNNSLayerParametersConvolution                | -
BNNSFullyConnectedLayerParameters     | struct     | deprecated | - | -                     | macOS 11.0, iOS 14.0                         | BNNSLayerParametersFullyConnected             | -
BNNSPoolingLayerParameters            | struct     | deprecated | - | -                     | macOS 11.0, iOS 14.0                         | BNNSLayerParametersPooling                    | -
BNNSImageStackDescriptor              | struct     | deprecated | - | -                     | macOS 11.0, iOS 14.0                         | BNNSNDArrayDescriptor                         | -
    + Plain __API_DEPRECATED("BNNS switched to new Layer Parameters data structures"); header comment
    + "DEPRECATED, Use BNNSNDArrayDescriptor".
BNNSVectorDescriptor                  | struct     | deprecated | - | -                     | macOS 11.0, iOS 14.0                         | BNNSNDArrayDescriptor                         | -
    + Plain __API_DEPRECATED("BNNS switched to new Layer Parameters data structures"); header comment
    + "DEPRECATED, Use BNNSNDArrayDescriptor".
BNNSLayerData                         | struct     | deprecated | - | -                     | macOS 11.0, iOS 14.0                         | BNNSNDArrayDescriptor                         | -
    + Plain __API_DEPRECATED("BNNS switched to new Layer Parameters data structures"); header comment
    + "Use BNNSNDArrayDescriptor instead".
BNNSPoolingFunctionAverage            | enum-value | deprecated | - | macOS 10.12           | macOS 11.0, iOS 14.0                         | BNNSPoolingFunctionAverageCountIncludePadding | -
    + Enum value 1.
BNNSDirectApplyBroadcastMatMul        | function   | deprecated | - | macOS 11.0            | macOS 13.0, iOS 16.0, watchOS 9.0, tvOS 16.0 | BNNSMatMul (with BNNSMatMulWorkspaceSize)     | -

# Swift convenience members of the old structs; Apple's documentation pages show the macOS range.
BNNSLayerData.zero            | swift-member      | deprecated | - | macOS 10.12 | macOS 12.0 | -                                             | -
    + Apple names no replacement for this member.
BNNSImageStackDescriptor.init | swift-initializer | deprecated | - | macOS 10.12 | macOS 12.0 | -                                             | -
    + The initializer init(width:…data_type:); Apple names no replacement for it.
BNNSPoolingFunction.average   | swift-member      | deprecated | - | macOS 10.15 | macOS 12.0 | BNNSPoolingFunctionAverageCountIncludePadding | -

# 5.2 Second wave: everything filter-based, replaced by the Graph API.
# __API_DEPRECATED("Use BNNSGraph* APIs", ...); Graph API: BNNSGraphCompileFromFile, BNNSGraphContextMake, BNNSGraphContextExecute, Swift BNNSGraph.
BNNSFilter           | typedef  | deprecated | - | macOS 10.12 | @wave2 | @graph | -
BNNSFilterApply      | function | deprecated | - | macOS 10.12 | @wave2 | @graph | -
BNNSFilterApplyBatch | function | deprecated | - | macOS 10.12 | @wave2 | @graph | -
BNNSFilterDestroy    | function | deprecated | - | macOS 10.12 | @wave2 | @graph | bnnsfw.Filter.close

# Filter creation.
BNNSFilterCreateLayerConvolution           | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerTransposedConvolution | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerFullyConnected        | function | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.FullyConnectedLayer
BNNSFilterCreateLayerPooling               | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerActivation            | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerLoss                  | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerNormalization         | function | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.NormalizationLayer
BNNSFilterCreateLayerArithmetic            | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerPermute               | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerDropout               | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerPadding               | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerBroadcastMatMul       | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerTensorContraction     | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerGram                  | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerResize                | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerMultiheadAttention    | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerReduction             | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateFusedLayer                 | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterCreateLayerEmbedding             | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -

# Forward.
BNNSPoolingFilterApplyBatch         | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterApplyTwoInput             | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterApplyTwoInputBatch        | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSNormalizationFilterApplyBatch   | function | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.NormalizationLayer.apply
BNNSFusedFilterApplyBatch           | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSArithmeticFilterApplyBatch      | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSApplyMultiheadAttention         | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLossFilterApplyBatch            | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFusedFilterApplyMultiInputBatch | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSDirectApplyQuantizer            | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSPoolingFilterApplyBatchEx       | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -

# Backward.
BNNSFilterApplyBackwardBatch                | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSPoolingFilterApplyBackwardBatch         | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFilterApplyBackwardTwoInputBatch        | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSNormalizationFilterApplyBackwardBatch   | function | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.NormalizationLayer.apply_backward
BNNSFusedFilterApplyBackwardBatch           | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSArithmeticFilterApplyBackwardBatch      | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSPermuteFilterApplyBackwardBatch         | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLossFilterApplyBackwardBatch            | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSApplyMultiheadAttentionBackward         | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSFusedFilterApplyBackwardMultiInputBatch | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSPoolingFilterApplyBackwardBatchEx       | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -

# LSTM.
BNNSComputeLSTMTrainingCacheCapacity    | function | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.LSTMLayer.training_cache_capacity
BNNSDirectApplyLSTMBatchTrainingCaching | function | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.LSTMLayer.apply
BNNSDirectApplyLSTMBatchBackward        | function | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.LSTMLayer.apply_backward

# Direct functions.
BNNSDirectApplyActivationBatch             | function | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.Activation.forward
BNNSCompareTensor                          | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSGetPointer                             | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSOptimizerStep                          | function | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSClipByValue                            | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSClipByNorm                             | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSClipByGlobalNorm                       | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSComputeNorm                            | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSComputeNormBackward                    | function | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSMatMul                                 | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSMatMulWorkspaceSize                    | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSTile                                   | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSTileBackward                           | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSGather                                 | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSScatter                                | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSGatherND                               | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSScatterND                              | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSShuffle                                | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSBandPart                               | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSCropResize                             | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSCropResizeBackward                     | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSNDArrayFullyConnectedSparsifySparseCOO | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -
BNNSNDArrayFullyConnectedSparsifySparseCSR | function | deprecated | - | macOS 13.0 | @wave2 | @graph | -

# Structures.
BNNSLayerParametersConvolution             | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersFullyConnected          | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.FullyConnectedParameters
BNNSLayerParametersPooling                 | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersActivation              | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersLossBase                | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersLossSoftmaxCrossEntropy | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersLossSigmoidCrossEntropy | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersLossHuber               | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersLossYolo                | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersNormalization           | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.NormalizationParameters
BNNSLayerParametersDropout                 | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersLSTM                    | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.LSTMParameters
BNNSLayerParametersArithmetic              | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersPermute                 | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersTensorContraction       | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersGram                    | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersResize                  | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersBroadcastMatMul         | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersMultiheadAttention      | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersPadding                 | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLSTMGateDescriptor                     | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | bnnsfw.LSTMGateDescriptor
BNNSLSTMDataDescriptor                     | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSArithmeticUnary                        | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSArithmeticBinary                       | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSArithmeticTernary                      | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSOptimizerSGDMomentumFields             | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSOptimizerAdamFields                    | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSOptimizerRMSPropFields                 | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSOptimizerSGDMomentumWithClippingFields | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSOptimizerAdamWithClippingFields        | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSOptimizerRMSPropWithClippingFields     | struct | deprecated | - | macOS 11.0 | @wave2 | @graph | -
BNNSLayerParametersEmbedding               | struct | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSLayerParametersQuantization            | struct | deprecated | - | macOS 12.0 | @wave2 | @graph | -
BNNSLayerParametersCropResize              | struct | deprecated | - | macOS 13.0 | @wave2 | @graph | -

# Swift overlay (second wave): "Use the BNNSGraph API instead". Fused*Layer classes, optimizers and other members
# the facts only summarise with "..." are not listed: no names are invented.
BNNS.Layer                     | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.UnaryLayer                | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.BinaryLayer               | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.NormalizationLayer        | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | bnnsfw.NormalizationLayer
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.ActivationLayer           | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.ConvolutionLayer          | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.FullyConnectedLayer       | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | bnnsfw.FullyConnectedLayer
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.PoolingLayer              | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.LossLayer                 | swift-class    | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.NormalizationType         | swift-enum     | deprecated | yes | - | @swift-sdk | @swift-graph | bnnsfw.NormalizationType
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.LearningPhase             | swift-enum     | deprecated | yes | - | @swift-sdk | @swift-graph | bnnsfw.LearningPhase
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.ActivationFunction        | swift-enum     | deprecated | yes | - | @swift-sdk | @swift-graph | bnnsfw.ActivationFunction
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.applyActivation           | swift-function | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0.
BNNS.compare                   | swift-function | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0. Listed as "compare" after BNNS.applyActivation; the BNNS. prefix is
    + read from that list.
BNNS.gather                    | swift-function | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0. Listed as "gather" after BNNS.applyActivation; the BNNS. prefix is
    + read from that list.
BNNSActivationFunction.sigmoid | swift-member   | deprecated | yes | - | @swift-sdk | @swift-graph | -
    + Apple's pages give no end version: macOS 15.0 / iOS 18.0 is inferred from the SDK. Introduced
    + between macOS 11.0 and 13.0. Swift static member of the C enum.

# Swift renames of C global constant spellings: still available in C and Objective-C; reported by scan in Swift files only.
BNNSActivationFunctionSigmoid | constant | renamed | - | - | - | BNNSActivationFunction.sigmoid | -
    + A C enum constant, not deprecated in C; the Swift spelling BNNSActivationFunction.sigmoid is
    + itself deprecated in the Swift overlay.
BNNSFlagsUseClientPtr         | constant | renamed | - | - | - | BNNSFlags.useClientPointer     | -
    + A C flag, not deprecated in C.

# Not deprecated: declared with __API_AVAILABLE.
BNNSCopy                          | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSTranspose                     | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSDirectApplyReduction          | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSDirectApplyTopK               | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSDirectApplyInTopK             | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSCreateRandomGenerator         | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE. Random-generator function.
BNNSCreateRandomGeneratorWithSeed | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE. Random-generator function.
BNNSDestroyRandomGenerator        | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE. Random-generator function.
BNNSRandomGeneratorGetState       | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE. Random-generator function.
BNNSRandomGeneratorSetState       | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE. Random-generator function.
BNNSRandomGeneratorStateSize      | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE. Random-generator function.
BNNSCreateNearestNeighbors        | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE. Nearest-neighbours function.
BNNSNDArrayGetDataSize            | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSTensorGetAllocationSize       | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSDataLayoutGetRank             | function | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSNDArrayDescriptor             | struct   | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSActivation                    | struct   | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSFilterParameters              | struct   | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSLayerParametersReduction      | struct   | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.
BNNSMHAProjectionParameters       | struct   | available | - | - | - | - | -
    + Declared with __API_AVAILABLE.

# Not deprecated by inference: named as replacements, or members of a group that is not deprecated.
BNNSPoolingFunctionAverageCountIncludePadding | enum-value   | available | yes | - | - | - | -
    + A C enum constant, and C enum constants are not deprecated; Apple's replacement for
    + BNNSPoolingFunctionAverage.
BNNSFlags.useClientPointer                    | swift-member | available | yes | - | - | - | -
    + The Swift spelling of BNNSFlagsUseClientPtr; no deprecation of it is recorded.
BNNSGraphCompileFromFile                      | function     | available | yes | - | - | - | -
    + Part of the Graph API (bnns_graph.h) that replaces the filter API.
BNNSGraphContextMake                          | function     | available | yes | - | - | - | -
    + Part of the Graph API (bnns_graph.h) that replaces the filter API.
BNNSGraphContextExecute                       | function     | available | yes | - | - | - | -
    + Part of the Graph API (bnns_graph.h) that replaces the filter API.
BNNSGraph                                     | swift-type   | available | yes | - | - | - | -
    + The Swift Graph API that replaces the filter API.
"""
