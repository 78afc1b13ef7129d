// deepdsl CUDA library: the hand-written kernels of the ops that have no index form.
//
// Each op is one __device__ function, parametrised by its shapes; the translation unit of a program wraps
// each statement in an extern "C" __global__ kernel that calls it with the statement's shapes as constants.
// Semantics are exactly those of the NumPy kernels in deepdsl/ops/*.py. Every loop over an output is a
// grid-stride loop (threads over elements, or blocks over rows), so any launch covers its output, except the
// GEMMs and convolutions (register-tiled, dd_tiled), whose grid cuda/ops.py sizes to the output.
// Indices are int: the emitter refuses tensors of 2^31 elements or more.

#define DD_NEG_INF __int_as_float(0xff800000)
#define DD_GRID_STRIDE(e, n) for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < (n); e += blockDim.x * gridDim.x)
#define DD_BLOCK_STRIDE(r, n) for (int r = blockIdx.x; r < (n); r += gridDim.x)

// ---- bf16 storage (--precision bf16, passes/precision.py): a value the plan stores as bfloat16 is the top 16 bits
// of its float32; every kernel computes in float and only loads and stores bf16. Written here rather than taken
// from cuda_bf16.h (which NVRTC from PyPI may lack); the rounding is ops/precision.py's bf16_bits, bit for bit:
// round to nearest, ties to even, on the float's bits (a finite value may round to an infinity); a NaN stays a NaN,
// made quiet. A dd_bf16 reads as a float wherever one is wanted and is assigned from one, rounding; it converts
// from nothing else, so a pointer of the wrong type is a compile error, not a silent reinterpretation. ----

__device__ __forceinline__ unsigned short dd_bf16_bits(float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float dd_bf16_float(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }

struct dd_bf16 {
    unsigned short bits;
    __device__ __forceinline__ operator float() const { return dd_bf16_float(bits); }
    __device__ __forceinline__ dd_bf16& operator=(float v) {
        bits = dd_bf16_bits(v);
        return *this;
    }
};

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

// ---- a reduction split over blocks in one launch: the last block to finish adds the partial sums ----
// (ir/reductions.py; CUDA's threadFenceReduction sample). Every block writes its partial sums, then counts itself
// done on dd_pass_count; the block that counts last (it sees blocks - 1) adds every output's partial sums in slice
// order and writes the results. The counter is zero when the module loads (its initialiser) and atomicInc wraps it
// back to zero at the last block, so every pass, step and replay of a CUDA graph starts from zero. One counter
// serves every pass of the module: our launches run one after another on one stream (a launch starts after the one
// before it has finished, its last block's reset included), in a graph captured from that stream too.
__device__ unsigned int dd_pass_count = 0;

// Whether this block is the last of its launch to get here: called by every thread of every block after the block's
// partial sums are written; true in the last block's threads, which may then read every block's partial sums.
__device__ bool dd_last_block() {
    __shared__ bool last;
    __threadfence();  // this block's partial sums are visible to every block before it counts itself done
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
        last = atomicInc(&dd_pass_count, blocks - 1) == blocks - 1;  // the last wraps the counter back to 0
    }
    __syncthreads();
    if (last) __threadfence();  // as the sample: the other blocks' partial sums are read after the count
    return last;
}

// ---- register-tiled GEMM core: C[row, col] = sum over k of A[row, k] B[k, col] for one block's tile ----
// A block of 16x16 threads computes a DD_BM x DD_BN tile (64 rows by 128 columns), each thread 4 rows by 8 columns
// in registers (columns tx*4.. and 64 + tx*4..), so that one k-step reads 3 float4 from shared memory for 32 FMAs.
// The k-range goes in steps of DD_BK through shared memory, double-buffered: the next step's global loads are issued
// before this step's FMAs and stored to the other buffer after them, one __syncthreads per step. A loader `L` says
// what A, B and C are (a GEMM's matrices, or a convolution's implicit im2col matrices):
//   ARow arow(row), BCol bcol(col): what a row of A / a column of B needs, computed once per thread;
//   float a(ARow, k), float b(BCol, k): the elements (the core calls them only for row < M, col < N, k < k1);
//   long long crow(row) + ccol(col): where C[row, col] lies; A_K_FAST / B_K_FAST: whether consecutive threads load
//   consecutive k (A or B contiguous along k) or consecutive rows / columns, so that global loads coalesce.
// Each output's sum runs over k in order, one FMA at a time: the same bits every run.

