"""Retrain the bundled byte-level model: ``python -m course_lib.train`` (``make model``).

Trains :class:`course_lib.model.LlamaModel` with the default :class:`ModelConfig` (vocab 256,
width 256, 4 layers, 8 query / 2 key-value heads, SwiGLU 640, context 256: 2.75M parameters)
on the training split of this machine's Python standard library (:mod:`course_lib.data`),
for a fixed number of steps (not wall-clock time, so the result does not depend on how busy
the machine is): AdamW, linear warm-up then cosine decay, batch 16 x 256 bytes.

Writes to ``course_lib/data/tiny_stdlib/`` (or ``--out``): ``config.json`` and
``model.safetensors`` (bf16, HF layout), ``train_log.txt`` and ``metrics.json`` (training time,
held-out bits per byte, unigram baseline). The bundled evaluation text
``course_lib/data/heldout_eval.txt`` is kept as it is (so every machine evaluates the same
bytes) unless ``--rewrite-eval-text``. Lesson 04 explains the result.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib import data
from course_lib.model import BUNDLED_DIR, LlamaModel, ModelConfig, save_pretrained


def get_batch(corpus: torch.Tensor, batch: int, ctx: int, g: torch.Generator):
    """Random windows of ctx+1 bytes -> inputs (B, ctx) and next-byte targets (B, ctx)."""
    if batch < 1 or ctx < 1:
        raise ValueError(f"batch and ctx must be >= 1; got batch={batch}, ctx={ctx}")
    if len(corpus) < ctx + 2:
        raise ValueError(f"the corpus ({len(corpus)} tokens) is too short for windows of "
                         f"{ctx} + 1 tokens: use more text or a smaller ctx")
    starts = torch.randint(0, len(corpus) - ctx - 1, (batch,), generator=g)       # (B,)
    idx = starts[:, None] + torch.arange(ctx + 1)[None, :]                          # (B, ctx+1)
    w = corpus[idx]                                                                 # (B, ctx+1)
    return w[:, :-1], w[:, 1:]


def lr_at(step: int, steps: int, peak: float, warmup: int, final_frac: float = 0.1) -> float:
    """Linear warm-up to ``peak``, then cosine decay to ``final_frac * peak``."""
    if steps < 1 or warmup < 0 or not peak > 0 or not 0 <= final_frac <= 1:
        raise ValueError(f"need steps >= 1, warmup >= 0, peak > 0 and final_frac in [0, 1]; got "
                         f"steps={steps}, warmup={warmup}, peak={peak}, final_frac={final_frac}")
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def heldout_bpb(model: LlamaModel, ids: torch.Tensor, ctx: int, batch: int = 32) -> float:
    """Bits per byte on non-overlapping windows of ``ids`` (the same windows as course_lib.eval)."""
    from course_lib.eval import bits_per_byte
    return bits_per_byte(model, ids, window=ctx, batch_size=batch)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dim", type=int, default=None, help="override hidden_size (experiments)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--ffn", type=int, default=None)
    ap.add_argument("--eval-every", type=int, default=400)
    ap.add_argument("--out", default=str(BUNDLED_DIR))
    ap.add_argument("--limit-files", type=int, default=None,
                    help="train on only the first N training files (quick tests)")
    ap.add_argument("--eval-bytes", type=int, default=None,
                    help="evaluate on only the first N bytes of the held-out text (quick tests)")
    ap.add_argument("--rewrite-eval-text", action="store_true",
                    help="rebuild the bundled held-out evaluation text from this machine's stdlib "
                         "(changes what every lesson evaluates on: only for a new release)")
    ap.add_argument("--eval-text-only", action="store_true",
                    help="only (re)write the bundled held-out evaluation text")
    args = ap.parse_args(argv)

    train_paths, held_paths = data.split()
    data.DATA_DIR.mkdir(parents=True, exist_ok=True)
    if args.rewrite_eval_text or args.eval_text_only or not data.HELDOUT_FILE.exists():
        data.HELDOUT_FILE.write_bytes(data.make_eval_text(held_paths))
    if args.eval_text_only:
        print(f"wrote {data.HELDOUT_FILE} ({data.HELDOUT_FILE.stat().st_size} bytes)")
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_bytes = data.read_bytes(train_paths[:args.limit_files])
    corpus = data.to_tensor(train_bytes)
    eval_ids = data.to_tensor(data.heldout_text(args.eval_bytes))

    cfg = ModelConfig()
    if args.dim:
        cfg = ModelConfig(hidden_size=args.dim, intermediate_size=args.ffn or int(2.5 * args.dim),
                          num_hidden_layers=args.layers or cfg.num_hidden_layers)
    elif args.layers or args.ffn:
        cfg = ModelConfig(num_hidden_layers=args.layers or cfg.num_hidden_layers,
                          intermediate_size=args.ffn or cfg.intermediate_size)
    model = LlamaModel(cfg).init_weights(args.seed).to(args.device)
    ctx = cfg.max_position_embeddings
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_lines = []

    def log(s):
        print(s, flush=True)
        log_lines.append(s)

    log(f"python {platform.python_version()} stdlib {data.stdlib_dir()}: {len(train_paths)} train "
        f"files ({len(train_bytes):,} bytes), {len(held_paths)} held-out files; eval text "
        f"{len(eval_ids):,} bytes")
    log(f"config {json.dumps(cfg.to_hf_dict())}")
    log(f"parameters {model.num_parameters():,}; steps {args.steps} x batch {args.batch} x ctx "
        f"{ctx} = {args.steps * args.batch * ctx:,} tokens; threads {args.threads}; "
        f"device {args.device}")
    t0 = time.time()
    eval_time = 0.0
    model.train()
    for step in range(args.steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x, y = get_batch(corpus, args.batch, ctx, g)                  # (B, ctx) each
        x, y = x.to(args.device), y.to(args.device)
        logits = model(x)                                             # (B, ctx, V)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - t0 - eval_time
            log(f"step {step:5d} loss {loss.item():.4f} ({loss.item() / math.log(2):.3f} bits/byte)"
                f" lr {opt.param_groups[0]['lr']:.2e} {el:7.1f}s "
                f"{(step + 1) * args.batch * ctx / max(el, 1e-9):,.0f} tok/s")
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            te = time.time()
            model.eval()
            bpb = heldout_bpb(model.cpu().float(), eval_ids, ctx)
            model.to(args.device).train()
            eval_time += time.time() - te
            log(f"step {step + 1:5d} held-out {bpb:.4f} bits/byte")
    train_s = time.time() - t0 - eval_time
    model = model.cpu().eval()
    save_pretrained(model, out, dtype=torch.bfloat16)
    # Evaluate what was saved: the bf16 weights, run in fp32 (the course's reference).
    from course_lib.model import load_pretrained
    ref = load_pretrained(out)
    bpb = heldout_bpb(ref, eval_ids, ctx)
    uni = data.unigram_bits_per_byte(train_bytes, data.heldout_text(args.eval_bytes))
    log(f"final held-out {bpb:.4f} bits/byte (bf16 weights in fp32); unigram baseline {uni:.4f}; "
        f"training {train_s / 60:.1f} min")
    metrics = {
        "heldout_bits_per_byte": round(bpb, 4),
        "heldout_loss_nats_per_byte": round(bpb * math.log(2), 4),
        "unigram_bits_per_byte": round(uni, 4),
        "train_seconds": round(train_s, 1),
        "steps": args.steps, "batch": args.batch, "context": ctx,
        "tokens_seen": args.steps * args.batch * ctx,
        "parameters": model.num_parameters(),
        "weights_bytes": (out / "model.safetensors").stat().st_size,
        "threads": args.threads, "device": args.device,
        "python": platform.python_version(), "platform": platform.platform(),
        "train_files": len(train_paths), "train_bytes": len(train_bytes),
        "heldout_files": held_paths, "eval_text_bytes": len(eval_ids),
        "lr": args.lr, "warmup": args.warmup, "weight_decay": args.weight_decay, "seed": args.seed,
        "command": "python -m course_lib.train " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "train_log.txt").write_text("\n".join(log_lines) + "\n")
    return metrics


if __name__ == "__main__":
    main()
