r"""Context parallelism: PaTH and FoX attention over a sequence split across the ranks of a process group.

Each rank of a ``torch.distributed`` process group holds one contiguous chunk of the sequence (chunks in rank
order, lengths free, empty chunks allowed) and gets back its chunk of the output, equal to
:func:`pathedu.path.path_matrix` / :func:`pathedu.fox.fox_matrix` on the whole sequence.

The design in one line: **the position encoding is a transition that acts on the keys**, so keys can travel.

The chain
---------
Rank ``r`` holds positions ``a_r .. e_r``.  Attention is causal, so rank ``r`` needs the keys and values of
ranks ``0 .. r-1`` only, never those of later ranks.  Blocks of keys and values travel *forward* along a chain
``0 -> 1 -> ... -> R-1``, and every rank a block passes applies its own chunk's whole transition to the keys
before passing them on.  At hop ``h = 1, 2, ...`` rank ``r`` sends to ``r+1`` the block it holds (its own at
hop 1, afterwards the one it received at hop ``h-1``, transformed) and receives from ``r-1`` the block that
started at rank ``r-h`` (while ``r-h >= 0``), which it folds into its online softmax
(:func:`pathedu.nope.online_softmax_step`).  After ``r`` hops rank ``r`` has seen every earlier chunk once.

**PaTH.**  From its chunk's own UT factor ``A_r`` (:func:`pathedu.path._block_factors`, the whole chunk as one
block) rank ``r`` has the boundary-adjusted keys ``k~_j^T = k_j^T H_{j+1} ... H_{e_r}``, the queries
``q~_i = H_{a_r} ... H_i q_i``, the in-chunk (diagonal) scores, and its chunk product in UT form
``P_r = H_{a_r} ... H_{e_r} = I - W_r^T A_r^T W_r``.  A block passing rank ``r`` is mapped, as rows,
``k <- k P_r = k - (k W_r^T)(A_r^T W_r)`` (``A_r^T W_r`` computed once, ``T_r x D``; no ``D x D`` matrix).
A key ``j`` of rank ``s`` reaches rank ``r > s`` as ``k~_j^T P_{s+1} ... P_{r-1}``, and::

    k~_j^T P_{s+1} ... P_{r-1} q~_i = k_j^T H_{j+1} ... H_{e_s} H_{a_{s+1}} ... H_{e_{r-1}} H_{a_r} ... H_i q_i

is exactly the PaTH score ``k_j^T H_{j+1} ... H_i q_i`` (smallest index on the left), times ``scale``.

**FoX.**  The same chain with an additive transition.  A key travels with ``g_j``, the sum of ``log_f`` over
the positions after ``j`` up to the end of the last chunk it has passed: ``g_j = sum_{t=j+1..e_s} log_f[t]``
when it leaves rank ``s``; each rank it passes adds its chunk's total log gate.  The query side adds its own
prefix ``c_i = sum_{t=a_r..i} log_f[t]``, so ``logit_ij = scale q_i . k_j + g_j + c_i`` with
``g_j + c_i = sum_{t=j+1..i} log_f[t]``: no all-gather of gate totals is needed.  (Gates are never scaled.)

The local step
--------------
A rank's own chunk is computed one of two ways (``local=``).  ``"kernel"`` (the default for CUDA tensors
whose head dims fit, 16..128): the in-chunk attention by the Triton kernel (PaTH's, or FlashAttention's with
the log-gate hook for FoX), which also returns each row's log-sum-exp, so the online softmax starts from its
output; for PaTH the carried queries, keys and the chunk product come from the kernel's own preparation pass
(one ``D x D`` transition per UT block of ``B`` tokens, 64 for ``D <= 64`` and 32 above, chained in ``T / B``
batched products, :func:`_path_chunk_kernels`).  ``"matrix"``: the whole chunk as one block in PyTorch (any head dim, float64;
``T x T`` memory and, for PaTH, a ``T x T`` triangular solve).  Either way a received block is folded by
matrix products a tile of query rows at a time (at most ``_TILE_ELEMENTS`` logits at once).

Communication and cost
----------------------
Before the chain, one ``all_gather`` of a small int64 header per rank (status, error code, ``T``, ``D``,
``Dv``, dtype codes, leading shape: 17 integers; a second gather only for more than 8 leading dims) tells
every rank the length of every chunk (to allocate its receive buffers) and checks that the ranks agree.  A
hop then carries one block, packed in one tensor of the working dtype: ``N T_o (D + Dv) b`` bytes for PaTH and
``N T_o (D + Dv + 1) b`` for FoX, with ``N`` the product of the leading dims, ``T_o`` the block's length and
``b`` the bytes per element (PaTH, fp32, ``N = 32``, ``T_o = 4096``, ``D = Dv = 128``: 128 MiB a hop).  Rank
``r < R-1`` sends ``r+1`` blocks, rank ``r > 0`` receives ``r`` (:func:`_sent_bytes`).  The next hop's
``irecv`` and ``isend`` are posted before the current block is computed on (double buffering), so
communication overlaps compute; a rank waits only before it uses what it received, and for its
previous ``isend`` before the next one (one send in flight).

The work is unbalanced, as causal masking makes it: rank ``r`` computes ``r + 1`` blocks of scores (its
diagonal and ``r`` received blocks) and transforms those it passes on, so rank 0 idles while rank ``R-1`` works.
The known fix, not implemented here, is a zig-zag assignment (rank ``r`` takes chunks ``r`` and ``2R-1-r``).

Errors, dtypes, autograd
------------------------
* Inputs are validated on each rank with the package's checks, but nothing is raised before the header
  gather: a rank whose input is wrong reports an error code instead, and then *every* rank raises (the
  failing rank its own error, the others the same type naming the argument and the rank), so that no rank
  waits forever for one that stopped.  Ranks that disagree (dtype, leading dims, ``D``, ``Dv``) all raise
  the same ``ValueError`` naming the argument.  ``scale`` is not compared: pass the same one everywhere.
  A failure after the header (out of memory, say) is not shared: the other ranks then wait until the
  process group's timeout.
* No process group: ``RuntimeError`` saying how to start one.
* Working dtype as the reference forms: PaTH computes float16/bfloat16 in float32 (:func:`pathedu.path._solve_dtype`),
  FoX in float32 or wider (float64 when ``q`` or ``log_f`` is); the output is in ``q``'s dtype.
* Forward only: gradients would have to travel the chain backwards, which this module does not do, so an
  input that requires grad while grad mode is on is refused (``RuntimeError``); call it under ``torch.no_grad()``.
* Communication runs on ``q``'s device: CPU tensors with gloo, CUDA tensors with NCCL.

Try it: ``torchrun --nproc-per-node 3 -m pathedu.distributed [kernel]`` (:func:`_demo`).
"""
from __future__ import annotations