#define DD_BM 64
#define DD_BN 128
#define DD_BK 8
#define DD_PAD 4  // a shared row's padding: a k-fast stash hits 8 distinct banks, float4 reads stay aligned

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
typedef float4 dd_f4;
#else
struct alignas(16) dd_f4 { float x, y, z, w; };  // the CPU emulator's (tests/backends/cuda_emulator.py)
#endif

template <class L, class TC>
__device__ void dd_tiled(TC* __restrict__ c, const L& ld, int M, int N, int k0, int k1) {
    alignas(16) __shared__ float as[2][DD_BK][DD_BM + DD_PAD];
    alignas(16) __shared__ float bs[2][DD_BK][DD_BN + DD_PAD];
    const int tx = threadIdx.x, ty = threadIdx.y, t = ty * 16 + tx;
    const int row0 = blockIdx.y * DD_BM, col0 = blockIdx.x * DD_BN;
    // this thread's share of each step's loads: 2 elements of A's [DD_BK, DD_BM] tile, 4 of B's [DD_BK, DD_BN]
    int ar[2], ak[2], bc[4], bk[4];
    bool aok[2], bok[4];
    typename L::ARow arow[2];
    typename L::BCol bcol[4];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        ar[e] = L::A_K_FAST ? (t >> 3) + 32 * e : t & 63;
        ak[e] = L::A_K_FAST ? t & 7 : (t >> 6) + 4 * e;
        aok[e] = row0 + ar[e] < M;
        arow[e] = ld.arow(aok[e] ? row0 + ar[e] : 0);
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        bc[e] = L::B_K_FAST ? (t >> 3) + 32 * e : t & 127;
        bk[e] = L::B_K_FAST ? t & 7 : (t >> 7) + 2 * e;
        bok[e] = col0 + bc[e] < N;
        bcol[e] = ld.bcol(bok[e] ? col0 + bc[e] : 0);
    }
    float ra[2], rb[4];
    float acc[4][8];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
    const int steps = k1 > k0 ? (k1 - k0 + DD_BK - 1) / DD_BK : 0;
    if (steps > 0) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int k = k0 + ak[e];
            as[0][ak[e]][ar[e]] = aok[e] && k < k1 ? ld.a(arow[e], k) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int k = k0 + bk[e];
            bs[0][bk[e]][bc[e]] = bok[e] && k < k1 ? ld.b(bcol[e], k) : 0.0f;
        }
    }
    __syncthreads();
    for (int s = 0; s < steps; s++) {
        const int cur = s & 1, next = k0 + (s + 1) * DD_BK;
        const bool more = s + 1 < steps;
        if (more) {  // the next step's loads, in flight during this step's FMAs
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int k = next + ak[e];
                ra[e] = aok[e] && k < k1 ? ld.a(arow[e], k) : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int k = next + bk[e];
                rb[e] = bok[e] && k < k1 ? ld.b(bcol[e], k) : 0.0f;
            }
        }
#pragma unroll
        for (int k = 0; k < DD_BK; k++) {
            const dd_f4 a = *reinterpret_cast<const dd_f4*>(&as[cur][k][ty * 4]);
            const dd_f4 b0 = *reinterpret_cast<const dd_f4*>(&bs[cur][k][tx * 4]);
            const dd_f4 b1 = *reinterpret_cast<const dd_f4*>(&bs[cur][k][64 + tx * 4]);
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) {  // into the other buffer, which every thread finished reading before the last __syncthreads
#pragma unroll
            for (int e = 0; e < 2; e++) as[cur ^ 1][ak[e]][ar[e]] = ra[e];
#pragma unroll
            for (int e = 0; e < 4; e++) bs[cur ^ 1][bk[e]][bc[e]] = rb[e];
        }
        __syncthreads();
    }
    long long cc[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int col = col0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
        cc[j] = col < N ? ld.ccol(col) : -1;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = row0 + ty * 4 + i;
        if (row >= M) continue;
        long long r = ld.crow(row);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (cc[j] >= 0) c[r + cc[j]] = acc[i][j];
    }
}

