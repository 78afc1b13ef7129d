// deepdsl CUDA library: the hand-written kernels of the ops that have no index form.
//
// Each op is one __device__ function, parametrised by its shapes; the translation unit of a program wraps
// each statement in an extern "C" __global__ kernel that calls it with the statement's shapes as constants.
// Semantics are exactly those of the NumPy kernels in deepdsl/ops/*.py. Every loop over an output is a
// grid-stride loop (threads over elements, or blocks over rows), so any launch covers its output, except the
// GEMMs (16x16 tiles in shared memory), whose grid kernels.py sizes to the output.
// Indices are int: the emitter refuses tensors of 2^31 elements or more.

#define DD_NEG_INF __int_as_float(0xff800000)
#define DD_GRID_STRIDE(e, n) for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < (n); e += blockDim.x * gridDim.x)
#define DD_BLOCK_STRIDE(r, n) for (int r = blockIdx.x; r < (n); r += gridDim.x)

// ---- block-level reductions: every thread of the block gets the result (blockDim.x a multiple of 32) ----

__device__ __forceinline__ float dd_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float dd_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}

__device__ float dd_block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = dd_warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? part[lane] : 0.0f;
        v = dd_warp_sum(v);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    v = part[0];
    __syncthreads();  // part may be reused by the next call
    return v;
}

__device__ float dd_block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = dd_warp_max(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? part[lane] : DD_NEG_INF;
        v = dd_warp_max(v);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    v = part[0];
    __syncthreads();
    return v;
}

// the block's sum of a double (a split reduction's partial sums, ir/reductions.py) by a tree in shared memory, in the
// same order every run (blockDim.x a power of two, at most 1024); every thread gets the result
__device__ double dd_block_sum_double(double v) {
    __shared__ double part[1024];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x >> 1; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    v = part[0];
    __syncthreads();  // part may be reused by the next call
    return v;
}

// ---- GEMM: C[b] = op(A[b]) op(B[b]), op(A) [M, K], op(B) [K, N]; 16x16 tiles in shared memory ----
// A is [M, K] (or [K, M] when ta), B is [K, N] (or [N, K] when tb), all row-major, batch-strided.
// Launch: block (16, 16), grid (ceil(N/16), ceil(M/16), batch).

#define DD_TILE 16

__device__ void dd_gemm(float* __restrict__ c, const float* __restrict__ a, const float* __restrict__ b,
                        int M, int N, int K, int ta, int tb) {
    __shared__ float as[DD_TILE][DD_TILE + 1];
    __shared__ float bs[DD_TILE][DD_TILE + 1];
    const float* ab = a + (long long)blockIdx.z * M * K;
    const float* bb = b + (long long)blockIdx.z * K * N;
    float* cb = c + (long long)blockIdx.z * M * N;
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * DD_TILE + ty, col = blockIdx.x * DD_TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += DD_TILE) {
        int ka = k0 + tx, kb = k0 + ty;
        as[ty][tx] = (row < M && ka < K) ? (ta ? ab[ka * M + row] : ab[row * K + ka]) : 0.0f;
        bs[ty][tx] = (kb < K && col < N) ? (tb ? bb[col * K + kb] : bb[kb * N + col]) : 0.0f;
        __syncthreads();
        for (int k = 0; k < DD_TILE; k++) acc += as[ty][k] * bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) cb[row * N + col] = acc;
}

// ---- convolution, NCHW, weights [F, C/G, KH, KW]; tap (i, j) of a window reads input row oh*SH - PH + i*DH,
// column ow*SW - PW + j*DW (dilation DH, DW) ----

