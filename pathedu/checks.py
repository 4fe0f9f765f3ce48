"""Input validation shared by every form of every mechanism.

Each check raises ``TypeError`` (wrong kind of object or dtype) or
``ValueError`` (wrong shape or value) with a message that names the argument,
so that a mistake is reported at the call, not deep inside a kernel.

Non-finite inputs, the convention of every form (naive, recurrent, matrix, blockwise/chunked, Triton; forward,
and a forward to be differentiated) of every mechanism:

* ``q, k, v`` are not checked for NaN or inf (that would cost a pass over them); a NaN or inf in any of them at
  position ``t`` changes only the outputs that depend on position ``t``, those at positions ``>= t``, and never
  an earlier one.  Causal masks are selects, never multiplications by 0 (``0 * NaN`` is NaN), and masked
  weights never multiply a value (:func:`pathedu.masks.causal_matmul`).
* The per-token and per-head arguments (``w``, ``beta``, ``log_f``, ALiBi's slopes, RetNet's decays, CoPE's
  ``pos_emb``) must be finite and in their ranges: anything else is refused with a ``ValueError`` naming the
  argument (:func:`finite_condition`, :func:`range_condition`, :func:`log_gate_condition`; PaTH's ``w`` and
  ``beta`` must also give non-expanding transitions, :func:`transition_condition`).

When a value check makes the host wait (:func:`value_checks`):

* Shape, dtype and device checks read only metadata and always run, at no cost to the device.
* A value check has to read a number the device computed.  By default (``"raise"``) each call reads it before it
  returns and raises a ``ValueError`` that names the argument and the offending value, at the line that passed
  it: what a reader running one cell of the book, or a student's exercise, needs.  The price is one wait for the
  device per call, so one per layer per forward in a model; a kernel entry point queues its kernels before it
  waits (:class:`checked_after`), so at the book's sizes the wait overlaps the kernels, but a host that waits
  cannot run ahead of the device, and a wait cannot be captured by a CUDA graph or traced by ``torch.compile``.
* A trainer chooses once: ``with value_checks("defer"):`` decides each condition on the device and reports the
  first failure, with the same message, when :func:`check_deferred` runs (or the block ends), so the host never
  waits in the step; ``with value_checks(False):`` skips the value checks altogether (CUDA graphs,
  ``torch.compile``, inputs valid by construction).
* The alternative, deferring by default, was not taken: the error would surface later, at an unrelated line
  (or never, in a notebook that does not call :func:`check_deferred`), and the book's pages and exercises rely on
  an error at the call.  What decided it is the count of waits each default saves or costs: a reader calls a
  form a handful of times per cell, so one wait per call costs nothing they can see, while a trainer's loop
  makes one per layer per step and can turn them all off with one line.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class QKV:
    """Sizes read off validated ``q, k, v``: ``lead`` are the batch/head dims."""

    lead: tuple
    T: int
    D: int
    Dv: int


def check_device(x: torch.Tensor, name: str) -> None:
    """Refuse tensors that hold no data (the ``meta`` device): nothing can be computed from them."""
    if x.device.type == "meta":
        raise ValueError(f"`{name}` is on the meta device, which holds no data; pass a CPU or CUDA tensor")


def _check_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"`{name}` must have a floating dtype (float16/bfloat16/float32/float64), got {x.dtype}")
    check_device(x, name)


def check_floating(x, name: str) -> None:
    """``x`` a tensor of any floating dtype (a ``TypeError`` naming the argument otherwise)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"`{name}` must have a floating dtype, got {x.dtype}")


