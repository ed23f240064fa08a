// Per-token log-probabilities and entropies straight from logits, and their gradient, one block
// per row: the log-softmax over the vocabulary is never written out (at Qwen's 151,936 tokens it
// is the largest tensor of a step). The same quantities as roll-tui's CPU kernel
// (kernels/cpu/src/logprobs.rs) and candle's `log_softmax` + gather:
//   lse = m + log(sum_v exp(x_v - m)),  logp_t = x_t - lse,
//   H   = lse - sum_v p_v x_v = log(s) - sum_v e_v (x_v - m) / s  (e_v = exp(x_v - m), s = sum e_v)
// and, for upstream gradients (g_lp, g_h) of a row,
//   d x_v = g_lp (1[v = t] - p_v) - g_h p_v (logp_v + H).

#include <stdint.h>

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum (or max) of one value per thread over the block, returned to every thread. `shared` holds
// one float per warp; blockDim.x is a multiple of 32.
__device__ float block_reduce(float v, float* shared, bool is_max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // `shared` may still be read from the previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? shared[lane] : (is_max ? -INFINITY : 0.0f);
        w = is_max ? warp_max(w) : warp_sum(w);
        if (lane == 0) shared[0] = w;
    }
    __syncthreads();
    return shared[0];
}

// logits (rows, vocab) f32, targets (rows) u32 -> out (rows, 2): (logp of the target, entropy
// or 0). A target outside the vocabulary gives NaN (the host cannot check device data cheaply).
extern "C" __global__ void logprob_entropy_f32(const float* __restrict__ logits,
                                               const uint32_t* __restrict__ targets,
                                               float* __restrict__ out, uint32_t vocab,
                                               int entropy) {
    __shared__ float shared[32];
    const size_t row = blockIdx.x;
    const float* x = logits + row * (size_t)vocab;
    float m = -INFINITY;
    for (uint32_t i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, x[i]);
    m = block_reduce(m, shared, true);
    float s = 0.0f, sx = 0.0f;
    for (uint32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float d = x[i] - m;
        const float e = expf(d);
        s += e;
        if (entropy && e > 0.0f) sx += e * d;
    }
    s = block_reduce(s, shared, false);
    if (entropy) sx = block_reduce(sx, shared, false);
    if (threadIdx.x == 0) {
        const uint32_t t = targets[row];
        const float log_s = logf(s);
        out[2 * row] = t < vocab ? x[t] - m - log_s : __int_as_float(0x7fc00000);
        out[2 * row + 1] = entropy ? log_s - sx / s : 0.0f;
    }
}

// The gradient of the logits from g (rows, 4) = (d logp, d H, logp, H) per row (the forward's
// outputs ride along: lse = x_t - logp_t) -> d (rows, vocab).
extern "C" __global__ void logprob_entropy_grad_f32(const float* __restrict__ logits,
                                                    const uint32_t* __restrict__ targets,
                                                    const float* __restrict__ g,
                                                    float* __restrict__ d, uint32_t vocab,
                                                    int entropy) {
    const size_t row = blockIdx.x;
    const float* x = logits + row * (size_t)vocab;
    float* dx = d + row * (size_t)vocab;
    const uint32_t t = targets[row];
    const float g_lp = g[4 * row];
    const float g_h = entropy ? g[4 * row + 1] : 0.0f;
    const float h = entropy ? g[4 * row + 3] : 0.0f;
    const float lse = (t < vocab ? x[t] : 0.0f) - g[4 * row + 2];
    for (uint32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float logp = x[i] - lse;
        const float p = expf(logp);
        const float entropy_term = p > 0.0f ? -p * (logp + h) : 0.0f;
        float v = -g_lp * p + g_h * entropy_term;
        if (i == t) v += g_lp;
        dx[i] = v;
    }
}
