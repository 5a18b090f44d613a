"""Exercises of lesson 15, "Quantization-aware training" (solutions/15_quantization_aware_training.ipynb).

Two of the three answers are things the lesson runs rather than values it prints: an autograd
Function (its backward matters as much as its forward) and a training step (what it does to
the model and the optimiser matters as much as the loss it returns). The checks therefore call
the learner's code through a small probe that also reads the gradient (``with_gradient``) or
the weights after the step (``after_one_step``), and compare those with the library's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib import qat
from course_lib.checks import Case, Exercise, register
from course_lib.model import LlamaModel, ModelConfig


def _g(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- 15.ste

def with_gradient(fake_quant):
    """A probe for a fake-quantization function ``fake_quant(w, scale, qmax)``: returns
    ``probe(w, scale, qmax, upstream) -> (w_hat, dL/dw)`` with L = sum(w_hat * upstream)."""
    def probe(w, scale, qmax, upstream):
        w = w.detach().clone().requires_grad_(True)
        out = fake_quant(w, scale, qmax)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"the function must return a tensor; got {type(out).__name__}")
        if out.grad_fn is None:
            return out.detach(), torch.zeros_like(w)     # no gradient reaches w at all
        out.backward(upstream)
        return out.detach(), (w.grad if w.grad is not None else torch.zeros_like(w))
    probe.__name__ = f"with_gradient({getattr(fake_quant, '__name__', 'fn')})"
    return probe


def _ste_cases():
    w = torch.randn(4, 8, generator=_g(0)) * 0.6
    s = w.abs().amax(-1, keepdim=True) / 7                                   # absmax steps
    edge = torch.tensor([-3.0, -2.5, -0.5, 0.5, 1.5, 3.0, 3.4, -7.0])
    return [
        Case((w, s, 7, torch.ones_like(w)),
             label="INT4 absmax steps per row: nothing clipped, each row's largest weight "
                   "exactly on the range's edge"),
        Case((w, s * 0.5, 7, torch.randn(4, 8, generator=_g(1))),
             label="steps halved: the largest weights fall outside the range (zero gradient)",
             hint="Where w / scale is outside -qmax..qmax, the clamp is flat: what gradient "
                  "reaches w there? And is the upstream gradient multiplied in?"),
        Case((edge, torch.tensor(1.0), 3, torch.arange(1.0, 9.0)),
             label="INT3 on hand-picked values: ties round to even (-2.5 -> -2, 0.5 -> 0, "
                   "1.5 -> 2), +-3 is inside, 3.4 outside",
             hint="torch.round rounds half to even; and the range test is on w / scale "
                  "itself, -qmax <= w / scale <= qmax, not on the rounded code."),
        Case((torch.randn(64, generator=_g(2)), torch.tensor(0.5), 1,
              torch.randn(64, generator=_g(3))), label="INT2 (qmax 1): three levels"),
        Case((torch.zeros(5), torch.tensor(0.1), 7, torch.ones(5)), label="all zero"),
    ]


def _wrong_ste_no_clip_mask(w, scale, qmax):     # passes the gradient everywhere
    q = torch.clamp(torch.round(w / scale), -qmax, qmax) * scale
    return w + (q - w).detach()


def _wrong_ste_detached(w, scale, qmax):         # rounding kills the gradient: it is zero
    return torch.clamp(torch.round(w / scale), -qmax, qmax) * scale


def _wrong_ste_no_clamp(w, scale, qmax):         # forgets the clamp in the forward pass
    v = w / scale
    inside = ((v >= -qmax) & (v <= qmax)).float()
    return w * inside + (torch.round(v) * scale - w * inside).detach()


def _wrong_ste_floor(w, scale, qmax):            # truncates instead of rounding
    v = w / scale
    inside = ((v >= -qmax) & (v <= qmax)).float()
    q = torch.clamp(torch.trunc(v), -qmax, qmax) * scale
    return w * inside + (q - w * inside).detach()


def _wrong_ste_strict_edges(w, scale, qmax):     # |w/s| == qmax counted as outside
    v = w / scale
    inside = ((v > -qmax) & (v < qmax)).float()
    q = torch.clamp(torch.round(v), -qmax, qmax) * scale
    return w * inside + (q - w * inside).detach()


register(Exercise(
    id="15.ste",
    title="the straight-through estimator: round forward, pass the gradient inside the range",
    reference=with_gradient(qat.RoundSTE.apply),
    cases=_ste_cases,
    hint=["Two things are checked: the forward value (lesson 02's rounding, clamped to "
          "-qmax..qmax) and the gradient reaching w. Where is the clamp flat, and what should "
          "the gradient be there?",
          "Inside the range pretend rounding is the identity (gradient 1), outside it is 0. "
          "In an autograd.Function, save the mask 'inside' in forward and return grad * inside "
          "in backward (None for scale and qmax).",
          "forward: v = w / scale; ctx.save_for_backward((v >= -qmax) & (v <= qmax)); return "
          "torch.clamp(torch.round(v), -qmax, qmax) * scale. backward: (inside,) = "
          "ctx.saved_tensors; return grad * inside, None, None"],
    wrong=[with_gradient(f) for f in (_wrong_ste_no_clip_mask, _wrong_ste_detached,
                                      _wrong_ste_no_clamp, _wrong_ste_floor,
                                      _wrong_ste_strict_edges)],
    rtol=1e-6, atol=1e-7,
))


# ---------------------------------------------------------------- 15.lsq_step_grad

def lsq_step_grad(w, scale, qmax, upstream, grad_scale):
    """The library's LSQ gradient with respect to one shared step (the reference)."""
    with torch.enable_grad():                 # also when called inside another backward
        s = scale.detach().clone().requires_grad_(True)
        (qat.LSQFakeQuant.apply(w.detach(), s, qmax, grad_scale) * upstream).sum().backward()
    return s.grad


