// Attention of decode steps over the KV cache, one block per query row: the row's scores against
// every cached key (a dot product a thread), their softmax (block reductions), then the weighted
// sum of the values (a thread per output element). candle's generic path does the same in four
// kernels with three intermediate tensors a step (scores, their exponentials, the probabilities).
//
// q: (rows, hd) contiguous, rows = batch * kv_heads * groups (each kv head's query heads one
// after another); k, v: (batch, kv_heads, keys, hd) with the cache's strides (its columns a
// narrowed view of a longer buffer); mask: (batch, groups, keys) additive, contiguous;
// scores: (rows, keys) f32 scratch; out: (rows, hd) in q's dtype. Sums in f32 whatever the dtype.

#include <cuda_bf16.h>
#include <stdint.h>

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void from_f(float x, float* o) { *o = x; }
__device__ __forceinline__ void from_f(float x, __nv_bfloat16* o) { *o = __float2bfloat16(x); }

__device__ float reduce(float v, float* shared, bool is_max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(FULL_MASK, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? shared[lane] : (is_max ? -INFINITY : 0.0f);
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(FULL_MASK, w, o);
            w = is_max ? fmaxf(w, other) : w + other;
        }
        if (lane == 0) shared[0] = w;
    }
    __syncthreads();
    return shared[0];
}

template <typename T>
__device__ void decode_attention(const T* __restrict__ q, const T* __restrict__ k,
                                 const T* __restrict__ v, const float* __restrict__ mask,
                                 float* __restrict__ scores, T* __restrict__ out, uint32_t kv_heads,
                                 uint32_t groups, uint32_t keys, uint32_t hd, uint64_t s_batch,
                                 uint64_t s_head, uint64_t s_key, float scale) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const size_t kv = (row / groups) % kv_heads, n = row / (groups * (size_t)kv_heads);
    const size_t g = row % groups;
    const T* qr = q + row * hd;
    const T* kb = k + n * s_batch + kv * s_head;
    const T* vb = v + n * s_batch + kv * s_head;
    const float* mr = mask + (n * groups + g) * (size_t)keys;
    float* sr = scores + row * (size_t)keys;
    float m = -INFINITY;
    for (uint32_t j = threadIdx.x; j < keys; j += blockDim.x) {
        const T* kj = kb + j * s_key;
        float dot = 0.0f;
        for (uint32_t d = 0; d < hd; ++d) dot += to_f(qr[d]) * to_f(kj[d]);
        const float s = dot * scale + mr[j];
        sr[j] = s;
        m = fmaxf(m, s);
    }
    m = reduce(m, shared, true);
    float sum = 0.0f;
    for (uint32_t j = threadIdx.x; j < keys; j += blockDim.x) {
        const float e = expf(sr[j] - m);
        sr[j] = e;
        sum += e;
    }
    sum = reduce(sum, shared, false);  // its barriers also publish every sr[j]
    const float inv = 1.0f / sum;
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < keys; ++j) acc += sr[j] * to_f(vb[j * s_key + d]);
        from_f(acc * inv, out + row * hd + d);
    }
}

extern "C" __global__ void decode_attention_f32(const float* q, const float* k, const float* v,
                                                const float* mask, float* scores, float* out,
                                                uint32_t kv_heads, uint32_t groups, uint32_t keys,
                                                uint32_t hd, uint64_t s_batch, uint64_t s_head,
                                                uint64_t s_key, float scale) {
    decode_attention(q, k, v, mask, scores, out, kv_heads, groups, keys, hd, s_batch, s_head,
                     s_key, scale);
}

extern "C" __global__ void decode_attention_bf16(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                 const __nv_bfloat16* v, const float* mask,
                                                 float* scores, __nv_bfloat16* out,
                                                 uint32_t kv_heads, uint32_t groups, uint32_t keys,
                                                 uint32_t hd, uint64_t s_batch, uint64_t s_head,
                                                 uint64_t s_key, float scale) {
    decode_attention(q, k, v, mask, scores, out, kv_heads, groups, keys, hd, s_batch, s_head,
                     s_key, scale);
}
