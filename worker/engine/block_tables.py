"""Every sequence's block table as one row of a preallocated array, kept in step with the
sequences' own lists by the block manager, which makes every change to them.

A step's block tables are then one gather of the rows of the sequences it runs
(``gather``), not a copy of each list entry by entry: at 256 sequences of 20 blocks
that copy alone took 0.18-0.24 ms of host time per step, the gather about 10 us
(``benchmarks/host_work.py``). A sequence holds a row (``Sequence.table_row``) from
its first block until its table is emptied; rows and columns grow by doubling.
"""

from __future__ import annotations

import numpy as np

from worker.engine.sequence import Sequence


class BlockTables:
    """Rows of block ids, one per sequence holding blocks; entries past a sequence's table
    are 0 (RELEASED entries are mirrored as they are)."""

    def __init__(self, rows: int = 64, width: int = 16) -> None:
        self.array = np.zeros((rows, width), dtype=np.int64)  # [rows, width]
        self.free_rows: list[int] = list(range(rows - 1, -1, -1))  # popped from the end: low rows first

    def _row(self, seq: Sequence) -> int:
        """``seq``'s row, assigned on first use."""
        if seq.table_row is None:
            if not self.free_rows:
                rows = self.array.shape[0]
                self.array = np.concatenate([self.array, np.zeros_like(self.array)])  # [2 * rows, width]
                self.free_rows = list(range(2 * rows - 1, rows - 1, -1))
            seq.table_row = self.free_rows.pop()
        return seq.table_row

    def _fit(self, width: int) -> None:
        """Widen the array to at least ``width`` columns."""
        have = self.array.shape[1]
        if width > have:
            wider = max(width, 2 * have)
            self.array = np.pad(self.array, ((0, 0), (0, wider - have)))  # [rows, wider]

    def set(self, seq: Sequence, index: int, block: int) -> None:
        """Entry ``index`` of ``seq``'s table is now ``block`` (the list already says so)."""
        self._fit(index + 1)
        row = self._row(seq)  # first: assigning a row may grow the array
        self.array[row, index] = block

    def load(self, seq: Sequence) -> None:
        """Copy ``seq``'s whole list into its row; an empty list gives the row back."""
        table = seq.block_table
        if not table:
            self.release(seq)
            return
        self._fit(len(table))
        index = self._row(seq)  # first: assigning a row may grow the array
        row = self.array[index]  # [width] view
        row[: len(table)] = table
        row[len(table):] = 0

    def release(self, seq: Sequence) -> None:
        """``seq`` holds no table any more: its row is free for another."""
        if seq.table_row is not None:
            self.array[seq.table_row] = 0
            self.free_rows.append(seq.table_row)
            seq.table_row = None

    def gather(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Write into ``out`` ``[len(rows), width]`` the first ``width`` entries of each of
        ``rows`` (the ``table_row`` of sequences holding blocks)."""
        width = out.shape[1]
        self._fit(width)
        np.take(self.array[:, :width], rows, axis=0, out=out)

    def matches(self, seq: Sequence) -> bool:
        """Whether ``seq``'s row says what its list says (tests and debugging)."""
        table = seq.block_table
        if not table:
            return seq.table_row is None
        row = seq.table_row
        return row is not None and self.array[row, : len(table)].tolist() == table