import math
import re

import torch
import torch.distributed as dist

from .checks import FLOAT_DTYPES, check_qkv, check_scale
from .fox import _log_gate_matrix, _prepare_fox
from .masks import causal_mask, masked_logits
from .nope import empty_output, online_softmax_step
from .path import _block_factors, _check_w_beta, _solve_dtype

__all__ = ["context_parallel_path", "context_parallel_fox"]

NO_GROUP = ("context parallelism needs a torch.distributed process group, and none is initialised: launch "
            "the script with `torchrun --nproc-per-node 2 your_script.py` and call "
            "`torch.distributed.init_process_group(\"gloo\")` in it (\"nccl\" for CUDA tensors), or pass `group=`")

_ARGS = ("q", "k", "v", "w", "beta", "log_f", "scale", "group", "local")  # argument codes in the header
_KINDS = (ValueError, TypeError, RuntimeError)  # error codes in the header (anything else: RuntimeError)
_LEAD_SLOTS = 8  # leading dims carried in the header; more need a second gather
# Header: ok, error kind, error argument, T, D, Dv, dtype of q, working dtype, number of leading dims, leading dims.
_HEADER = 9
_TILE_ELEMENTS = 1 << 26  # the most logits one fold of a received block holds at once (256 MiB in fp32)
LOCAL = ("auto", "kernel", "matrix")  # how a rank computes its own chunk


# ---------------------------------------------------------------------------
# Agreeing before computing: one all-gather of a small header
# ---------------------------------------------------------------------------

def _group_rank(group):
    """``(rank, world size)`` of this process in ``group`` (default: the world); ``RuntimeError`` without a group."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(NO_GROUP)
    rank = dist.get_rank(group)
    if rank < 0:
        raise RuntimeError("this process is not a member of `group`: call on the ranks of the group only")
    return rank, dist.get_world_size(group)


def _header_device(group) -> torch.device:
    """Where the header is gathered: NCCL moves CUDA tensors only (the current device), every other backend CPU ones."""
    if str(dist.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather_ints(values, group, device) -> list[list[int]]:
    """Every rank's list of ints (one length on every rank), in rank order."""
    x = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, x, group=group)
    return [t.tolist() for t in out]


