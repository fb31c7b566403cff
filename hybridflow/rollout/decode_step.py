"""One decode step of the native rollout: the model's forward over one token per row, as a CUDA graph on GPU.

An eager megatron-core forward launches ~600 kernels per step from Python and the host, not the GPU, sets
the pace (23 ms per step for a 1B model on an H200, see benchmarks/results/decode_roofline_h200_20261202/).
With the static KV cache of `megatron_adapters.decode_cache` every shape is fixed, so the forward is captured
once per (live rows, attention length bucket) and replayed; on CPU the same step runs eagerly. The live rows
are the first rows of the batch (the engine moves finished rows behind them), so a smaller batch is a view of the
same static inputs and cache.
"""

from __future__ import annotations

import torch

from megatron_adapters.decode_cache import DecodeCache

# Keys a decode step attends over are rounded up to a multiple of this: one graph per bucket, and a step
# reads at most this many cached columns beyond its own.
ATTEND_BUCKET = 256


def uses_graphs(device: torch.device, use_graphs: bool | None) -> bool:
    """Whether decode steps on `device` replay CUDA graphs: `use_graphs`, by default on CUDA only."""
    return device.type == "cuda" if use_graphs is None else use_graphs


class DecodeStep:
    """`step(tokens [n, 1], column)` -> logits `[n, vocab shard]` of the next token, for the first n <= `batch`
    rows of the cache, fed at `column`; the KV cache attached to `model` (`cache`) is updated in place."""

    def __init__(self, model: torch.nn.Module, cache: DecodeCache, batch: int, device: torch.device,
                 bucket: int = ATTEND_BUCKET, use_graphs: bool | None = None):
        self.model, self.cache, self.bucket = model, cache, bucket
        self.use_graphs = uses_graphs(device, use_graphs)
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self._warmed_up = False

    def _forward(self, rows: int) -> torch.Tensor:
        return self.model(self.tokens[:rows], self.positions[:rows], None)[:, -1, :]

    def __call__(self, tokens: torch.Tensor, column: int) -> torch.Tensor:
        rows = tokens.shape[0]
        self.tokens[:rows].copy_(tokens)
        self.positions.fill_(column)
        self.cache.start.fill_(column)
        attend_len = min(self.cache.max_len, -(-(column + 1) // self.bucket) * self.bucket)
        self.cache.attend_len = attend_len
        if not self.use_graphs:
            return self._forward(rows)
        if (rows, attend_len) not in self.graphs:
            self.graphs[rows, attend_len] = self._capture(rows)
        graph, logits = self.graphs[rows, attend_len]
        graph.replay()
        return logits

    def _capture(self, rows: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture the step at the current bucket. Before the first capture, one eager step on a side stream
        does the lazy set-up (cuBLAS workspaces, kernel selection) that must not land in a graph; it writes
        the same keys/values at the same column the real step writes. Later buckets and row counts need no
        warm-up (the GPU tests capture several of each), unless the cache is `fused`: torch.compile compiles at
        the first call of a new row count, which must not happen inside a capture. Graphs share one memory pool:
        they replay one at a time, and a step's logits are consumed before the next replay."""
        if not self._warmed_up or self.cache.fused:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward(rows)
            torch.cuda.current_stream().wait_stream(side)
            self._warmed_up = True
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._forward(rows)
        self._pool = graph.pool()
        return graph, logits
