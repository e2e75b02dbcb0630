"""The layers: one module per layer, each with its parameter objects beside it."""