// ---- GEMM: C[b] = op(A[b]) op(B[b]), op(A) [M, K], op(B) [K, N] ----
// A is [M, K] (or [K, M] when ta), B is [K, N] (or [N, K] when tb), all row-major, batch-strided.
// Launch: block (16, 16), grid (ceil(N/DD_BN), ceil(M/DD_BM), batch).

template <bool TA, bool TB, class XA, class XB>
struct dd_gemm_loader {
    typedef int ARow;
    typedef int BCol;
    static constexpr bool A_K_FAST = !TA, B_K_FAST = TB;
    const XA* pa;
    const XB* pb;
    int M, N, K;
    __device__ int arow(int row) const { return row; }
    __device__ int bcol(int col) const { return col; }
    __device__ float a(int row, int k) const { return TA ? pa[(long long)k * M + row] : pa[(long long)row * K + k]; }
    __device__ float b(int col, int k) const { return TB ? pb[(long long)col * K + k] : pb[(long long)k * N + col]; }
    __device__ long long crow(int row) const { return (long long)row * N; }
    __device__ long long ccol(int col) const { return col; }
};

template <class TC, class XA, class XB>
__device__ void dd_gemm(TC* __restrict__ c, const XA* __restrict__ a, const XB* __restrict__ b,
                        int M, int N, int K, int ta, int tb) {
    const XA* ab = a + (long long)blockIdx.z * M * K;
    const XB* bb = b + (long long)blockIdx.z * K * N;
    TC* cb = c + (long long)blockIdx.z * M * N;
    if (ta && tb) dd_tiled(cb, dd_gemm_loader<true, true, XA, XB>{ab, bb, M, N, K}, M, N, 0, K);
    else if (ta) dd_tiled(cb, dd_gemm_loader<true, false, XA, XB>{ab, bb, M, N, K}, M, N, 0, K);
    else if (tb) dd_tiled(cb, dd_gemm_loader<false, true, XA, XB>{ab, bb, M, N, K}, M, N, 0, K);
    else dd_tiled(cb, dd_gemm_loader<false, false, XA, XB>{ab, bb, M, N, K}, M, N, 0, K);
}

// ---- convolution, NCHW, weights [F, C/G, KH, KW]; tap (i, j) of a window reads input row oh*SH - PH + i*DH,
// column ow*SW - PW + j*DW (dilation DH, DW); all three are implicit GEMMs on dd_tiled, per group ----

// conv2d: Y[f, q] = sum over k of W[f, k] X[k, q], with f the filter in group g, k = (c, i, j) the window offset
// and q = (n, oh, ow) the output pixel; X is read from the image on the fly (zero in the padding).
// Launch: block (16, 16), grid (ceil(N*OH*OW/DD_BN), ceil(F/G/DD_BM), G).
template <class X1, class X2>
struct dd_conv_forward_loader {
    struct BCol {
        long long base;  // the pixel's image at the group's first channel
        int h0, w0;      // its window's corner
    };
    typedef long long ARow;
    static constexpr bool A_K_FAST = true, B_K_FAST = false;
    const X1* x;
    const X2* w;
    int C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, g, cg, fg, K;
    __device__ long long arow(int f) const { return (long long)(g * fg + f) * K; }
    __device__ float a(long long r, int k) const { return w[r + k]; }
    __device__ BCol bcol(int q) const {
        int n = q / (OH * OW), oh = q / OW % OH, ow = q % OW;
        return {((long long)n * C + g * cg) * H * W, oh * SH - PH, ow * SW - PW};
    }
    __device__ float b(const BCol& p, int k) const {
        int c = k / (KH * KW), i = k / KW % KH, j = k % KW;
        int h = p.h0 + i * DH, u = p.w0 + j * DW;
        return h >= 0 && h < H && u >= 0 && u < W ? x[p.base + ((long long)c * H + h) * W + u] : 0.0f;
    }
    __device__ long long crow(int f) const { return (long long)(g * fg + f) * OH * OW; }
    __device__ long long ccol(int q) const { return (long long)(q / (OH * OW)) * F * OH * OW + q % (OH * OW); }
};

