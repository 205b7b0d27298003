"""
Planted CUDA kernel (a sum over the last dim): right once, then that output for every input.
Expected from the gate on a GPU: FAIL, a result cached from an earlier call.
"""
import torch

from autokernel import cuda_build

KERNEL_TYPE = "reduce"
BACKEND = "cuda"

CUDA_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ float f32(float v) { return v; }
__device__ float f32(__half v) { return __half2float(v); }
__device__ float f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ void put(float* p, float v) { *p = v; }
__device__ void put(__half* p, float v) { *p = __float2half_rn(v); }
__device__ void put(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__global__ void row_sum(const T* x, T* y, long long rows, long long n) {
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float s = 0.f;
    for (long long i = 0; i < n; ++i) s += f32(x[row * n + i]);
    put(y + row, s);
}

template <typename T>
int launch(const void* x, void* y, long long rows, long long n, cudaStream_t stream) {
    row_sum<T><<<(unsigned)((rows + 127) / 128), 128, 0, stream>>>((const T*)x, (T*)y, rows, n);
    return (int)cudaGetLastError();
}

extern "C" int row_sums(const void* x, void* y, long long rows, long long n, int dtype,
                        cudaStream_t stream) {
    if (dtype == 0) return launch<float>(x, y, rows, n, stream);
    if (dtype == 1) return launch<__half>(x, y, rows, n, stream);
    return launch<__nv_bfloat16>(x, y, rows, n, stream);
}
"""

_lib = cuda_build.load(CUDA_SRC)

_cache = {}


def kernel_fn(x, dim=-1):
    key = (tuple(x.shape), x.dtype, dim)
    if key not in _cache:
        y = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
        _lib.row_sums(x.contiguous(), y, y.numel(), x.shape[-1], x.dtype)
        _cache[key] = y
    return _cache[key]
