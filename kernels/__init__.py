"""Triton kernels, installed as :mod:`pathedu.kernels`.

Two templates that every chapter extends through hooks instead of copying:

* :mod:`.flash_attention`: causal FlashAttention forward (online softmax,
  fp32 accumulation) with an additive-bias hook: ALiBi slopes (chapter 2) and
  cumulative log forget gates (chapter 3).  RoPE (chapter 4) reuses it
  unchanged after the rotation pre-pass of :mod:`.rope`.  Its backward pass
  (FlashAttention-2's: log-sum-exp saved, probabilities recomputed) is one
  more kernel with the same hook, wired as a ``torch.autograd.Function``.
* :mod:`.linear_attention`: chunked linear attention with a carried state and a
  gate hook: none (chapter 1), a per-token scalar gate (RetNet, Mamba2), a
  per-channel gate (GLA) (chapters 2 and 3), or a Householder transition
  (the Householder RNN in the UT form, DeltaNet in the WY form, chapter 5, driven by :mod:`.delta_rule`).
  Its backward pass (no gate, scalar and per-channel gates) is two more launches, a right-to-left scan of
  the states' gradients and one over the chunks, wired as a ``torch.autograd.Function``; an initial state
  goes in and the final one comes out, so a sequence runs in pieces.

Chapter 5 adds :mod:`.path_attention` (PaTH: a preparation pass with per-block
UT factors, then the FlashAttention loop scanning key blocks right to left with
the query carried through each block's Householder product) and
:mod:`.delta_rule` (chunked Householder RNN: the same preparation pass, then the linear
template's ``"householder"`` hook; chunked DeltaNet: a lighter preparation pass of WY factors, then
the ``"delta"`` hook), whose backward pass is :mod:`.delta_rule_backward` (the states' gradients right to left, each
chunk's gradients, then the UT factors' backward; DeltaNet's as the Householder RNN's with ``w = k``); the book's Part
III (*Making it fast*) explains their design and what it costs.
  PaTH's backward meets every pair of blocks at a
boundary of a dyadic tree: :mod:`.path_carry` carries queries and keys there (and back, for
the gradients), the FlashAttention template's backward steps do the rest, and
:mod:`.ut_prepare` has the preparation pass's backward beside its forward.  :mod:`.path_attention`'s
docstring lists every kernel of PaTH's forward and backward, in launch order, with the function that launches it.

Beyond the six dualities, :mod:`.cope` (CoPE) runs the FlashAttention loop right to left from the
diagonal, carrying each query row's count of sigmoid gates; a fp32 pre-pass forms ``qe = Q E^T`` and the
positions, interpolated, are two gathers into it (forward only).
:mod:`.stickbreaking` (stick-breaking attention) scans key blocks right to left from the diagonal as well,
carrying each query row's log of the remaining stick (a cumulative sum of log sigmoid(-z)); no maximum and no
normaliser, since every weight is <= 1 (forward only).

Where the shared pieces live:

* :mod:`._pieces`: jit helpers used by several kernels: tile loads/stores
  (``load_rows``, ``store_rows``), the softmax kernels' prologue
  (``query_block``), the online-softmax update (``softmax_fold``, FlashAttention
  and PaTH), rounded / three-pass fp32 products (``rn``, ``dot``) and
  ``masked_dot``, the product that keeps a NaN or inf of a hidden (future) key
  out of earlier rows.
* :mod:`.ut_prepare`: the UT preparation pass (``Prepared``), shared by PaTH and
  the Householder hook, and DeltaNet's WY pass (``WYPrepared``); both start from the same
  diagonal inverses.
* :mod:`.gates`: the log gates' prefix sums for the gate hook (FoX, PaTH-FoX), one launch that also
  counts the gates that break their condition (``cumulative_log_gates``).
* :mod:`._launch`: the validation boundary.  Each public entry point validates
  every argument once (shapes, dtypes, devices; values with one wait for
  the check, after the kernels are queued) and refuses meta tensors; a kernel without a backward pass would
  also refuse, while grad mode is on, inputs that require grad (``prepare_qkv(..., backward=False)``; every entry
  point has one now).  Internal ``_*_launch`` functions check nothing.

Causality holds for non-finite inputs too: a NaN or inf in ``q``, ``k`` or ``v``
at position ``t`` changes outputs at positions ``>= t`` only.

Import :mod:`pathedu` first (it does, being our parent package): it decides
whether Triton compiles for a GPU or interprets on the CPU.
"""

from .._device import TritonUnavailable as _TritonUnavailable

try:
    import triton as _triton  # noqa: F401  (every kernel module needs it: fail here, once, with what to use instead)
except ImportError as _exc:  # no Triton (macOS, Windows): pathedu.TritonUnavailable names the alternatives
    raise _TritonUnavailable(f"{type(_exc).__name__}: {_exc}") from None
