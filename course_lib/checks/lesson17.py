"""Exercises of lesson 17, "Your own model" (solutions/17_your_own_model.ipynb).

Three pieces the lesson then uses on the learner's checkpoint: the parameter count of a
config.json (the start of the bill, before any weight is read), the sequential scheme that
feeds each decoder layer the outputs of the layers already QUANTIZED (GPTQ's reference code and
llm-compressor's sequential pipeline), and the choice of a method and format under a byte budget
from measured rows. The references are the library's where it has one
(``own_model.count_parameters``); the other two are the few lines the task describes.
"""
from __future__ import annotations

import torch

from course_lib import own_model, stream
from course_lib.checks import Case, Exercise, register
from course_lib.model import Block, ModelConfig


# ---------------------------------------------------------------- 17.count_parameters

def count_parameters(config):
    """The reference: every parameter of a Llama-family checkpoint, from its config.json."""
    return own_model.count_parameters(own_model.own_config(config))["total"]


#: Released configs, from the library (``own_model.RELEASED``: the keys the count needs).
from course_lib.own_model import (LLAMA1_7B, LLAMA31_8B, LLAMA32_1B,  # noqa: E402,F401
                                  MISTRAL_7B, QWEN3_06B, QWEN25_05B, RELEASED,
                                  SMOLLM2_135M)


def _cp_cases():
    return [
        Case((SMOLLM2_135M,), label="SmolLM2-135M: 9 query heads share 3 key/value heads, a "
             "tied head",
             hint="k_proj and v_proj do not have hidden x hidden weights when the key/value "
                  "heads are fewer than the query heads: how many outputs do they have?"),
        Case((LLAMA32_1B,), label="Llama-3.2-1B: tied head, head_dim given (64)"),
        Case((LLAMA31_8B,), label="Llama-3.1-8B: an UNTIED head (tie_word_embeddings false)",
             hint="An untied model stores the output head (vocab x hidden) beside the "
                  "embedding; a tied one stores one matrix for both. Which is this?"),
        Case((QWEN25_05B,), label="Qwen2.5-0.5B: biases on q, k and v",
             hint="Qwen2 adds a bias to q_proj, k_proj and v_proj (not o_proj): one number "
                  "per output of each."),
        Case((QWEN3_06B,), label="Qwen3-0.6B: head_dim 128 is NOT hidden / heads (64), and "
             "q/k norms",
             hint="When config.json gives head_dim, q_proj has heads x head_dim outputs, which "
                  "need not equal hidden_size. Qwen3 also adds two RMSNorm weights of head_dim "
                  "per layer (on q and k)."),
        Case((MISTRAL_7B,), label="Mistral-7B-v0.1: untied, 4 query heads per key/value head"),
        Case((LLAMA1_7B,), label="LLaMA-7B's config: no num_key_value_heads (one per query "
             "head), no tie_word_embeddings (false)",
             hint="A key config.json leaves out takes transformers' default: "
                  "num_key_value_heads = num_attention_heads, tie_word_embeddings = False."),
    ]


def _cp_parts(c, gqa=True, head="auto", norms=True, bias=True, head_dim="auto", qk_norm=True,
              mlp=3, tie_default=False, final_norm=True):
    """The count with one rule switchable: the wrong answers below each flip one."""
    V, D, F, L = c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    H = c["num_attention_heads"]
    K = c.get("num_key_value_heads") or H
    hd = c.get("head_dim") or D // H if head_dim == "auto" else D // H
    if not gqa:
        K = H
    per = D * H * hd + 2 * D * K * hd + H * hd * D + mlp * D * F
    if norms:
        per += 2 * D
    if bias and c.get("model_type") == "qwen2":
        per += (H + 2 * K) * hd
    if qk_norm and c.get("model_type") == "qwen3":
        per += 2 * hd
    tied = c.get("tie_word_embeddings", tie_default)
    n_head = {"auto": 0 if tied else V * D, "always": V * D, "never": 0}[head]
    return V * D + L * per + (D if final_norm else 0) + n_head