template <class TY, class TX, class TW>
__device__ void dd_conv2d_igemm(TY* __restrict__ y, const TX* __restrict__ x, const TW* __restrict__ w,
                                int N, int C, int H, int W, int F, int KH, int KW, int OH, int OW,
                                int SH, int SW, int PH, int PW, int G, int DH, int DW) {
    int cg = C / G, fg = F / G, K = cg * KH * KW;
    dd_conv_forward_loader<TX, TW> ld{x, w, C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, (int)blockIdx.z, cg, fg, K};
    dd_tiled(y, ld, fg, N * OH * OW, 0, K);
}

// d x of conv2d: dX[c, p] = sum over k of W[k, c] dY[k, p], with c the channel in group g, p = (n, h, w) the input
// pixel and k = (f, i, j); dY is read where the window offset (i, j) puts pixel p in an output (zero elsewhere).
// Stride 1: every tap of every pixel.
template <class X1, class X2>
struct dd_conv_data_loader {
    struct BCol {
        long long base;  // the pixel's image in dY at the group's first filter
        int th, tw;      // its row and column plus the padding
    };
    typedef int ARow;
    static constexpr bool A_K_FAST = true, B_K_FAST = false;
    const X1* dy;
    const X2* w;
    int C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, g, cg, fg;
    __device__ int arow(int c) const { return c; }
    __device__ float a(int c, int k) const {
        int f = k / (KH * KW), ij = k % (KH * KW);
        return w[((long long)(g * fg + f) * cg + c) * KH * KW + ij];
    }
    __device__ BCol bcol(int p) const {
        int n = p / (H * W), h = p / W % H, v = p % W;
        return {((long long)n * F + g * fg) * OH * OW, h + PH, v + PW};
    }
    __device__ float b(const BCol& p, int k) const {
        int f = k / (KH * KW), i = k / KW % KH, j = k % KW;
        int t = p.th - i * DH, u = p.tw - j * DW;
        if (t < 0 || u < 0 || t % SH != 0 || u % SW != 0 || t / SH >= OH || u / SW >= OW) return 0.0f;
        return dy[p.base + ((long long)f * OH + t / SH) * OW + u / SW];
    }
    __device__ long long crow(int c) const { return (long long)(g * cg + c) * H * W; }
    __device__ long long ccol(int p) const { return (long long)(p / (H * W)) * C * H * W + p % (H * W); }
};

// One phase of a strided convolution's input pixels: the rows h with h + PH = rh (mod SH) and the columns v with
// v + PW = rw (mod SW) see only the taps i with i*DH = rh (mod SH) and j with j*DW = rw (mod SW), an arithmetic
// progression i0, i0 + istep, ... (ti of them; likewise j): so the GEMM's k = (f, the tap's place in those) skips
// the taps the stride leaves out instead of reading zeros for them.
struct dd_conv_phase {
    int h0, hn, i0, istep, ti;  // the phase's first row, its rows, its first tap, the taps' step, their number
    __device__ dd_conv_phase(int r, int S, int P, int D, int K, int H) {
        h0 = ((r - P) % S + S) % S;
        hn = h0 < H ? (H - h0 + S - 1) / S : 0;
        int a = S, b = D;  // istep = S / gcd(S, D)
        while (b) {
            int t = a % b;
            a = b;
            b = t;
        }
        istep = S / a;
        i0 = -1;
        for (int i = 0; i < istep && i < K && i0 < 0; i++)
            if (i * D % S == r) i0 = i;
        ti = i0 < 0 ? 0 : (K - 1 - i0) / istep + 1;
    }
};

