"""Real Triton kernels for quantized linear layers and attention (lessons 08-11).

Each file follows the Triton tutorials' order: a docstring that says what you will learn,
pseudo-code, the kernel with every argument commented, a thin wrapper that checks its
inputs, a plain-torch reference and a benchmark.

- ``kernels.w8a16``    int8 weights, one scale per output channel, 16-bit activations
- ``kernels.w4a16``    int4 weights packed two per byte, group-wise scales (and zero points)
- ``kernels.dequant16`` int4 -> fp16/bf16 in the 16-bit domain from 32-bit words (Marlin's
  trick), the kernel layout (``prepack``) and a NumPy model of the inline assembly
- ``kernels.ptx_interp`` a small PTX interpreter that runs that inline assembly as written
  on a CPU (the tests check it bit for bit on every 16-bit element)
- ``kernels.fp8_w8a8`` FP8 E4M3 weights (per channel) and activations (per token, quantized
  on the fly), fp32 accumulation; needs compute capability 8.9+ on a GPU
- ``kernels.w8a8_int8`` INT8 weights (per channel) and activations (per token, quantized by a
  fused kernel), int32 accumulation, scales in the epilogue; compute capability 8.0+ (lesson 08)
- ``kernels.decode_attention`` one query per sequence against a BF16, FP8 or INT8 KV cache,
  dequantized in registers, online softmax, split along the context (lesson 11)
- ``kernels.hadamard_quant`` a fast Walsh-Hadamard transform (2^k, 12 x 2^k, 20 x 2^k,
  144 x 2^k) fused with per-token INT4 quantization: QuaRot's online rotation (lesson 16)
- ``kernels._triton``  Triton itself, or where it is not installed (macOS, Windows) a stand-in:
  every kernel file still loads, ``source`` still prints its kernels, the plain-torch references
  still run, and a launch raises ``TritonMissing`` with one line that says why (``TRITON``,
  ``TRITON_MISSING`` here)
- ``kernels._common``  what the kernel files share: input checks, launch plans, the
  ``CompileJob`` and the ``Backend`` each file hands to the compiler check and the benchmark
- ``kernels.bench``    ``python -m kernels.bench``: the benchmark that writes ``results/*.json``;
  it runs the parts ``bench_layers`` (output check, layer timing, the JSON),
  ``bench_peers`` (what a user would pick instead), ``bench_decode`` (the decoder stack,
  tokens/s) and ``bench_targets`` (the course's targets, ``--separate``)
- ``kernels.sweep_gemv`` ``python -m kernels.sweep_gemv``: launch plans of the GEMVs on a GPU
- ``kernels.compile_check`` ``python -m kernels.compile_check``: compile every kernel for
  sm_75 ... sm_120 without a GPU and read the compiled code (instructions per weight byte,
  shared memory, tensor-core instruction)
- ``kernels.pipes``    which pipe of an SM runs each SASS instruction (ALU, FMA, FP16, XU, from
  Nsight Compute's pipeline descriptions) and what a main loop costs against the issue budget
- ``kernels/gpu_check.sh``  on a GPU machine, in parts of under 8 minutes each (``--part tests``,
  ``compile``, ``bench``, ``notebooks``): everything it writes goes under ``$OUT``

A new kernel file registers itself with one line in ``compile_check.KERNEL_MODULES`` (it
provides ``compile_jobs``) and one in ``bench.GPU_KERNEL_MODULES`` (``bench_backends``).
Kernel files import ``_common`` and ``course_lib``, never the benchmark, which imports them
(``docs/architecture.md``).

Without a CUDA GPU the kernels run through the Triton interpreter (``TRITON_INTERPRET=1``),
which must be set *before* triton is imported: importing this package does that first.
The interpreter is correct but hundreds of times slower than torch, so on a CPU use small
shapes and never time it.
"""
import os

from course_lib.device import ensure_triton_mode

# Triton 3.9 warns on every GPU compile until this is set; 1 keeps its current default.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

if os.environ.get("COURSE_TRITON_AOT") == "1":
    # kernels.compile_check: compile for a GPU architecture ahead of time, launch nothing
    INTERPRET = False
else:
    INTERPRET = ensure_triton_mode()  # must run before `import triton` anywhere

# Triton where it is installed (Linux); elsewhere a stand-in that keeps every kernel's source
# readable and says in one line why a launch cannot happen (kernels._triton).
from kernels._triton import AVAILABLE as TRITON  # noqa: E402  (after the mode is set)
from kernels._triton import WHY_MISSING as TRITON_MISSING  # noqa: E402
from kernels._triton import TritonMissing  # noqa: E402
from kernels._triton import tl, triton  # noqa: E402,F401  (an exercise's kernel imports these)

if not TRITON:
    INTERPRET = False                 # nothing to interpret: kernels are shown, not launched

__all__ = ["INTERPRET", "TRITON", "TRITON_MISSING", "TritonMissing", "tl", "triton"]


class exercise_launch:
    """Context manager around a learner's kernel launch (lesson 09's exercise).

    An unsolved exercise kernel raises ``NotImplementedError``; the interpreter wraps it in
    its own ``InterpreterError`` (and a GPU compile fails on the ``raise``). This turns
    both back into ``NotImplementedError`` so the checker says "not yet implemented".
    """

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or isinstance(err, NotImplementedError):
            return False
        chain = [err, err.__cause__, err.__context__]
        if any(isinstance(e, NotImplementedError) for e in chain) or "NotImplementedError" in str(err):
            raise NotImplementedError("exercise: write the kernel body") from err
        return False


def source(kernel) -> str:
    """The Python source of a kernel (a ``@triton.jit`` function, autotuned or not) or helper.

    ``inspect.getsource`` does not accept Triton's wrappers; the plain function sits in
    their ``fn`` attribute (lessons 09 and 10 print kernels with this).
    """
    import inspect

    while hasattr(kernel, "fn"):
        kernel = kernel.fn
    return inspect.getsource(kernel)


__all__ += ["exercise_launch", "source"]