def _wrong_cp_no_gqa(c):                      # k and v as wide as q
    return _cp_parts(c, gqa=False)


def _wrong_cp_head_always(c):                 # counts the head even when it is tied
    return _cp_parts(c, head="always")


def _wrong_cp_head_never(c):                  # forgets the untied head
    return _cp_parts(c, head="never")


def _wrong_cp_no_norms(c):                    # forgets the two RMSNorms of each layer
    return _cp_parts(c, norms=False)


def _wrong_cp_no_bias(c):                     # forgets Qwen2's q/k/v biases
    return _cp_parts(c, bias=False)


def _wrong_cp_head_dim_derived(c):            # hidden / heads even where head_dim is given
    return _cp_parts(c, head_dim="derived")


def _wrong_cp_no_qk_norm(c):                  # forgets Qwen3's q/k norms
    return _cp_parts(c, qk_norm=False)


def _wrong_cp_two_matrices(c):                # a GELU MLP (up, down): SwiGLU has three
    return _cp_parts(c, mlp=2)


def _wrong_cp_tie_default_true(c):            # a missing tie_word_embeddings read as true
    return _cp_parts(c, tie_default=True)


def _wrong_cp_no_final_norm(c):               # forgets the norm before the head
    return _cp_parts(c, final_norm=False)


def _wrong_cp_float(c):                       # billions, as a float
    return _cp_parts(c) / 1e9


register(Exercise(
    id="17.count_parameters",
    title="the parameters of a checkpoint from its config.json alone",
    reference=count_parameters,
    cases=_cp_cases,
    hint=["What matrices does one decoder layer hold, what are their shapes in terms of the "
          "config's numbers, and what sits outside the layers?",
          "Per layer: q_proj (heads x head_dim, hidden), k_proj and v_proj (kv_heads x head_dim, "
          "hidden), o_proj (hidden, heads x head_dim), gate/up (intermediate, hidden), down "
          "(hidden, intermediate), and two RMSNorm weights of hidden. Qwen2 adds q/k/v biases, "
          "Qwen3 two norms of head_dim. Outside: the embedding (vocab x hidden), the final norm, "
          "and the head when it is not tied.",
          "H, K = heads, c.get('num_key_value_heads') or H; hd = c.get('head_dim') or D // H; "
          "per = D*H*hd + 2*D*K*hd + H*hd*D + 3*D*F + 2*D (+ (H + 2K)*hd for qwen2, + 2*hd for "
          "qwen3); total = V*D + L*per + D + (0 if c.get('tie_word_embeddings', False) else "
          "V*D)."],
    wrong=[_wrong_cp_no_gqa, _wrong_cp_head_always, _wrong_cp_head_never, _wrong_cp_no_norms,
           _wrong_cp_no_bias, _wrong_cp_head_dim_derived, _wrong_cp_no_qk_norm,
           _wrong_cp_two_matrices, _wrong_cp_tie_default_true, _wrong_cp_no_final_norm,
           _wrong_cp_float],
    right=[_cp_parts],
    rtol=0, atol=0, int_results=True,
))


# ---------------------------------------------------------------- 17.sequential_inputs

def sequential_inputs(blocks, x, cos, sin, quantize):
    """The reference: for each block in order, record its input x, quantize it on x
    (``quantize(block, x, cos, sin)`` returns a new, quantized block) and feed x through the
    QUANTIZED block, so the next block is calibrated on what the quantized model computes.
    Returns the inputs, one per block, as a tuple."""
    if len(blocks) == 0:
        raise ValueError("blocks is empty: there is nothing to calibrate")
    inputs = []
    with torch.no_grad():
        for block in blocks:
            inputs.append(x)
            q = quantize(block, x, cos, sin)
            x = q(x, cos, sin)
    return tuple(inputs)


