"""Quantize a whole model: swap its ``nn.Linear`` layers for quantized ones (lesson 04).

Two kinds of replacement, both with a one-line ``forward``:

- :class:`FakeQuantLinear` (``mode="fake"``): the weight is rounded to the grid and stored back
  in float (``quant.fake_quantize``). Same speed and memory as before; exactly the numbers a
  real low-bit kernel would compute with. Use it for accuracy studies.
- :class:`PackedLinear` (``mode="packed"``): the weight is stored as integer codes (INT8 as int8,
  4 bits and fewer as two codes per byte via ``quant.pack_int4``) plus fp16 scales (and zero
  points), and dequantized on the fly. Its buffers really are smaller: use it for memory.

:func:`quantize_model` works on any torch model built from ``nn.Linear`` (the course's
:class:`~course_lib.model.LlamaModel`, a ``transformers`` model, your own MLP). Layers whose name
contains an entry of ``skip`` are left alone (by default the output head; embeddings are not
``nn.Linear`` and stay in 16-bit too). The :class:`QuantReport` counts bytes before and after.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib import quant

DEFAULT_SKIP = ("lm_head", "embed_tokens")
MODES = ("fake", "packed")


def _bits(fmt: str) -> int:
    digits = "".join(ch for ch in fmt if ch.isdigit())
    if not fmt.startswith(("int", "uint")) or not digits:
        raise ValueError(f"model-level quantization supports integer formats int2..int8 and "
                         f"uint2..uint8; got {fmt!r}")
    bits = int(digits)
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be 2..8; got {fmt!r}")
    return bits


def stored_bytes(shape, fmt: str, granularity: str, group_size: int | None,
                 symmetric: bool = True, scale_bytes: int = 2) -> int:
    """Bytes a quantized (out, in) weight occupies at its nominal bit width: codes + scales
    (+ one zero point byte per scale when asymmetric)."""
    if len(tuple(shape)) != 2 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                                     for d in shape):
        raise ValueError(f"shape must be (out_features, in_features), two whole numbers >= 1; "
                         f"got {shape!r}")
    out_f, in_f = shape
    bits = _bits(fmt)
    if granularity == "per_group":
        gs = group_size or 128
        if isinstance(gs, bool) or not isinstance(gs, int) or gs < 1 or in_f % gs:
            raise ValueError(f"group_size {gs!r} must be a whole number that divides "
                             f"in_features={in_f}")
    elif granularity not in ("per_tensor", "per_channel", "per_token"):
        raise ValueError(f"unknown granularity {granularity!r}; known: per_tensor, per_channel, "
                         f"per_token, per_group")
    if isinstance(scale_bytes, bool) or not isinstance(scale_bytes, int) or scale_bytes < 1:
        raise ValueError(f"scale_bytes must be a whole number >= 1 (2 for fp16); got {scale_bytes!r}")
    n_scales = {"per_tensor": 1, "per_channel": out_f, "per_token": out_f}.get(
        granularity, out_f * (in_f // (group_size or 128)))
    zero = 0 if symmetric and not fmt.startswith("uint") else n_scales
    return (out_f * in_f * bits + 7) // 8 + n_scales * scale_bytes + zero


def fake_quant_weight(w: torch.Tensor, bits: int, group_size: int | None = None) -> torch.Tensor:
    """Symmetric absmax round-to-nearest of an (out, in) weight, returned in float (lesson 04).

    One scale per output row (``group_size=None``) or per run of ``group_size`` consecutive
    inputs of a row; scale = max |w| / (2**(bits-1) - 1) (1.0 for an all-zero group), codes
    rounded half to even and clamped, computed in fp32, returned in ``w``'s dtype. This is
    what :class:`FakeQuantLinear` does to an ``intN`` weight (the reference of exercise
    04.fake_quant_weight).
    """
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D float tensor (out_features, in_features); got "
                         f"{type(w).__name__} {tuple(getattr(w, 'shape', ()))}")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be a whole number 2..8; got {bits!r}")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size < 1 or w.shape[1] % group_size):
        raise ValueError(f"group_size must be None (one scale per row) or a whole number that "
                         f"divides in_features={w.shape[1]}; got {group_size!r}")
    gran = "per_channel" if group_size is None else "per_group"
    return quant.fake_quantize(w, f"int{bits}", gran, group_size)


def _shape(mod):
    """(out_features, in_features) of a Linear, or (num_embeddings, embedding_dim)."""
    return tuple(mod.weight.shape)


class FakeQuantLinear(nn.Module):
    """A Linear whose weight has been rounded to a low-bit grid and kept in float (lesson 04)."""

    def __init__(self, linear: nn.Linear, fmt="int4", granularity="per_group", group_size=128,
                 symmetric=True):
        super().__init__()
        self.out_features, self.in_features = _shape(linear)
        self.fmt, self.granularity, self.group_size, self.symmetric = \
            fmt, granularity, group_size, symmetric
        w = linear.weight.detach()                                          # (out, in)
        self.weight = nn.Parameter(quant.fake_quantize(w, fmt, granularity, group_size, symmetric),
                                   requires_grad=False)                     # (out, in), w's dtype
        self.bias = getattr(linear, "bias", None)

    def forward(self, x):                                                   # (..., in) -> (..., out)
        return F.linear(x, self.weight, self.bias)

    def nbytes(self) -> int:
        """Bytes the weight would take stored at its bit width (codes + fp16 scales); no bias."""
        return stored_bytes(self.weight.shape, self.fmt, self.granularity, self.group_size,
                            self.symmetric)

    def extra_repr(self):
        g = f", group_size={self.group_size}" if self.granularity == "per_group" else ""
        return f"{self.in_features}, {self.out_features}, {self.fmt}, {self.granularity}{g}"


class PackedLinear(nn.Module):
    """A Linear stored as integer codes + fp16 scales, dequantized in ``forward`` (lesson 04).

    Buffers: ``codes`` int8 (out, in) for 5-8 bits, or uint8 (out, in/2) two per byte for
    2-4 bits; ``scale`` fp16 (out, n_groups); ``zero`` uint8 (out, n_groups) when asymmetric.
    """

    def __init__(self, linear: nn.Linear, fmt="int4", granularity="per_group", group_size=128,
                 symmetric=True):
        super().__init__()
        self.out_features, self.in_features = _shape(linear)
        self.fmt, self.granularity, self.symmetric = fmt, granularity, symmetric
        self.bits = _bits(fmt)
        w = linear.weight.detach().float()                                  # (out, in)
        qt = quant.quantize(w, fmt, granularity, group_size if granularity == "per_group" else None,
                            symmetric)
        self.group_size = qt.group_size
        self.nibbles = self.bits <= 4
        if self.nibbles and self.in_features % 2:
            raise ValueError(f"packing {fmt} two codes per byte needs an even in_features; "
                             f"got {self.in_features} (use mode='fake' for this layer)")
        codes = quant.pack_int4(qt.q) if self.nibbles else qt.q            # (out, in/2) or (out, in)
        self.register_buffer("codes", codes)
        self.register_buffer("scale", qt.scale.reshape(self.out_features, -1).half())  # (out, G)
        zero = None if qt.zero is None else qt.zero.reshape(self.out_features, -1).to(torch.uint8)
        self.register_buffer("zero", zero)
        self.unsigned = qt.q.dtype == torch.uint8
        self.bias = getattr(linear, "bias", None)
        self.out_dtype = linear.weight.dtype

    def dequantized_weight(self) -> torch.Tensor:
        """codes -> (out, in) weight in the original dtype."""
        q = quant.unpack_int4(self.codes, signed=not self.unsigned) if self.nibbles else self.codes
        q = q.float().view(self.out_features, -1, self.group_size)          # (out, G, gs)
        if self.zero is not None:
            q = q - self.zero.float()[..., None]
        w = q * self.scale.float()[..., None]                               # (out, G, gs)
        return w.reshape(self.out_features, self.in_features).to(self.out_dtype)

    def forward(self, x):                                                   # (..., in) -> (..., out)
        return F.linear(x, self.dequantized_weight(), self.bias)

    def nbytes(self) -> int:
        """Bytes actually held by the codes, scales and zero points (the bias is not counted)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    def extra_repr(self):
        return (f"{self.in_features}, {self.out_features}, {self.fmt}, {self.granularity}, "
                f"group_size={self.group_size}, codes={tuple(self.codes.shape)} "
                f"{str(self.codes.dtype).replace('torch.', '')}")


