"""Which synced journal bytes to drop from the page cache, and when (I/O-free).

Why: a journal is written once, synced, and read again only by a replay after a
restart. Its pages are of no use in the page cache once synced, yet each one kept there
takes a page that nothing gives back until the kernel reclaims it: the cache grows by
every journal byte ever written and pushes out what readers need (the entry logs).
BookKeeper drops them for that reason (``journalRemoveFromPageCache``, on by default).

On this project's machines it also costs CPU at the writer. Pages freed back to the
kernel are reused while warm; pages the cache never gives back must be new ones, and a
virtual machine's new pages are slow to touch the first time. Measured (one process,
1 MiB writes, fdatasync every 4 MiB, 4 GiB): the kernel's copy into the page cache costs
0.30-0.39 us per KiB while the first GiB fills, then 2.1-3.6 us per KiB; with the synced
range dropped after each sync it stays at 0.29-0.39 us per KiB. A bookie writes every
entry twice (journal and entry log), so under a steady load its CPU per entry grew about
2.5-fold after its first few GiB.

The journal drops in steps of ``step`` bytes (one ``posix_fadvise`` per MiB, not one per
group: dropping 1 MiB of synced pages takes about 0.24 ms) and only whole pages below the
synced offset; the page holding the synced end stays cached, since the next group writes
into it. Only the journal's thread drops, after it has handed the group's acknowledgement
to the loop; a record written inline (a lone record on an idle journal, on the loop)
leaves its pages to the thread's next drop, which starts where the last one ended. A file
left for the next is not dropped whole: the checkpoint that passes it deletes it, and its
pages with it. A step of 0 keeps everything (the behaviour before).
"""

from __future__ import annotations

from typing import Final

PAGE_BYTES: Final = 4096


class PageDrops:
    """One journal file's dropped prefix: :meth:`after_sync` says what to drop next."""

    __slots__ = ("_done", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self._done = 0  # bytes from the file's start already dropped

    def restart(self) -> None:
        """A new file: nothing of it dropped yet."""
        self._done = 0

    def after_sync(self, synced: int) -> tuple[int, int] | None:
        """``(offset, length)`` to drop now that the file is synced up to ``synced``
        bytes, or None while less than a step has been synced since the last drop."""
        end = synced - synced % PAGE_BYTES
        if self.step <= 0 or end - self._done < self.step:
            return None
        start, self._done = self._done, end
        return start, end - start
