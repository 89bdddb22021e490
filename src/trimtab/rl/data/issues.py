"""What a problem in market data raises (``DataError``) and what it records (``DataIssue``).

A leaf module (it imports nothing from trimtab), so the loader, its checks and the calendar
can all use it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The kinds of :class:`DataIssue`, each a problem the loader found and did not refuse:
#: ``gap``: more business days missing between two rows than ``max_gap_days``;
#: ``empty_row``: rows with no values, dropped or filled (``gaps='drop'|'ffill'``);
#: ``alignment``: rows an asset lost to the inner join on the dates all assets share;
#: ``split``: a one-day move at a split ratio (2, 3, 3/2, ...) in a file without Adj Close;
#: ``bad_tick``: a one-day spike that reverses the next day;
#: ``extreme``: any other one-day move far outside the asset's own spread;
#: ``still``: a price that does not move on most days, or a volume that is always zero;
#: ``timezone``: assets stamped at different UTC offsets (different exchanges' closes).
ISSUE_KINDS = ("gap", "empty_row", "alignment", "split", "bad_tick", "extreme", "still", "timezone")


class DataError(ValueError):
    """A defect in the user's market data; the message is self-contained and says how to fix it."""


@dataclass(frozen=True)
class DataIssue:
    """One problem found in the data and reported, not refused.

    ``first``/``last``: the ISO dates the issue spans (both ``None`` when it concerns no
    particular dates, e.g. zero volume throughout); ``message``: one self-contained line that
    names the file and the dates, as printed to the user.
    """

    kind: str
    asset: str | None
    first: str | None
    last: str | None
    message: str

    def __post_init__(self) -> None:
        if self.kind not in ISSUE_KINDS:
            raise ValueError(f"DataIssue.kind={self.kind!r} is not one of {ISSUE_KINDS}")
        if (self.first is None) != (self.last is None):
            raise ValueError(f"DataIssue needs both first and last, or neither: {self}")
        if self.first is not None and self.last is not None and self.first > self.last:
            raise ValueError(f"DataIssue.first={self.first} is after last={self.last}")
        if "\n" in self.message:
            raise ValueError(f"DataIssue.message must be one line: {self.message!r}")


def data_error(file: str, where: str, col: str | None, problem: str, fix: str) -> DataError:
    """``"FILE: WHERE, column 'COL': PROBLEM. FIX"``, the parts that are empty left out."""
    loc = ", ".join(p for p in (where, f"column '{col}'" if col is not None else "") if p)
    return DataError(f"{file}: {loc + ': ' if loc else ''}{problem}. {fix}")
