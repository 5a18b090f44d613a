"""How much did quantization hurt? Held-out metrics on fixed tokens and windows (lesson 04).

Every variant of a model is scored on *the same* token ids cut into *the same* windows:

- :func:`bits_per_byte`: mean next-token cross-entropy in bits, per byte of text (for the
  byte-level bundled model one token is one byte; pass ``bytes_per_token`` otherwise);
- :func:`reference` + :func:`compare`: KL divergence KL(reference || variant) of the next-token
  distributions (nats per token) and top-1 agreement (how often both pick the same next token);
  these separate quantization methods far better than bits per byte does;
- :func:`completion_accuracy`: a small task metric, greedy exact-match completion of held-out
  Python identifiers (or, harder, of the second half of code lines).

Windows are non-overlapping: window i feeds tokens [i*W, (i+1)*W) and predicts [i*W+1, (i+1)*W+1).
With ``stride`` (the real-LLM protocol: ``window=511, stride=512``) window i starts at i*stride
instead, so 512-token blocks are scored each on its own, 511 predictions per block.
Perplexity per token is exp(mean nats per token).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def as_ids(text) -> torch.Tensor:
    """bytes / str / list / tensor -> int64 ids (N,) (bytes and str are byte-level tokens)."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    if isinstance(text, (bytes, bytearray)):
        if not text:
            raise ValueError("the text is empty: nothing to score")
        return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    ids = torch.as_tensor(text)
    if ids.dim() != 1:
        raise ValueError(f"expected a 1-D sequence of token ids; got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("the sequence of token ids is empty: nothing to score")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"token ids must be whole numbers (an integer tensor or list of ints); "
                        f"got {ids.dtype}: truncating {ids.dtype} to ids would silently change "
                        f"them. Use tokenizer.encode(text) or torch.tensor(ids, dtype=torch.long)")
    return ids.long()


def make_windows(ids, window: int, stride: int | None = None) -> torch.Tensor:
    """Cut ids (N,) into windows of ``window`` inputs + 1 target: (n, window+1).

    Window i starts at i * stride (default stride = window: consecutive windows share only
    their boundary token; stride = window + 1: disjoint blocks, each scored on its own)."""
    ids = as_ids(ids)
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a whole number >= 1; got {window!r}")
    stride = window if stride is None else stride
    if not isinstance(stride, int) or stride < window:
        raise ValueError(f"stride must be a whole number >= window ({window}) so that no "
                         f"position is scored twice; got {stride!r}")
    n = (len(ids) - 1 - window) // stride + 1 if len(ids) > window else 0
    if n < 1:
        raise ValueError(f"text of {len(ids)} tokens is shorter than the evaluation window "
                         f"({window} + 1 tokens): use more text or a smaller window")
    starts = torch.arange(n) * stride                                        # (n,)
    return ids[starts[:, None] + torch.arange(window + 1)[None, :]]          # (n, window+1)


