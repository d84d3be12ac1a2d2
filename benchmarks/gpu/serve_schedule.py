"""The host side of the server loop (serve_loop.py): requests, continuous batching, and the page allocator.

Continuous batching: a fixed number of slots (the decode step's batch); every iteration first admits waiting
requests into free slots (each admission is a prefill of the request's context), then runs one decode step for
every busy slot; a request that has generated its tokens leaves its slot after that step, and the next waiting
request takes the slot at the next iteration. The schedule depends on the request set alone (the tokens are fixed
in advance, teacher-forced), so both servers run the same iterations and their logits can be compared step by step.

Pages: a request holds ceil(tokens / page_size) pages of the pool, taken when it is admitted (its context) and one
at a time as its tokens cross a page boundary, and given back when it leaves; freed pages are taken again first
(a stack), so a later request writes into pages an earlier one read. The pool holds the most pages the schedule
ever has in use at once (found by a dry run of the same allocator): what a server provisions for this load.
No JAX here: the metadata is numpy, built on the host each step as a serving stack builds it.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Request:
    rid: int
    context: int             # prompt tokens, prefilled on admission
    generate: int            # decode steps (tokens generated after the prefill's)
    tokens: np.ndarray = field(repr=False)  # int32 [context + generate]: the prompt, then the teacher-forced tokens


def make_requests(n: int, contexts: tuple[int, ...], generate: tuple[int, ...], vocab: int,
                  seed: int = 0) -> list[Request]:
    """n requests, each context and generation length drawn from the given choices (a fixed seed)."""
    rng = np.random.default_rng(seed)
    out = []
    for rid in range(n):
        c, g = int(rng.choice(contexts)), int(rng.choice(generate))
        out.append(Request(rid, c, g, rng.integers(0, vocab, c + g, dtype=np.int32)))
    return out


@dataclass(frozen=True)
class Step:
    admit: list[tuple[int, Request]]         # (slot, request) prefilled before this step
    decode: list[tuple[int, Request, int]]   # (slot, request, j): decode step j of the request (0-based)


def schedule(requests: list[Request], slots: int) -> Iterator[Step]:
    """The iterations of continuous batching over `slots` slots, requests admitted in order."""
    queue = deque(requests)
    busy: list[list | None] = [None] * slots  # [request, next decode step]
    while queue or any(busy):
        admit = []
        for s in range(slots):
            if busy[s] is None and queue:
                busy[s] = [queue.popleft(), 0]
                admit.append((s, busy[s][0]))
        yield Step(admit, [(s, b[0], b[1]) for s, b in enumerate(busy) if b is not None])
        for s, b in enumerate(busy):
            if b is not None:
                b[1] += 1
                if b[1] == b[0].generate:
                    busy[s] = None


class PageTable:
    """Pages of one pool, per slot, for the schedule; decode() gives the step's FlashInfer metadata."""

    def __init__(self, num_pages: int | None, page_size: int, slots: int):
        self.page_size, self.slots = page_size, slots
        self.num_pages = num_pages  # None: unbounded (the dry run)
        self.free: list[int] = [] if num_pages is None else list(range(num_pages - 1, -1, -1))
        self.next_new = 0 if num_pages is None else num_pages
        self.pages: list[list[int]] = [[] for _ in range(slots)]
        self.length = [0] * slots  # tokens held per slot
        self.peak_pages = 0
        self.reused = 0            # pages taken that an earlier request had held

    def _take(self) -> int:
        if self.free:
            self.reused += 1
            return self.free.pop()
        if self.num_pages is not None:
            raise RuntimeError(f"page pool exhausted ({self.num_pages} pages): the dry run sized it too small")
        self.next_new += 1
        return self.next_new - 1

    def _grow(self, slot: int, tokens: int) -> None:
        while len(self.pages[slot]) * self.page_size < tokens:
            self.pages[slot].append(self._take())
        self.length[slot] = tokens
        self.peak_pages = max(self.peak_pages, self.in_use())

    def in_use(self) -> int:
        return sum(len(p) for p in self.pages)

    def held(self) -> int:
        return sum(self.length)

    def slots_of(self, slot: int, start: int, stop: int) -> np.ndarray:
        """Absolute pool slots of the slot's tokens [start, stop)."""
        t = np.arange(start, stop)
        return np.asarray(self.pages[slot], np.int64)[t // self.page_size] * self.page_size + t % self.page_size

    def admit(self, slot: int, context: int) -> np.ndarray:
        """Pages for a new request's context; the pool slots of its tokens (int32 [context])."""
        assert not self.pages[slot], f"slot {slot} is busy"
        self._grow(slot, context)
        return self.slots_of(slot, 0, context).astype(np.int32)

    def release(self, slot: int) -> None:
        self.free.extend(reversed(self.pages[slot]))
        self.pages[slot], self.length[slot] = [], 0

    def decode(self, active: list[int]) -> dict[str, np.ndarray]:
        """One token more for each active slot: slot_mapping [slots] (-1 for an idle slot), kv_indptr [slots + 1],
        kv_page_indices [pool pages] (padded), kv_last_page_lens [slots] (0 for an idle slot)."""
        mapping = np.full(self.slots, -1, np.int32)
        for s in active:
            self._grow(s, self.length[s] + 1)
            mapping[s] = self.slots_of(s, self.length[s] - 1, self.length[s])[0]
        counts = [len(p) for p in self.pages]
        indices = np.zeros(max(self.num_pages or 0, sum(counts), 1), np.int32)
        flat = [p for ps in self.pages for p in ps]
        indices[:len(flat)] = flat
        last = np.asarray([(n - 1) % self.page_size + 1 if n else 0 for n in self.length], np.int32)
        return {"slot_mapping": mapping, "kv_indptr": np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
                "kv_page_indices": indices, "kv_last_page_lens": last}


def pool_pages(requests: list[Request], slots: int, page_size: int) -> int:
    """The most pages the schedule holds at once (the dry run of PageTable over it)."""
    table = PageTable(None, page_size, slots)
    for step in schedule(requests, slots):
        for s, r in step.admit:
            table.admit(s, r.context)
        table.decode([s for s, _, _ in step.decode])
        for s, r, j in step.decode:
            if j + 1 == r.generate:
                table.release(s)
    return table.peak_pages


def max_tokens(requests: list[Request]) -> int:
    """The longest a request gets (context + generated): the dense cache's length."""
    return max(r.context + r.generate for r in requests)