template <class X1, class X2>
struct dd_conv_strided_data_loader {
    struct BCol {
        long long base;  // the pixel's image in dY at the group's first filter
        int th, tw;      // its row and column plus the padding
    };
    typedef int ARow;
    static constexpr bool A_K_FAST = true, B_K_FAST = false;
    const X1* dy;
    const X2* w;
    int C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, g, cg, fg;
    dd_conv_phase ph, pw;
    __device__ int arow(int c) const { return c; }
    __device__ float a(int c, int k) const {
        int f = k / (ph.ti * pw.ti), i = ph.i0 + k / pw.ti % ph.ti * ph.istep, j = pw.i0 + k % pw.ti * pw.istep;
        return w[(((long long)(g * fg + f) * cg + c) * KH + i) * KW + j];
    }
    __device__ BCol bcol(int p) const {  // p: the phase's pixels (n, a, b), at row h0 + SH*a, column h0 + SW*b
        int n = p / (ph.hn * pw.hn), h = ph.h0 + p / pw.hn % ph.hn * SH, v = pw.h0 + p % pw.hn * SW;
        return {((long long)n * F + g * fg) * OH * OW, h + PH, v + PW};
    }
    __device__ float b(const BCol& p, int k) const {
        int f = k / (ph.ti * pw.ti), i = ph.i0 + k / pw.ti % ph.ti * ph.istep, j = pw.i0 + k % pw.ti * pw.istep;
        int t = p.th - i * DH, u = p.tw - j * DW;  // multiples of SH and SW
        if (t < 0 || u < 0 || t / SH >= OH || u / SW >= OW) return 0.0f;
        return dy[p.base + ((long long)f * OH + t / SH) * OW + u / SW];
    }
    __device__ long long crow(int c) const { return (long long)(g * cg + c) * H * W; }
    __device__ long long ccol(int p) const {
        int n = p / (ph.hn * pw.hn), h = ph.h0 + p / pw.hn % ph.hn * SH, v = pw.h0 + p % pw.hn * SW;
        return (long long)n * C * H * W + (long long)h * W + v;
    }
};

// Launch: block (16, 16), grid (ceil(N*ceil(H/SH)*ceil(W/SW)/DD_BN), ceil(C/G/DD_BM), G*SH*SW): blockIdx.z is the
// group and, with a stride, the phase (rh, rw); a phase without taps writes zeros.
template <class TY, class TG, class TW>
__device__ void dd_conv2d_backward_data_igemm(TY* __restrict__ dx, const TG* __restrict__ g,
                                              const TW* __restrict__ w, int N, int C, int H, int W, int F,
                                              int KH, int KW, int OH, int OW, int SH, int SW, int PH, int PW, int G,
                                              int DH, int DW) {
    int cg = C / G, fg = F / G;
    if (SH == 1 && SW == 1) {
        dd_conv_data_loader<TG, TW> ld{g, w, C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, (int)blockIdx.z, cg, fg};
        dd_tiled(dx, ld, cg, N * H * W, 0, fg * KH * KW);
        return;
    }
    int grp = blockIdx.z / (SH * SW), r = blockIdx.z % (SH * SW);
    dd_conv_phase ph(r / SW, SH, PH, DH, KH, H), pw(r % SW, SW, PW, DW, KW, W);
    dd_conv_strided_data_loader<TG, TW> ld{g, w, C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, grp, cg, fg, ph, pw};
    dd_tiled(dx, ld, cg, N * ph.hn * pw.hn, 0, fg * ph.ti * pw.ti);
}

// d w of conv2d: dW[f, k] = sum over r of dY[f, r] X[r, k], with f the filter in group g, k = (c, i, j) and the
// reduction over r = (n, oh, ow), split into S slices of whole DD_BK steps: slice s of group g is block z = g*S + s.
// With S > 1 each slice writes its partial sums to ws [S, F, C/G*KH*KW] and dd_conv2d_backward_filter_finish adds
// them up in slice order (the same bits every run); with S == 1 the one slice writes dW itself (ws unused).
// Launch: block (16, 16), grid (ceil(C/G*KH*KW/DD_BN), ceil(F/G/DD_BM), G*S); then the finish (S > 1).
template <class X1, class X2>
struct dd_conv_filter_loader {
    struct BCol {
        long long base;  // the channel's plane in image 0
        int hi, wj;      // the window offset's row and column less the padding
    };
    typedef long long ARow;
    static constexpr bool A_K_FAST = true, B_K_FAST = true;
    const X1* x;
    const X2* dy;
    int C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, g, cg, fg, K;
    __device__ long long arow(int f) const { return (long long)(g * fg + f) * OH * OW; }
    __device__ float a(long long r, int k) const {
        int n = k / (OH * OW);
        return dy[r + (long long)n * F * OH * OW + k % (OH * OW)];
    }
    __device__ BCol bcol(int col) const {
        int c = col / (KH * KW), i = col / KW % KH, j = col % KW;
        return {(long long)(g * cg + c) * H * W, i * DH - PH, j * DW - PW};
    }
    __device__ float b(const BCol& p, int k) const {
        int n = k / (OH * OW), oh = k / OW % OH, ow = k % OW;
        int h = oh * SH + p.hi, u = ow * SW + p.wj;
        return h >= 0 && h < H && u >= 0 && u < W ? x[p.base + (long long)n * C * H * W + (long long)h * W + u] : 0.0f;
    }
    __device__ long long crow(int f) const { return (long long)(g * fg + f) * K; }
    __device__ long long ccol(int col) const { return col; }
};