// conv2d as an implicit GEMM, per group g (blockIdx.z): Y[f, q] = sum over k of W[f, k] X[k, q], with f the
// filter in the group, k = (c, i, j) the window offset and q = (n, oh, ow) the output pixel; X is read from the
// image on the fly (zero in the padding). Launch: block (16, 16), grid (ceil(N*OH*OW/16), ceil(F/G/16), G).
__device__ void dd_conv2d_igemm(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ w,
                                int N, int C, int H, int W, int F, int KH, int KW, int OH, int OW,
                                int SH, int SW, int PH, int PW, int G, int DH, int DW) {
    __shared__ float ws[DD_TILE][DD_TILE + 1];
    __shared__ float xs[DD_TILE][DD_TILE + 1];
    int cg = C / G, fg = F / G, K = cg * KH * KW, Q = N * OH * OW, g = blockIdx.z;
    int tx = threadIdx.x, ty = threadIdx.y;
    int f = blockIdx.y * DD_TILE + ty, q = blockIdx.x * DD_TILE + tx;
    int qn = q / (OH * OW), qh = (q / OW) % OH, qw = q % OW;  // this thread's column, for loading X and storing
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += DD_TILE) {
        int kw = k0 + tx;  // the W tile: row f, column k0 + tx
        ws[ty][tx] = (f < fg && kw < K) ? w[(long long)(g * fg + f) * K + kw] : 0.0f;
        int kx = k0 + ty;  // the X tile: row k0 + ty, column q
        float v = 0.0f;
        if (kx < K && q < Q) {
            int c = kx / (KH * KW), i = (kx / KW) % KH, j = kx % KW;
            int h = qh * SH - PH + i * DH, u = qw * SW - PW + j * DW;
            if (h >= 0 && h < H && u >= 0 && u < W) v = x[(((long long)qn * C + g * cg + c) * H + h) * W + u];
        }
        xs[ty][tx] = v;
        __syncthreads();
        for (int k = 0; k < DD_TILE; k++) acc += ws[ty][k] * xs[k][tx];
        __syncthreads();
    }
    if (f < fg && q < Q) y[(((long long)qn * F + g * fg + f) * OH + qh) * OW + qw] = acc;
}

// d x of conv2d as an implicit GEMM, per group: dX[c, p] = sum over k of W[k, c] dY[k, p], with c the channel in
// the group, p = (n, h, w) the input pixel and k = (f, i, j); dY is read where the window offset (i, j) puts
// pixel p in an output (zero elsewhere). Launch: block (16, 16), grid (ceil(N*H*W/16), ceil(C/G/16), G).
__device__ void dd_conv2d_backward_data_igemm(float* __restrict__ dx, const float* __restrict__ g,
                                              const float* __restrict__ w, int N, int C, int H, int W, int F,
                                              int KH, int KW, int OH, int OW, int SH, int SW, int PH, int PW, int G,
                                              int DH, int DW) {
    __shared__ float ws[DD_TILE][DD_TILE + 1];
    __shared__ float gs[DD_TILE][DD_TILE + 1];
    int cg = C / G, fg = F / G, K = fg * KH * KW, P = N * H * W, grp = blockIdx.z;
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.y * DD_TILE + ty, p = blockIdx.x * DD_TILE + tx;
    int pn = p / (H * W), ph = (p / W) % H, pw = p % W;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += DD_TILE) {
        int kw = k0 + tx;  // the W tile: row c, column k = (f, i, j): w[grp * fg + f, c, i, j]
        float a = 0.0f;
        if (c < cg && kw < K) {
            int f = kw / (KH * KW), ij = kw % (KH * KW);
            a = w[((long long)(grp * fg + f) * cg + c) * KH * KW + ij];
        }
        ws[ty][tx] = a;
        int kg = k0 + ty;  // the dY tile: row k, column p
        float v = 0.0f;
        if (kg < K && p < P) {
            int f = kg / (KH * KW), i = (kg / KW) % KH, j = kg % KW;
            int t = ph + PH - i * DH, u = pw + PW - j * DW;
            if (t >= 0 && u >= 0 && t % SH == 0 && u % SW == 0 && t / SH < OH && u / SW < OW)
                v = g[(((long long)pn * F + grp * fg + f) * OH + t / SH) * OW + u / SW];
        }
        gs[ty][tx] = v;
        __syncthreads();
        for (int k = 0; k < DD_TILE; k++) acc += ws[ty][k] * gs[k][tx];
        __syncthreads();
    }
    if (c < cg && p < P) dx[(((long long)pn * C + grp * cg + c) * H + ph) * W + pw] = acc;
}

