// One AdamW step over a parameter's elements, in place: the moments m and v and the parameter p
// (f32: a bf16 parameter's f32 master) read and written once each, the gradient g read once —
// candle's elementwise ops make a tensor of every intermediate (seven passes over memory and
// their allocations). The same arithmetic as roll-tui's candle path (src/train/optim.rs):
//   g' = clip g,  m = b1 m + (1 - b1) g',  v = b2 v + (1 - b2) g'^2,
//   u = (m / c1) / (sqrt(v / c2) + eps) + wd p,  p = p - lr u      (wd = 0: no decay)

#include <stddef.h>

extern "C" __global__ void adamw_f32(float* __restrict__ p, const float* __restrict__ g,
                                     float* __restrict__ m, float* __restrict__ v, size_t n,
                                     float clip, float b1, float b2, float c1, float c2,
                                     float eps, float lr, float wd) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float gi = g[i] * clip;
        const float mi = b1 * m[i] + (1.0f - b1) * gi;
        const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        const float theta = p[i];
        const float u = (mi / c1) / (sqrtf(vi / c2) + eps) + wd * theta;
        p[i] = theta - lr * u;
    }
}