def _lsq_cases():
    w = torch.randn(32, generator=_g(4))
    gs32 = qat.lsq_grad_scale(32, 4)
    return [
        Case((w, torch.tensor(0.4), 7, torch.ones(32), gs32),
             label="32 weights, INT4, step 0.4 (none clipped), upstream all ones, LSQ's scale"),
        Case((w, torch.tensor(0.1), 7, torch.randn(32, generator=_g(5)), gs32),
             label="a small step: many weights clipped (their term is -qmax or +qmax)"),
        Case((w * 3, torch.tensor(0.5), 3, torch.randn(32, generator=_g(6)),
              qat.lsq_grad_scale(32, 3)), label="INT3"),
        Case((torch.tensor([0.25, -0.25, 0.75, 1.0]), torch.tensor(0.5), 1,
              torch.tensor([1.0, 1.0, 1.0, 1.0]), 1.0),
             label="hand-checkable INT2, grad_scale 1: two weights inside, two clipped above"),
        Case((torch.tensor([0.5, 1.5, -0.5, 2.5]), torch.tensor(1.0), 3,
              torch.tensor([1.0, 2.0, 3.0, 4.0]), 1.0),
             label="INT3, every w / s a tie (0.5, 1.5, -0.5, 2.5): round half to even gives "
                   "0, 2, 0, 2 (sum 0); half away from zero 1, 2, -1, 3 (sum 2)",
             hint="Which way does a tie round? torch.round rounds half to even, as lesson 02; "
                  "floor(v + 0.5) and rounding away from zero do not."),
        Case((torch.tensor([3.0, -3.0, 1.2, 3.3]), torch.tensor(1.0), 3,
              torch.tensor([1.0, 2.0, 1.0, 1.0]), 1.0),
             label="w / s exactly +-qmax is inside the range (term 0), 3.3 is outside (+qmax)",
             hint="Is w / s = qmax inside the range or clipped? The task: inside is "
                  "-qmax <= w / s <= qmax."),
        Case((w, torch.tensor(0.3), 7, torch.ones(32), 1.0), label="grad_scale 1 (no scaling)"),
    ]


def _lsq_terms(w, scale, qmax):
    v = w / scale
    return v, torch.clamp(torch.round(v), -qmax, qmax), (v >= -qmax) & (v <= qmax)


def _wrong_lsq_no_scale(w, scale, qmax, upstream, grad_scale):   # forgets the grad scale
    v, q, inside = _lsq_terms(w, scale, qmax)
    return (upstream * torch.where(inside, q - v, q)).sum()


def _wrong_lsq_zero_outside(w, scale, qmax, upstream, grad_scale):   # clipped weights give 0
    v, q, inside = _lsq_terms(w, scale, qmax)
    return (upstream * torch.where(inside, q - v, torch.zeros_like(v))).sum() * grad_scale


