"""GPTQ: quantize a layer column by column, spreading each rounding error over the columns not yet
quantized (lesson 06). Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training
Quantization for Generative Pre-trained Transformers", 2022 (arXiv:2210.17323).

A Linear computes y = W x. Rounding W to W' changes the output on the calibration inputs X
(in, N) by (W - W') X; GPTQ minimises ||W X - W' X||^2 row by row. Its curvature is the
Hessian H = 2 X X^T (in, in), the same for every row. The steps:

1. H from calibration inputs (:func:`accumulate_hessian`), dampened by a fraction of its mean
   diagonal so it can be inverted; inputs that never fire (zero diagonal) are zeroed out.
2. U = upper Cholesky factor of H^-1 (:func:`inverse_cholesky`): its rows are the successive
   OBS steps' inverses, computed once; the paper chose this form for numerical stability
   (section 4, "Step 3: Cholesky Reformulation"), since updating H^-1 column by column lets
   rounding errors make it indefinite on large models.
3. For each column j: quantize it, e = (w_j - q_j) / U[j, j], and subtract e * U[j, k] from
   every later column k (:func:`gptq_plain`, the loop lesson 06's exercise asks for).
4. Lazy batches: the same updates, applied inside a block of columns at once and to the rest
   of the matrix once per block (:func:`gptq_quantize`), which turns vector updates into
   matrix multiplications.
5. Act-order: columns with the largest H diagonal (the busiest inputs) first; the group scales
   are then computed up front from the original weight, so each group keeps one scale whatever
   the order (``act_order=True``; "static" act-order, llm-compressor 0.14's default).
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn

from course_lib.methods import calibration as cal
from course_lib.methods.calibration import GroupQuantLinear


# ----------------------------------------------------------------------------- the Hessian
def accumulate_hessian(H: torch.Tensor | None, n_seen: int, x: torch.Tensor):
    """Add a batch of layer inputs x (..., in) to the running H = (2 / N) sum_t x_t x_t^T.

    Returns (H (in, in) fp32, tokens seen). Averaging (not summing) keeps H's size independent
    of the calibration size; GPTQ's answer does not depend on that scale.
    """
    x = x.reshape(-1, x.shape[-1]).float()                                   # (b, in)
    b = x.shape[0]
    if H is not None and H.shape != (x.shape[1], x.shape[1]):
        raise ValueError(f"inputs of width {x.shape[1]} do not match the running H of shape "
                         f"{tuple(H.shape)}: one H per Linear")
    if H is None:
        H = torch.zeros(x.shape[1], x.shape[1], device=x.device)
    if b == 0:
        return H, n_seen
    H = H * (n_seen / (n_seen + b)) + (2.0 / (n_seen + b)) * (x.T @ x)      # (in, in)
    return H, n_seen + b


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2 X X^T / N from inputs x (N, in) in one go (lesson 06): (in, in) fp32.

    X here is (in, N), one column per token, as in the paper; with the tokens as rows of x
    that is 2 x^T x / N."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch tensor of layer inputs (tokens, in_features); got "
                        f"{type(x).__name__}")
    if x.dim() != 2 or x.shape[0] == 0:
        raise ValueError(f"x must hold layer inputs as rows, shape (tokens, in_features); got "
                         f"{tuple(x.shape)} (use x[None] for a single token, "
                         f"x.reshape(-1, x.shape[-1]) for a batch of windows)")
    if not torch.isfinite(x).all():
        raise ValueError("x holds NaN or inf: H would be NaN; check the model's activations")
    return accumulate_hessian(None, 0, x)[0]


def dampen(H: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """A copy of H with dead inputs (zero diagonal) given H[j, j] = 1, then damp * mean(diag H)
    added to the diagonal (lesson 06), so that H can be inverted."""
    if H.dim() != 2 or H.shape[0] != H.shape[1]:
        raise ValueError(f"H must be square (in, in); got {tuple(H.shape)}")
    if not torch.isfinite(H).all():
        raise ValueError("H holds NaN or inf: check the calibration inputs")
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not damp >= 0:
        raise ValueError(f"damp must be >= 0 (a fraction of the mean diagonal, e.g. 0.01); "
                         f"got {damp}")
    H = H.clone()
    dead = torch.diag(H) == 0                                                # (in,)
    H[dead, dead] = 1
    return H + damp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], dtype=H.dtype,
                                                            device=H.device)


def prepare(W: torch.Tensor, H: torch.Tensor, damp: float = 0.01):
    """Dead inputs and dampening: returns (W, H) copies, fp32 (fp64 stays fp64).

    A zero diagonal entry means that input was always 0 on the calibration text: its weights
    cannot matter there, so they are set to 0 and H[j, j] to 1 (the paper's code does the same).
    Then damp * mean(diag H) is added to the diagonal so that H can be inverted.
    """
    if W.dim() != 2 or H.shape != (W.shape[1], W.shape[1]):
        raise ValueError(f"W must be (out, in) and H (in, in); got {tuple(W.shape)} and "
                         f"{tuple(H.shape)}")
    if not (torch.isfinite(W).all() and torch.isfinite(H).all()):
        raise ValueError("W or H holds NaN or inf: check the model and the calibration inputs")
    if not damp >= 0:
        raise ValueError(f"damp must be >= 0 (a fraction of the mean diagonal, e.g. 0.01); "
                         f"got {damp}")
    dt = torch.float64 if W.dtype == torch.float64 else torch.float32
    W, H = W.to(dt).clone(), H.to(dt)
    W[:, torch.diag(H) == 0] = 0                                             # dead inputs
    return W, dampen(H, damp)


def inverse_cholesky(H: torch.Tensor) -> torch.Tensor:
    """U, the upper Cholesky factor of H^-1 (U^T U = H^-1), (in, in) (lesson 06).

    Row j of U holds what GPTQ needs when it reaches column j: U[j, j] scales the error and
    U[j, j+1:] spreads it over the later columns.
    """
    if H.dim() != 2 or H.shape[0] != H.shape[1]:
        raise ValueError(f"H must be square (in, in); got {tuple(H.shape)}")
    try:
        L = torch.linalg.cholesky(H)                                         # H = L L^T
        Hinv = torch.cholesky_inverse(L)                                     # H^-1
        return torch.linalg.cholesky(Hinv, upper=True)                       # (in, in)
    except torch.linalg.LinAlgError:
        raise ValueError("H is not positive definite even after dampening: raise damp (e.g. "
                         "0.1), or use more calibration text (fewer tokens than inputs give a "
                         "singular H)") from None


# ----------------------------------------------------------------------------- the loops
def _group_start(j: int, group_size: int) -> bool:
    return j % group_size == 0


def gptq_plain(W: torch.Tensor, U: torch.Tensor, bits: int = 4, group_size: int = 128,
               symmetric: bool | None = None, grid="course"):
    """The column loop, one column at a time (lesson 06's exercise; slow but plain).

    W (out, in): the (prepared) weight; U: ``inverse_cholesky`` of its dampened H. Each group's
    scale comes from the group's columns as they are when the loop reaches the group (earlier
    errors already added), or from the original W for a grid that sets them up front
    (llm-compressor's). Returns (codes (out, in), scale (out, G), second (out, G) or None),
    ``second`` being the grid's zero point or offset. Scales are fp32 on the course's and
    llm-compressor's grids (the loop then computes in W's dtype), fp16 on llama.cpp's.
    """
    gr = cal.get_grid(grid)
    sym = gr.check(bits, group_size, symmetric)
    if W.dim() != 2 or U.shape != (W.shape[1], W.shape[1]):
        raise ValueError(f"W must be (out, in) and U (in, in); got {tuple(W.shape)} and "
                         f"{tuple(U.shape)}")
    W = W.clone()
    out_f, in_f = W.shape
    cal.check_group_size(in_f, group_size)
    G = in_f // group_size
    codes = torch.zeros(out_f, in_f, dtype=gr.code_dtype(sym))
    scale = torch.zeros(out_f, G, dtype=W.dtype)
    up_front = [gr.params(W[:, g * group_size:(g + 1) * group_size], bits, sym)
                for g in range(G)] if gr.up_front else None
    for j in range(in_f):
        g = j // group_size
        if _group_start(j, group_size):
            s, z = up_front[g] if up_front else gr.params(W[:, j:j + group_size], bits, sym)
            st_s, st_z = gr.store(s, z, W.dtype if gr.codes_from_stored else None)
            if g == 0:
                scale = scale.to(st_s.dtype)
                second = None if st_z is None else torch.zeros(out_f, G, dtype=st_z.dtype)
            scale[:, g] = st_s
            if second is not None:
                second[:, g] = st_z
            qs, qz = (st_s, st_z) if gr.codes_from_stored else (s, z)
        codes[:, j] = gr.quantize(W[:, j], qs, qz, bits)
        q = gr.dequantize(codes[:, j], st_s, st_z).to(W.dtype)               # (out,)
        err = (W[:, j] - q) / U[j, j]                                        # (out,)
        W[:, j + 1:] -= err[:, None] * U[j, j + 1:][None, :]                 # (out, in-j-1)
    return codes, scale, second


def gptq_quantize(W: torch.Tensor, H: torch.Tensor, bits: int = 4, group_size: int = 128,
                  symmetric: bool | None = None, damp: float = 0.01, block_size: int = 128,
                  act_order: bool = False, scale_dtype: torch.dtype | None = None,
                  cache: dict | None = None, grid="course"):
    """GPTQ for one weight W (out, in) with Hessian H (in, in): lazy block updates, optional
    act-order, on a grid (lesson 06). Returns (codes (out, in), scale (out, G), second (out, G)
    or None), in the original column order; ``second``: the grid's zero point (int32) or
    offset (q4_1's fp16 minimum).

    grid: "course" (absmax / (2**(bits-1) - 1), the default), "llm-compressor" (absmax / 7.5,
    codes -8..7, every group's scale up front from the original weight), "q4_0" / "q4_1"
    (llama.cpp's blocks of 32; see :mod:`course_lib.methods.calibration`).
    symmetric: None takes the grid's own (the course's: symmetric).
    scale_dtype: the dtype scales are stored in (None: fp32, or fp16 on llama.cpp's grids; a
    checkpoint's bf16/fp16 for an exact export): the loop dequantizes with the stored scale,
    so codes and scales agree.
    cache: a dict shared by Linears with the same H (q/k/v), so its factor is computed once.
    """
    gr = cal.get_grid(grid)
    sym = gr.check(bits, group_size, symmetric, scale_dtype)
    cal.check_group_size(W.shape[1], group_size)
    H_in = H
    W, H = prepare(W, H, damp)
    out_f, in_f = W.shape
    G = in_f // group_size
    perm = torch.arange(in_f, device=W.device)
    static = None
    if act_order or gr.up_front:    # group scales from the original weight, before any change
        static = [gr.params(W[:, g * group_size:(g + 1) * group_size], bits, sym)
                  for g in range(G)]
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True, stable=True)    # (in,)
        W, H = W[:, perm], H[perm][:, perm]
    key = (id(H_in), damp, act_order)
    if cache is not None and key in cache:
        U = cache[key]
    else:
        U = inverse_cholesky(H)                                              # (in, in)
        if cache is not None:
            cache[key] = U
    dev = W.device
    order = perm.tolist()                     # a Python list: no device round trip per column
    codes = torch.zeros(out_f, in_f, dtype=gr.code_dtype(sym), device=dev)
    st_dtype = gr.store(torch.zeros(1), None if sym else torch.zeros(1), scale_dtype)
    scale = torch.zeros(out_f, G, dtype=st_dtype[0].dtype, device=dev)
    second = None if st_dtype[1] is None else \
        torch.zeros(out_f, G, dtype=torch.int32 if gr.name == "course" else st_dtype[1].dtype,
                    device=dev)
    groups = [None] * G     # per group: stored scale and second, and those the codes use

    def set_group(g, s, z):
        st_s, st_z = gr.store(s, z, scale_dtype)
        scale[:, g] = st_s
        if second is not None:
            second[:, g] = st_z
        st_s = scale[:, g].to(W.dtype) if gr.codes_from_stored else scale[:, g].clone()
        st_z = None if second is None else second[:, g].clone()
        groups[g] = (st_s, st_z) + ((st_s, st_z) if gr.codes_from_stored else (s, z))

    if static is not None:
        for g, (s, z) in enumerate(static):
            set_group(g, s, z)
    # a block never splits a group: the scale is taken from up-to-date columns
    block_size = -(-max(block_size, 1) // group_size) * group_size if static is None else block_size
    for b0 in range(0, in_f, block_size):
        b1 = min(b0 + block_size, in_f)
        # the block transposed: column i is the contiguous row W1[i] (memory order, for speed)
        W1 = W[:, b0:b1].T.clone(memory_format=torch.contiguous_format)      # (nb, out)
        E1 = torch.zeros(out_f, b1 - b0, dtype=W.dtype, device=dev)         # scaled errors
        U1 = U[b0:b1, b0:b1]                                                 # (nb, nb)
        for i in range(b1 - b0):
            j = b0 + i                        # position in the (possibly permuted) order
            col = order[j]                    # the column's original index
            g = col // group_size
            if static is None and _group_start(j, group_size):
                set_group(g, *gr.params(W1[i:i + group_size].T, bits, sym))
            st_s, st_z, qs, qz = groups[g]
            w = W1[i]                                                        # (out,)
            q_codes = gr.quantize(w, qs, qz, bits)                           # (out,)
            codes[:, col] = q_codes
            err = (w - gr.dequantize(q_codes, st_s, st_z).to(W.dtype)) / U1[i, i]  # (out,)
            W1[i + 1:] -= torch.outer(U1[i, i + 1:], err)   # every later column k in the
            E1[:, i] = err                                  # block: w_k -= U[i, k] * err
        W[:, b1:] -= E1 @ U[b0:b1, b1:]                                      # the lazy update
    return codes, scale, second


# ----------------------------------------------------------------------------- whole model
def gptq_linear(linear: nn.Linear, H: torch.Tensor, bits: int = 4, group_size: int = 128,
                symmetric: bool | None = None, damp: float = 0.01, block_size: int = 128,
                act_order: bool = False, scale_dtype: torch.dtype | None = None,
                cache: dict | None = None, grid="course") -> GroupQuantLinear:
    """GPTQ of one nn.Linear given its inputs' Hessian, as a :class:`GroupQuantLinear`."""
    return gptq_linears([linear], H, bits, group_size, symmetric, damp, block_size, act_order,
                        scale_dtype, cache, grid)[0]


def gptq_linears(linears: list[nn.Linear], H: torch.Tensor, bits: int = 4,
                 group_size: int = 128, symmetric: bool | None = None, damp: float = 0.01,
                 block_size: int = 128, act_order: bool = False,
                 scale_dtype: torch.dtype | None = None, cache: dict | None = None,
                 grid="course") -> list[GroupQuantLinear]:
    """GPTQ of several nn.Linear fed the same input (so sharing H: q/k/v, gate/up) in one loop
    over the columns (lesson 06). GPTQ treats every row on its own (the update of row r uses
    only row r and U), so the weights stacked row-wise give each Linear the codes it would get
    alone, and the Python loop over columns runs once instead of once per Linear."""
    if not linears or not all(isinstance(lin, nn.Linear) for lin in linears):
        raise TypeError("gptq_linears needs a non-empty list of nn.Linear fed the same input")
    gr = cal.get_grid(grid)
    rows = [lin.out_features for lin in linears]
    W = torch.cat([lin.weight.detach().float() for lin in linears])       # (sum out, in)
    codes, scale, second = gptq_quantize(W, H, bits, group_size, symmetric, damp, block_size,
                                         act_order, scale_dtype, cache, gr)
    split = (lambda t: [None] * len(rows) if t is None else t.split(rows))  # back per Linear
    return [gr.linear(c.contiguous(), s.contiguous(), None if z is None else z.contiguous(),
                      bits, group_size, lin.bias, lin.weight.dtype,
                      "gptq" + ("+act" if act_order else ""))
            for lin, c, s, z in zip(linears, split(codes), split(scale), split(second))]


def same_input(Hs: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names of Linears grouped by shared Hessian (the same tensor: the same input), in order."""
    groups: dict[int, list[str]] = {}
    for name, H in Hs.items():
        groups.setdefault(id(H), []).append(name)
    return list(groups.values())


@torch.no_grad()
def block_hessians(block: nn.Module, x: torch.Tensor, cos, sin, batch_size: int = 16
                   ) -> dict[str, torch.Tensor]:
    """H of every Linear in a decoder block from one pass over its inputs x (n, T, D).

    Linears fed the same tensor (q/k/v; gate/up) share one H, computed once.
    """
    lins = cal.linears(block)
    Hs: dict[str, list] = {}
    last = {"x": None, "name": None}   # the tensor itself, held: a freed tensor's address can
                                       # be reused by the next input of the same shape

    def hook(mod, inputs, name):
        xin = inputs[0]
        if xin is last["x"]:                   # same input as the Linear hooked just before
            Hs[name] = Hs[last["name"]]
            return
        last.update(x=xin, name=name)
        H, n = Hs.get(name, [None, 0])
        Hs[name] = list(accumulate_hessian(H, n, xin))

    handles = [m.register_forward_pre_hook(lambda m, i, name=n: hook(m, i, name))
               for n, m in lins.items()]
    try:
        for i in range(0, x.shape[0], batch_size):
            last.update(x=None, name=None)
            block(x[i:i + batch_size], cos, sin)
    finally:
        for h in handles:
            h.remove()
    return {n: Hs[n][0] for n in lins}


def gptq_block(block: nn.Module, x: torch.Tensor, cos, sin, bits: int = 4,
               group_size: int | None = 128, symmetric: bool | None = None, damp: float = 0.01,
               block_size: int = 128, act_order: bool = False,
               scale_dtype: torch.dtype | None = None, batch_size: int = 16,
               grid="course") -> None:
    """GPTQ on every Linear of one decoder block, in place, on that block's inputs x (n, T, D)
    (lesson 06; lesson 17 streams it layer by layer): the Hessians of each Linear's inputs,
    then one GPTQ loop per group of Linears fed the same input (q/k/v, o, gate/up, down).
    ``group_size`` None: one group per row (each Linear's whole input)."""
    Hs = block_hessians(block, x, cos, sin, batch_size)
    lins = cal.linears(block)
    for names in same_input(Hs):                         # q/k/v, o, gate/up, down
        g = group_size if group_size is not None else lins[names[0]].in_features
        new = gptq_linears([lins[n] for n in names], Hs[names[0]], bits, g, symmetric, damp,
                           block_size, act_order, scale_dtype, None, grid)
        for name, module in zip(names, new):
            cal.replace(block, name, module)


def gptq_model(model: nn.Module, ids: torch.Tensor, bits: int = 4, group_size: int = 128,
               symmetric: bool | None = None, damp: float = 0.01, block_size: int = 128,
               act_order: bool = False, scale_dtype: torch.dtype | None = None,
               batch_size: int = 16, progress: bool = False, n_blocks: int | None = None,
               grid="course", quantize_linear=None):
    """GPTQ on every Linear of the decoder blocks (the head and embeddings stay), block by block
    on calibration windows ``ids`` (n, T) (lesson 06). Returns ``(quantized copy, seconds)``.

    grid: see :func:`gptq_quantize`. quantize_linear: the per-Linear step, called as
    ``quantize_linear(linear, H)`` and returning the module that replaces it (default: this
    module's :func:`gptq_linear` with the arguments above); lesson 06's exercise plugs the
    learner's own loop in here."""
    sym = cal.check_model(model, bits, group_size, symmetric, grid, scale_dtype)
    if quantize_linear is not None and not callable(quantize_linear):
        raise TypeError(f"quantize_linear must be a function (linear, H) -> module; got "
                        f"{type(quantize_linear).__name__}")

    def quantize_block(block, x, cos, sin):
        if quantize_linear is not None:                  # the learner's step, Linear by Linear
            Hs = block_hessians(block, x, cos, sin, batch_size)
            for name, lin in cal.linears(block).items():
                cal.replace(block, name, quantize_linear(lin, Hs[name]))
            return
        gptq_block(block, x, cos, sin, bits, group_size, sym, damp, block_size, act_order,
                   scale_dtype, batch_size, grid)

    return cal.quantize_blockwise(model, ids, quantize_block, batch_size, progress=progress,
                                  desc="GPTQ" + (" act-order" if act_order else ""),
                                  n_blocks=n_blocks)


def output_error(W: torch.Tensor, W_q: torch.Tensor, x: torch.Tensor) -> float:
    """Relative output error ||W X - W' X|| / ||W X|| on inputs x (N, in) (lesson 06)."""
    if W.shape != W_q.shape or x.shape[-1] != W.shape[1]:
        raise ValueError(f"W {tuple(W.shape)} and W_q {tuple(W_q.shape)} must match, and x's "
                         f"last dimension ({x.shape[-1]}) must be W's inputs ({W.shape[1]})")
    ref = x.float() @ W.float().T                                            # (N, out)
    return float((ref - x.float() @ W_q.float().T).norm() / ref.norm().clamp_min(1e-30))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def benchmark_layer(d: int = 4096, n_tokens: int = 32 * 2048, batch: int = 2048, bits: int = 4,
                    group_size: int = 128, act_order: bool = False, device: str | None = None,
                    seed: int = 0, warmup: bool = True) -> dict:
    """Time GPTQ on one random d x d layer with ``n_tokens`` calibration tokens (lesson 06):
    the Hessian (accumulated in batches of ``batch`` tokens, the random inputs' generation not
    counted) and the quantization, in seconds. The device is the GPU when there is one (CUDA
    is synchronised around every timed region), else the CPU. A benchmark to run by hand, not a
    test: ``python -m course_lib.methods.gptq`` (writes ``results/gptq_bench_<device>.json``).
    The paper quantized a 175B model in about four GPU hours."""
    import time
    if n_tokens < batch or n_tokens % batch:
        raise ValueError(f"n_tokens ({n_tokens}) must be a positive multiple of batch ({batch})")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if warmup:      # first calls pay for library loading and (on a GPU) kernel selection
        benchmark_layer(256, 512, 256, bits, min(group_size, 128), act_order, str(dev), seed,
                        warmup=False)
    g = torch.Generator(device=dev).manual_seed(seed)
    W = torch.randn(d, d, generator=g, device=dev) * 0.02                   # (d, d)
    H, n, hessian_s = None, 0, 0.0
    for _ in range(n_tokens // batch):
        x = torch.randn(batch, d, generator=g, device=dev)                  # (batch, d)
        _sync(dev)
        t0 = time.perf_counter()
        H, n = accumulate_hessian(H, n, x)                                  # (d, d)
        _sync(dev)
        hessian_s += time.perf_counter() - t0
    _sync(dev)
    t0 = time.perf_counter()
    codes, scale, zero = gptq_quantize(W, H, bits, group_size, act_order=act_order)
    _sync(dev)
    quantize_s = time.perf_counter() - t0
    from course_lib import device as cdevice
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cdevice.detect().name
    return {"device": dev.type, "device_name": name, "d": d, "n_tokens": n, "batch": batch,
            "bits": bits, "group_size": group_size, "act_order": act_order,
            "hessian_s": round(hessian_s, 3), "quantize_s": round(quantize_s, 3),
            "total_s": round(hessian_s + quantize_s, 3), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "load_avg_1min": round(os.getloadavg()[0], 2),
            "machine": cdevice.machine_record()}   # the host CPU, on a GPU run too


def main(argv=None) -> dict:
    """``python -m course_lib.methods.gptq [--device cuda] [--d 4096] [--tokens 65536]``:
    the one-layer benchmark, printed and written to results/ as JSON."""
    import argparse
    import json
    import re
    from pathlib import Path
    p = argparse.ArgumentParser(description="GPTQ on one d x d layer (the Performance benchmark "
                                            "of lesson 06).")
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=32 * 2048, help="calibration tokens (32 x 2048)")
    p.add_argument("--batch", type=int, default=2048, help="tokens per Hessian update")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--act-order", action="store_true")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--out", default=None, help="JSON path (default results/gptq_bench_<device>"
                                               ".json; '-' to write nothing)")
    a = p.parse_args(argv)
    r = benchmark_layer(a.d, a.tokens, a.batch, group_size=a.group_size,
                        act_order=a.act_order, device=a.device)
    print(json.dumps(r, indent=1))
    if a.out != "-":
        slug = re.sub(r"[^a-z0-9]+", "_", f"{r['device']} {r['device_name']}".lower()).strip("_")
        out = Path(a.out) if a.out else \
            Path(__file__).resolve().parent.parent.parent / "results" / f"gptq_bench_{slug}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(r, indent=1) + "\n")
        print(f"written to {out}")
    return r


if __name__ == "__main__":
    main()