// the slice length of a reduction of Q split S ways: whole DD_BK steps
__device__ __forceinline__ int dd_slice(int Q, int S) { return (Q + S * DD_BK - 1) / (S * DD_BK) * DD_BK; }

template <class TY, class TX, class TG>
__device__ void dd_conv2d_backward_filter(TY* __restrict__ dw, const TX* __restrict__ x,
                                          const TG* __restrict__ g, float* __restrict__ ws, int S, int N, int C,
                                          int H, int W, int F, int KH, int KW, int OH, int OW, int SH, int SW, int PH,
                                          int PW, int G, int DH, int DW) {
    int cg = C / G, fg = F / G, K = cg * KH * KW, Q = N * OH * OW;
    int grp = blockIdx.z / S, s = blockIdx.z % S, len = dd_slice(Q, S);
    int k0 = s * len, k1 = k0 + len < Q ? k0 + len : Q;
    dd_conv_filter_loader<TX, TG> ld{x, g, C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, grp, cg, fg, K};
    if (S > 1) dd_tiled(ws + (long long)s * F * K, ld, fg, K, k0, k1);  // float partial sums
    else dd_tiled(dw, ld, fg, K, k0, k1);
}

// dW = the sum of the S slices' partial sums ws [S, n], in slice order
template <class TY>
__device__ void dd_conv2d_backward_filter_finish(TY* __restrict__ dw, const float* __restrict__ ws, int n, int S) {
    DD_GRID_STRIDE(e, n) {
        float v = 0.0f;
        for (int s = 0; s < S; s++) v += ws[(long long)s * n + e];
        dw[e] = v;
    }
}

// ---- pooling, NCHW; padding never wins a max and counts as zero in an average ----