def _wrong_lsq_only_q(w, scale, qmax, upstream, grad_scale):     # d(s q)/ds = q, q held fixed
    v, q, inside = _lsq_terms(w, scale, qmax)
    return (upstream * q).sum() * grad_scale


def _wrong_lsq_sign(w, scale, qmax, upstream, grad_scale):       # v - q instead of q - v
    v, q, inside = _lsq_terms(w, scale, qmax)
    return (upstream * torch.where(inside, v - q, q)).sum() * grad_scale


def _wrong_lsq_no_upstream(w, scale, qmax, upstream, grad_scale):  # ignores dL/dw_hat
    v, q, inside = _lsq_terms(w, scale, qmax)
    return torch.where(inside, q - v, q).sum() * grad_scale


register(Exercise(
    id="15.lsq_step_grad",
    title="LSQ's gradient with respect to the learned step size",
    reference=lsq_step_grad,
    cases=_lsq_cases,
    hint=["w_hat = s * clamp(round(w / s), -qmax, qmax). Differentiate with respect to s, "
          "treating round() as the identity (the straight-through estimator) where w / s is "
          "inside the range. What do you get inside, below and above?",
          "Inside: d(s * round(w/s))/ds = round(w/s) - w/s (the second term comes from w/s "
          "itself depending on s). Below the range w_hat = -qmax * s, above +qmax * s. Multiply "
          "by the upstream gradient, sum over the weights, then by grad_scale.",
          "v = w / scale; q = torch.clamp(torch.round(v), -qmax, qmax); inside = (v >= -qmax) "
          "& (v <= qmax); return (upstream * torch.where(inside, q - v, q)).sum() * grad_scale"],
    wrong=[_wrong_lsq_no_scale, _wrong_lsq_zero_outside, _wrong_lsq_only_q, _wrong_lsq_sign,
           _wrong_lsq_no_upstream],
    rtol=1e-5, atol=1e-6, check_dtype=False,
))


# ---------------------------------------------------------------- 15.qat_step

def _tiny(seed):
    cfg = ModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return LlamaModel(cfg).init_weights(seed)


def after_one_step(step_fn):
    """A probe for a QAT step ``step_fn(model, opt, x, y, teacher_logits, step)``: builds a
    tiny model (seeded), prepares it for QAT, leaves a gradient in it as an earlier step
    would, calls the step once on seeded windows and
    returns (the loss it returned, every trainable tensor after the step, the model's loss
    after the step)."""
    def probe(seed, bits, distil, lr, init_scale=1.0, nan_teacher=False):
        torch.manual_seed(seed)
        float_model = _tiny(seed)
        with torch.no_grad():                    # larger weights: gradient norms above 1
            for p in float_model.parameters():
                if p.dim() == 2:
                    p.mul_(init_scale)
        model = qat.prepare_qat(float_model, bits, 32, "lsq")
        opt = torch.optim.AdamW(qat.param_groups(model, lr), betas=(0.9, 0.95))
        corpus = torch.randint(0, 16, (600,), generator=_g(seed))
        x, y = qat.random_windows(corpus, 2, 16, _g(seed + 1))
        with torch.no_grad():
            teacher = float_model(x) if distil else None
            if nan_teacher:
                teacher[0, 3, 5] = float("nan")           # a non-finite loss: stop, say where
        _loss(model(x[:1]), y[:1], None).backward()       # a previous step's gradients in .grad
        loss = step_fn(model, opt, x, y, teacher, 0)
        params = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        with torch.no_grad():
            logits = model(x)
            after = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
        if isinstance(loss, torch.Tensor):               # compared as returned: a float is asked
            loss = loss.detach()
        return loss, params, after
    probe.__name__ = f"after_one_step({getattr(step_fn, '__name__', 'fn')})"
    return probe


def _step_cases():
    return [
        Case((0, 4, False, 1e-3), label="INT4, cross-entropy on the next tokens"),
        Case((1, 3, False, 1e-2), label="INT3, a larger learning rate"),
        Case((2, 2, True, 1e-3), label="INT2, distilling the float model (teacher_logits given)"),
        Case((3, 4, True, 1e-3), label="INT4 with a teacher"),
        Case((4, 4, False, 1e-3, 10.0),
             label="weights 10x larger: the gradient norm is about 3 and must be clipped to 1",
             hint="Is the gradient norm clipped to 1.0 over all the optimiser's parameters "
                  "together, after backward and before opt.step()?"),
        Case((5, 4, True, 1e-3, 1.0, True),
             label="a NaN in the teacher's logits: the loss is NaN, qat.check_loss(loss, step) "
                   "must stop the step (NonFiniteLoss) before any weight changes",
             raises=qat.NonFiniteLoss,
             hint="Which call stops on a non-finite loss? The task names "
                  "qat.check_loss(loss, step): call it on the loss before backward."),
    ]


