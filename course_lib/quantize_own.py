"""``python -m course_lib.quantize_own PATH --method gptq --bits 4 --out DIR``: quantize your own
Hugging Face checkpoint one decoder layer at a time, score it, and say how to serve it
(lesson 17).

The steps, each printed as it runs:

1. the bill (:func:`course_lib.own_model.bill`): parameters, bytes per format and the memory
   the method needs one layer at a time against this machine's free memory; a method that does
   not fit is refused with the figures and what to change;
2. calibration windows from ``--calib FILE`` or the course's calibration text, tokenized with
   the checkpoint's own tokenizer (RTN reads none);
3. quantization, one layer in memory at a time, a progress bar over the layers
   (:func:`course_lib.stream.quantize`); the folder appears only when it is complete;
4. evaluation against the unquantized checkpoint on ``--eval FILE`` or the course's held-out
   text (:func:`course_lib.stream.evaluate`): perplexity of both, KL and top-1 agreement;
5. with ``--gguf FILE``: the folder written again as one GGUF file llama.cpp runs
   (:func:`course_lib.stream_gguf.from_packed`: W4 as Q4_0, W8 as Q8_0, the codes and scales
   unchanged; one layer in memory at a time, a progress bar over the layers);
``--method kmix`` takes another road after step 2: :func:`course_lib.own_kmix.scan` measures
every tensor's cost in every k-quant format one layer at a time, :func:`course_lib.own_kmix.plan`
chooses a format per tensor under ``--bpw`` (default: Q4_K_M's bytes) and
:func:`course_lib.stream_gguf.from_checkpoint` writes the GGUF file, which step 4 scores.

6. a summary table and the commands that serve the folder with vLLM and the GGUF file with
   llama.cpp (``llama-cli -m FILE``, ``llama-server -m FILE``).
"""
from __future__ import annotations

import argparse
import errno
import sys

