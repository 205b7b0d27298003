"""
Softmax over the last dim of x[M, N], in Triton. Starter kernel for AutoKernel.

Three paths, picked by row length:
  * rows that fit in registers (N <= MAX_FUSED_N): one read, one write. Each program owns a
    [BLOCK_M, BLOCK_N] tile of whole rows (several rows per program when rows are short).
  * long rows (vocabularies: 50257, 128256; up to RESIDENT_SLICE x the SM count, ~1M on an
    H100): each row is cut into slices of at most 8192 elements, each held in registers by its
    own program. The programs of a row publish their slice's (max, sum of exp) as one 64-bit
    word, wait for the rest of the row's words, combine them and write their slice: one read and
    one write of x. On the H100 (GPU time, fp16): 4096x50257 287 us, 96% of a copy's speed, and
    4096x128256 701 us (99%), where looping over each row twice took 429 and 1085 (its second
    read came from HBM) and torch 385 and 1430. Few rows take smaller slices (down to 2048) so
    that every SM has work: 8x50257 7.4 us (torch 16.2).
  * longer rows: a program loops over its slice twice (max and sum, then write), the slices of
    a row sharing their (max, sum) the same way. Pass 1 keeps a running max and per-lane sums of
    exp (online softmax, one exp per element); pass 2 re-reads the slice last chunk first (the
    likeliest to still be in L2) and writes.
A row's programs wait for one another: CUDA starts blocks in grid order and a row never has
more programs than the GPU has SMs, so they run side by side. Nothing in CUDA promises that,
though, so a program waits a bounded time and then reads the whole row itself: slower, never a
hang (the CPU interpreter, which runs programs one after another, goes that way).
Chunks and slices start on 16-byte boundaries even when rows don't (odd N), so loads and
stores inside a row move whole 16-byte vectors; the few elements at a row's two ends are
handled apart.
Rows that fit, on the H200 (8192x8192 fp16): 69 us, 3.9 TB/s (eager 259 us).
Math in fp32 whatever the input dtype; the output has x's dtype.

What has worked here: whole rows in registers, several a program when short; a row's programs
swapping (max, sum) as one 64-bit word each, written and polled with relaxed atomics (3% of the
kernel's time, where a counter with a release fence cost 13%); slices on 16-byte boundaries, so
odd N still loads in vectors; the register count (n_regs) watched, since a cap on it decides
several % (_resident_plan).

Usage:
  uv run bench.py --kernel kernels/softmax.py      # the gate
  cp kernels/softmax.py kernel.py                  # start the agent from here
"""
import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BACKEND = "triton"

LOG2E = tl.constexpr(1.4426950408889634)
MAX_FUSED_N = 16384   # longest row held whole in registers (fp32: 64 KB per program)
RESIDENT_SLICE = 8192  # most elements of a long row one program holds (64 a thread at 4 warps)
RESIDENT_MAXNREG = 96  # registers a thread for 16-bit x (5 programs per SM), see _resident_plan
SPIN_LIMIT = 1 << 20   # polls (~1 us each) a program waits for the other slices of its row