def _ce(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _wrong_step_no_zero_grad(model, opt, x, y, teacher_logits=None, step=0):
    # adds this step's gradient to the stale one the previous backward left in .grad
    logits = model(x)
    loss = _loss(logits, y, teacher_logits)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
    opt.step()
    return loss.item()


def _loss(logits, y, teacher_logits):
    V = logits.shape[-1]
    if teacher_logits is None:
        return _ce(logits, y)
    return F.kl_div(F.log_softmax(logits, -1).reshape(-1, V),
                    F.log_softmax(teacher_logits, -1).reshape(-1, V), log_target=True,
                    reduction="batchmean")


def _wrong_step_no_opt_step(model, opt, x, y, teacher_logits=None, step=0):
    loss = _loss(model(x), y, teacher_logits)
    opt.zero_grad()
    loss.backward()
    return loss.item()


def _wrong_step_ignores_teacher(model, opt, x, y, teacher_logits=None, step=0):
    return qat.qat_step(model, opt, x, y, None, step)


def _wrong_step_no_clip(model, opt, x, y, teacher_logits=None, step=0):
    return qat.qat_step(model, opt, x, y, teacher_logits, step, clip_norm=1e9)


def _wrong_step_kl_reversed(model, opt, x, y, teacher_logits=None, step=0):
    if teacher_logits is None:
        return qat.qat_step(model, opt, x, y, None, step)
    logits = model(x)
    V = logits.shape[-1]
    loss = F.kl_div(F.log_softmax(teacher_logits, -1).reshape(-1, V),
                    F.log_softmax(logits, -1).reshape(-1, V), log_target=True,
                    reduction="batchmean")
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
    opt.step()
    return loss.item()


def _wrong_step_no_check_loss(model, opt, x, y, teacher_logits=None, step=0):
    # trains on whatever the loss is: a NaN loss makes every weight NaN, silently
    loss = _loss(model(x), y, teacher_logits)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
    opt.step()
    with torch.no_grad():
        for m in qat.qat_linears(model).values():
            m.step.clamp_(min=1e-8)
    return loss.item()


def _wrong_step_tensor_loss(model, opt, x, y, teacher_logits=None, step=0):
    # the right value, as a 0-d tensor (loss.detach()) where a Python float is asked
    return torch.tensor(qat.qat_step(model, opt, x, y, teacher_logits, step))


def _wrong_step_loss_after(model, opt, x, y, teacher_logits=None, step=0):
    qat.qat_step(model, opt, x, y, teacher_logits, step)     # returns the loss *after* the step
    with torch.no_grad():
        return float(_loss(model(x), y, teacher_logits))


register(Exercise(
    id="15.qat_step",
    title="one QAT training step: forward through the fake-quantized model, loss, backward, "
          "clip, step",
    reference=after_one_step(qat.qat_step),
    cases=_step_cases,
    hint=["The check runs your step once on a tiny model and compares the loss you return and "
          "every trainable tensor afterwards with the library's. The order matters: which "
          "loss, when the old gradients are cleared, when the norm is clipped.",
          "Loss: cross-entropy of model(x) against y, or, when teacher_logits is given, "
          "F.kl_div(log_softmax(student), log_softmax(teacher), log_target=True, "
          "reduction='batchmean') (KL from the teacher). Then zero_grad, backward, clip the "
          "gradient norm of the optimiser's parameters to 1.0, opt.step(). Return loss.item() "
          "(the loss before the step).",
          "qat.check_loss(loss, step) stops on a NaN loss; after opt.step() keep each LSQ step "
          "positive: for m in qat.qat_linears(model).values(): m.step.data.clamp_(min=1e-8)"],
    wrong=[after_one_step(f) for f in (_wrong_step_no_zero_grad, _wrong_step_no_opt_step,
                                       _wrong_step_ignores_teacher, _wrong_step_no_clip,
                                       _wrong_step_kl_reversed, _wrong_step_loss_after,
                                       _wrong_step_no_check_loss, _wrong_step_tensor_loss)],
    rtol=1e-4, atol=1e-6, float_results=True,
))
