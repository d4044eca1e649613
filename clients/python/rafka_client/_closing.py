"""What the client's objects share as context managers: `with X(...) as x:` closes x when
the block ends, and a close that fails after the block failed does not hide the block's
error (it is added to it as a note)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    # What the note on a failed block calls the close (the Producer's close is a flush).
    _close_on_exit = "the close on exit"

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as error:
            exc.add_note(f"rafka_client: {self._close_on_exit} failed too: {error!r}")
