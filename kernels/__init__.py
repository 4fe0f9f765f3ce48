"""Triton kernels, installed as :mod:`pathedu.kernels`.

Two templates that every chapter extends through hooks instead of copying:

* :mod:`.flash_attention`: causal FlashAttention forward (online softmax,
  fp32 accumulation) with an additive-bias hook (ALiBi slopes, cumulative log
  forget gates) and room for rotated q/k or PaTH's scan.
* :mod:`.linear_attention`: chunked linear attention with a carried state and a
  per-token scalar-gate hook (RetNet, Mamba2-style gates).

Import :mod:`pathedu` first (it does, being our parent package): it decides
whether Triton compiles for a GPU or interprets on the CPU.
"""
