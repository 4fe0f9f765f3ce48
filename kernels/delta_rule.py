r"""Chunked Householder RNN and DeltaNet: the linear-attention template with a Householder-like gate.

The Householder RNN (PaTH's linear dual) and DeltaNet are ::

    S_t = S_{t-1} H_t + v_t k_t^T,                 H_t = I - beta_t w_t w_t^T,   o_t = S_t q_t
    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T                      (DeltaNet: w = k, values beta v)

(``S_t`` is ``Dv x D``; no scale, no normalisation).  Both run on the linear-attention template
(:mod:`.linear_attention`): one program owns one (batch, head) and a block of ``BLOCK_DV`` value
channels and walks the sequence chunk by chunk with the state ``H = S^T`` (``D x BLOCK_DV``, fp32)
in registers.  A preparation pass first makes, for all chunks in parallel, what the chunk loop
needs from each chunk's triangular inverse (which keeps the inverse off the sequential loop).
The two recurrences use it differently.

DeltaNet: the WY form (:func:`pathedu.path.deltanet_chunked`, the ``"delta"`` hook).  The
transition and the write share ``k``, so a chunk's writes are pseudo-values ``U``, the values
corrected by what the state already predicts, and one triangular system gives them::

    A_c = (I + strictLower(diag(beta) K_c K_c^T))^{-1} diag(beta)        (C x C)
    W_c = A_c K_c,   U~_c = A_c V_c                                      (preparation pass, :class:`.ut_prepare.WYPrepared`)
    U_c = U~_c - W_c H,   O_c = Q_c H + (Q_c K_c^T * M) U_c,   H <- H + K_c^T U_c      (chunk loop)

With a scalar gate (Gated DeltaNet, chapter 7) the decay enters the inverse, ``W_c`` carries
``e^{b}`` and the template's ``DECAY`` hook does the rest
(:func:`pathedu.pathfox.gated_deltanet_chunked`); the pass computes that inverse as the ungated one times
``exp(b_i - b_j)`` entry by entry (:func:`.ut_prepare._wy_prepare`).  The pass writes two ``T x D`` tensors where the
UT form below writes four (``q~``, ``k~``, ``Ã``, ``G``), and the loop reads the raw q and k: this is
flash-linear-attention's factorisation.

The Householder RNN (``w`` apart from ``k``): the UT form (:func:`pathedu.path.householder_chunked`,
the ``"householder"`` hook), with, for chunk ``[s, e]`` and its UT factor ``A_c``::

    O_c = Q~_c H + Ã_c V_c                           (inter-chunk + intra-chunk)
    H  <- P_c^T H + K~_c^T V_c = H + G_c H + K~_c^T V_c,      G_c = P_c^T - I = -W_c^T A_c W_c

``q~_i = H_s ... H_i q_i``, ``k~_j = H_e ... H_{j+1} k_j``,
``Ã_ij = k_j^T H_{j+1} ... H_i q_i`` (j <= i, masked UT form) and
``P_c = H_s ... H_e = I - W_c^T A_c^T W_c``, whose transpose minus the
identity is kept as one dense ``D x D`` matrix ``G_c``.  These are exactly what PaTH's
preparation pass makes, so they come from the same kernels (:class:`.ut_prepare.Prepared`).
With a write ``v k^T`` apart from the transition's ``w``, the WY trick does not apply: the
pseudo-values would need ``S w_t`` and ``k_t`` both.

Both preparation passes start from the same ``16 x 16`` diagonal inverses (``_ut_diag_inverse``).
The Householder RNN's factors are fp32.  DeltaNet's ``W`` and ``U~`` are stored in bf16 for bf16 inputs (as
flash-linear-attention stores them: they are written once and read once, and fp32 doubles those bytes) and in
fp32 otherwise (fp16's exponent range is too narrow for ``U~ = A V``), or in ``factor_dtype`` when given:
``torch.float32`` for bf16 inputs is about a third closer to float64 and up to 9% slower (bf16 factors round
each one to 8 mantissa bits, once; the state and the products stay fp32).  Products are tf32 for 16-bit inputs with
operands rounded to nearest (the state is multiplied by ``I - K^T W`` or ``I + G_c`` chunk after
chunk, and the tensor cores' truncation would shrink it a little every time), and about fp32 for
fp32 inputs (three tf32 products on a GPU, exact in the interpreter); see :func:`._pieces.dot`.  DeltaNet's WY
pass multiplies 16-bit inputs' factors in fp16 instead (the same ten mantissa bits, each block conjugated into
fp16's range by powers of two: :func:`.ut_prepare._wy_prepare`; 29% less time for the pass on an H200, whose
tensor cores multiply fp16 at twice the rate of tf32, and half the registers for its operands).
A NaN or inf in ``q``, ``k`` or ``v`` at position ``t`` changes outputs at positions ``>= t`` only
(:mod:`.ut_prepare` says how, for DeltaNet's ``w = k``).  Inputs are validated once, at the entry
points below (see :mod:`._launch`).

The state and training.  ``initial_state`` starts the chunk loop from a given ``S``, and the final ``S`` can be
returned, so a sequence runs in pieces (prefill in chunks, then decoding), as the recurrent forms do.  Inputs that
require grad go through :mod:`.delta_rule_backward`: the forward also stores the state entering each chunk, and the
backward scans the states' gradients right to left, takes each chunk's gradients in parallel, then brings them
through the UT factors to ``q, k, w, beta`` and the gate.  DeltaNet's backward is the Householder RNN's with
``w = k`` and values ``beta v``.
"""
from __future__ import annotations