EXAMPLES = """examples:
  # GPTQ (act-order) W4 g128 of a Llama-3.2-1B downloaded with
  # `hf download meta-llama/Llama-3.2-1B --local-dir ~/models/llama-3.2-1b`
  python -m course_lib.quantize_own ~/models/llama-3.2-1b --method gptq --bits 4 \\
      --out ~/models/llama-3.2-1b-w4-gptq

  # AWQ on your own calibration text, scored on your own held-out text
  python -m course_lib.quantize_own ~/models/qwen2.5-0.5b --method awq --calib my_train.txt \\
      --eval my_heldout.txt --out ~/models/qwen2.5-0.5b-w4-awq

  # RTN (no calibration) W8 per group of 64, replacing an earlier output
  python -m course_lib.quantize_own ~/models/qwen3-0.6b --method rtn --bits 8 --group-size 64 \\
      --out /tmp/qwen3-w8 --overwrite

  # GPTQ W4 g128, also written as a GGUF file llama.cpp runs (Q4_0 blocks, the same codes)
  python -m course_lib.quantize_own ~/models/qwen2.5-0.5b --method gptq --out /tmp/q-w4 \\
      --gguf /tmp/q-w4.gguf

  # a k-quant mix for llama.cpp: each tensor's format chosen by its measured sensitivity on
  # the calibration text, at Q4_K_M's bytes (or --bpw 5.0), written as GGUF only
  python -m course_lib.quantize_own ~/models/llama-3.2-1b --method kmix --windows 4 \\
      --gguf /tmp/llama-3.2-1b-mix.gguf

exit status: 0 done; 2 bad input (a refused argument, an existing --out, a text too short);
1 the machine cannot do it (not enough memory or disk)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m course_lib.quantize_own",
        description="Quantize a Hugging Face checkpoint folder (Llama 2/3.x, Mistral, Qwen2/2.5, "
                    "Qwen3, SmolLM, TinyLlama) one decoder layer at a time into a "
                    "compressed-tensors W4A16/W8A16 checkpoint that transformers and vLLM load "
                    "(and, with --gguf, a GGUF file that llama.cpp runs), then score it against "
                    "the original (lesson 17).",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="the checkpoint folder (config.json, *.safetensors, "
                                "tokenizer.json)")
    p.add_argument("--out", default=None, help="the output folder (refused if it holds files, "
                                               "unless --overwrite); needed by rtn, gptq, awq")
    p.add_argument("--method", choices=("rtn", "gptq", "awq", "kmix"), default="gptq",
                   help="rtn: round to nearest, no calibration; gptq: GPTQ with act-order "
                        "(lesson 06); awq: AWQ (lesson 07); kmix: a k-quant mix, a GGUF format "
                        "per tensor chosen by each tensor's measured sensitivity on the "
                        "calibration text (lessons 14, 17), written to --gguf only. Default gptq")
    p.add_argument("--bpw", type=float, default=None, metavar="BITS",
                   help="kmix: the file's bits per weight (default: the bytes of llama.cpp's "
                        "Q4_K_M on this model, so the two compare at the same size)")
    p.add_argument("--bits", type=int, choices=(4, 8), default=4, help="bits per weight "
                   "(default 4)")
    p.add_argument("--group-size", type=int, default=128,
                   help="inputs per scale; must divide every Linear's inputs (default 128)")
    p.add_argument("--no-act-order", action="store_true",
                   help="GPTQ: quantize columns in their stored order")
    p.add_argument("--calib", metavar="FILE", default=None,
                   help="calibration text (UTF-8); default: the course's calibration text")
    p.add_argument("--windows", type=int, default=16,
                   help="calibration windows (default 16)")
    p.add_argument("--window", type=int, default=512,
                   help="tokens per calibration window (default 512)")
    p.add_argument("--eval", metavar="FILE", default=None,
                   help="held-out text to score on (UTF-8); default: the course's evaluation "
                        "text, disjoint from its calibration text")
    p.add_argument("--eval-windows", type=int, default=4,
                   help="evaluation windows (default 4)")
    p.add_argument("--eval-window", type=int, default=512,
                   help="tokens per evaluation window (default 512)")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation")
    p.add_argument("--gguf", metavar="FILE", default=None,
                   help="also write the result as a GGUF file for llama.cpp (W4 -> Q4_0, W8 -> "
                        "Q8_0, codes and scales unchanged; the embedding and head as the folder "
                        "stores them). Needs --group-size a multiple of 32 and a byte-level BPE "
                        "tokenizer.json (Llama 3, SmolLM, Qwen, Mistral Nemo)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the checkpoint already in --out (and the --gguf file)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's own choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _fail(msg: str, code: int) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    import torch
    from course_lib import export, own_model, stream, stream_gguf
    if a.threads is not None:
        if a.threads < 1:
            return _fail(f"--threads must be >= 1; got {a.threads}", 2)
        torch.set_num_threads(a.threads)
    progress = not a.no_progress
    try:
        _check_outputs(a)
        ck = own_model.open_checkpoint(a.path)
        calibrated = a.method != "rtn"
        b = own_model.bill(ck, a.method, a.bits, a.group_size,
                           calib_samples=a.windows if calibrated else 1,
                           seq_len=a.window if calibrated else 1)
        print(b.table(), flush=True)
        for note in ck.notes:
            print(f"note: {note}")
        b.check("layer")
        if a.method == "kmix":
            return _kmix(a, ck, progress)
        stream._check_out(a.out, ck, a.overwrite)             # refuse before tokenizing
        if a.gguf is not None:                                # settings GGUF holds exactly
            stream_gguf.preflight(ck, a.bits, a.group_size, a.gguf, a.overwrite)
        ids = None
        if calibrated:
            ids = stream.calibration_ids(ck, a.calib, a.windows, a.window)
            print(f"calibration: {ids.shape[0]} windows x {ids.shape[1]} tokens of "
                  f"{a.calib or 'the course calibration text'}", flush=True)
        eval_windows = None
        if not a.no_eval:                                      # before the long part
            eval_windows = stream.eval_ids(ck, a.eval, a.eval_windows, a.eval_window)
        report = stream.quantize(ck, a.out, a.method, a.bits, a.group_size, ids=ids,
                                 act_order=not a.no_act_order, overwrite=a.overwrite,
                                 progress=progress)
        gguf = None
        if a.gguf is not None:
            try:
                gguf = stream_gguf.from_packed(report.folder, a.gguf, overwrite=a.overwrite,
                                               progress=progress)
            except ValueError as e:
                raise ValueError(f"{e}\n(the quantized folder {report.folder} is complete; "
                                 f"only the GGUF file was not written)") from None
        scores = None
        if eval_windows is not None:
            scores = stream.evaluate(ck, report.folder, eval_windows, progress=progress)
    except MemoryError as e:
        return _fail(str(e), 1)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            return _fail(str(e.strerror or e), 1)
        if isinstance(e, (FileExistsError, FileNotFoundError, NotADirectoryError)):
            return _fail(str(e), 2)
        raise
    except (ValueError, TypeError) as e:
        return _fail(str(e), 2)
    print()
    print(summary(report, scores, a.eval))
    print()
    print("serve it on a GPU machine with:")
    print(f"  {export.vllm_command(report.folder)}")
    print("or load it with transformers (compressed-tensors installed): "
          f"AutoModelForCausalLM.from_pretrained({str(report.folder)!r})")
    if gguf is not None:
        print()
        print(gguf.table())
        print("run the GGUF file with llama.cpp (its CLI, or its OpenAI-compatible server):")
        print(f"  llama-cli -m {gguf.path}")
        print(f"  llama-server -m {gguf.path}")
    return 0


def _check_outputs(a) -> None:
    """What each method writes: a folder (rtn, gptq, awq; --gguf besides) or a GGUF file only
    (kmix)."""
    if a.method == "kmix":
        if a.gguf is None:
            raise ValueError("--method kmix writes a GGUF file: give --gguf FILE")
        if a.out is not None:
            raise ValueError("--method kmix writes a GGUF file only (--gguf), no folder: drop "
                             "--out")
    else:
        if a.out is None:
            raise ValueError(f"--method {a.method} writes a compressed-tensors folder: give "
                             f"--out DIR")
        if a.bpw is not None:
            raise ValueError("--bpw is the budget of --method kmix; the other methods store "
                             "--bits per weight plus a scale per --group-size")


def _kmix(a, ck, progress: bool) -> int:
    """--method kmix: scan on calibration windows, plan under the budget, write the GGUF one
    layer at a time, score the file's weights against the checkpoint (lesson 17)."""
    from course_lib import own_kmix, stream, stream_gguf
    stream_gguf.preflight(ck, None, None, a.gguf, a.overwrite)   # before the long part
    ids = stream.calibration_ids(ck, a.calib, a.windows, a.window)
    print(f"calibration: {ids.shape[0]} windows x {ids.shape[1]} tokens of "
          f"{a.calib or 'the course calibration text'}", flush=True)
    eval_windows = None
    if not a.no_eval:
        eval_windows = stream.eval_ids(ck, a.eval, a.eval_windows, a.eval_window)
    result = own_kmix.scan(ck, ids, progress=progress)
    mix = own_kmix.plan(result, bits_per_weight=a.bpw)
    print(mix_table(mix), flush=True)
    gguf = stream_gguf.from_checkpoint(ck, a.gguf, mix["types"], imatrix=result["imatrix"],
                                       overwrite=a.overwrite, progress=progress)
    scores = None
    if eval_windows is not None:
        import warnings
        with warnings.catch_warnings():     # "a quantized GGUF keeps its grid": ours, on purpose
            warnings.simplefilter("ignore")
            scores = stream.evaluate(ck, gguf.path, eval_windows, progress=progress)
    print()
    print(gguf.table())
    if scores is not None:
        print(_scores_lines(scores, a.eval))
    print("run the GGUF file with llama.cpp (its CLI, or its OpenAI-compatible server):")
    print(f"  llama-cli -m {gguf.path}")
    print(f"  llama-server -m {gguf.path}")
    return 0