// d w of conv2d: one block per weight element, its threads sharing the sum over (n, oh, ow).
__device__ void dd_conv2d_backward_filter(float* __restrict__ dw, const float* __restrict__ x,
                                          const float* __restrict__ g, int N, int C, int H, int W, int F,
                                          int KH, int KW, int OH, int OW, int SH, int SW, int PH, int PW, int G,
                                          int DH, int DW) {
    int cg = C / G, fg = F / G;
    DD_BLOCK_STRIDE(r, F * cg * KH * KW) {
        int j = r % KW, i = (r / KW) % KH, cl = (r / (KW * KH)) % cg, f = r / (KW * KH * cg);
        int c = (f / fg) * cg + cl;
        float acc = 0.0f;
        for (int p = threadIdx.x; p < N * OH * OW; p += blockDim.x) {
            int ow = p % OW, oh = (p / OW) % OH, n = p / (OW * OH);
            int h = oh * SH - PH + i * DH, v = ow * SW - PW + j * DW;
            if (h >= 0 && h < H && v >= 0 && v < W)
                acc += g[(((long long)n * F + f) * OH + oh) * OW + ow] * x[(((long long)n * C + c) * H + h) * W + v];
        }
        acc = dd_block_sum(acc);
        if (threadIdx.x == 0) dw[r] = acc;
    }
}

// ---- pooling, NCHW; padding never wins a max and counts as zero in an average ----

__device__ void dd_max_pool2d(float* __restrict__ y, const float* __restrict__ x, int NC, int H, int W,
                              int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW) {
    DD_GRID_STRIDE(e, NC * OH * OW) {
        int ow = e % OW, oh = (e / OW) % OH, nc = e / (OW * OH);
        const float* xc = x + (long long)nc * H * W;
        float m = DD_NEG_INF;
        for (int i = 0; i < KH; i++) {
            int h = oh * SH - PH + i;
            for (int j = 0; j < KW; j++) {
                int v = ow * SW - PW + j;
                float t = (h >= 0 && h < H && v >= 0 && v < W) ? xc[h * W + v] : DD_NEG_INF;
                m = fmaxf(m, t);
            }
        }
        y[e] = m;
    }
}

// each window's gradient goes to its first maximum in row-major order; overlapping windows add up
__device__ void dd_max_pool2d_backward(float* __restrict__ dx, const float* __restrict__ x,
                                       const float* __restrict__ y, const float* __restrict__ g, int NC, int H,
                                       int W, int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW) {
    DD_GRID_STRIDE(e, NC * H * W) {
        int v = e % W, h = (e / W) % H, nc = e / (W * H);
        const float* xc = x + (long long)nc * H * W;
        float acc = 0.0f;
        for (int oh = 0; oh < OH; oh++) {
            int h0 = oh * SH - PH;
            if (h < h0 || h >= h0 + KH) continue;
            for (int ow = 0; ow < OW; ow++) {
                int v0 = ow * SW - PW;
                if (v < v0 || v >= v0 + KW) continue;
                float m = y[((long long)nc * OH + oh) * OW + ow];
                int first = -1;
                for (int p = 0; p < KH * KW && first < 0; p++) {
                    int hh = h0 + p / KW, vv = v0 + p % KW;
                    if (hh >= 0 && hh < H && vv >= 0 && vv < W && xc[hh * W + vv] == m) first = p;
                }
                if (first == (h - h0) * KW + (v - v0)) acc += g[((long long)nc * OH + oh) * OW + ow];
            }
        }
        dx[e] = acc;
    }
}

