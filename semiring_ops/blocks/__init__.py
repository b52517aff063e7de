"""The block engine: outputs too large for one launch or one device, computed block by block.

- :func:`dense`, :func:`pdist`, :func:`matmul` (api.py): a lazy formula's values, its condensed symmetric
  values in scipy's pdist layout, a semiring product, into a host output; :func:`empty` (host_memory.py):
  the output they allocate (huge pages); :func:`last_run`: where the last run's time went;
- scheduler.py: how an (M, N[, D]) output is cut into blocks under a memory budget, ordered for a pool of
  GPUs (pure Python);
- engine.py: the generic orchestration (a worker per device, a double-buffered pipeline per GPU, faults,
  progress); policies.py: what each operation adds (its sizes, how a block is computed); writers.py: where
  a block goes (dense or condensed output).
"""

from .api import dense, matmul, pdist
from .engine import BlockError, RunStats, last_run
from .host_memory import empty
from .scheduler import (
    BLOCKS_PER_GPU,
    ROWS_PER_SM,
    Block,
    BlockGrid,
    condensed_index,
    condensed_row_start,
    condensed_size,
    plan_blocks,
    split_bands,
)

__all__ = [
    "BLOCKS_PER_GPU",
    "ROWS_PER_SM",
    "Block",
    "BlockError",
    "BlockGrid",
    "RunStats",
    "condensed_index",
    "condensed_row_start",
    "condensed_size",
    "dense",
    "empty",
    "last_run",
    "matmul",
    "pdist",
    "plan_blocks",
    "split_bands",
]