import torch

from ..checks import check_bool, checked_after, log_gate_condition
from ._launch import per_token, prepare_qkv, state_result, state_rows, wants_grad
from .delta_rule_backward import DeltaRule, HouseholderRNN
from .linear_attention import linear_launch
from .ut_prepare import Prepared, WYPrepared, check_block, prep_precision

__all__ = ["chunked_householder", "chunked_delta_rule"]


def _factor_dtype(factor_dtype, input_dtype):
    """DeltaNet's WY factor dtype: ``factor_dtype`` (None, ``torch.bfloat16`` or ``torch.float32``) or, for None, bf16
    for bf16 inputs and fp32 for the others."""
    if factor_dtype is None:
        return torch.bfloat16 if input_dtype == torch.bfloat16 else torch.float32
    if factor_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"`factor_dtype` must be None, torch.bfloat16 or torch.float32, got {factor_dtype!r}")
    return factor_dtype


def _run(q, k, v, w, beta, log_f=None, *, delta: bool, chunk, factor_dtype=None, initial_state=None,
         return_state=False):
    x = prepare_qkv(q, k, v, backward=True)
    wy_dtype = _factor_dtype(factor_dtype, x.dtype) if delta else torch.float32
    n = x.n
    w3 = x.k if delta else per_token(w, "w", x, extra=(n.D,), backward=True)
    beta3 = per_token(beta, "beta", x, backward=True)
    log_f3 = None if log_f is None else per_token(log_f, "log_f", x, backward=True)
    chunk = check_block(chunk, n.D, "chunk")
    h0 = None if initial_state is None else state_rows(initial_state, x)
    return_state = check_bool(return_state, "return_state")
    # Read once the kernels are queued.  The preparation pass's first launch counts the entries of w, beta and
    # (DeltaNet's) log_f that break their conditions as it reads them; the Householder RNN's gate it does not read.
    with checked_after(None if log_f3 is None or delta else log_gate_condition(log_f3, "log_f")) as check:
        if wants_grad(x.q, x.k, x.v, None if delta else w3, beta3, log_f3, h0):
            if delta:
                out, ht = DeltaRule.apply(x.q, x.k, x.v, beta3, log_f3, h0, x, chunk, wy_dtype, check)
            else:
                out, ht = HouseholderRNN.apply(x.q, x.k, x.v, w3, beta3, log_f3, h0, x, chunk, check)
        else:
            ht = torch.empty(x.BH, n.D, n.Dv, dtype=torch.float32, device=x.device) if return_state else None
            if x.empty_input:
                out = linear_launch(x, "delta" if delta else "householder", log_f3, chunk=chunk, h0=h0, final=ht)
            else:
                prep, precision = _prepare(x, w3, beta3, chunk, delta=delta, log_f3=log_f3, check=check,
                                           wy_dtype=wy_dtype)
                gate = "delta" if delta else "householder"
                out = linear_launch(x, gate, log_f3, chunk=chunk, prep=prep, precision=precision, h0=h0, final=ht)
        return (x.result(out), state_result(ht, x)) if return_state else x.result(out)