def check_qkv(q, k, v) -> QKV:
    """Validate ``q, k: (..., T, D)`` and ``v: (..., T, Dv)``; return their sizes.

    The leading dims (batch, heads, ...) must be equal across the three tensors,
    as must dtype and device.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(x, name)
        if x.dim() < 2:
            raise ValueError(f"`{name}` must have shape (..., T, dim) with at least 2 dims, got shape {tuple(x.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"`q`, `k`, `v` must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"`q`, `k`, `v` must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"`q`, `k`, `v` must have the same number of dims, got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"leading dims of `k` {tuple(k.shape[:-2])} differ from those of `q` {tuple(q.shape[:-2])}")
    if v.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"leading dims of `v` {tuple(v.shape[:-2])} differ from those of `q` {tuple(q.shape[:-2])}")
    if k.shape[-2] != q.shape[-2]:
        raise ValueError(f"sequence length of `k` ({k.shape[-2]}) differs from that of `q` ({q.shape[-2]})")
    if v.shape[-2] != q.shape[-2]:
        raise ValueError(f"sequence length of `v` ({v.shape[-2]}) differs from that of `q` ({q.shape[-2]})")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"head dim of `k` ({k.shape[-1]}) differs from that of `q` ({q.shape[-1]})")
    if q.shape[-1] == 0 or v.shape[-1] == 0:
        raise ValueError(f"head dims must be positive, got D={q.shape[-1]} (`q`), Dv={v.shape[-1]} (`v`)")
    return QKV(tuple(q.shape[:-2]), q.shape[-2], q.shape[-1], v.shape[-1])


def check_scale(scale, D: int) -> float:
    """``scale=None`` means ``D ** -0.5``; otherwise a positive finite number."""
    if scale is None:
        return D ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"`scale` must be a float or None, got {type(scale).__name__}")
    if not (scale > 0 and scale < float("inf")):
        raise ValueError(f"`scale` must be positive and finite, got {scale}")
    return float(scale)


def check_per_token(x, name: str, sizes: QKV, like: torch.Tensor, *, extra: tuple = ()) -> torch.Tensor:
    """Validate a per-token tensor of shape ``(..., T) + extra`` matching ``like``'s leading dims."""
    _check_tensor(x, name)
    want = sizes.lead + (sizes.T,) + tuple(extra)
    if tuple(x.shape) != want:
        raise ValueError(f"`{name}` must have shape {want} (leading dims, T{', ...' if extra else ''}), got {tuple(x.shape)}")
    if x.device != like.device:
        raise ValueError(f"`{name}` must be on {like.device}, got {x.device}")
    return x


def check_state(state, want: tuple, like: torch.Tensor, *, allow_complex: bool = False, name: str = "initial_state",
                shape_note: str = "") -> torch.Tensor:
    """Validate a recurrent state (a linear-side form's ``initial_state``): a tensor of shape ``want`` on ``like``'s
    device, floating, or complex too where ``allow_complex``.  ``shape_note`` follows the wanted shape in the
    message.  Returns ``state`` unchanged."""
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(state).__name__}")
    if allow_complex:
        if not (state.is_complex() or state.is_floating_point()):
            raise TypeError(f"`{name}` must be complex (or real), got {state.dtype}")
    elif not state.is_floating_point():
        raise TypeError(f"`{name}` must have a floating dtype, got {state.dtype}")
    check_device(state, name)
    if tuple(state.shape) != tuple(want):
        raise ValueError(f"`{name}` must have shape {tuple(want)}{shape_note}, got {tuple(state.shape)}")
    if state.device != like.device:
        raise ValueError(f"`{name}` must be on {like.device}, got {state.device}")
    return state


def check_bool(x, name: str) -> bool:
    """A flag (``return_state``): ``True`` or ``False``, nothing else."""
    if not isinstance(x, bool):
        raise TypeError(f"`{name}` must be a bool, got {type(x).__name__} {x!r}")
    return x


def check_kernel_inputs(sizes: QKV, dtype: torch.dtype, *, min_dim: int = 16, max_dim: int = 128) -> None:
    """What the Triton kernels accept: fp16/bf16/fp32 and head dims in [min_dim, max_dim]."""
    if dtype not in KERNEL_DTYPES:
        raise TypeError(f"Triton forms take float16, bfloat16 or float32 `q`, `k`, `v`; got {dtype} (use a reference form for float64)")
    for name, d in (("q", sizes.D), ("v", sizes.Dv)):
        if not (min_dim <= d <= max_dim):
            raise ValueError(f"Triton forms support head dims {min_dim}..{max_dim}; `{name}` has {d}")


