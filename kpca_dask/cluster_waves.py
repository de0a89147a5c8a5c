"""The waves of one exact product on a distributed cluster, their partial sums added on
the workers (a part of :class:`kpca_dask.block_matrix.BlockKernelMatrix`)."""

from __future__ import annotations

import collections
from typing import Any

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph


class ClusterWaves:
    """:meth:`BlockKernelMatrix.product` on a distributed cluster (a mixin: it uses the
    matrix's ``X``, ``row_chunks``, ``_evaluates_blocks`` and ``_pair_graph``)."""

    def _product_on_cluster(self, client, Zsrc, waves, token, offsets, Y) -> None:
        """The waves of one pass on a distributed cluster, their partial sums added on the
        workers: wave ``w``'s sum for row block ``j`` is ``acc_{w-1, j} + part_{w, j}``
        (the same additions in the same order as adding the waves on the caller, so the
        same bits). A row block is final once a wave starts past it; only final row
        blocks travel to the caller, each once, so the bytes into the caller per pass
        are ``n x l x 8`` whatever the number of waves (before: every wave's partial
        sums of every row block from its first row to ``n``).

        Two waves are on the cluster at a time: the next one's block tasks start while
        the last of this one's finish. Memory on the workers: one wave's block products
        plus one accumulator per row block."""
        from distributed import futures_of, wait

        # The rows too: two waves are on the cluster at a time and each wave's graph
        # would carry X's tasks again, under the keys the scheduler is releasing
        # from the wave before (distributed 2026.8 then lost a worker, "'<' not
        # supported between NoneType", and the caller got a KeyError for an X
        # block). Persisted for the pass, X is also read from its store once per
        # pass instead of once per wave. Held by this frame only.
        X = None
        if self._evaluates_blocks():  # recomputed blocks, or those a partial cache lacks
            X = client.persist(self.X)
        nb, ncols = self.n_blocks, int(Zsrc.shape[1])
        # the row blocks each wave makes final: those no later wave adds to (a wave
        # adds to every row block from its first one on; waves may run backwards)
        final, bound = [], nb
        for start, _ in reversed(waves):
            final.append(range(start, max(start, bound)))
            bound = min(bound, start)
        final.reverse()
        prev: tuple[int, Any] | None = None  # (first row block, persisted accumulator)
        inflight: collections.deque = collections.deque()
        for (start, stop), done in zip(waves, final):
            dsk, deps, oname = self._pair_graph(Zsrc, range(start, stop), f"{token}-{start}", X)
            name = oname
            if prev is not None:
                pstart, pacc = prev
                name = f"kpca-kz-acc-{token}-{start}"
                for j in range(start, nb):
                    dsk[(name, j - start, 0)] = (
                        (np.add, (pacc.name, j - pstart, 0), (oname, j - start, 0))
                        if j >= pstart
                        else (oname, j - start, 0)
                    )
                deps.append(pacc)
            graph = HighLevelGraph.from_collections(name, dsk, dependencies=deps)
            acc = client.persist(
                da.Array(
                    graph, name, chunks=(self.row_chunks[start:], (ncols,)), dtype=np.float64
                )
            )
            inflight.append((start, done, acc))
            prev = (start, acc)
            if len(inflight) > 1:
                self._gather_final(client, inflight.popleft(), offsets, Y, futures_of, wait)
        while inflight:
            self._gather_final(client, inflight.popleft(), offsets, Y, futures_of, wait)

    @staticmethod
    def _gather_final(client, item, offsets, Y, futures_of, wait) -> None:
        """Wait for a wave's accumulator and bring the row blocks it made final to the
        caller."""
        start, done, acc = item
        futs = {f.key: f for f in futures_of(acc)}
        wait(list(futs.values()))
        if len(done):
            parts = client.gather([futs[(acc.name, j - start, 0)] for j in done])
            Y[offsets[done.start] : offsets[done.stop]] = np.concatenate(parts, axis=0)