def _check_model_window(model, window: int, batch_size: int = 1) -> None:
    """Refuse a window longer than the model's context (it was never trained beyond it, and
    RoPE positions past it give plausible-looking, wrong scores) and a batch size below 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1; got {batch_size!r}")
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context is not None and isinstance(window, int) and window > context:
        raise ValueError(f"window={window} exceeds the model's context of {context} positions, "
                         f"beyond which it was never trained (its score would be meaningless); "
                         f"use window <= {context}")


def _check_bytes_per_token(bytes_per_token) -> None:
    if (isinstance(bytes_per_token, bool) or not isinstance(bytes_per_token, (int, float))
            or not math.isfinite(bytes_per_token) or bytes_per_token <= 0):
        raise ValueError(f"bytes_per_token must be a finite number > 0; got {bytes_per_token!r}")


def _check_vocab(model, windows):
    V = model.config.vocab_size if hasattr(model, "config") else None
    if V is not None and (int(windows.min()) < 0 or int(windows.max()) >= V):
        raise ValueError(f"token ids span [{int(windows.min())}, {int(windows.max())}] but the "
                         f"model's vocabulary has {V} entries (valid 0..{V - 1})")


@torch.no_grad()
def logprobs(model, ids, window: int = 256, batch_size: int = 32, stride: int | None = None
             ) -> torch.Tensor:
    """Next-token log-probabilities on every window position: (n * window, V) fp32."""
    _check_model_window(model, window, batch_size)
    w = make_windows(ids, window, stride)                                    # (n, W+1)
    _check_vocab(model, w)
    out = []
    for i in range(0, len(w), batch_size):
        logits = model(w[i:i + batch_size, :-1])                             # (b, W, V)
        out.append(F.log_softmax(logits.float(), -1).flatten(0, 1))         # (b*W, V)
    return torch.cat(out)


def targets(ids, window: int = 256, stride: int | None = None) -> torch.Tensor:
    """The target token of every window position: (n * window,)."""
    return make_windows(ids, window, stride)[:, 1:].reshape(-1)


def _check_logprobs(lp: torch.Tensor, what: str = "lp") -> None:
    """Raise unless every row of lp (N, V) is a log-probability vector (logsumexp ~ 0).

    Raw logits (a very easy thing to pass by mistake) give a plausible-looking but wrong
    cross-entropy or KL, so they are refused here; -inf (probability 0) is allowed, NaN is not.
    """
    if lp.numel() == 0:
        return
    lpf = lp.detach().float()          # fp32 is ample for a 1e-2 tolerance
    if bool(torch.isnan(lpf).any()) or bool((lpf == math.inf).any()):
        raise ValueError(f"{what} holds NaN or +inf: a log-probability is at most 0; check the "
                         f"model's logits for overflow before comparing")
    lse = torch.logsumexp(lpf, -1)                                           # (N,)
    worst = float(lse.abs().max())
    if worst > 1e-2:
        raise ValueError(f"{what} rows are not log-probabilities: logsumexp over the vocabulary "
                         f"should be 0, got up to {worst:.3g} in size. Pass "
                         f"torch.log_softmax(logits, -1), not raw logits")


def bits_from_logprobs(lp: torch.Tensor, tgt: torch.Tensor, bytes_per_token: float = 1.0
                       ) -> float:
    """Bits per byte from next-token log-probs (N, V) (natural log) and targets (N,) (lesson 04).

    Cross-entropy = mean over positions of -ln p(target); / ln 2 turns nats into bits;
    / bytes_per_token turns bits per token into bits per byte (1 for a byte-level model).
    Perplexity per token is exp(mean nats) = 2 ** (bits per token).
    """
    if not isinstance(lp, torch.Tensor) or not isinstance(tgt, torch.Tensor):
        raise TypeError(f"lp and tgt must be torch tensors (log-probs (N, V) and targets (N,)); "
                        f"got {type(lp).__name__} and {type(tgt).__name__}: wrap numpy arrays "
                        f"with torch.from_numpy(...)")
    if lp.dim() != 2 or tgt.shape != lp.shape[:1]:
        raise ValueError(f"expected log-probs (N, V) and targets (N,); got {tuple(lp.shape)} "
                         f"and {tuple(tgt.shape)}")
    if tgt.numel() == 0:
        raise ValueError("no positions to score: log-probs and targets are empty")
    if tgt.is_floating_point():
        raise TypeError(f"targets must be integer token ids; got {tgt.dtype}")
    _check_bytes_per_token(bytes_per_token)
    if tgt.numel() and (int(tgt.min()) < 0 or int(tgt.max()) >= lp.shape[1]):
        raise ValueError(f"targets span [{int(tgt.min())}, {int(tgt.max())}] but there are only "
                         f"{lp.shape[1]} log-probs per position")
    _check_logprobs(lp)
    nll = -lp.gather(1, tgt.long()[:, None]).mean()                          # nats / token
    return float(nll) / math.log(2) / bytes_per_token


def perplexity_from_logprobs(lp: torch.Tensor, tgt: torch.Tensor) -> float:
    """Perplexity per token, exp(mean -ln p(target)), from log-probs (N, V) and targets (N,)
    (lesson 04: the real LLM's headline metric; 2 ** bits per token)."""
    return 2.0 ** bits_from_logprobs(lp, tgt, 1.0)


def bits_per_byte(model, ids, window: int = 256, batch_size: int = 32,
                  bytes_per_token: float = 1.0) -> float:
    """Mean cross-entropy of the next token in bits, divided by bytes per token (lesson 04).

    ``window`` must fit the model's context (a 256-context model refuses window=512)."""
    _check_bytes_per_token(bytes_per_token)
    lp = logprobs(model, ids, window, batch_size)                            # (N, V)
    return bits_from_logprobs(lp, targets(ids, window), bytes_per_token)


@dataclass
class Reference:
    """The unquantized model's next-token log-probabilities on fixed windows."""
    logprobs: torch.Tensor   # (N, V)
    targets: torch.Tensor    # (N,)
    ids: torch.Tensor
    window: int
    bytes_per_token: float = 1.0
    stride: int | None = None

    @property
    def bits_per_byte(self) -> float:
        return bits_from_logprobs(self.logprobs, self.targets, self.bytes_per_token)

    @property
    def perplexity(self) -> float:
        return perplexity_from_logprobs(self.logprobs, self.targets)


def reference(model, ids, window: int = 256, batch_size: int = 32,
              bytes_per_token: float = 1.0, stride: int | None = None) -> Reference:
    """Score the reference (unquantized fp32) model once; :func:`compare` reuses it."""
    ids = as_ids(ids)
    _check_bytes_per_token(bytes_per_token)
    return Reference(logprobs(model, ids, window, batch_size, stride),
                     targets(ids, window, stride), ids, window, bytes_per_token, stride)


def kl_and_top1(ref_lp: torch.Tensor, lp: torch.Tensor) -> tuple[float, float]:
    """Mean KL(ref || variant) in nats per token and top-1 agreement, from log-probs (N, V).

    KL(P || Q) = sum_v P(v) (ln P(v) - ln Q(v)), averaged over positions; top-1 agreement is
    the fraction of positions where argmax P == argmax Q (lesson 04).
    """
    if ref_lp.shape != lp.shape:
        raise ValueError(f"log-prob shapes differ: {tuple(ref_lp.shape)} vs {tuple(lp.shape)}")
    _check_logprobs(ref_lp, "ref_lp")
    _check_logprobs(lp, "lp")
    p = ref_lp.exp()                                                         # (N, V)
    terms = torch.where(p > 0, p * (ref_lp - lp), torch.zeros_like(p))       # 0 ln 0 = 0
    kl = terms.sum(-1).mean()                                                # nats / token
    top1 = (ref_lp.argmax(-1) == lp.argmax(-1)).float().mean()
    return float(kl), float(top1)


def compare(model, ref: Reference, batch_size: int = 32) -> dict:
    """Bits per byte, perplexity, KL vs the reference and top-1 agreement of ``model`` on
    ref's windows."""
    lp = logprobs(model, ref.ids, ref.window, batch_size, ref.stride)        # (N, V)
    kl, top1 = kl_and_top1(ref.logprobs, lp)
    return {"bits_per_byte": bits_from_logprobs(lp, ref.targets, ref.bytes_per_token),
            "perplexity": perplexity_from_logprobs(lp, ref.targets),
            "kl_nats": kl, "top1_agreement": top1}


# ----------------------------------------------------------------------------- task metric
UNITS = ("identifier", "line")


def completion_cases(text: bytes, n: int = 128, prompt_bytes: int = 128, unit: str = "identifier",
                     seed: int = 0, min_len: int = 5, keep: int = 2, max_target: int = 24):
    """Fixed (prompt, target) pairs cut from ``text`` (seeded choice of ``n`` of them).

    unit="identifier": a Python name of at least ``min_len`` characters; the prompt is the
    ``prompt_bytes`` bytes ending after its first ``keep`` characters, the target the rest of
    the name. unit="line": the target is the second half of a code line (at most ``max_target``
    bytes), the prompt the bytes before it (much harder: a small model rarely gets a whole
    half-line right).
    """
    import re
    if isinstance(text, str):
        text = text.encode("utf-8")
    if not isinstance(text, (bytes, bytearray)):
        raise TypeError(f"text must be bytes or str; got {type(text).__name__}")
    for name, v in (("n", n), ("prompt_bytes", prompt_bytes), ("min_len", min_len),
                    ("max_target", max_target)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1; got {v!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep < min_len:
        raise ValueError(f"keep must be a whole number in 0..min_len-1 ({min_len - 1}); got {keep!r}")
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; known: {', '.join(UNITS)}")
    cands = []
    if unit == "identifier":
        for mt in re.finditer(rb"[A-Za-z_][A-Za-z0-9_]*", text):
            cut = mt.start() + keep
            if mt.end() - mt.start() >= min_len and cut >= prompt_bytes:
                cands.append((cut, mt.end()))
    else:
        pos = 0
        for line in text.split(b"\n"):
            stripped = line.strip()
            if len(stripped) >= 24 and not stripped.startswith(b"#"):
                cut = pos + (len(line) - len(stripped)) + len(stripped) // 2
                if cut >= prompt_bytes:
                    cands.append((cut, min(pos + len(line), cut + max_target)))
            pos += len(line) + 1
    if not cands:
        raise ValueError(f"no {unit} in this text is long enough for the completion task "
                         f"(after the first {prompt_bytes} bytes)")
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(len(cands), generator=g)[:n].sort().values
    return [(text[cands[i][0] - prompt_bytes:cands[i][0]], text[cands[i][0]:cands[i][1]])
            for i in pick.tolist()]


@torch.no_grad()
def completion_accuracy(model, text: bytes, n: int = 128, prompt_bytes: int = 128,
                        unit: str = "identifier", seed: int = 0) -> float:
    """A small task metric (lesson 04): the fraction of held-out identifiers (or line halves)
    the model completes exactly, greedily, from the bytes before them.

    Byte-level models only (the bundled model). All prompts have the same length, so they run
    as one batch with the KV cache.
    """
    from course_lib.model import generate
    cases = completion_cases(text, n, prompt_bytes, unit, seed)
    prompts = torch.stack([as_ids(p) for p, _ in cases])                    # (n, P)
    longest = max(len(t) for _, t in cases)
    out = generate(model, prompts, longest)[:, prompt_bytes:]              # (n, longest)
    hits = [bytes(out[i, :len(t)].tolist()) == t for i, (_, t) in enumerate(cases)]
    return sum(hits) / len(hits)