def check_int(x, name: str, minimum: int = 1) -> int:
    """A size or a count (``n_heads``, ``d_model``, a filter size): an int ``>= minimum``; a boolean or a float is
    refused with a ``TypeError``, a smaller int with a ``ValueError``, each naming the argument."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"`{name}` must be an int, got {type(x).__name__}")
    if int(x) < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {x}")
    return int(x)


def check_positive_int(x, name: str) -> int:
    """A tuning argument (``page``, ``block_m``, ``block_n``, ``chunk``, ``block``): a positive int.

    Booleans, floats (even ``2.0``), zero and negative numbers are refused with a
    ``TypeError``/``ValueError`` naming the argument, never turned into an empty
    loop or a ``range()`` error from inside.
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"`{name}` must be a positive int, got {type(x).__name__} {x!r}")
    if x < 1:
        raise ValueError(f"`{name}` must be a positive int, got {x}")
    return int(x)


# ---------------------------------------------------------------------------
# Value checks: when the host waits for them
# ---------------------------------------------------------------------------
# A value check (is every gate <= 0?) is a reduction on the device followed by
# a read of its result on the host.  Every condition here reduces its tensor to
# its two extremes, [min, max], with one kernel (``torch.aminmax``, which
# propagates NaN), and is decided from those two numbers against an interval:
# a condition costs one launch whatever it asks (finite, in a range, a valid
# log gate).  What happens next is the value-check mode (:func:`value_checks`):
# read on the host at once (``"raise"``, the default; a call that checks several
# tensors reads them all together, so it waits for the device once, and a
# kernel entry point reads them with :class:`checked_after`, after queuing its
# kernels), decided on the device and read later (``"defer"``), or not computed
# at all (``"off"``).

VALUE_CHECK_MODES = ("raise", "defer", "off")
_MODE_ALIASES = {True: "raise", False: "off", "raise": "raise", "defer": "defer", "off": "off"}
_process_mode = ["raise"]  # set_value_checks
_local_mode: contextvars.ContextVar = contextvars.ContextVar("pathedu_value_checks", default=None)  # value_checks


def _mode_name(mode) -> str:
    if isinstance(mode, bool) or isinstance(mode, str):
        if mode in _MODE_ALIASES:
            return _MODE_ALIASES[mode]
    raise ValueError(f"`mode` must be True, False or one of {VALUE_CHECK_MODES}, got {mode!r}")


def value_check_mode() -> str:
    """The value-check mode in force here: ``"raise"``, ``"defer"`` or ``"off"`` (see :func:`value_checks`)."""
    return _local_mode.get() or _process_mode[0]


def set_value_checks(mode) -> str:
    """Set the value-check mode of the whole process (every thread without a :func:`value_checks` block of its
    own); returns the previous one.  ``mode``: as in :func:`value_checks`."""
    previous, _process_mode[0] = _process_mode[0], _mode_name(mode)
    return previous


@contextlib.contextmanager
def value_checks(mode=True):
    """Choose, inside the block, what the value checks of every form do (the shape, dtype and device checks,
    which read no values, always run).

    * ``True`` or ``"raise"`` (the default outside any block): each call reads its conditions on the host and
      raises ``ValueError`` naming the argument and the offending value before it returns.  On a GPU that is one
      wait for the device per call.
    * ``"defer"``: each condition is decided on the device (a few elementwise kernels on its ``[min, max]``) and
      the flags are kept; nothing waits.  :func:`check_deferred` reads every flag kept so far with one wait and
      raises the first failing condition's ``ValueError``, message unchanged; leaving the block calls it.
      Call it where the host waits anyway (logging a loss).  The flags keep the checked tensors alive until then
      (at most :data:`MAX_PENDING` calls' worth; older flags are folded into one and lose their message).
    * ``False`` or ``"off"``: no value is checked; a bad value gives what the kernels compute on it (NaN, an
      expanding product), silently.  For CUDA graphs and ``torch.compile``, which cannot capture a read of the
      device, and for a trainer whose inputs are correct by construction (``beta = 2 sigmoid(...)``, normalised
      ``w``, ``log_f = logsigmoid(...)``).

    Per thread (a ``contextvars`` variable); :func:`set_value_checks` sets the mode of the whole process.
    """
    name = _mode_name(mode)
    token = _local_mode.set(name)
    try:
        yield name
        if name == "defer":
            check_deferred()
    finally:
        _local_mode.reset(token)