def _error_codes(err: Exception) -> tuple[int, int]:
    """``(kind, argument)`` codes of a local error: its type and the first name in backticks in its message."""
    kind = next((i for i, t in enumerate(_KINDS) if type(err) is t), len(_KINDS))
    found = re.search(r"`(\w+)`", str(err))
    arg = _ARGS.index(found.group(1)) if found and found.group(1) in _ARGS else -1
    return kind, arg


def _same(values: list, what: str) -> None:
    """All ranks agree on a size or dtype, or every rank raises this same ``ValueError``."""
    if len(set(values)) > 1:
        raise ValueError(f"{what} must be the same on every rank, got {values} (in rank order)")


def _agree(group, validate, q, d_args: str, work_arg: str):
    """Validate locally, all-gather the header, and raise on every rank or on none.

    ``validate()`` returns ``(n, scale, dt, tensors)`` or raises; the error is held until every rank has
    reported.  Returns ``(rank, world, lengths, n, scale, dt, tensors)``, ``lengths`` every rank's T.
    """
    rank, world = _group_rank(group)
    try:
        n, scale, dt, tensors = validate()
        err = None
        lead = list(n.lead)
        header = [1, -1, -1, n.T, n.D, n.Dv, FLOAT_DTYPES.index(q.dtype), FLOAT_DTYPES.index(dt), len(lead)]
        header += lead + [-1] * (_LEAD_SLOTS - len(lead)) if len(lead) <= _LEAD_SLOTS else [-1] * _LEAD_SLOTS
    except Exception as e:  # noqa: BLE001  (reported to every rank first; re-raised below)
        err, lead = e, []
        header = [0, *_error_codes(e)] + [-1] * (_HEADER - 3 + _LEAD_SLOTS)
    device = _header_device(group)
    rows = _gather_ints(header, group, device)
    bad = [i for i, row in enumerate(rows) if row[0] == 0]
    if bad:
        if err is not None:
            raise err
        i = bad[0]
        kind = _KINDS[rows[i][1]] if rows[i][1] < len(_KINDS) else RuntimeError
        name = f"`{_ARGS[rows[i][2]]}`" if rows[i][2] >= 0 else "an argument"
        raise kind(f"{name} is invalid on rank {i} (that rank raises the reason); every rank raises, so that "
                   f"none waits for it")
    n_lead = [row[8] for row in rows]
    if max(n_lead) > _LEAD_SLOTS:  # every rank sees the same rows, so every rank gathers again, or none
        leads = _gather_ints(lead + [-1] * (max(n_lead) - len(lead)), group, device)
    else:
        leads = [row[_HEADER:] for row in rows]
    _same([FLOAT_DTYPES[row[6]] for row in rows], "the dtype of `q`, `k`, `v`")
    _same([FLOAT_DTYPES[row[7]] for row in rows], f"the working dtype (set by {work_arg})")
    _same([tuple(ld[:m]) for ld, m in zip(leads, n_lead)], "the leading dims of `q`, `k`, `v`")
    _same([row[4] for row in rows], f"the head dim D of {d_args}")
    _same([row[5] for row in rows], "the head dim Dv of `v`")
    return rank, world, [row[3] for row in rows], n, scale, dt, tensors


def _no_grad_needed(**tensors) -> None:
    """Forward only: refuse an input that requires grad while grad mode is on (gradients do not cross ranks)."""
    if torch.is_grad_enabled():
        for name, x in tensors.items():
            if x.requires_grad:
                raise RuntimeError(f"`{name}` requires grad: context parallelism here is forward only (no "
                                   f"gradient crosses ranks); call it under torch.no_grad()")


# ---------------------------------------------------------------------------
# The chain
# ---------------------------------------------------------------------------

def _sent_bytes(lengths, rank: int, lead_numel: int, width: int, itemsize: int) -> int:
    """Bytes rank ``rank`` sends per call of the chain: its own block and every block it forwards (those of ranks
    ``0 .. rank``), each ``lead_numel * T_o * width`` elements of ``itemsize`` bytes; the last rank sends none.
    ``width`` is ``D + Dv`` (PaTH) or ``D + Dv + 1`` (FoX)."""
    if rank + 1 >= len(lengths):
        return 0
    return sum(lengths[: rank + 1]) * lead_numel * width * itemsize


