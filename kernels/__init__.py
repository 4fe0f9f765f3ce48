"""Triton kernels, installed as :mod:`pathedu.kernels`.

Two templates that every chapter extends through hooks instead of copying:

* :mod:`.flash_attention`: causal FlashAttention forward (online softmax,
  fp32 accumulation) with an additive-bias hook: ALiBi slopes (chapter 2) and
  cumulative log forget gates (chapter 3).  RoPE (chapter 4) reuses it
  unchanged after the rotation pre-pass of :mod:`.rope`.
* :mod:`.linear_attention`: chunked linear attention with a carried state and a
  gate hook: none (chapter 1), a per-token scalar gate (RetNet, Mamba2) or a
  per-channel gate (GLA) (chapters 2 and 3).

Chapter 5 adds :mod:`.path_attention` (PaTH: a preparation pass with per-block
UT factors, then the FlashAttention loop scanning key blocks right to left with
the query carried through each block's Householder product) and
:mod:`.delta_rule` (chunked DeltaNet / Householder RNN through the same
preparation pass); see ``kernels/NOTES_path.md`` for their design and timings.

Import :mod:`pathedu` first (it does, being our parent package): it decides
whether Triton compiles for a GPU or interprets on the CPU.
"""
