"""The block engine: outputs too large for one launch or one device, computed block by block.

For now only the scheduler (:mod:`.scheduler`): how an (M, N[, D]) output is cut into blocks under a memory
budget, ordered for a pool of GPUs.
"""

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
    "BlockGrid",
    "condensed_index",
    "condensed_row_start",
    "condensed_size",
    "plan_blocks",
    "split_bands",
]