def _nonempty(lengths, n):
    """The lengths of the blocks that are sent: all zero when the leading dims hold no element."""
    return lengths if torch.Size(n.lead).numel() > 0 else [0] * len(lengths)


def _chain(group, rank, world, lengths, alloc, own, diagonal, fold, forward) -> None:
    """Run this rank's part of the chain ``0 -> 1 -> ... -> R-1``.

    ``own``: this rank's packed block (sent at hop 1); ``alloc(L)``: an empty packed block of L rows;
    ``diagonal()``: the local computation, run while hop 1 is in flight; ``fold(block)``: fold a received
    block into the softmax; ``forward(block)``: the block as the next rank receives it (this chunk's
    transition applied).  Empty blocks are never sent: every rank knows every length.  The message of the
    block from rank ``o`` carries tag ``o``.
    """
    whole = group if group is not None else dist.group.WORLD
    prev = dist.get_global_rank(whole, rank - 1) if rank > 0 else None
    nxt = dist.get_global_rank(whole, rank + 1) if rank + 1 < world else None
    origins = [o for o in range(rank - 1, -1, -1) if lengths[o] > 0]  # the blocks received, in order
    in_flight = None  # (tensor, work) of the last isend: its buffer is kept alive until it is done

    def post_recv(idx):
        if idx >= len(origins):
            return None
        buf = alloc(lengths[origins[idx]])
        return buf, dist.irecv(buf, src=prev, group=group, tag=origins[idx])

    def send(block, origin):
        nonlocal in_flight
        if in_flight is not None:
            in_flight[1].wait()
        in_flight = (block, dist.isend(block, dst=nxt, group=group, tag=origin))

    pending = post_recv(0)
    if nxt is not None and lengths[rank] > 0:
        send(own, rank)
    diagonal()
    for idx, origin in enumerate(origins):
        block, work = pending
        work.wait()
        pending = post_recv(idx + 1)  # the next hop is posted before this block is computed on
        if nxt is not None:
            send(forward(block), origin)
        fold(block)
    if in_flight is not None:
        in_flight[1].wait()