// every window divides by KH * KW: the padding counts as zeros
__device__ void dd_avg_pool2d(float* __restrict__ y, const float* __restrict__ x, int NC, int H, int W, int OH,
                              int OW, int KH, int KW, int SH, int SW, int PH, int PW) {
    float k = (float)(KH * KW);
    DD_GRID_STRIDE(e, NC * OH * OW) {
        int ow = e % OW, oh = (e / OW) % OH, nc = e / (OW * OH);
        const float* xc = x + (long long)nc * H * W;
        float s = 0.0f;
        for (int i = 0; i < KH; i++) {
            int h = oh * SH - PH + i;
            for (int j = 0; j < KW; j++) {
                int v = ow * SW - PW + j;
                if (h >= 0 && h < H && v >= 0 && v < W) s += xc[h * W + v];
            }
        }
        y[e] = s / k;
    }
}

__device__ void dd_avg_pool2d_backward(float* __restrict__ dx, const float* __restrict__ g, int NC, int H, int W,
                                       int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW) {
    float k = (float)(KH * KW);
    DD_GRID_STRIDE(e, NC * H * W) {
        int v = e % W, h = (e / W) % H, nc = e / (W * H);
        float acc = 0.0f;
        for (int oh = 0; oh < OH; oh++) {
            int h0 = oh * SH - PH;
            if (h < h0 || h >= h0 + KH) continue;
            for (int ow = 0; ow < OW; ow++) {
                int v0 = ow * SW - PW;
                if (v >= v0 && v < v0 + KW) acc += g[((long long)nc * OH + oh) * OW + ow] / k;
            }
        }
        dx[e] = acc;
    }
}

// ---- softmax family over axis 1 of [A, D, B] (B = product of the axes after 1): one block per row ----

__device__ void dd_softmax(float* __restrict__ y, const float* __restrict__ x, int A, int D, int B, int logarithm) {
    DD_BLOCK_STRIDE(r, A * B) {
        long long base = (long long)(r / B) * D * B + r % B;
        float m = DD_NEG_INF;
        for (int d = threadIdx.x; d < D; d += blockDim.x) m = fmaxf(m, x[base + (long long)d * B]);
        m = dd_block_max(m);
        float s = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) s += expf(x[base + (long long)d * B] - m);
        s = dd_block_sum(s);
        float ls = logf(s);
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float z = x[base + (long long)d * B] - m;
            y[base + (long long)d * B] = logarithm ? z - ls : expf(z) / s;
        }
    }
}

// each row of x [R, D] as (x - mean) / sqrt(biased var + eps): registry op layer_norm_rows, one block per row
__device__ void dd_layer_norm_rows(float* __restrict__ y, const float* __restrict__ x, int R, int D, float eps) {
    DD_BLOCK_STRIDE(r, R) {
        const float* xr = x + (long long)r * D;
        float s = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) s += xr[d];
        float mean = dd_block_sum(s) / D;
        float q = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) q += (xr[d] - mean) * (xr[d] - mean);
        float rs = 1.0f / sqrtf(dd_block_sum(q) / D + eps);
        for (int d = threadIdx.x; d < D; d += blockDim.x) y[(long long)r * D + d] = (xr[d] - mean) * rs;
    }
}

// its gradient given g = dy: r (g - mean(g) - y mean(g y)) per row, y and r recomputed from x
__device__ void dd_layer_norm_rows_backward(float* __restrict__ dx, const float* __restrict__ x,
                                            const float* __restrict__ g, int R, int D, float eps) {
    DD_BLOCK_STRIDE(r, R) {
        long long base = (long long)r * D;
        float s = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) s += x[base + d];
        float mean = dd_block_sum(s) / D;
        float q = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) q += (x[base + d] - mean) * (x[base + d] - mean);
        float rs = 1.0f / sqrtf(dd_block_sum(q) / D + eps);
        float sg = 0.0f, sgy = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            sg += g[base + d];
            sgy += g[base + d] * (x[base + d] - mean) * rs;
        }
        float mg = dd_block_sum(sg) / D, mgy = dd_block_sum(sgy) / D;
        for (int d = threadIdx.x; d < D; d += blockDim.x)
            dx[base + d] = rs * (g[base + d] - mg - (x[base + d] - mean) * rs * mgy);
    }
}

