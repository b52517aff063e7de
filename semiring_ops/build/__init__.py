"""Building and choosing the compiled kernels (JIT with ninja, ahead-of-time via setup.py, or the
PyTorch reference as fallback)."""