class _Softmax:
    """The online-softmax state ``(m, l, acc)`` of this rank's queries."""

    def __init__(self, lead, T, Dv, dt, device):
        self.m = torch.full(tuple(lead) + (T,), float("-inf"), dtype=dt, device=device)
        self.l = torch.zeros_like(self.m)
        self.acc = torch.zeros(tuple(lead) + (T, Dv), dtype=dt, device=device)

    def step(self, logits, values, **kw):
        self.m, self.l, self.acc = online_softmax_step(self.m, self.l, self.acc, logits, values, **kw)

    def start(self, out, lse):
        """Begin from a kernel's normalised output ``out (..., T, Dv)`` and natural-log log-sum-exp
        ``lse (..., T)``: ``m = lse, l = 1, acc = out`` is the same state as the sums it came from."""
        self.m, self.acc = lse.to(self.m.dtype), out.to(self.acc.dtype)
        self.l = torch.ones_like(self.m)

    def fold(self, queries, keys, values, scale, row_bias=None, col_bias=None):
        """Fold a received block, every key visible: ``logits = scale q k^T (+ row_bias_i + col_bias_j)``, computed
        a tile of query rows at a time so that no tile holds more than ``_TILE_ELEMENTS`` logits."""
        T, lead = queries.shape[-2], torch.Size(queries.shape[:-2]).numel()
        rows = max(1, min(T, _TILE_ELEMENTS // max(1, lead * keys.shape[-2])))
        for a in range(0, T, rows):
            sl = slice(a, a + rows)
            logits = scale * queries[..., sl, :] @ keys.transpose(-1, -2)
            if row_bias is not None:
                logits = logits + row_bias[..., sl, None] + col_bias[..., None, :]
            self.m[..., sl], self.l[..., sl], self.acc[..., sl, :] = online_softmax_step(
                self.m[..., sl], self.l[..., sl], self.acc[..., sl, :], logits, values)

    def output(self):
        return self.acc / self.l[..., None]


# ---------------------------------------------------------------------------
# The local step: Triton kernels, or PyTorch on the whole chunk
# ---------------------------------------------------------------------------

def _use_kernels(local, n, dt, device) -> bool:
    """Whether this rank computes its own chunk with the Triton kernels.  ``local``: ``"kernel"``, ``"matrix"``
    (PyTorch on the whole chunk: any D, float64 too, but ``T x T`` memory and a ``T x T`` triangular solve) or
    ``"auto"`` (the kernels for CUDA tensors that fit them, else the matrix path)."""
    if local not in LOCAL:
        raise ValueError(f"`local` must be one of {LOCAL}, got {local!r}")
    fits = 16 <= n.D <= 128 and 16 <= n.Dv <= 128 and dt != torch.float64
    if local == "kernel" and not fits:
        raise ValueError(f"`local`='kernel' runs the Triton kernels, which need D and Dv in 16..128 and fp16, bf16 "
                         f"or fp32 inputs (got D={n.D}, Dv={n.Dv}, working dtype {dt}); use local='matrix'")
    return local == "kernel" or (local == "auto" and fits and device.type == "cuda")


def _as_lead(t, n, last=()):
    """A kernel's ``(BH, T_pad, ...)`` rows back to ``lead + (T,) + last``."""
    return t[:, : n.T].reshape(tuple(n.lead) + (n.T,) + tuple(last))


def _path_chunk_kernels(q, k, v, w_, beta_, scale):
    """This rank's PaTH chunk through the kernels: ``(out, lse, q_tilde, k_tilde, N)``.

    ``out (..., T, Dv)`` and its natural-log log-sum-exp ``(..., T)``: the causal in-chunk attention (the
    preparation pass, then the scan, :mod:`pathedu.kernels.path_attention`).  From the same preparation pass
    (per block of ``B`` tokens: queries carried to the block's start, keys to its end, and the block's dense
    transition ``P_J = (I + G_J)^T``): ``q_tilde_i = H_a ... H_i q_i`` (to the chunk's start), as rows
    ``q~_i^T N_J`` with ``N_0 = I``, ``N_{J+1} = (I + G_J) N_J``; ``k_tilde_j^T = k_j^T H_{j+1} ... H_e`` (to
    the chunk's end), as rows ``k~_j^T P_{J+1} ... P_last``; and ``N (BH, D, D)`` after the last block, the
    chunk's product ``P_r = N^T``.  O(T D^2) work in ``T / B`` batched products, no ``T x T`` matrix."""
    from .kernels._launch import per_token, prepare_qkv
    from .kernels.path_attention import _path_launch, _prepare
    from .kernels.ut_prepare import check_block

    x = prepare_qkv(q, k, v)
    n = x.n
    w3, beta3 = per_token(w_, "w", x, extra=(n.D,)), per_token(beta_, "beta", x)
    block = check_block(None, n.D)
    prep = _prepare(x, w3, beta3, block)
    lse = torch.empty(x.BH, n.T, dtype=torch.float32, device=x.device)
    out = _path_launch(x, w3, beta3, scale, block, "dense", {}, lse=lse, prep=prep)
    q_loc = prep.qt.float() * prep.qn[..., None]  # q~ from each block's start (the pass stores it normalised)
    k_loc, g = prep.kt.float(), prep.g.float()  # (BH, T_pad, D), (BH, blocks, D, D)
    eye = torch.eye(n.D, dtype=torch.float32, device=x.device).expand(x.BH, n.D, n.D)
    q_t, k_t, N, S = torch.empty_like(q_loc), torch.empty_like(k_loc), eye.clone(), eye.clone()
    blocks = prep.T_pad // block
    for J in range(blocks):  # queries: the transitions of the blocks before theirs, nearest first
        q_t[:, J * block:(J + 1) * block] = q_loc[:, J * block:(J + 1) * block] @ N
        N = N + g[:, J] @ N
    for J in range(blocks - 1, -1, -1):  # keys: the transitions of the blocks after theirs
        k_t[:, J * block:(J + 1) * block] = k_loc[:, J * block:(J + 1) * block] @ S
        S = (eye + g[:, J]).transpose(-1, -2) @ S
    return (_as_lead(out, n, (n.Dv,)), _as_lead(lse * math.log(2), n), _as_lead(q_t, n, (n.D,)),
            _as_lead(k_t, n, (n.D,)), N)


def _fox_chunk_kernels(q, k, v, g, scale):
    """This rank's FoX chunk through the FlashAttention kernel (``"loggate"`` hook): ``(out, lse)``, the causal
    in-chunk attention ``(..., T, Dv)`` and its natural-log log-sum-exp ``(..., T)``."""
    from .kernels._launch import per_token, prepare_qkv
    from .kernels.flash_attention import attention_launch

    x = prepare_qkv(q, k, v)
    n = x.n
    c = torch.cumsum(per_token(g, "log_f", x), dim=-1)  # (BH, T) fp32
    lse = torch.empty(x.BH, n.T, dtype=torch.float32, device=x.device)
    out = attention_launch(x, scale, "loggate", c, lse=lse)
    return _as_lead(out, n, (n.Dv,)), _as_lead(lse * math.log(2), n)


# ---------------------------------------------------------------------------
# PaTH
# ---------------------------------------------------------------------------

def context_parallel_path(q, k, v, w, beta, *, scale=None, group=None, local="auto"):
    r"""PaTH attention with the sequence split across the ranks of ``group``: this rank's chunk of the output.

    Call on every rank of ``group`` (default: the world group), each with its contiguous chunk of the
    sequence, chunks in rank order (lengths may differ; a chunk may be empty).  The result equals
    :func:`pathedu.path.path_matrix` on the concatenation of the chunks, restricted to this rank's rows::

        logit_ij = scale * k_j^T H_{j+1} H_{j+2} ... H_i q_i,    H_t = I - beta_t w_t w_t^T

    positions global and 0-based, smallest index on the left, a token's own transition never acting on
    itself.  Keys and values travel forward rank to rank, each rank applying its chunk's product
    ``P_r = H_{a_r} ... H_{e_r}`` to the keys (module docstring).  Forward only.

    Shapes (T: this rank's chunk length): ``q, k, w: (..., T, D)``, ``v: (..., T, Dv)``, ``beta: (..., T)``
    in [0, 2] -> ``(..., T, Dv)`` in ``q``'s dtype.  Leading dims, ``D``, ``Dv`` and the dtype must agree
    across ranks (else ``ValueError`` on every rank); no process group: ``RuntimeError``.

    ``local``: how a rank computes its own chunk.  ``"kernel"``: the Triton kernels (the PaTH kernel for the
    causal in-chunk attention, its preparation pass's per-block transitions for carrying queries and keys
    across the chunk: O(T D^2) beside the attention, no ``T x T`` matrix; D and Dv in 16..128, fp16, bf16 or
    fp32 inputs, which the kernels take in their own dtype; blocks travel in float32).  ``"matrix"``: PyTorch
    on the whole chunk as one UT block (any D, float64 too; ``T x T`` memory).
    ``"auto"``: the kernels for CUDA tensors that fit them.  Received blocks are folded by matrix products,
    a tile of query rows at a time.
    """
    def validate():
        n = check_qkv(q, k, v)
        s = check_scale(scale, n.D)
        dt = _solve_dtype(q.dtype)
        w_, beta_ = _check_w_beta(w, beta, n, q, dtype=dt)
        _no_grad_needed(q=q, k=k, v=v, w=w, beta=beta)
        kernels = _use_kernels(local, n, dt, q.device)
        return n, s, dt, (q.to(dt), k.to(dt), v.to(dt), w_, beta_, kernels)

    rank, world, lengths, n, scale, dt, (q_, k_, v_, w_, beta_, kernels) = _agree(group, validate, q,
                                                                                   "`q`, `k`, `w`", "`q`")
    D, T = n.D, n.T
    alloc = lambda rows: torch.empty(n.lead + (rows, D + n.Dv), dtype=dt, device=q.device)  # noqa: E731
    soft = _Softmax(n.lead, T, n.Dv, dt, q.device)
    if T > 0 and kernels:  # the kernels take q, k, v in their own dtype (16-bit: tensor-core products)
        out, lse, q_tilde, k_tilde, N = _path_chunk_kernels(q, k, v, w_, beta_, scale)
        own = torch.cat([k_tilde, v_], dim=-1)
        def chunk_map(keys):  # k <- k P_r, P_r = N^T
            return (keys.reshape(N.shape[0], -1, D) @ N.transpose(-1, -2)).reshape(keys.shape)
    elif T > 0:
        A, intra, q_tilde, k_tilde = _block_factors(q_, k_, w_, beta_)
        own = torch.cat([k_tilde, v_], dim=-1)
        at_w = A.transpose(-1, -2) @ w_  # A_r^T W_r: k P_r = k - (k W_r^T) (A_r^T W_r)
        chunk_map = lambda keys: keys - (keys @ w_.transpose(-1, -2)) @ at_w  # noqa: E731
    else:
        own = alloc(0)

    def diagonal():
        if T > 0 and kernels:
            soft.start(out, lse)
        elif T > 0:
            logits = masked_logits(scale * intra, causal_mask(T, q.device))
            soft.step(logits, v_, masked=True, finite=bool(torch.isfinite(v_).all()))

    def fold(block):
        if T > 0:
            soft.fold(q_tilde, block[..., :D], block[..., D:], scale)

    def forward(block):
        if T == 0:
            return block  # an empty chunk's transition is I
        return torch.cat([chunk_map(block[..., :D]), block[..., D:]], dim=-1)

    _chain(group, rank, world, _nonempty(lengths, n), alloc, own, diagonal, fold, forward)
    return soft.output().to(q.dtype) if T > 0 else empty_output(q, v)


# ---------------------------------------------------------------------------
# FoX
# ---------------------------------------------------------------------------

def context_parallel_fox(q, k, v, log_f, *, scale=None, group=None, local="auto"):
    r"""FoX attention with the sequence split across the ranks of ``group``: this rank's chunk of the output.

    Call on every rank of ``group`` (default: the world group), each with its contiguous chunk of the
    sequence, chunks in rank order (lengths may differ; a chunk may be empty).  The result equals
    :func:`pathedu.fox.fox_matrix` on the concatenation of the chunks, restricted to this rank's rows::

        logit_ij = scale * q_i . k_j + sum_{t=j+1..i} log_f[t]      (j <= i; the gate is not scaled)

    positions global and 0-based, a token's own gate never acting on itself.  Each key travels with the sum
    of the gates after it up to the end of the chunks it has passed; each rank adds its chunk's total, the
    query adds its prefix within its own chunk (module docstring).  Forward only.

    Shapes (T: this rank's chunk length): ``q, k: (..., T, D)``, ``v: (..., T, Dv)``, ``log_f: (..., T)``
    with entries <= 0 -> ``(..., T, Dv)`` in ``q``'s dtype.  Leading dims, ``D``, ``Dv`` and the dtypes must
    agree across ranks (else ``ValueError`` on every rank); no process group: ``RuntimeError``.

    ``local``: ``"kernel"`` (the FlashAttention kernel with its log-gate hook for the in-chunk attention; D and
    Dv in 16..128, fp16, bf16 or fp32 inputs), ``"matrix"`` (PyTorch, ``T x T`` logits) or ``"auto"`` (the kernel
    for CUDA tensors that fit it), as :func:`context_parallel_path`.
    """
    def validate():
        n, s, dt = _prepare_fox(q, k, v, log_f, scale)
        _no_grad_needed(q=q, k=k, v=v, log_f=log_f)
        kernels = _use_kernels(local, n, dt, q.device)
        return n, s, dt, (q.to(dt), k.to(dt), v.to(dt), log_f.to(dt), kernels)

    rank, world, lengths, n, scale, dt, (q_, k_, v_, g, kernels) = _agree(group, validate, q, "`q`, `k`",
                                                                          "`q` and `log_f`")
    D, T = n.D, n.T
    alloc = lambda rows: torch.empty(n.lead + (rows, D + n.Dv + 1), dtype=dt, device=q.device)  # noqa: E731
    soft = _Softmax(n.lead, T, n.Dv, dt, q.device)
    if T > 0:
        suffix = g.flip(-1).cumsum(-1).flip(-1)  # sum_{t >= j} log_f[t] within the chunk
        after = torch.cat([suffix[..., 1:], torch.zeros_like(suffix[..., :1])], dim=-1)  # sum_{t=j+1..e_r}
        total = suffix[..., :1]  # the chunk's whole log gate, (..., 1)
        prefix = g.cumsum(-1)  # c_i = sum_{t=a_r..i} log_f[t]
        own = torch.cat([k_, v_, after[..., None]], dim=-1)
    else:
        own = alloc(0)

    def diagonal():
        if T > 0 and kernels:  # q, k, v in their own dtype, as above
            soft.start(*_fox_chunk_kernels(q, k, v, g, scale))
        elif T > 0:
            logits = masked_logits(scale * q_ @ k_.transpose(-1, -2) + _log_gate_matrix(g), causal_mask(T, q.device))
            soft.step(logits, v_, masked=True, finite=bool(torch.isfinite(v_).all()))

    def fold(block):
        if T > 0:  # logit_ij = scale q_i . k_j + c_i + g_j
            soft.fold(q_, block[..., :D], block[..., D:-1], scale, row_bias=prefix, col_bias=block[..., -1])

    def forward(block):
        if T == 0:
            return block  # no gate to add
        return torch.cat([block[..., :-1], block[..., -1:] + total[..., None]], dim=-1)

    _chain(group, rank, world, _nonempty(lengths, n), alloc, own, diagonal, fold, forward)
    return soft.output().to(q.dtype) if T > 0 else empty_output(q, v)


# ---------------------------------------------------------------------------
# Demo: torchrun --nproc-per-node N -m pathedu.distributed
# ---------------------------------------------------------------------------

def _demo(argv=None) -> None:
    """Split one random sequence (shared seed) unevenly across the ranks, run both functions, and print on
    rank 0 the largest relative error against :func:`pathedu.path.path_matrix` / :func:`pathedu.fox.fox_matrix`
    (each rank checks its chunk; the maximum is reduced to rank 0).  gloo on CPU, NCCL when CUDA is there for
    every rank.  Run without torchrun, it is a group of one.  An argument ``kernel``, ``matrix`` or ``auto`` (the
    default) picks the local step; with ``kernel`` the inputs are float32 and every chunk longer than a UT block
    (a positional argument: torchrun would take an option named ``--local...`` for one of its own)."""
    import argparse
    import os
    import socket

    import torch.nn.functional as F

    from .fox import fox_matrix
    from .path import path_matrix

    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    world = int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and world <= torch.cuda.device_count()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, device = dist.get_rank(), torch.device("cuda" if cuda else "cpu")
    parser = argparse.ArgumentParser(prog="python -m pathedu.distributed", description=_demo.__doc__)
    parser.add_argument("local", nargs="?", choices=LOCAL, default="auto", help="the local step (default auto)")
    local = parser.parse_args(argv).local
    g = torch.Generator().manual_seed(0)  # the same numbers on every rank
    low, high = (65, 140) if local == "kernel" else (0, 24)  # kernels: chunks longer than a UT block
    lengths = [int(x) for x in torch.randint(low, high, (world,), generator=g)]
    lead, T, D, Dv = (2, 3), sum(lengths), 16, 24
    q, k, w = (torch.randn(lead + (T, D), generator=g, dtype=torch.float64) for _ in range(3))
    v = torch.randn(lead + (T, Dv), generator=g, dtype=torch.float64)
    w = F.normalize(w, dim=-1)
    beta = 2 * torch.rand(lead + (T,), generator=g, dtype=torch.float64)
    log_f = F.logsigmoid(2 + 1.5 * torch.randn(lead + (T,), generator=g, dtype=torch.float64))
    q, k, v, w, beta, log_f = (x.to(device) for x in (q, k, v, w, beta, log_f))
    a, b = sum(lengths[:rank]), sum(lengths[: rank + 1])
    dt = torch.float32 if local == "kernel" else torch.float64  # the references stay float64
    rows = lambda x: x[..., a:b, :].to(dt)  # noqa: E731
    errors = []
    for ours, ref in ((context_parallel_path(rows(q), rows(k), rows(v), rows(w), beta[..., a:b].to(dt), local=local),
                       path_matrix(q, k, v, w, beta)),
                      (context_parallel_fox(rows(q), rows(k), rows(v), log_f[..., a:b].to(dt), local=local),
                       fox_matrix(q, k, v, log_f))):
        errors.append(((ours.double() - ref[..., a:b, :]).abs().max() if b > a else torch.zeros((), device=device))
                      / ref.abs().max())
    err = torch.stack(errors).to(device)
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"{world} ranks ({'nccl' if cuda else 'gloo'}), chunk lengths {lengths}, lead {lead}, D {D}, Dv {Dv}, "
              f"local step {local!r}, {str(dt).removeprefix('torch.')}")
        print(f"max relative error vs path_matrix: {err[0].item():.2e}; vs fox_matrix: {err[1].item():.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    _demo()