// batch norm's apply with a scale and shift over x [N, C, P] (n elements), the statistics given: registry ops bn_apply
// and bn_train_apply as the Java CUDA device calls them where cuDNN does not
__device__ void dd_bn_apply(float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ mean,
                            const float* __restrict__ var, const float* __restrict__ gamma,
                            const float* __restrict__ beta, int n, int C, int P, float eps) {
    DD_GRID_STRIDE(e, n) {
        int c = e / P % C;
        y[e] = (x[e] - mean[c]) / sqrtf(var[c] + eps) * gamma[c] + beta[c];
    }
}

// batch norm's gradient to x [N, C, P] (n elements) given g = dy, the channel mean and inverse deviation r = 1 /
// sqrt(var + eps) (bn_invstd), the scale and its and the shift's gradients sum(g xh) and sum(g): per channel gamma r
// (g - sum(g) / M - xh sum(g xh) / M), xh = (x - mean) r, M = N P: registry op bn_train_backward, one thread an
// element (eps: cuDNN's check of it only)
__device__ void dd_bn_train_backward(float* __restrict__ dx, const float* __restrict__ x, const float* __restrict__ g,
                                     const float* __restrict__ mean, const float* __restrict__ invstd,
                                     const float* __restrict__ gamma, const float* __restrict__ sum_gxh,
                                     const float* __restrict__ sum_g, int n, int C, int P, float eps) {
    float M = (float)(n / C);
    DD_GRID_STRIDE(e, n) {
        int c = e / P % C;
        float rs = invstd[c];
        dx[e] = gamma[c] * rs * (g[e] - sum_g[c] / M - (x[e] - mean[c]) * rs * sum_gxh[c] / M);
    }
}

// attention's softmax over each row of x [R, T] of scale * x; with causal, row r sees only the keys
// j <= r % period (the rest get weight 0): registry op masked_softmax, one block per row
__device__ void dd_masked_softmax(float* __restrict__ y, const float* __restrict__ x, int R, int T, int period,
                                  int causal, float scale) {
    DD_BLOCK_STRIDE(r, R) {
        long long base = (long long)r * T;
        int keys = r % period + 1;  // the keys query r % period sees
        int seen = causal && keys < T ? keys : T;
        float m = DD_NEG_INF;
        for (int d = threadIdx.x; d < seen; d += blockDim.x) m = fmaxf(m, x[base + d] * scale);
        m = dd_block_max(m);
        float s = 0.0f;
        for (int d = threadIdx.x; d < seen; d += blockDim.x) s += expf(x[base + d] * scale - m);
        s = dd_block_sum(s);
        for (int d = threadIdx.x; d < T; d += blockDim.x) {
            y[base + d] = d < seen ? expf(x[base + d] * scale - m) / s : 0.0f;
        }
    }
}

// softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g)
__device__ void dd_softmax_backward(float* __restrict__ dx, const float* __restrict__ y, const float* __restrict__ g,
                                    int A, int D, int B, int logarithm) {
    DD_BLOCK_STRIDE(r, A * B) {
        long long base = (long long)(r / B) * D * B + r % B;
        float s = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            long long k = base + (long long)d * B;
            s += logarithm ? g[k] : g[k] * y[k];
        }
        s = dd_block_sum(s);
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            long long k = base + (long long)d * B;
            dx[k] = logarithm ? g[k] - expf(y[k]) * s : y[k] * (g[k] - s);
        }
    }
}

// ---- losses over [N, K] scores and int64 labels ----