def _prepare(x, w3, beta3, chunk: int, *, delta: bool, log_f3=None, check=None, wy_dtype=torch.float32):
    """The preparation pass of the chunked kernel on validated inputs: ``(factors, precision)``, the
    precision also being the one of the state's products (see :func:`._pieces.dot`).  DeltaNet
    (``delta``): the WY factors :class:`.ut_prepare.WYPrepared` (gated by ``log_f3`` when given, in ``wy_dtype``);
    the Householder RNN: the UT factors :class:`.ut_prepare.Prepared` (gate-free, fp32).  Both count the values
    that break their conditions for ``check`` when given (:func:`.ut_prepare.invert_diagonal_blocks`)."""
    precision = prep_precision(x.dtype)
    f32 = torch.float32
    if delta:
        return WYPrepared(x.k, x.v, beta3, log_f3, x.n.T, chunk, dtype=wy_dtype, precision=precision,
                          check=check), precision
    prep = Prepared(x.q, x.k, w3, beta3, x.n.T, chunk, q_dtype=f32, k_dtype=f32, update_dtype=f32,
                    precision=precision, check=check)
    return prep, precision


def chunked_householder(q, k, v, w, beta, *, log_f=None, chunk=None, initial_state=None, return_state=False):
    """The Householder RNN ``S_t = a_t S_{t-1} H_t + v_t k_t^T``, ``o_t = S_t q_t``, chunked.

    ``H_t = I - beta_t w_t w_t^T`` (``w`` used as given); ``a_t = exp(log_f[t])``, or 1
    when ``log_f`` is None (chapter 5; with a gate it is chapter 7's gated Householder
    RNN).  Shapes: ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``, ``beta, log_f: (..., T)``
    -> ``(..., T, Dv)``; ``D, Dv`` in 16..128; any T.  fp16/bf16/fp32 ``q, k, v``
    (the output has their dtype), ``w`` (finite) and ``beta`` (in [0, 2]) used in
    fp32; fp32 state; the UT form (module docstring).  Unrolled: ``o_i = sum_{j<=i} (k_j^T H_{j+1} ... H_i q_i) v_j``
    (smallest index on the left).  ``chunk`` in {16, 32, 64, 128} (``None``: 64 for
    ``D <= 64``, else 32).  Every argument is validated here (values read once the kernels are
    queued, :class:`pathedu.checks.checked_after`).

    ``initial_state``: ``S_{-1}``, ``(..., Dv, D)`` (any floating dtype; default 0); ``return_state=True`` returns
    ``(out, S_{T-1})``, the state fp32 ``(..., Dv, D)``, as the recurrent forms do: a sequence runs in pieces, each
    starting from the last one's state.  Differentiable in ``q, k, v, w, beta``, ``log_f`` and ``initial_state``, and
    through the returned state (:class:`.delta_rule_backward.HouseholderRNN`).
    """
    return _run(q, k, v, w, beta, log_f, delta=False, chunk=chunk, initial_state=initial_state,
                return_state=return_state)


def chunked_delta_rule(q, k, v, beta, *, log_f=None, chunk=None, factor_dtype=None, initial_state=None,
                       return_state=False):
    """DeltaNet ``S_t = a_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t q_t``, chunked.

    No scale, no normalisation of ``q``/``k`` (normalise ``k`` yourself: the
    transition is a contraction only for ``beta_t |k_t|^2`` in [0, 2]).  Shapes:
    ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``beta: (..., T)`` in [0, 2] ->
    ``(..., T, Dv)``; ``a_t`` (Gated DeltaNet), dtypes, sizes and validation as
    :func:`chunked_householder` (``beta`` used in fp32).  The WY form (module docstring); ``factor_dtype``
    (None, ``torch.bfloat16`` or ``torch.float32``): the dtype of the stored factors ``W`` and ``U~`` (None: bf16
    for bf16 inputs, fp32 for the others).  ``initial_state``, ``return_state`` and gradients as
    :func:`chunked_householder` (:class:`.delta_rule_backward.DeltaRule`: ``k`` gets the gradients of both its
    roles, the key and the transition's ``w``).
    """
    return _run(q, k, v, None, beta, log_f, delta=True, chunk=chunk, factor_dtype=factor_dtype,
                initial_state=initial_state, return_state=return_state)