class Condition:
    """A value condition on a tensor, decided from the tensor's extremes against an interval.

    ``stats``: ``[min, max]`` of the tensor, shape ``(2,)``, on its device (NaN when the tensor holds a NaN);
    the condition holds when ``lo <= min`` (``lo < min`` with ``lo_open``) and ``max <= hi`` (``max < hi`` with
    ``hi_open``), so a NaN fails it; ``message() -> str``: the error to raise (computed only on failure, so it
    may read the offending values)."""

    __slots__ = ("stats", "lo", "hi", "lo_open", "hi_open", "message")

    def __init__(self, stats: torch.Tensor, lo: float, hi: float, message: Callable[[], str], *,
                 lo_open: bool = False, hi_open: bool = False):
        self.stats, self.lo, self.hi, self.message = stats, lo, hi, message
        self.lo_open, self.hi_open = lo_open, hi_open

    def holds(self, lo: float, hi: float) -> bool:
        """Whether extremes ``lo, hi`` (host numbers) meet the condition."""
        return ((lo > self.lo) if self.lo_open else (lo >= self.lo)) and \
            ((hi < self.hi) if self.hi_open else (hi <= self.hi))

    def holds_on_device(self, stats: torch.Tensor) -> torch.Tensor:
        """:meth:`holds` on ``stats`` (this condition's ``[min, max]``) where they are: a bool tensor of shape
        ``(1,)``, no read by the host."""
        lo, hi = stats[0:1], stats[1:2]
        return (lo > self.lo if self.lo_open else lo >= self.lo) & (hi < self.hi if self.hi_open else hi <= self.hi)


def extremes(x: torch.Tensor) -> torch.Tensor:
    """``[min, max]`` of a non-empty floating tensor, shape ``(2,)``, one reduction (NaN if any entry is NaN)."""
    stats = torch.empty(2, dtype=x.dtype, device=x.device)
    torch.aminmax(x.detach(), out=(stats[0], stats[1]))
    return stats


def _first_bad(x: torch.Tensor, good: torch.Tensor):
    return x[~good].flatten()[0].item()


def _pairs(values: list) -> list:
    return [values[i: i + 2] for i in range(0, len(values), 2)]


def _raise_first_false(pairs: list, conditions: list, cause=None) -> None:
    for (lo, hi), c in zip(pairs, conditions):
        if not c.holds(lo, hi):
            raise ValueError(c.message()) from cause


def _gathered(conditions: list) -> torch.Tensor:
    """Every condition's ``[min, max]`` in one tensor on the first one's device (float64 if dtypes differ)."""
    stats = [c.stats.to(conditions[0].stats.device) for c in conditions]
    if len({s.dtype for s in stats}) > 1:
        stats = [s.to(torch.float64) for s in stats]
    return stats[0] if len(stats) == 1 else torch.cat(stats)


# Deferred flags: (bool tensor on the device, one entry per condition; the conditions, or None once folded).
MAX_PENDING = 1024
"""How many calls' flags ``"defer"`` keeps with their conditions before it folds the oldest into one flag."""
_pending: list = []
_pending_lock = threading.Lock()
_FOLDED = ("a value check failed in a call whose message was dropped (more than MAX_PENDING calls were checked "
           "in \"defer\" mode between two reads; call `pathedu.checks.check_deferred()` more often)")