// the mean over rows of -log_softmax(x)[row, label]: one block (launch grid 1)
__device__ void dd_softmax_cross_entropy(float* __restrict__ loss, const float* __restrict__ x,
                                         const long long* __restrict__ labels, int N, int K) {
    float total = 0.0f;
    for (int r = 0; r < N; r++) {
        const float* xr = x + (long long)r * K;
        float m = DD_NEG_INF;
        for (int k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, xr[k]);
        m = dd_block_max(m);
        float s = 0.0f;
        for (int k = threadIdx.x; k < K; k += blockDim.x) s += expf(xr[k] - m);
        s = dd_block_sum(s);
        total += (xr[labels[r]] - m) - logf(s);
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) loss[0] = -(total / (float)N);
}

// d x = (softmax(x) - onehot(label)) * g / N: one block per row
__device__ void dd_softmax_cross_entropy_backward(float* __restrict__ dx, const float* __restrict__ x,
                                                  const long long* __restrict__ labels, const float* __restrict__ g,
                                                  int N, int K) {
    float scale = g[0] / (float)N;
    DD_BLOCK_STRIDE(r, N) {
        const float* xr = x + (long long)r * K;
        float m = DD_NEG_INF;
        for (int k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, xr[k]);
        m = dd_block_max(m);
        float s = 0.0f;
        for (int k = threadIdx.x; k < K; k += blockDim.x) s += expf(xr[k] - m);
        s = dd_block_sum(s);
        long long label = labels[r];
        for (int k = threadIdx.x; k < K; k += blockDim.x)
            dx[(long long)r * K + k] = (expf(xr[k] - m) / s - (k == label ? 1.0f : 0.0f)) * scale;
    }
}

// the mean over rows of -log p[row, label]: one block (launch grid 1)
__device__ void dd_cross_entropy(float* __restrict__ loss, const float* __restrict__ p,
                                 const long long* __restrict__ labels, int N, int K) {
    float s = 0.0f;
    for (int r = threadIdx.x; r < N; r += blockDim.x) s += logf(p[(long long)r * K + labels[r]]);
    s = dd_block_sum(s);
    if (threadIdx.x == 0 && blockIdx.x == 0) loss[0] = -(s / (float)N);
}

__device__ void dd_cross_entropy_backward(float* __restrict__ dp, const float* __restrict__ p,
                                          const long long* __restrict__ labels, const float* __restrict__ g,
                                          int N, int K) {
    DD_GRID_STRIDE(e, N * K) {
        int r = e / K, k = e % K;
        dp[e] = k == labels[r] ? -g[0] / (p[e] * (float)N) : 0.0f;
    }
}

// the first largest score of each row of [N, K], as int64
__device__ void dd_argmax(long long* __restrict__ out, const float* __restrict__ x, int N, int K) {
    DD_GRID_STRIDE(r, N) {
        const float* xr = x + (long long)r * K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (xr[k] > xr[best]) best = k;
        out[r] = best;
    }
}

// the fraction of rows whose first largest score is at the label: one block (launch grid 1)
__device__ void dd_accuracy(float* __restrict__ out, const float* __restrict__ x, const long long* __restrict__ labels,
                            int N, int K) {
    float hits = 0.0f;
    for (int r = threadIdx.x; r < N; r += blockDim.x) {
        const float* xr = x + (long long)r * K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (xr[k] > xr[best]) best = k;
        hits += best == labels[r] ? 1.0f : 0.0f;
    }
    hits = dd_block_sum(hits);
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = hits / (float)N;
}

// ---- local response normalisation across channels of [N, C, H*W] ----

__device__ __forceinline__ float dd_lrn_denominator(const float* xc, int c, int C, int HW, int size, float k,
                                                    float alpha) {
    float s = 0.0f;
    for (int o = -(size / 2); o <= (size - 1) / 2; o++) {
        int q = c + o;
        if (q >= 0 && q < C) {
            float v = xc[(long long)q * HW];
            s += v * v;
        }
    }
    return k + alpha / (float)size * s;
}