class FakeQuantEmbedding(FakeQuantLinear):
    """An embedding table rounded row by row (one row per token id), kept in float."""

    def forward(self, ids):                                                 # (B, T) -> (B, T, D)
        return F.embedding(ids, self.weight)


class PackedEmbedding(PackedLinear):
    """An embedding table stored as codes + fp16 scales; rows dequantized on lookup."""

    def forward(self, ids):                                                 # (B, T) -> (B, T, D)
        return F.embedding(ids, self.dequantized_weight())


@dataclass
class QuantReport:
    """What :func:`quantize_model` changed and how many bytes the weights take before/after."""
    fmt: str
    granularity: str
    group_size: int | None
    mode: str
    quantized: list = field(default_factory=list)    # (name, (out, in)) of replaced layers
    skipped: list = field(default_factory=list)      # names of Linears / Embeddings left alone
    bytes_before: int = 0                            # every parameter at 16 bits
    bytes_after: int = 0
    quantized_weights: int = 0                       # weights in the quantized layers
    quantized_bytes: int = 0                         # what they take now (codes + scales)

    @property
    def bits_per_weight(self) -> float:
        """Average storage of a quantized weight, scales and zero points included."""
        return 8 * self.quantized_bytes / max(1, self.quantized_weights)

    @property
    def ratio(self) -> float:
        return self.bytes_before / max(1, self.bytes_after)

    def __str__(self):
        g = f" g{self.group_size}" if self.granularity == "per_group" else ""
        return (f"{self.fmt} {self.granularity}{g} ({self.mode}): {len(self.quantized)} "
                f"layers quantized, {len(self.skipped)} skipped {self.skipped}; weights "
                f"{self.bytes_before / 2**20:.2f} MiB -> {self.bytes_after / 2**20:.2f} MiB "
                f"({self.ratio:.2f}x smaller)")


