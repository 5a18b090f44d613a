"""End-to-end decode speed: one part of the benchmark ``python -m kernels.bench`` (lesson 10).

A stack of decoder layers with Llama's linear shapes and random weights (``DecoderStack``;
attention left out: at short context its cost is small next to the weight reads) is stepped
one token at a time with each backend's linears; ``decode_tokens_per_s`` times a step (from a
CUDA graph on a GPU, ``_cuda_graph``) and ``decode_layers_that_fit`` sizes the stack from the
free GPU memory.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from course_lib import bench
from kernels._common import Backend
from kernels.bench_layers import backend_device


class DecoderStack(torch.nn.Module):
    """Decoder layers with Llama's linear shapes (random weights; attention left out).

    Each layer: RMSNorm, q/k/v/o projections (the attention itself skipped: at short context
    its cost is small next to the weight reads), RMSNorm, SwiGLU MLP. Enough to time what
    weight quantization changes in a decode step: every weight is read once per token.
    """

    def __init__(self, backend: Backend, n_layers: int, d: int, d_kv: int, d_ff: int,
                 device: str, seed: int = 0):
        super().__init__()
        gen = torch.Generator(device=device).manual_seed(seed)
        self.backend = backend
        shapes = {"q": (d, d), "k": (d_kv, d), "v": (d_kv, d), "o": (d, d),
                  "gate": (d_ff, d), "up": (d_ff, d), "down": (d, d_ff)}
        self.layers = []
        for _ in range(n_layers):
            layer = {}
            for key, (n, k) in shapes.items():
                w = torch.randn(n, k, generator=gen, device=device) / math.sqrt(k)
                layer[key] = backend.prepare(w)
            self.layers.append(layer)

    def _lin(self, x, st):
        return self.backend.apply(x, st)

    def forward(self, h):                        # h: (B, d)
        for L in self.layers:
            a = F.rms_norm(h, h.shape[-1:])
            q = self._lin(a, L["q"])                                    # (B, d)
            self._lin(a, L["k"]), self._lin(a, L["v"])                  # read, then unused:
            h = h + self._lin(q, L["o"])                                # attention skipped
            a = F.rms_norm(h, h.shape[-1:])
            h = h + self._lin(F.silu(self._lin(a, L["gate"])) * self._lin(a, L["up"]), L["down"])
        return h


def decode_tokens_per_s(backends: list[Backend], n_layers: int, d: int, d_kv: int, d_ff: int,
                        timer: str, device: str, batch: int = 1, repeats: int = 5,
                        log=print) -> dict:
    """Tokens/s of one decode step (batch ``batch``) through a DecoderStack, per backend."""
    out = {}
    for b in backends:
        dev = backend_device(b, device)
        model = DecoderStack(b, n_layers, d, d_kv, d_ff, dev)
        h = torch.randn(batch, d).to(dev, b.act_dtype)                       # (B, d)
        step, graphed = (lambda: model(h)), False
        if timer == "gpu" and dev != "cpu":
            step, graphed = _cuda_graph(step)
            ms = bench.time_gpu(step)
        else:
            ms = bench.time_cpu(step, warmup=1, repeats=repeats)
        out[b.name] = {"ms_per_step": ms, "tokens_per_s": batch * 1e3 / ms, "cuda_graph": graphed}
        log(f"  decode {b.name:40s} {ms:8.2f} ms/step  {batch * 1e3 / ms:9.1f} tokens/s")
        del model
    base = next(b.name for b in backends if b.baseline)
    for r in out.values():
        r["ratio_vs_baseline"] = r["tokens_per_s"] / out[base]["tokens_per_s"]
    return out


def _cuda_graph(step):
    """Capture a decode step in a CUDA graph (removes launch overhead); eager on failure."""
    try:
        for _ in range(3):                      # autotuning happens here, outside the capture
            step()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        return g.replay, True
    except Exception as err:  # noqa: BLE001  (reported in the JSON as "cuda_graph": false)
        print(f"  (CUDA graph capture failed, timing eagerly: {type(err).__name__}: {err})")
        return step, False


def decode_layers_that_fit(d: int, d_kv: int, d_ff: int, want: int, bytes_per_weight: float = 2.0,
                           free_bytes: float | None = None, share: float = 0.5) -> int:
    """How many decoder layers of this shape fit in ``share`` of the free GPU memory (the
    16-bit stack is the largest; one stack is alive at a time). At least 1, at most want."""
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info()[0]
    per_layer = (2 * d * d + 2 * d_kv * d + 3 * d_ff * d) * bytes_per_weight
    return max(1, min(want, int(share * free_bytes // per_layer)))