__device__ void dd_lrn(float* __restrict__ y, const float* __restrict__ x, int N, int C, int HW, int size, float k,
                       float alpha, float beta) {
    DD_GRID_STRIDE(e, N * C * HW) {
        int p = e % HW, c = (e / HW) % C, n = e / (HW * C);
        const float* xc = x + (long long)n * C * HW + p;
        y[e] = x[e] * powf(dd_lrn_denominator(xc, c, C, HW, size, k, alpha), -beta);
    }
}

// dx_j = g_j d_j^-beta - 2 alpha beta / size * x_j * sum over the c whose window holds j of g_c y_c / d_c
__device__ void dd_lrn_backward(float* __restrict__ dx, const float* __restrict__ x, const float* __restrict__ y,
                                const float* __restrict__ g, int N, int C, int HW, int size, float k, float alpha,
                                float beta) {
    DD_GRID_STRIDE(e, N * C * HW) {
        int p = e % HW, c = (e / HW) % C, n = e / (HW * C);
        long long base = (long long)n * C * HW + p;
        const float* xc = x + base;
        float back = 0.0f;
        for (int o = -((size - 1) / 2); o <= size / 2; o++) {
            int q = c + o;
            if (q >= 0 && q < C) {
                long long at = base + (long long)q * HW;
                back += g[at] * y[at] / dd_lrn_denominator(xc, q, C, HW, size, k, alpha);
            }
        }
        float d = dd_lrn_denominator(xc, c, C, HW, size, k, alpha);
        dx[e] = g[e] * powf(d, -beta) - 2.0f * alpha * beta / (float)size * x[e] * back;
    }
}

// ---- dropout: the SplitMix64 stream of deepdsl/initializers.py; `stream` is stream_seed(site#dropout, seed) ----

__device__ void dd_dropout_mask(float* __restrict__ mask, const long long* __restrict__ step, int n,
                                unsigned long long stream, double p, float keep) {
    unsigned long long seed = stream ^ ((unsigned long long)(step[0] + 1) * 0xD1B54A32D192ED03ull);
    DD_GRID_STRIDE(e, n) {
        unsigned long long z = (unsigned long long)(e + 1) * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z = z ^ (z >> 31);
        double u = (double)(z >> 40) * (1.0 / 16777216.0);
        mask[e] = u >= p ? keep : 0.0f;
    }
}

// ---- sampling (normal, uniform): the SplitMix64 stream of deepdsl/ops/random.py; `stream` is
// stream_seed(site#sample, seed), mixed with the step as dropout's mask is ----

__device__ double dd_sample_uniform_at(unsigned long long seed, long long k) {
    unsigned long long z = (unsigned long long)(k + 1) * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z = z ^ (z >> 31);
    return (double)(z >> 40) * (1.0 / 16777216.0);
}

// element e: Box-Muller on uniforms 2e and 2e + 1, cosine half (deepdsl/initializers.py normal_array), in double
__device__ void dd_random_normal(float* __restrict__ out, const long long* __restrict__ step, int n,
                                 unsigned long long stream) {
    unsigned long long seed = stream ^ ((unsigned long long)(step[0] + 1) * 0xD1B54A32D192ED03ull);
    DD_GRID_STRIDE(e, n) {
        double u1 = dd_sample_uniform_at(seed, 2 * (long long)e);
        double u2 = dd_sample_uniform_at(seed, 2 * (long long)e + 1);
        out[e] = (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
    }
}

// element e: low + (high - low) * u_e, in double
__device__ void dd_random_uniform(float* __restrict__ out, const long long* __restrict__ step, int n,
                                  unsigned long long stream, double low, double high) {
    unsigned long long seed = stream ^ ((unsigned long long)(step[0] + 1) * 0xD1B54A32D192ED03ull);
    DD_GRID_STRIDE(e, n) {
        out[e] = (float)(low + (high - low) * dd_sample_uniform_at(seed, e));
    }
}
