"""
Decode attention in CUDA C++: Q[B, Hq, Sq, D], the newest Sq positions of each sequence, over a
static KV cache K/V[B, Hkv, L, D] whose first lengths[b] positions are live. Starter kernel for
AutoKernel (BACKEND = "cuda"): query i of sequence b sits at position lengths[b] - Sq + i and
attends to the cache up to it; query head h reads key/value head h // (Hq / Hkv); scale
1/sqrt(D) unless given. Output [B, Hq, Sq, D] in Q's dtype, math in fp32.

Split-KV ("flash-decoding"), two kernels:
  * partial: a block per (query row, slice of the cache), four warps. A warp takes one key at a
    time: each lane holds D/32 of the query's elements, the dot product is a warp shuffle
    reduction, and the warp keeps its own online softmax (max m, sum l, and D/32 accumulator
    elements per lane). The four warps' states are merged through shared memory and the slice's
    (m, l, unnormalized output) written out in fp32.
  * combine: a block per query row rescales its slices to a common max and divides by the sum.
The slice count gives the partial kernel about two blocks per SM over the full cache (the live
length is only known on the device); slices past the live length return at once with l = 0.
Positions past lengths[b] are never read, so stale or NaN values there cannot leak in.

Things to try: a block per key/value head holding all GROUP query heads (each key read once
instead of GROUP times; the Triton starter does this with tl.dot), 16-byte vector loads of K
and V rows (D = 64 in bf16 is 128 bytes: 8 lanes of 16 bytes instead of 32 lanes of 4), several
keys in flight per warp.

Usage:
  uv run bench.py --kernel kernels/cuda/decode_attention.py     # on a GPU machine
"""
import torch

from autokernel import cuda_build

KERNEL_TYPE = "decode_attention"
BACKEND = "cuda"

MAX_D = 256  # 8 elements a lane
WARPS = 4

CUDA_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

constexpr int WARPS = 4;
constexpr int PER_LANE = 8;  // D <= 256

struct Shape {               // element strides of Q [B, H, Sq, D] and of K, V [B, Hkv, L, D]
    long long qb, qh, qs, qd, kb, kh, kn, kd, vb, vh, vn, vd;
    int H, Hkv, Sq, L, D, splits, split_len;
    float scale;
};

// One block per (query row = (b, h, i), slice). Partial results at [row, slice].
template <typename T>
__global__ void __launch_bounds__(WARPS * 32)
decode_partial(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
               const int* __restrict__ lengths, float* __restrict__ part_o,
               float* __restrict__ part_ml, Shape S) {
    const int row = blockIdx.x, slice = blockIdx.y;
    const int i = row % S.Sq, h = (row / S.Sq) % S.H, b = row / (S.Sq * S.H);
    const int hkv = h / (S.H / S.Hkv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int query_pos = lengths[b] - S.Sq + i;          // sees keys 0 .. query_pos
    const int start = slice * S.split_len;
    const int end = min(start + S.split_len, query_pos + 1);

    float qv[PER_LANE], acc[PER_LANE];
    const T* qrow = q + b * S.qb + h * S.qh + i * S.qs;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
        const int d = lane + 32 * e;
        qv[e] = d < S.D ? to_f32(qrow[d * S.qd]) * S.scale : 0.f;
        acc[e] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const T* kbase = k + b * S.kb + hkv * S.kh;
    const T* vbase = v + b * S.vb + hkv * S.vh;
    for (int n = start + warp; n < end; n += WARPS) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
            const int d = lane + 32 * e;
            if (d < S.D) dot += qv[e] * to_f32(kbase[n * S.kn + d * S.kd]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        const float m_new = fmaxf(m, dot);
        const float alpha = __expf(m - m_new), p = __expf(dot - m_new);
        l = l * alpha + p;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
            const int d = lane + 32 * e;
            acc[e] = acc[e] * alpha + (d < S.D ? p * to_f32(vbase[n * S.vn + d * S.vd]) : 0.f);
        }
        m = m_new;
    }

    // merge the warps: each writes (m, l) and its accumulator, warp 0 combines
    __shared__ float sm_m[WARPS], sm_l[WARPS], sm_acc[WARPS][32 * PER_LANE];
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) sm_acc[warp][lane + 32 * e] = acc[e];
    __syncthreads();
    if (warp != 0) return;
    float m_all = -INFINITY;
    for (int w = 0; w < WARPS; ++w) m_all = fmaxf(m_all, sm_m[w]);
    float l_all = 0.f, out[PER_LANE];
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) out[e] = 0.f;
    for (int w = 0; w < WARPS; ++w) {
        const float wgt = sm_l[w] > 0.f ? __expf(sm_m[w] - m_all) : 0.f;  // an idle warp: 0
        l_all += sm_l[w] * wgt;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) out[e] += sm_acc[w][lane + 32 * e] * wgt;
    }
    const long long p = (long long)row * S.splits + slice;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
        const int d = lane + 32 * e;
        if (d < S.D) part_o[p * S.D + d] = out[e];
    }
    if (lane == 0) { part_ml[2 * p] = m_all; part_ml[2 * p + 1] = l_all; }
}