def _unique_params(model: nn.Module):
    return {id(p): p for p in model.parameters()}.values()


def model_bytes(model: nn.Module, bits: int = 16) -> int:
    """Bytes of every parameter at ``bits`` per value (16: the bf16/fp16 checkpoint)."""
    return sum(p.numel() for p in _unique_params(model)) * bits // 8


def quantize_model(model: nn.Module, fmt: str = "int4", granularity: str = "per_group",
                   group_size: int | None = 128, symmetric: bool = True, mode: str = "fake",
                   skip=DEFAULT_SKIP, only=None, inplace: bool = False):
    """Replace ``model``'s Linear layers by quantized ones; returns ``(model, QuantReport)``.

    skip: names containing any of these strings stay as they are (default: the output head
    ``lm_head`` and the embeddings ``embed_tokens``; pass ``skip=()`` to quantize both: an
    ``nn.Embedding`` is quantized one row per token id). A tied head and embedding are
    untied by quantizing only one of them. only: if given, quantize only layers whose name
    contains one of these strings (layer sensitivity studies). A copy is quantized unless
    ``inplace``. Taught in lesson 04.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    _bits(fmt)
    if isinstance(skip, str) or isinstance(only, str):
        raise TypeError("skip and only take a list of name fragments, e.g. skip=['lm_head']")
    if granularity != "per_group":
        group_size = None
    if not inplace:
        model = copy.deepcopy(model)
    report = QuantReport(fmt, granularity, group_size, mode)
    before_params = model_bytes(model)
    classes = {nn.Linear: FakeQuantLinear if mode == "fake" else PackedLinear,
               nn.Embedding: FakeQuantEmbedding if mode == "fake" else PackedEmbedding}
    targets = [(n, m) for n, m in model.named_modules() if type(m) in classes
               or isinstance(m, nn.Linear)]
    if not any(isinstance(m, nn.Linear) for _, m in targets):
        raise ValueError("this model has no nn.Linear layers to quantize")
    if skip is not DEFAULT_SKIP:   # a typo in skip would quantize the layer it meant to keep
        unused = [s for s in skip if not any(s in n for n, _ in targets)]
        if unused:
            raise ValueError(f"skip fragment(s) {unused} match no layer, so nothing would be kept "
                             f"for them; layer names look like {[n for n, _ in targets][:6]}")
    saved = 0
    for name, lin in targets:
        if any(s in name for s in skip) or (only is not None and not any(o in name for o in only)):
            report.skipped.append(name)
            continue
        cls = classes[nn.Embedding if isinstance(lin, nn.Embedding) else nn.Linear]
        try:
            new = cls(lin, fmt, granularity, group_size, symmetric)
        except ValueError as e:
            raise ValueError(f"layer {name!r} (weight {tuple(lin.weight.shape)}): {e}") from None
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
        report.quantized.append((name, tuple(lin.weight.shape)))
        saved += lin.weight.numel() * 2 - new.nbytes()          # weight at 16 bits -> stored
        report.quantized_weights += lin.weight.numel()
        report.quantized_bytes += new.nbytes()
    if only is not None and not report.quantized:
        raise ValueError(f"no layer name contains any of {list(only)}; names look like "
                         f"{[n for n, _ in targets[:4]]}")
    report.bytes_before = before_params
    report.bytes_after = before_params - saved
    return model, report


def linear_names(model: nn.Module) -> list[str]:
    """Names of every nn.Linear (or quantized replacement) in ``model``."""
    kinds = (nn.Linear, FakeQuantLinear, PackedLinear)
    return [n for n, m in model.named_modules() if isinstance(m, kinds)]


def buffer_bytes(model: nn.Module) -> int:
    """Bytes actually held in memory by parameters and buffers (for ``mode='packed'``)."""
    ps = sum(p.numel() * p.element_size() for p in _unique_params(model))
    return ps + sum(b.numel() * b.element_size() for b in model.buffers())


def rtn_sweep(model: nn.Module, ref, variants, skip=DEFAULT_SKIP, only=None) -> list[dict]:
    """Quantize ``model`` once per variant (round-to-nearest, fake-quant) and score each against
    the reference ``ref`` (:func:`course_lib.eval.reference`) on the same windows (lesson 04).

    variants: (fmt, granularity, group_size) triples. Returns one dict per variant with the
    label, bits per weight (scales included), weight MiB, bits per byte, its increase over the
    reference, KL (nats/token) and top-1 agreement.
    """
    from course_lib import eval as ceval
    variants = list(variants)
    if not variants or not all(isinstance(v, (tuple, list)) and len(v) == 3 for v in variants):
        raise ValueError(f"variants must be a non-empty list of (fmt, granularity, group_size) "
                         f"triples, e.g. [('int4', 'per_group', 32)]; got {variants!r}")
    rows = []
    for fmt, gran, gs in variants:
        qm, rep = quantize_model(model, fmt, gran, gs, skip=skip, only=only)
        r = ceval.compare(qm, ref)
        label = f"W{_bits(fmt)} " + (f"g{gs}" if gran == "per_group" else gran.replace("_", "-"))
        rows.append({"variant": label, "fmt": fmt, "granularity": gran, "group_size": gs,
                     "bits_per_weight": rep.bits_per_weight,
                     "weights_mib": rep.bytes_after / 2**20,
                     "bits_per_byte": r["bits_per_byte"],
                     "delta_bpb": r["bits_per_byte"] - ref.bits_per_byte,
                     "kl_nats": r["kl_nats"], "top1_agreement": r["top1_agreement"]})
    return rows


def layer_sensitivity(model: nn.Module, ref, fragments, bits: int = 3,
                      group_size: int | None = None) -> dict[str, float]:
    """KL vs ``ref`` when only the Linears whose name contains one fragment are quantized
    (symmetric INT``bits``, per row or per group), one fragment at a time (lesson 04, section 5;
    the reference of exercise 04.layer_sensitivity).

    Each fragment starts again from the unquantized ``model``, so the numbers do not add up
    damage from earlier fragments. Returns ``{fragment: kl_nats}`` in the order given.
    """
    if isinstance(fragments, str) or not fragments or not all(isinstance(f, str) and f
                                                              for f in fragments):
        raise ValueError(f"fragments must be a non-empty list of name pieces such as "
                         f"['.q_proj', '.down_proj']; got {fragments!r}")
    if len(set(fragments)) != len(fragments):
        raise ValueError(f"fragments repeat an entry: {list(fragments)}")
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise ValueError(f"bits must be a whole number 2..8; got {bits!r}")
    gran = "per_channel" if group_size is None else "per_group"
    return {f: rtn_sweep(model, ref, [(f"int{bits}", gran, group_size)], only=[f])[0]["kl_nats"]
            for f in fragments}


def format_rows(rows: list[dict], cols=None) -> str:
    """A plain-text table of ``rtn_sweep`` rows (floats to 4 significant digits)."""
    cols = cols or list(rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[fmt(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.rjust(w) for x, w in zip(xs, widths))  # noqa: E731
    return "\n".join([line(cols)] + [line(x) for x in cells])