#: A decoder small enough for the checker: 3 layers of width 32.
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _tiny_blocks(seed, n_layers=3):
    cfg = ModelConfig(**{**TINY, "num_hidden_layers": n_layers})
    torch.manual_seed(seed)
    blocks = []
    for i in range(n_layers):
        b = Block(cfg, i)
        with torch.no_grad():
            for p in b.parameters():
                p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 2 else 0.2) + (p.dim() == 1))
        blocks.append(b.eval().requires_grad_(False))
    return cfg, blocks


def _rope(cfg, T):
    from course_lib.model import rope_frequencies
    inv = rope_frequencies(cfg)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)                                      # (T, hd)
    return ang.cos(), ang.sin()


#: The calibrated and the plain quantizer the cases (and the lesson) pass: the library's
#: (``stream.gptq_copy``, ``stream.rtn_copy``), here at the cases' 2 bits.
def gptq_block(block, x, cos, sin, bits=2, group_size=None, act_order=False):
    return stream.gptq_copy(block, x, cos, sin, bits, group_size, act_order)


def rtn_block(block, x, cos, sin, bits=2, group_size=None):
    return stream.rtn_copy(block, x, cos, sin, bits, group_size)


def _si_cases():
    cfg, blocks = _tiny_blocks(0)
    cos, sin = _rope(cfg, 12)
    x = torch.randn(2, 12, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    cfg1, one = _tiny_blocks(2, n_layers=1)
    cos1, sin1 = _rope(cfg1, 8)
    x1 = torch.randn(1, 8, cfg1.hidden_size, generator=torch.Generator().manual_seed(3))
    cfg5, five = _tiny_blocks(4, n_layers=5)
    cos5, sin5 = _rope(cfg5, 16)
    x5 = torch.randn(3, 16, cfg5.hidden_size, generator=torch.Generator().manual_seed(5))
    return [
        Case((one, x1, cos1, sin1, gptq_block), label="one block: its input is x itself",
             hint="The first block is calibrated on the inputs you were given. Do you record x "
                  "BEFORE running the block, and return one input per block?"),
        Case((blocks, x, cos, sin, rtn_block), label="3 blocks, round-to-nearest (ignores x): "
             "block i+1's input is the QUANTIZED block i's output",
             hint="After quantizing block i, which block computes the next input: the original "
                  "or the quantized copy that quantize returned?"),
        Case((blocks, x, cos, sin, gptq_block), label="3 blocks, GPTQ at 2 bits (calibrated "
             "on x): each block sees the errors of those before it"),
        Case((five, x5, cos5, sin5, gptq_block), label="5 blocks, 3 windows of 16 tokens"),
        Case(([], x, cos, sin, rtn_block), label="no blocks: raise ValueError",
             raises=ValueError),
    ]


def _wrong_si_fp(blocks, x, cos, sin, quantize):        # the ORIGINAL block's output goes on
    if len(blocks) == 0:
        raise ValueError("empty")
    inputs = []
    with torch.no_grad():
        for b in blocks:
            inputs.append(x)
            quantize(b, x, cos, sin)
            x = b(x, cos, sin)
    return tuple(inputs)


def _wrong_si_outputs(blocks, x, cos, sin, quantize):   # records each block's OUTPUT
    if len(blocks) == 0:
        raise ValueError("empty")
    outs = []
    with torch.no_grad():
        for b in blocks:
            x = quantize(b, x, cos, sin)(x, cos, sin)
            outs.append(x)
    return tuple(outs)


def _wrong_si_all_on_x(blocks, x, cos, sin, quantize):  # every block calibrated on x
    if len(blocks) == 0:
        raise ValueError("empty")
    return tuple(x for _ in blocks)


def _wrong_si_drop_last(blocks, x, cos, sin, quantize):  # stops one block early
    return sequential_inputs(blocks, x, cos, sin, quantize)[:-1] if len(blocks) > 1 else \
        sequential_inputs(blocks, x, cos, sin, quantize)


def _wrong_si_swapped_rope(blocks, x, cos, sin, quantize):   # passes (sin, cos)
    if len(blocks) == 0:
        raise ValueError("empty")
    inputs = []
    with torch.no_grad():
        for b in blocks:
            inputs.append(x)
            x = quantize(b, x, sin, cos)(x, sin, cos)
    return tuple(inputs)


def _wrong_si_in_place(blocks, x, cos, sin, quantize):  # writes the quantized weights into blocks
    if len(blocks) == 0:
        raise ValueError("empty")
    inputs = []
    with torch.no_grad():
        for b in blocks:
            inputs.append(x)
            q = quantize(b, x, cos, sin)
            b.self_attn, b.mlp = q.self_attn, q.mlp
            x = b(x, cos, sin)
    return tuple(inputs)


def _wrong_si_no_refusal(blocks, x, cos, sin, quantize):
    return sequential_inputs(blocks, x, cos, sin, quantize) if len(blocks) else ()


register(Exercise(
    id="17.sequential_inputs",
    title="the sequential scheme: each layer calibrated on the quantized layers' outputs",
    reference=sequential_inputs,
    cases=_si_cases,
    hint=["A layer's quantization is chosen from the inputs it sees. Which inputs will it see "
          "once the model is quantized, and so which model should produce them during "
          "calibration?",
          "Walk the blocks in order. Record x as this block's input; q = quantize(block, x, "
          "cos, sin) (a new block; leave the original alone); then the next x is what q, not "
          "block, outputs. Refuse an empty list with ValueError.",
          "inputs = []; for block in blocks: inputs.append(x); q = quantize(block, x, cos, sin); "
          "x = q(x, cos, sin). Return tuple(inputs) (inside torch.no_grad())."],
    wrong=[_wrong_si_fp, _wrong_si_outputs, _wrong_si_all_on_x, _wrong_si_drop_last,
           _wrong_si_swapped_rope, _wrong_si_in_place, _wrong_si_no_refusal],
    rtol=1e-5, atol=1e-6,
))


# ---------------------------------------------------------------- 17.choose_format

def choose_format(rows, budget_bytes):
    """The reference: the name of the row with the lowest ``kl_nats`` among those whose
    ``bytes`` fit the budget (<=); equal KL: the fewer bytes, then the first listed. None fits:
    ValueError naming the smallest row's bytes."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) \
            or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be a number of bytes >= 0; got {budget_bytes!r}")
    fits = [r for r in rows if r["bytes"] <= budget_bytes]
    if not fits:
        small = min(rows, key=lambda r: r["bytes"]) if rows else None
        raise ValueError(f"no row fits {budget_bytes} bytes" + (
            f"; the smallest, {small['name']}, needs {small['bytes']}" if small else ""))
    best = min(fits, key=lambda r: (r["kl_nats"], r["bytes"]))
    return best["name"]


def _row(name, nbytes, kl, ppl):
    return {"name": name, "bytes": nbytes, "kl_nats": kl, "perplexity": ppl}


def _cf_rows():
    """SmolLM2's measured rows (results/methods_smollm2.json, W4 g32 and g64; KL and
    perplexity rounded) with the bytes of its Linears in each format."""
    g32, g64 = 4.5, 4.25
    lin = 30 * 3_538_944                                  # SmolLM2's Linear weights
    b = lambda bpw: int(lin * bpw / 8)                    # noqa: E731
    return [_row("RTN W4 g32", b(g32), 0.355, 16.98), _row("GPTQ W4 g32", b(g32), 0.2297, 15.96),
            _row("GPTQ act-order W4 g32", b(g32), 0.1292, 14.23),
            _row("AWQ W4 g32", b(g32), 0.1253, 14.32),
            _row("RTN W4 g64", b(g64), 0.4887, 18.86),
            _row("GPTQ act-order W4 g64", b(g64), 0.1570, 14.56),
            _row("AWQ W4 g64", b(g64), 0.1734, 14.82),
            _row("GPTQ act-order W3 g32", int(lin * 3.5 / 8), 0.6895, 25.54)]


def _cf_cases():
    rows = _cf_rows()
    g32 = rows[0]["bytes"]
    g64 = rows[4]["bytes"]
    tie = [_row("A", 100, 0.2, 15.0), _row("B", 80, 0.2, 15.5), _row("C", 120, 0.3, 14.0)]
    return [
        Case((rows, 10 ** 9), label="everything fits: the lowest KL wins (AWQ W4 g32), even "
             "though GPTQ act-order has the lower perplexity",
             hint="Which column says how far the quantized model is from the original: KL or "
                  "perplexity? They disagree on these two rows."),
        Case((rows, g64), label="a budget at W4 g64's bytes: g32 rows are too big",
             hint="Only rows whose bytes are at most the budget may be chosen; which ones are "
                  "left here?"),
        Case((rows, g32), label="a budget exactly at W4 g32's bytes: <= fits",
             hint="A row of exactly the budget fits (<=, not <)."),
        Case((rows, g64 - 1), label="one byte under W4 g64: only the W3 row fits"),
        Case((tie, 200), label="equal KL: the fewer bytes (B)",
             hint="Two rows with the same KL: the task keeps the smaller file."),
        Case((rows, 1000), label="nothing fits: raise ValueError", raises=ValueError),
        Case((rows, -1), label="a negative budget: raise ValueError", raises=ValueError),
    ]


def _fits(rows, budget):
    if budget < 0:
        raise ValueError("negative budget")
    f = [r for r in rows if r["bytes"] <= budget]
    if not f:
        raise ValueError("nothing fits")
    return f


def _wrong_cf_smallest(rows, budget):          # the smallest file that fits
    return min(_fits(rows, budget), key=lambda r: r["bytes"])["name"]


def _wrong_cf_ignore_budget(rows, budget):     # the lowest KL of all
    _fits(rows, budget)
    return min(rows, key=lambda r: r["kl_nats"])["name"]


def _wrong_cf_strict(rows, budget):            # bytes < budget
    f = [r for r in rows if r["bytes"] < budget]
    if budget < 0 or not f:
        raise ValueError("nothing fits")
    return min(f, key=lambda r: (r["kl_nats"], r["bytes"]))["name"]


def _wrong_cf_biggest(rows, budget):           # more bytes taken as better
    return max(_fits(rows, budget), key=lambda r: (r["bytes"], -r["kl_nats"]))["name"]


def _wrong_cf_perplexity(rows, budget):        # ranks by perplexity
    return min(_fits(rows, budget), key=lambda r: (r["perplexity"], r["bytes"]))["name"]


def _wrong_cf_none(rows, budget):              # None when nothing fits
    f = [r for r in rows if r["bytes"] <= budget]
    return min(f, key=lambda r: (r["kl_nats"], r["bytes"]))["name"] if f else None


def _wrong_cf_tie_bigger(rows, budget):        # equal KL: the bigger file
    return min(_fits(rows, budget), key=lambda r: (r["kl_nats"], -r["bytes"]))["name"]


def _wrong_cf_returns_row(rows, budget):       # the whole row, not its name
    return min(_fits(rows, budget), key=lambda r: (r["kl_nats"], r["bytes"]))


register(Exercise(
    id="17.choose_format",
    title="a method and format under a byte budget, from measured rows",
    reference=choose_format,
    cases=_cf_cases,
    hint=["Two questions in order: which rows are allowed by the budget, and among those, which "
          "measurement says how close a row stays to the original model?",
          "Keep the rows with r['bytes'] <= budget_bytes (refuse a negative budget, and raise "
          "ValueError when none is left). Among them take the lowest r['kl_nats']; on equal KL, "
          "the fewer bytes. Return its r['name'].",
          "fits = [r for r in rows if r['bytes'] <= budget_bytes]; if budget_bytes < 0 or not "
          "fits: raise ValueError(...); return min(fits, key=lambda r: (r['kl_nats'], "
          "r['bytes']))['name']"],
    wrong=[_wrong_cf_smallest, _wrong_cf_ignore_budget, _wrong_cf_strict, _wrong_cf_biggest,
           _wrong_cf_perplexity, _wrong_cf_none, _wrong_cf_tie_bigger, _wrong_cf_returns_row],
))