// One block (a warp) per query row: the slices rescaled to a common max, summed, divided.
template <typename T>
__global__ void decode_combine(const float* __restrict__ part_o,
                               const float* __restrict__ part_ml, T* __restrict__ out, Shape S) {
    const long long row = blockIdx.x;
    float m_all = -INFINITY;
    for (int s = 0; s < S.splits; ++s) m_all = fmaxf(m_all, part_ml[2 * (row * S.splits + s)]);
    float l_all = 0.f;
    for (int s = 0; s < S.splits; ++s) {
        const float l = part_ml[2 * (row * S.splits + s) + 1];
        if (l > 0.f) l_all += l * __expf(part_ml[2 * (row * S.splits + s)] - m_all);
    }
    for (int d = threadIdx.x; d < S.D; d += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < S.splits; ++s) {
            const long long p = row * S.splits + s;
            const float l = part_ml[2 * p + 1];
            if (l > 0.f) o += part_o[p * S.D + d] * __expf(part_ml[2 * p] - m_all);
        }
        out[row * S.D + d] = from_f32<T>(o / l_all);  // out is contiguous [B, H, Sq, D]
    }
}

template <typename T>
int launch(const void* q, const void* k, const void* v, const int* lengths, float* part_o,
           float* part_ml, void* out, Shape S, long long rows, cudaStream_t stream) {
    decode_partial<T><<<dim3((unsigned)rows, S.splits), WARPS * 32, 0, stream>>>(
        (const T*)q, (const T*)k, (const T*)v, lengths, part_o, part_ml, S);
    decode_combine<T><<<(unsigned)rows, 32, 0, stream>>>(part_o, part_ml, (T*)out, S);
    return (int)cudaGetLastError();
}

// dtype: 0 float32, 1 float16, 2 bfloat16 (cuda_build.DTYPE_CODES); Q, K, V and out share it.
extern "C" int decode_attention(const void* q, const void* k, const void* v,
                                const int* lengths, float* part_o, float* part_ml, void* out,
                                long long qb, long long qh, long long qs, long long qd,
                                long long kb, long long kh, long long kn, long long kd,
                                long long vb, long long vh, long long vn, long long vd,
                                int B, int H, int Hkv, int Sq, int L, int D, int splits,
                                int split_len, float scale, int dtype, cudaStream_t stream) {
    const Shape S{qb, qh, qs, qd, kb, kh, kn, kd, vb, vh, vn, vd, H, Hkv, Sq, L, D, splits,
                  split_len, scale};
    const long long rows = (long long)B * H * Sq;
    switch (dtype) {
        case 0: return launch<float>(q, k, v, lengths, part_o, part_ml, out, S, rows, stream);
        case 1: return launch<__half>(q, k, v, lengths, part_o, part_ml, out, S, rows, stream);
        case 2:
            return launch<__nv_bfloat16>(q, k, v, lengths, part_o, part_ml, out, S, rows, stream);
    }
    return (int)cudaErrorInvalidValue;
}
"""

_lib = cuda_build.load(CUDA_SRC)
_SM_COUNT = {}


def _slices(B, H, Sq, L, device):
    """(slice count, slice length): about two partial blocks per SM over the full cache, a
    slice at least 64 keys."""
    if device not in _SM_COUNT:
        _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = max(1, -(-2 * _SM_COUNT[device] // (B * H * Sq)))
    split_len = max(64, -(-max(L, 1) // wanted))
    return -(-max(L, 1) // split_len), split_len


def kernel_fn(Q, K, V, lengths, scale=None):
    B, H, Sq, D = Q.shape
    Hkv, L = K.shape[1], K.shape[2]
    if H % Hkv or K.shape != V.shape or K.shape[0] != B or K.shape[3] != D or D > MAX_D:
        raise ValueError(f"Q {tuple(Q.shape)} and K/V {tuple(K.shape)} do not fit (D <= {MAX_D})")
    if V.dtype != Q.dtype or K.dtype != Q.dtype or lengths.dtype != torch.int32:
        raise ValueError("Q, K and V must share a dtype, and lengths be int32")
    splits, split_len = _slices(B, H, Sq, L, Q.device)
    rows = B * H * Sq
    part_o = torch.empty((rows * splits, D), dtype=torch.float32, device=Q.device)
    part_ml = torch.empty((rows * splits, 2), dtype=torch.float32, device=Q.device)
    out = torch.empty((B, H, Sq, D), dtype=Q.dtype, device=Q.device)
    if out.numel():
        _lib.decode_attention(Q, K, V, lengths, part_o, part_ml, out, *Q.stride(), *K.stride(),
                              *V.stride(), B, H, Hkv, Sq, L, D, splits, split_len,
                              D ** -0.5 if scale is None else float(scale), Q.dtype)
    return out