@triton.jit
def softmax_fused_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_xn, stride_ym, stride_yn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    rows64 = rows.to(tl.int64)[:, None]  # M*N can pass 2^31 elements
    x = tl.load(x_ptr + rows64 * stride_xm + cols[None, :] * stride_xn, mask=mask,
                other=-float("inf"), eviction_policy=EVICT).to(tl.float32)
    row_max = tl.max(x, axis=1)
    e = tl.exp2((x - row_max[:, None]) * LOG2E)
    inv_sum = 1.0 / tl.sum(e, axis=1)
    y = e * inv_sum[:, None]
    tl.store(y_ptr + rows64 * stride_ym + cols[None, :] * stride_yn,
             y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_chunk(x_ptr, row_off, c, N, stride_n, cols, ALIGN: tl.constexpr,
                BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    """Columns c .. c+BLOCK_N of the row at x_ptr + row_off, -inf outside [0, N). The caller
    makes row_off + c a multiple of ALIGN elements (16 bytes; ALIGN is 1 unless the row is
    unit-stride), so a chunk inside the row loads unmasked in 16-byte vectors even when the
    row length is odd (vocab 50257) and rows start misaligned."""
    if (c >= 0) & (c + BLOCK_N <= N):
        x = tl.load(x_ptr + tl.multiple_of(row_off + c * stride_n, ALIGN) + cols * stride_n,
                    eviction_policy=EVICT)
    else:
        cc = c + cols
        x = tl.load(x_ptr + row_off + cc * stride_n, mask=(cc >= 0) & (cc < N),
                    other=-float("inf"), eviction_policy=EVICT)
    return x.to(tl.float32)


@triton.jit
def _store_chunk(y_ptr, y, row_off, c, N, stride_n, cols, ALIGN: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    if (c >= 0) & (c + BLOCK_N <= N):
        tl.store(y_ptr + tl.multiple_of(row_off + c * stride_n, ALIGN) + cols * stride_n, y)
    else:
        cc = c + cols
        tl.store(y_ptr + row_off + cc * stride_n, y, mask=(cc >= 0) & (cc < N))


@triton.jit
def _row_stats(x_ptr, x_off, c_begin, num_chunks, N, stride_n, cols, ALIGN: tl.constexpr,
               BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    """Pass 1 over chunks c_begin + k * BLOCK_N, k < num_chunks: one running max m (a scalar,
    updated once per chunk) and per-lane sums s of exp(x - m), rescaled when m grows: one FMA,
    one exp2 and one FMA an element. (A per-lane running max costs ~4 more ALU ops an element;
    on the H200 it measured 8% slower, the memory there being fast enough for ALU work to show.)"""
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    for k in range(0, num_chunks):
        x = _load_chunk(x_ptr, x_off, c_begin + k * BLOCK_N, N, stride_n, cols, ALIGN, BLOCK_N,
                        EVICT)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)  # all -inf so far: exp2 -> 0
        s = s * tl.exp2((m - m_ref) * LOG2E) + tl.exp2((x - m_ref) * LOG2E)
        m = m_new
    return m, s


@triton.jit
def _write_chunks(x_ptr, y_ptr, x_off, y_off, c_begin, num_chunks, row_max, inv_sum, N,
                  stride_xn, stride_yn, cols, ALIGN: tl.constexpr, BLOCK_N: tl.constexpr,
                  EVICT: tl.constexpr):
    """Pass 2: y = exp(x - row_max) * inv_sum over the same chunks, walked backwards: the chunks
    read last in pass 1 are the likeliest to still be in L2."""
    for i in range(0, num_chunks):
        c = c_begin + (num_chunks - 1 - i) * BLOCK_N
        x = _load_chunk(x_ptr, x_off, c, N, stride_xn, cols, ALIGN, BLOCK_N, EVICT)
        y = tl.exp2((x - row_max) * LOG2E) * inv_sum
        _store_chunk(y_ptr, y.to(y_ptr.dtype.element_ty), y_off, c, N, stride_yn, cols, ALIGN,
                     BLOCK_N)


@triton.jit
def _poll_slices(ptrs, mask):
    """The row's words, read with atomics: Triton gives each word to one thread and shares the
    value through shared memory, so every thread sees the same snapshot (plain volatile loads
    would let threads see different ones, and a row combined from two snapshots is wrong)."""
    words = tl.atomic_add(ptrs, 0, mask=mask, sem="relaxed")
    missing = tl.sum(tl.where(mask, (words >> 31) & 1, 0), axis=0)
    return words, missing


@triton.jit
def _row_from_slices(m, total, x_ptr, x_off, N, stride_xn, words_ptr, row, pid, max_spin,
                     SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr, ALIGN: tl.constexpr,
                     FALLBACK_N: tl.constexpr):
    """(row max, row sum of exp) from every slice's (max m, sum of exp(x - m)). Each program
    publishes its pair as one 64-bit word, max in the high half, sum in the low: one atomic
    store, so a reader sees the whole pair or none of it. The host fills the words with -1 and
    a sum is never negative (its sign bit is cleared, for NaN's sake), so the sum's sign bit
    says "not written yet". A program waits at most max_spin polls for the others: CUDA starts
    blocks in order, so a row's programs run side by side, but nothing guarantees it (a GPU
    shared with other work; the CPU interpreter, which runs programs one after another). One
    that gives up reads the whole row itself: slower, never stuck, the same result up to
    rounding. (A counter that programs increment after storing their pair needs a release fence
    and a second round of loads: on the H100 that exchange cost 13% of the kernel at 4096x50257,
    this one 3%. Its price: each poll reads all the row's words, which shows only when a row has
    ~100 programs: 1x1000000 9 -> 14 us.)"""
    word = (m.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (
        total.to(tl.int32, bitcast=True).to(tl.int64) & 0x7FFFFFFF)
    tl.atomic_xchg(words_ptr + pid, word, sem="relaxed")
    k = tl.arange(0, SPLITS_POW2)
    ptrs = words_ptr + row * SPLITS + k
    valid = k < SPLITS
    words, missing = _poll_slices(ptrs, valid)
    spins = 0
    while (missing > 0) & (spins < max_spin):
        words, missing = _poll_slices(ptrs, valid)
        spins += 1
    if missing == 0:
        pm = tl.where(valid, (words >> 32).to(tl.int32).to(tl.float32, bitcast=True),
                      -float("inf"))
        ps = tl.where(valid, words.to(tl.int32).to(tl.float32, bitcast=True), 0.0)
        row_max = tl.max(pm, axis=0)
        row_sum = tl.sum(ps * tl.where(pm == -float("inf"), 0.0,
                                       tl.exp2((pm - row_max) * LOG2E)), axis=0)
    else:
        first = -(x_off % ALIGN)
        row_max, s = _row_stats(x_ptr, x_off, first, tl.cdiv(N - first, FALLBACK_N), N,
                                stride_xn, tl.arange(0, FALLBACK_N), ALIGN, FALLBACK_N, "")
        row_sum = tl.sum(s, axis=0)
    return row_max, row_sum


@triton.jit
def softmax_resident_kernel(x_ptr, y_ptr, words_ptr, N, stride_xm, stride_xn, stride_ym,
                            stride_yn, slice_cols, max_spin,
                            SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr, SLICE: tl.constexpr,
                            ALIGN: tl.constexpr, FALLBACK_N: tl.constexpr):
    """Program (row, split) holds slice `split` of the row in registers: one read, one write."""
    pid = tl.program_id(0)
    row = (pid // SPLITS).to(tl.int64)  # the programs of a row are neighbours: launched together
    split = pid % SPLITS
    x_off = row * stride_xm
    y_off = row * stride_ym
    # Columns [head, head + interior) start and end on 16-byte boundaries (ALIGN elements) and
    # slice_cols is a multiple of 16, so every slice loads and stores whole 16-byte vectors even
    # when rows are not aligned (odd N). The < ALIGN columns around them go to split 0.
    head = tl.minimum((ALIGN - x_off % ALIGN) % ALIGN, N)
    interior = (N - head) // ALIGN * ALIGN
    c0 = head + split * slice_cols
    n_cols = tl.multiple_of(tl.minimum(tl.maximum(interior - split * slice_cols, 0), slice_cols),
                            ALIGN)
    i = tl.arange(0, SLICE)
    x = tl.load(x_ptr + tl.multiple_of(x_off + c0 * stride_xn, ALIGN) + i * stride_xn,
                mask=i < n_cols, other=-float("inf")).to(tl.float32)
    j = tl.arange(0, 2 * ALIGN)
    c_ends = tl.where(j < ALIGN, j, head + interior + j - ALIGN)
    ends_mask = ((j < ALIGN) & (j < head)) | ((j >= ALIGN) & (c_ends < N))
    # split 0's only (compared as a tensor: the interpreter rejects `mask & (split == 0)`)
    ends_mask = ends_mask & (tl.full([2 * ALIGN], split, tl.int32) == 0)
    x_ends = tl.load(x_ptr + x_off + c_ends * stride_xn, mask=ends_mask,
                     other=-float("inf")).to(tl.float32)
    m = tl.maximum(tl.max(x, axis=0), tl.max(x_ends, axis=0))
    m_ref = tl.where(m == -float("inf"), 0.0, m)  # all -inf: exp2 -> 0
    e = tl.exp2((x - m_ref) * LOG2E)
    e_ends = tl.exp2((x_ends - m_ref) * LOG2E)
    total = tl.sum(e, axis=0) + tl.sum(e_ends, axis=0)
    if SPLITS == 1:
        scale = 1.0 / total
    else:
        row_max, row_sum = _row_from_slices(m, total, x_ptr, x_off, N, stride_xn, words_ptr, row,
                                            pid, max_spin, SPLITS, SPLITS_POW2, ALIGN, FALLBACK_N)
        scale = tl.exp2((m - row_max) * LOG2E) / row_sum  # this slice's exps were relative to m
    tl.store(y_ptr + tl.multiple_of(y_off + c0 * stride_yn, ALIGN) + i * stride_yn,
             (e * scale).to(y_ptr.dtype.element_ty), mask=i < n_cols)
    tl.store(y_ptr + y_off + c_ends * stride_yn, (e_ends * scale).to(y_ptr.dtype.element_ty),
             mask=ends_mask)


@triton.jit
def softmax_looped_kernel(x_ptr, y_ptr, words_ptr, N, stride_xm, stride_xn, stride_ym,
                          stride_yn, chunks_per_split, max_spin,
                          SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr, ALIGN: tl.constexpr,
                          BLOCK_N: tl.constexpr, EVICT1: tl.constexpr, EVICT2: tl.constexpr):
    """Program (row, split) takes chunks split * chunks_per_split onwards of the row's
    16-byte-aligned chunks (a row's last slices can be short or empty) and reads them twice."""
    pid = tl.program_id(0)
    row = (pid // SPLITS).to(tl.int64)  # M*N can pass 2^31 elements
    x_off = row * stride_xm
    c_begin = -(x_off % ALIGN) + (pid % SPLITS) * chunks_per_split * BLOCK_N
    num_chunks = tl.minimum(chunks_per_split, tl.cdiv(N - c_begin, BLOCK_N))
    cols = tl.arange(0, BLOCK_N)
    m, s = _row_stats(x_ptr, x_off, c_begin, num_chunks, N, stride_xn, cols, ALIGN, BLOCK_N,
                      EVICT1)
    if SPLITS == 1:
        row_max = m
        row_sum = tl.sum(s, axis=0)
    else:
        row_max, row_sum = _row_from_slices(m, tl.sum(s, axis=0), x_ptr, x_off, N, stride_xn,
                                            words_ptr, row, pid, max_spin, SPLITS, SPLITS_POW2,
                                            ALIGN, BLOCK_N)
    _write_chunks(x_ptr, y_ptr, x_off, row * stride_ym, c_begin, num_chunks, row_max,
                  1.0 / row_sum, N, stride_xn, stride_yn, cols, ALIGN, BLOCK_N, EVICT2)


# Host-side arithmetic is plain Python and configs are cached per shape: triton.cdiv and
# triton.next_power_of_2 are ConstexprFunctions costing ~2.5 us a call on the host, and a
# model launches these kernels hundreds of times a forward.
@functools.lru_cache(maxsize=None)
def _fused_config(M, N):
    """Whole rows per program, ~16 fp32 values per thread, 8K elements a tile; 2K for rows of up
    to 1024 (at 16384x768 and 32768x512 on the H100, 2K tiles with 4 warps ran at the speed of a
    same-bytes copy and 8K tiles 1-5% slower)."""
    block_n = triton.next_power_of_2(N)
    tile = 2048 if block_n <= 1024 else 8192
    block_m = min(max(1, tile // block_n), triton.next_power_of_2(M))
    num_warps = min(16, max(1, block_m * block_n // 512))
    return block_m, block_n, num_warps


@functools.lru_cache(maxsize=None)
def _sm_count(device_index):
    if device_index is None:   # CPU interpreter: a small "GPU" keeps test grids small
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _split_count(M, sm_count):
    """Programs a row needs for ~4 programs per SM in all, never more than there are SMs."""
    return min(-(-4 * sm_count // M), sm_count)


@functools.lru_cache(maxsize=None)
def _resident_plan(M, N, splits, sm_count):
    """(splits, slice_cols, SLICE) for rows held in registers, or None when a row would need
    more programs than there are SMs (they might not all run at once). Slices of at most
    RESIDENT_SLICE elements, 4 warps (64 fp32 a thread); down to 2048 when there are too few
    rows to fill the GPU. On the H100 both the slice size and the register cap mattered: at
    4096x50257 slices of 2048-4096 or 16384 elements ran 11-20% slower, and what counts is how
    many slices an SM holds at once. For 16-bit x a cap of 96 registers (5 programs per SM)
    beat no cap (~113 registers, 4 programs) by 3-7% at every long-row shape tried (2 bytes
    spilled); 88 or fewer spilled 20+ bytes and ran slower. fp32 x spills more under 96, and
    uncapped it runs within 2% of a copy."""
    if splits is None:
        splits = max(-(-N // RESIDENT_SLICE), min(_split_count(M, sm_count), -(-N // 2048)))
        if splits > sm_count:
            return None
    slice_cols = -(-N // splits)
    slice_cols = -(-slice_cols // 16) * 16  # 16-byte vectors for any dtype
    splits = -(-N // slice_cols)  # none starting past the row's end
    return splits, slice_cols, triton.next_power_of_2(slice_cols)


@functools.lru_cache(maxsize=None)
def _looped_plan(M, N, block_n, align, splits, sm_count):
    """(block_n, splits, chunks_per_split) for rows too long for registers. Chunks: 2048 for
    one program per row (sweeps on the H100 and H200), 4096 for rows split once there is a
    program per SM anyway (5-12% faster on the H100 at 132-264 rows of 128256)."""
    if splits is None:
        splits = _split_count(M, sm_count)
    if block_n is None:
        block_n = 4096 if 1 < splits and sm_count <= M else 2048
    chunks = (N + align - 1 + block_n - 1) // block_n   # the most any row's alignment lead needs
    chunks_per_split = -(-chunks // min(splits, chunks))
    return block_n, -(-chunks // chunks_per_split), chunks_per_split


def softmax(x, fused=None, resident=None, splits=None, block_n=None, num_warps=None,
            block_m=None, evict="", evict1="evict_last", evict2="evict_first", max_spin=None):
    """Launch with heuristic settings; the keyword overrides exist for tuning scripts and tests
    (fused=False, resident=False picks the looped kernel; splits= the programs per row)."""
    N = x.shape[-1]
    x2 = x.reshape(-1, N)  # a view for the contiguous inputs the contract promises
    M = x2.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.view(x.shape)
    if fused is None:
        fused = N <= MAX_FUSED_N
    if fused:
        bm, bn, nw = _fused_config(M, N)
        bm, nw = block_m or bm, num_warps or nw
        softmax_fused_kernel[((M + bm - 1) // bm,)](
            x2, y, M, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1),
            BLOCK_M=bm, BLOCK_N=bn, EVICT=evict, num_warps=nw)
        return y.view(x.shape)
    # 16-byte alignment holds for x and y alike only for unit-stride rows whose row strides
    # agree modulo 16 bytes (always so for the contiguous inputs of the contract)
    align = 16 // x.element_size()
    if x2.stride(1) != 1 or (x2.stride(0) - y.stride(0)) % align:
        align = 1
    sm_count = _sm_count(x.device.index if x.is_cuda else None)
    plan = _resident_plan(M, N, splits, sm_count) if resident is not False else None
    if max_spin is None:  # the CPU interpreter runs programs one by one: waiting never helps
        max_spin = SPIN_LIMIT if x.is_cuda else 0
    if plan is not None:
        splits, slice_cols, slice_pow2 = plan
    else:
        block_n, splits, chunks_per_split = _looped_plan(M, N, block_n, align, splits, sm_count)
    if splits > 1:  # a word a program for its (max, sum of exp); -1 = not written yet
        words = torch.full((M * splits,), -1, dtype=torch.int64, device=x.device)
    else:  # one program a row shares nothing: the kernels never touch it (no fill launch)
        words = y
    args = (x2, y, words, N, x2.stride(0), x2.stride(1), y.stride(0), y.stride(1))
    splits_pow2 = 1 << (splits - 1).bit_length()  # plain Python: next_power_of_2 costs ~2.5 us
    if plan is not None:
        # maxnreg is an NVIDIA launch option: ROCm's Triton refuses the keyword
        cap = (RESIDENT_MAXNREG if x.element_size() == 2 and slice_pow2 <= RESIDENT_SLICE
               and torch.version.hip is None else None)
        softmax_resident_kernel[(M * splits,)](
            *args, slice_cols, max_spin, SPLITS=splits, SPLITS_POW2=splits_pow2,
            SLICE=slice_pow2, ALIGN=align, FALLBACK_N=block_n or 256, num_warps=num_warps or 4,
            **({"maxnreg": cap} if cap else {}))
    else:
        softmax_looped_kernel[(M * splits,)](
            *args, chunks_per_split, max_spin, SPLITS=splits, SPLITS_POW2=splits_pow2,
            ALIGN=align, BLOCK_N=block_n, EVICT1=evict1, EVICT2=evict2, num_warps=num_warps or 4)
    return y.view(x.shape)


def kernel_fn(x):
    return softmax(x)
