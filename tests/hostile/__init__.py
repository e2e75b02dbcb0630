"""The hostile-input suite: one module per family of the hardening issue."""
