"""A stand-in for plotly, for plot_LDDMM_Surface.py where plotly is not installed (tests/test_keops_tutorials.py puts
this folder on the path only then): the figures it builds are kept, and written as a small HTML summary."""
