"""LazyTensors of NumPy arrays, as KeOps's ``pykeops.numpy`` front end:

    from semiring_ops.lazy.numpy import LazyTensor, Vi, Vj, Pm     # was: from pykeops.numpy import ...

The torch LazyTensor of semiring_ops.lazy behind KeOps's NumPy interface (lazy_tensor.py): arrays are wrapped
as tensors without a copy, NumPy arrays and numbers combine with a LazyTensor on either side, ``K @ v``,
``K.solve(b)`` and ``out=`` take arrays, every reduction returns arrays (values and int64 indices), and a scalar
formula is a ``scipy.sparse.linalg`` linear operator (``dtype``, a 2-D ``shape``, ``matvec``, ``rmatvec``). The
computation is the torch one (CPU kernels, or a GPU with ``backend="GPU"`` / ``device_id=``, the result copied
back); there is no autograd on arrays. ``semiring_ops.lazy.numpy.cluster`` and ``.utils`` stand for
``pykeops.numpy.cluster`` and ``pykeops.numpy.utils.WarmUpGpu``.
"""

from .lazy_tensor import ComplexLazyTensor, LazyTensor, Pm, Vi, Vj

__all__ = ["ComplexLazyTensor", "LazyTensor", "Pm", "Vi", "Vj"]