def mix_table(mix: dict) -> str:
    """The planned mix against llama.cpp's Q4_K_M on the same model: bytes, bits per weight,
    tensors per format, and the measured cost each adds up to."""
    def line(name, m):
        kinds = ", ".join(f"{n} {t}" for t, n in sorted(m["by_type"].items()))
        cost = "not measured" if m["estimated_cost"] is None else f"{m['estimated_cost']:.4g}"
        return (f"{name:<22}{m['bytes'] / 1e9:8.3f} GB  {m['bits_per_weight']:6.3f} bits/weight  "
                f"cost {cost}  ({kinds})")
    return "\n".join(["k-quant mix by measured sensitivity (summed layer-local cost):",
                      line("  the course's mix", mix), line("  llama.cpp Q4_K_M", mix["q4_k_m"])])


def _scores_lines(scores: dict, eval_file=None) -> str:
    pr = scores["perplexity"]
    return "\n".join([
        f"evaluation            {scores['n_windows']} windows x {scores['window']} "
        f"tokens of {eval_file or 'the course evaluation text'}",
        f"perplexity            {pr['reference']:.3f} unquantized -> "
        f"{pr['quantized']:.3f} quantized",
        f"KL(ref || quantized)  {scores['kl_nats']:.4f} nats per token "
        f"(windows {min(scores['windows']['kl_nats']):.4f}.."
        f"{max(scores['windows']['kl_nats']):.4f})",
        f"top-1 agreement       {scores['top1_agreement']:.3f}"])


def summary(report, scores: dict | None, eval_file=None) -> str:
    """The command's closing table: the quantization's report, then the scores."""
    lines = [report.table()]
    if scores is not None:
        lines.append(_scores_lines(scores, eval_file))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