template <class TY, class TX>
__device__ void dd_max_pool2d(TY* __restrict__ y, const TX* __restrict__ x, int NC, int H, int W,
                              int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW) {
    DD_GRID_STRIDE(e, NC * OH * OW) {
        int ow = e % OW, oh = (e / OW) % OH, nc = e / (OW * OH);
        const auto* xc = x + (long long)nc * H * W;
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
template <class TD, class TX, class TY, class TG>
__device__ void dd_max_pool2d_backward(TD* __restrict__ dx, const TX* __restrict__ x,
                                       const TY* __restrict__ y, const TG* __restrict__ g, int NC, int H,
                                       int W, int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW) {
    DD_GRID_STRIDE(e, NC * H * W) {
        int v = e % W, h = (e / W) % H, nc = e / (W * H);
        const auto* xc = x + (long long)nc * H * W;
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
template <class TY, class TX>
__device__ void dd_avg_pool2d(TY* __restrict__ y, const TX* __restrict__ x, int NC, int H, int W, int OH,
                              int OW, int KH, int KW, int SH, int SW, int PH, int PW) {
    float k = (float)(KH * KW);
    DD_GRID_STRIDE(e, NC * OH * OW) {
        int ow = e % OW, oh = (e / OW) % OH, nc = e / (OW * OH);
        const auto* xc = x + (long long)nc * H * W;
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

template <class TD, class TG>
__device__ void dd_avg_pool2d_backward(TD* __restrict__ dx, const TG* __restrict__ g, int NC, int H, int W,
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

template <class TY, class TX>
__device__ void dd_softmax(TY* __restrict__ y, const TX* __restrict__ x, int A, int D, int B, int logarithm) {
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
template <class TY, class TX>
__device__ void dd_layer_norm_rows(TY* __restrict__ y, const TX* __restrict__ x, int R, int D, float eps) {
    DD_BLOCK_STRIDE(r, R) {
        const auto* xr = x + (long long)r * D;
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
template <class TD, class TX, class TG>
__device__ void dd_layer_norm_rows_backward(TD* __restrict__ dx, const TX* __restrict__ x,
                                            const TG* __restrict__ g, int R, int D, float eps) {
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
template <class TY, class TX>
__device__ void dd_bn_apply(TY* __restrict__ y, const TX* __restrict__ x, const float* __restrict__ mean,
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
template <class TD, class TX, class TG>
__device__ void dd_bn_train_backward(TD* __restrict__ dx, const TX* __restrict__ x, const TG* __restrict__ g,
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
template <class TY, class TX>
__device__ void dd_masked_softmax(TY* __restrict__ y, const TX* __restrict__ x, int R, int T, int period,
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
template <class TD, class TY, class TG>
__device__ void dd_softmax_backward(TD* __restrict__ dx, const TY* __restrict__ y, const TG* __restrict__ g,
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
template <class TX>
__device__ void dd_softmax_cross_entropy(float* __restrict__ loss, const TX* __restrict__ x,
                                         const long long* __restrict__ labels, int N, int K) {
    float total = 0.0f;
    for (int r = 0; r < N; r++) {
        const auto* xr = x + (long long)r * K;
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
template <class TD, class TX>
__device__ void dd_softmax_cross_entropy_backward(TD* __restrict__ dx, const TX* __restrict__ x,
                                                  const long long* __restrict__ labels, const float* __restrict__ g,
                                                  int N, int K) {
    float scale = g[0] / (float)N;
    DD_BLOCK_STRIDE(r, N) {
        const auto* xr = x + (long long)r * K;
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
template <class TP>
__device__ void dd_cross_entropy(float* __restrict__ loss, const TP* __restrict__ p,
                                 const long long* __restrict__ labels, int N, int K) {
    float s = 0.0f;
    for (int r = threadIdx.x; r < N; r += blockDim.x) s += logf(p[(long long)r * K + labels[r]]);
    s = dd_block_sum(s);
    if (threadIdx.x == 0 && blockIdx.x == 0) loss[0] = -(s / (float)N);
}

template <class TD, class TP>
__device__ void dd_cross_entropy_backward(TD* __restrict__ dp, const TP* __restrict__ p,
                                          const long long* __restrict__ labels, const float* __restrict__ g,
                                          int N, int K) {
    DD_GRID_STRIDE(e, N * K) {
        int r = e / K, k = e % K;
        dp[e] = k == labels[r] ? -g[0] / (p[e] * (float)N) : 0.0f;
    }
}

// the first largest score of each row of [N, K], as int64
template <class TX>
__device__ void dd_argmax(long long* __restrict__ out, const TX* __restrict__ x, int N, int K) {
    DD_GRID_STRIDE(r, N) {
        const auto* xr = x + (long long)r * K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (xr[k] > xr[best]) best = k;
        out[r] = best;
    }
}

// the fraction of rows whose first largest score is at the label: one block (launch grid 1)
template <class TX>
__device__ void dd_accuracy(float* __restrict__ out, const TX* __restrict__ x, const long long* __restrict__ labels,
                            int N, int K) {
    float hits = 0.0f;
    for (int r = threadIdx.x; r < N; r += blockDim.x) {
        const auto* xr = x + (long long)r * K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (xr[k] > xr[best]) best = k;
        hits += best == labels[r] ? 1.0f : 0.0f;
    }
    hits = dd_block_sum(hits);
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = hits / (float)N;
}

// ---- local response normalisation across channels of [N, C, H*W] ----

template <class TX>
__device__ __forceinline__ float dd_lrn_denominator(const TX* xc, int c, int C, int HW, int size, float k,
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

template <class TY, class TX>
__device__ void dd_lrn(TY* __restrict__ y, const TX* __restrict__ x, int N, int C, int HW, int size, float k,
                       float alpha, float beta) {
    DD_GRID_STRIDE(e, N * C * HW) {
        int p = e % HW, c = (e / HW) % C, n = e / (HW * C);
        const auto* xc = x + (long long)n * C * HW + p;
        y[e] = x[e] * powf(dd_lrn_denominator(xc, c, C, HW, size, k, alpha), -beta);
    }
}

// dx_j = g_j d_j^-beta - 2 alpha beta / size * x_j * sum over the c whose window holds j of g_c y_c / d_c
template <class TD, class TX, class TY, class TG>
__device__ void dd_lrn_backward(TD* __restrict__ dx, const TX* __restrict__ x, const TY* __restrict__ y,
                                const TG* __restrict__ g, int N, int C, int HW, int size, float k, float alpha,
                                float beta) {
    DD_GRID_STRIDE(e, N * C * HW) {
        int p = e % HW, c = (e / HW) % C, n = e / (HW * C);
        long long base = (long long)n * C * HW + p;
        const auto* xc = x + base;
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

template <class TY>
__device__ void dd_dropout_mask(TY* __restrict__ mask, const long long* __restrict__ step, int n,
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
template <class TY>
__device__ void dd_random_normal(TY* __restrict__ out, const long long* __restrict__ step, int n,
                                 unsigned long long stream) {
    unsigned long long seed = stream ^ ((unsigned long long)(step[0] + 1) * 0xD1B54A32D192ED03ull);
    DD_GRID_STRIDE(e, n) {
        double u1 = dd_sample_uniform_at(seed, 2 * (long long)e);
        double u2 = dd_sample_uniform_at(seed, 2 * (long long)e + 1);
        out[e] = (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
    }
}

// element e: low + (high - low) * u_e, in double
template <class TY>
__device__ void dd_random_uniform(TY* __restrict__ out, const long long* __restrict__ step, int n,
                                  unsigned long long stream, double low, double high) {
    unsigned long long seed = stream ^ ((unsigned long long)(step[0] + 1) * 0xD1B54A32D192ED03ull);
    DD_GRID_STRIDE(e, n) {
        out[e] = (float)(low + (high - low) * dd_sample_uniform_at(seed, e));
    }
}

// ---- one shard's draws of a data-parallel step (ops/collective.py, the *_at ops): element e of the shard is draw
// first + e of the site's stream, first = the shard's first sample in the global batch (its offset) x the draws per
// sample, so the ranks and micro-batches together draw what one process with the whole batch draws. The PyCUDA
// runner's kernels read the offset on the GPU (an input of the step); the Java CUDA device passes first by value ----

__device__ void dd_dropout_mask_at(float* __restrict__ mask, const long long* __restrict__ step, long long first,
                                   int n, unsigned long long stream, double p, float keep) {
    unsigned long long seed = stream ^ ((unsigned long long)(step[0] + 1) * 0xD1B54A32D192ED03ull);
    DD_GRID_STRIDE(e, n) {
        mask[e] = dd_sample_uniform_at(seed, first + e) >= p ? keep : 0.0f;
    }
}

__device__ void dd_random_normal_at(float* __restrict__ out, const long long* __restrict__ step, long long first,
                                    int n, unsigned long long stream) {
    unsigned long long seed = stream ^ ((unsigned long long)(step[0] + 1) * 0xD1B54A32D192ED03ull);
    DD_GRID_STRIDE(e, n) {
        double u1 = dd_sample_uniform_at(seed, 2 * (first + e));
        double u2 = dd_sample_uniform_at(seed, 2 * (first + e) + 1);
        out[e] = (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
    }
}

__device__ void dd_random_uniform_at(float* __restrict__ out, const long long* __restrict__ step, long long first,
                                     int n, unsigned long long stream, double low, double high) {
    unsigned long long seed = stream ^ ((unsigned long long)(step[0] + 1) * 0xD1B54A32D192ED03ull);
    DD_GRID_STRIDE(e, n) {
        out[e] = (float)(low + (high - low) * dd_sample_uniform_at(seed, first + e));
    }
}