def _keep_deferred(conditions: list, stats: torch.Tensor) -> None:
    """Decide ``conditions`` (``None`` entries hold a place in ``stats`` and are skipped) on the device from
    ``stats``, their ``[min, max]`` pairs in order, and keep the flags for :func:`check_deferred`."""
    kept = [(c, stats[2 * i: 2 * i + 2]) for i, c in enumerate(conditions) if c is not None]
    if not kept:
        return
    flags = torch.cat([c.holds_on_device(s) for c, s in kept])
    with _pending_lock:
        _pending.append((flags, [c for c, _ in kept]))
        if len(_pending) > MAX_PENDING:
            old = _pending[: len(_pending) // 2]
            del _pending[: len(old)]
            for device in {f.device for f, _ in old}:
                folded = torch.cat([f for f, _ in old if f.device == device]).all().reshape(1)
                _pending.insert(0, (folded, None))


def check_deferred() -> None:
    """Read every flag kept in ``"defer"`` mode (:func:`value_checks`) since the last read, with one wait per
    device, forget them, and raise the ``ValueError`` of the first condition that failed, in call order."""
    with _pending_lock:
        taken = list(_pending)
        _pending.clear()
    if not taken:
        return
    values = {}
    for device in {f.device for f, _ in taken}:
        values[device] = iter(torch.cat([f for f, _ in taken if f.device == device]).tolist())
    for flags, conditions in taken:
        ok = [next(values[flags.device]) for _ in range(flags.numel())]
        for good, condition in zip(ok, conditions or [None] * len(ok)):
            if not good:
                raise ValueError(_FOLDED if condition is None else condition.message())


def require(*conditions: Condition | None) -> None:
    """Raise ``ValueError`` with the message of the first condition (:class:`Condition`) that fails.

    ``None`` entries are skipped (a condition on an empty tensor).  All conditions are read with
    one host synchronisation; in ``"defer"`` mode they are decided on the device and kept for
    :func:`check_deferred` instead (no wait)."""
    conditions = [c for c in conditions if c is not None]
    if not conditions:
        return
    if value_check_mode() == "defer":
        _keep_deferred(conditions, _gathered(conditions))
    else:
        _raise_first_false(_pairs(_gathered(conditions).tolist()), conditions)


class checked_after:
    """:func:`require` around the work that depends on the checked values, waiting for the check only.

    ``with checked_after(*conditions): out = launch(...)``: on a GPU the conditions' extremes are
    copied to pinned host memory behind an event, the body queues its kernels, and on leaving the
    block the host waits for that event (the check), not for the kernels queued after it, then
    raises ``ValueError`` as :func:`require` would.  So the kernels are already queued when the
    host waits and the device never idles for the check; a kernel that ran on a bad value is
    discarded with its output.  Only for bodies that are safe on any value (no value decides an
    index or a size).  A kernel of the body may add a condition it decides as it goes
    (:meth:`defer`).  Every condition is read with one host synchronisation, on leaving the block
    (on the CPU too, where the body has then run on the values).  In ``"defer"`` mode
    (:func:`value_checks`) nothing is copied or read: the conditions are decided on the device and
    kept for :func:`check_deferred`.  In ``"off"`` mode the condition builders return None, so
    there is nothing to read.

    In Triton's interpreter (the CPU) the body's warnings are held back until the conditions are read: dropped
    when one fails, so that only its ``ValueError`` is shown, and issued again after the block otherwise, except
    numpy's floating-point warnings from inside the interpreter (``invalid value encountered in divide``,
    ``divide by zero encountered in log2``, ...).  Those come from lanes a kernel computes and then masks out (the
    normaliser of a padding row past ``T`` is 0, and ``0 / 0`` is computed, never stored) or from non-finite
    ``q, k, v``, which the kernels confine by design; a GPU computes the same lanes without a word, and they say
    nothing about the outputs, so they are dropped.
    """

    def __init__(self, *conditions: Condition | None):
        self._held = None  # the warnings.catch_warnings that holds the body's warnings back (interpreter only)
        self._groups = []  # (conditions, their [min, max] pairs: pinned host copy or CPU tensor, event or None)
        self._deferred = value_check_mode() == "defer"
        kept = [c for c in conditions if c is not None]
        if kept:
            self._add(kept, _gathered(kept))

    def _add(self, conditions: list, stats: torch.Tensor) -> None:
        """Keep ``conditions`` (``None`` entries hold a place in ``stats`` and are skipped) with ``stats``, their
        ``[min, max]`` pairs in order; on a GPU, queue the copy to the host behind the work queued so far."""
        if self._deferred:
            _keep_deferred(conditions, stats)
        elif stats.device.type == "cuda":
            host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
            host.copy_(stats, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(stats.device))
            self._groups.append((conditions, host, event))
        else:
            self._groups.append((conditions, stats, None))

    def defer(self, *conditions: Condition | None, stats: torch.Tensor) -> None:
        """Add conditions whose extremes a kernel of the body has just queued into ``stats``, two numbers a
        condition in order (a kernel that reads the tensors anyway and counts what breaks a condition as it goes:
        the UT preparation pass's first launch, for ``w``, ``beta`` and ``log_f``; a ``None`` condition's place
        is skipped).  Their copy is queued behind that kernel, so the host waits for it, not for what the body
        queues after it."""
        if stats.numel() != 2 * len(conditions):
            raise ValueError(f"`stats` must hold two numbers per condition: {len(conditions)} conditions, "
                             f"{stats.numel()} numbers")
        if any(c is not None for c in conditions):
            self._add(list(conditions), stats)

    def __enter__(self) -> "checked_after":
        from ._device import triton_mode

        if triton_mode() == "interpreter":
            self._held = warnings.catch_warnings(record=True)
            self._caught = self._held.__enter__()
            warnings.simplefilter("always")
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        caught = []
        if self._held is not None:
            self._held.__exit__(None, None, None)
            self._held, caught = None, self._caught
        self._read(exc)  # a failed condition raises here, and the body's warnings are dropped
        for w in caught:
            if not _interpreter_float_warning(w):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        return False

    def _read(self, exc) -> None:
        """Wait for the conditions' extremes and raise ``ValueError`` for the first that fails."""
        if not self._groups:
            return
        events = [e for _, _, e in self._groups if e is not None]
        if events:  # events complete in stream order: the last one covers every copy
            events[-1].synchronize()
        stats = [h for _, h, _ in self._groups]
        values = (stats[0] if len(stats) == 1 else torch.cat([h.double() for h in stats])).tolist()
        conditions = [c for group, _, _ in self._groups for c in group]
        pairs = [(p, c) for p, c in zip(_pairs(values), conditions) if c is not None]
        _raise_first_false([p for p, _ in pairs], [c for _, c in pairs], exc)


def _interpreter_float_warning(w: warnings.WarningMessage) -> bool:
    """Whether ``w`` is numpy's floating-point warning from inside Triton's interpreter (see :class:`checked_after`)."""
    path, text = w.filename.replace("\\", "/"), str(w.message)
    return (issubclass(w.category, RuntimeWarning) and ("/triton/" in path or "/numpy/" in path)
            and ("encountered in" in text or "All-NaN" in text))


def _off(x: torch.Tensor) -> bool:
    """No condition to build: ``x`` is empty, or value checks are off (:func:`value_checks`)."""
    return x.numel() == 0 or value_check_mode() == "off"


def _counted(counted: torch.Tensor, message) -> Condition:
    """The condition "``counted`` (a kernel's count of the entries that break it, twice) is zero"."""
    return Condition(counted, 0.0, 0.0, message)


def log_gate_condition(log_f: torch.Tensor, name: str = "log_f", *,
                       counted: torch.Tensor | None = None) -> Condition | None:
    """``-inf < log_f <= 0`` everywhere (the log of a forget gate in (0, 1]; NaN fails).  ``counted``: as in
    :func:`finite_condition`."""
    if _off(log_f):
        return None

    def message():
        bad = _first_bad(log_f, (log_f <= 0) & (log_f > float("-inf")))
        if bad == float("-inf"):
            return f"`{name}` must be finite (a gate of exactly 0 is -inf; use a large negative number)"
        return f"`{name}` must be <= 0 (the log of a forget gate in (0, 1]); found {bad}"

    if counted is not None:
        return _counted(counted, message)
    return Condition(extremes(log_f), -math.inf, 0.0, message, lo_open=True)


def range_condition(x: torch.Tensor, name: str, lo: float, hi: float, why: str = "", *,
                    lo_open: bool = False, finite: bool = False,
                    counted: torch.Tensor | None = None) -> Condition | None:
    """``lo <= x <= hi`` everywhere (``lo < x`` with ``lo_open``; ``finite``: no inf either, for an open-ended
    range).  NaN fails, as does anything outside the range.  ``counted``: as in :func:`finite_condition`."""
    if _off(x):
        return None

    def message():
        good = ((x > lo) if lo_open else (x >= lo)) & (x <= hi) & (torch.isfinite(x) if finite else True)
        if hi == float("inf"):
            where = f"be {'finite and ' if finite else ''}{'>' if lo_open else '>='} {lo:g}"
        else:
            where = f"{'be finite and ' if finite else ''}lie in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        return f"`{name}` must {where}{why}; found {_first_bad(x, good)}"

    if counted is not None:
        return _counted(counted, message)
    return Condition(extremes(x), lo, hi, message, lo_open=lo_open or (finite and lo == -math.inf),
                     hi_open=finite and hi == math.inf)


def finite_condition(x: torch.Tensor, name: str, *, counted: torch.Tensor | None = None) -> Condition | None:
    """Every entry finite (no NaN, no inf).  ``counted``: instead of a reduction of ``x``, a ``(2,)`` fp32 tensor
    both of whose entries a kernel that reads ``x`` anyway sets to the number of non-finite entries it met (zero
    when there are none; for :meth:`checked_after.defer`)."""
    if _off(x):
        return None

    def message():
        return f"`{name}` must be finite; found {_first_bad(x, torch.isfinite(x))}"

    if counted is not None:
        return _counted(counted, message)
    return Condition(extremes(x), -math.inf, math.inf, message, lo_open=True, hi_open=True)


# PaTH's transitions H_t = I - beta_t w_t w_t^T must not expand: H_t has the eigenvalue 1 - beta_t |w_t|^2 (along
# w_t) and 1 (across it), so its products stay bounded iff beta_t |w_t|^2 <= 2 (with beta_t >= 0, checked apart).
# PaTH's w_t is a unit vector and beta_t in [0, 2]; w_t = 0 (no transition) is allowed, as in the paper's
# constructions.  The excess allowed is the same for every dtype: a unit vector rounded to bfloat16 moves |w|^2 by
# up to about 2^-7, and references in float32/float64 are routinely evaluated on inputs rounded to 16 bits.
TRANSITION_TOL = 2.0 ** -4


def transition_condition(w: torch.Tensor, beta: torch.Tensor, name: str = "w", *, tol: float = TRANSITION_TOL,
                         counted: torch.Tensor | None = None) -> Condition | None:
    """``beta_t |w_t|^2 <= 2 + tol`` for every row ``w[..., t, :]`` and its ``beta[..., t]`` (NaN fails): every
    transition ``H_t = I - beta_t w_t w_t^T`` is non-expansive (eigenvalues in [-1, 1]), as it is for a unit
    ``w_t`` and ``beta_t`` in [0, 2].  ``|w_t|^2`` is summed in float32 for 16-bit ``w``.  ``counted``: as in
    :func:`finite_condition` (a kernel that forms ``|w_t|^2`` anyway counts the rows that break it)."""
    if _off(w):
        return None

    def products():
        x, b = w.detach(), beta.detach()
        wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        return x.to(wide).square().sum(-1) * b.to(wide)

    def message():
        p = products()
        bad = p[~(p <= 2 + tol)].flatten()
        found = f"; found beta_t |{name}_t|^2 = {bad[0].item():.6g}" if bad.numel() else ""
        return (f"`{name}` gives transitions H_t = I - beta_t {name}_t {name}_t^T that expand: beta_t |{name}_t|^2 "
                f"must be <= 2 (within {tol:g}), as for PaTH's unit {name}_t and beta_t in [0, 2]{found}; normalise "
                f"`{name}`, e.g. `{name} = torch.nn.functional.normalize({name}, dim=-1)`")

    if counted is not None:
        return _counted(counted, message)
    return Condition(extremes(products()), -math.inf, 2 + tol, message)
