// deepdsl CUDA entry points: the library's ops as kernels with their sizes as arguments, which the Java
// program's CUDA device (deepdsl/runtime/CudaDevice.java) launches for its library calls (dev.conv2d(...), ...).
// CudaDevice sizes each launch as backends/cuda/ops.py does; the functions they call are in library.cu.

extern "C" __global__ void dd_k_gemm(float* c, const float* a, const float* b, int M, int N, int K, int ta, int tb) {
    dd_gemm(c, a, b, M, N, K, ta, tb);
}

extern "C" __global__ void dd_k_conv2d(float* y, const float* x, const float* w, int N, int C, int H, int W, int F,
                                       int KH, int KW, int OH, int OW, int SH, int SW, int PH, int PW, int G, int DH,
                                       int DW) {
    dd_conv2d_igemm(y, x, w, N, C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, G, DH, DW);
}

extern "C" __global__ void dd_k_conv2d_backward_data(float* dx, const float* g, const float* w, int N, int C, int H,
                                                     int W, int F, int KH, int KW, int OH, int OW, int SH, int SW,
                                                     int PH, int PW, int G, int DH, int DW) {
    dd_conv2d_backward_data_igemm(dx, g, w, N, C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, G, DH, DW);
}

// S > 1: the reduction split S ways, its partial sums in ws [S, F, C/G*KH*KW], then dd_k_conv2d_backward_filter_finish
extern "C" __global__ void dd_k_conv2d_backward_filter(float* dw, const float* x, const float* g, int N, int C, int H,
                                                       int W, int F, int KH, int KW, int OH, int OW, int SH, int SW,
                                                       int PH, int PW, int G, int DH, int DW, float* ws, int S) {
    dd_conv2d_backward_filter(dw, x, g, ws, S, N, C, H, W, F, KH, KW, OH, OW, SH, SW, PH, PW, G, DH, DW);
}

extern "C" __global__ void dd_k_conv2d_backward_filter_finish(float* dw, const float* ws, int n, int S) {
    dd_conv2d_backward_filter_finish(dw, ws, n, S);
}

extern "C" __global__ void dd_k_max_pool2d(float* y, const float* x, int NC, int H, int W, int OH, int OW, int KH,
                                           int KW, int SH, int SW, int PH, int PW) {
    dd_max_pool2d(y, x, NC, H, W, OH, OW, KH, KW, SH, SW, PH, PW);
}

extern "C" __global__ void dd_k_max_pool2d_backward(float* dx, const float* x, const float* y, const float* g, int NC,
                                                    int H, int W, int OH, int OW, int KH, int KW, int SH, int SW,
                                                    int PH, int PW) {
    dd_max_pool2d_backward(dx, x, y, g, NC, H, W, OH, OW, KH, KW, SH, SW, PH, PW);
}

extern "C" __global__ void dd_k_avg_pool2d(float* y, const float* x, int NC, int H, int W, int OH, int OW, int KH,
                                           int KW, int SH, int SW, int PH, int PW) {
    dd_avg_pool2d(y, x, NC, H, W, OH, OW, KH, KW, SH, SW, PH, PW);
}

extern "C" __global__ void dd_k_avg_pool2d_backward(float* dx, const float* g, int NC, int H, int W, int OH, int OW,
                                                    int KH, int KW, int SH, int SW, int PH, int PW) {
    dd_avg_pool2d_backward(dx, g, NC, H, W, OH, OW, KH, KW, SH, SW, PH, PW);
}

extern "C" __global__ void dd_k_softmax(float* y, const float* x, int A, int D, int B, int logarithm) {
    dd_softmax(y, x, A, D, B, logarithm);
}

extern "C" __global__ void dd_k_masked_softmax(float* y, const float* x, int R, int T, int period, int causal,
                                               float scale) {
    dd_masked_softmax(y, x, R, T, period, causal, scale);
}

extern "C" __global__ void dd_k_softmax_backward(float* dx, const float* y, const float* g, int A, int D, int B,
                                                 int logarithm) {
    dd_softmax_backward(dx, y, g, A, D, B, logarithm);
}

extern "C" __global__ void dd_k_softmax_cross_entropy(float* loss, const float* x, const long long* labels, int N,
                                                      int K) {
    dd_softmax_cross_entropy(loss, x, labels, N, K);
}

extern "C" __global__ void dd_k_softmax_cross_entropy_backward(float* dx, const float* x, const long long* labels,
                                                               const float* g, int N, int K) {
    dd_softmax_cross_entropy_backward(dx, x, labels, g, N, K);
}

extern "C" __global__ void dd_k_cross_entropy(float* loss, const float* p, const long long* labels, int N, int K) {
    dd_cross_entropy(loss, p, labels, N, K);
}

extern "C" __global__ void dd_k_cross_entropy_backward(float* dp, const float* p, const long long* labels,
                                                       const float* g, int N, int K) {
    dd_cross_entropy_backward(dp, p, labels, g, N, K);
}

extern "C" __global__ void dd_k_argmax(long long* out, const float* x, int N, int K) { dd_argmax(out, x, N, K); }

extern "C" __global__ void dd_k_accuracy(float* out, const float* x, const long long* labels, int N, int K) {
    dd_accuracy(out, x, labels, N, K);
}

extern "C" __global__ void dd_k_lrn(float* y, const float* x, int N, int C, int HW, int size, float k, float alpha,
                                    float beta) {
    dd_lrn(y, x, N, C, HW, size, k, alpha, beta);
}

extern "C" __global__ void dd_k_lrn_backward(float* dx, const float* x, const float* y, const float* g, int N, int C,
                                             int HW, int size, float k, float alpha, float beta) {
    dd_lrn_backward(dx, x, y, g, N, C, HW, size, k, alpha, beta);
}

extern "C" __global__ void dd_k_layer_norm_rows(float* y, const float* x, int R, int D, float eps) {
    dd_layer_norm_rows(y, x, R, D, eps);
}

extern "C" __global__ void dd_k_layer_norm_rows_backward(float* dx, const float* x, const float* g, int R, int D,
                                                         float eps) {
    dd_layer_norm_rows_backward(dx, x, g, R, D, eps);
}

extern "C" __global__ void dd_k_bn_apply(float* y, const float* x, const float* mean, const float* var,
                                         const float* gamma, const float* beta, int n, int C, int P, float eps) {
    dd_bn_apply(y, x, mean, var, gamma, beta, n, C, P, eps);
}

extern "C" __global__ void dd_k_bn_train_backward(float* dx, const float* x, const float* g, const float* mean,
                                                  const float* invstd, const float* gamma, const float* sum_gxh,
                                                  const float* sum_g, int n, int C, int P, float eps) {
    dd_bn_train_backward(dx, x, g, mean, invstd, gamma, sum_gxh, sum_g, n, C, P, eps);
}

extern "C" __global__ void dd_k_dropout_mask(float* mask, const long long* step, int n, unsigned long long stream,
                                             double p, float keep) {
    dd_dropout_mask(mask, step, n, stream, p, keep);
}

extern "C" __global__ void dd_k_random_normal(float* out, const long long* step, int n, unsigned long long stream) {
    dd_random_normal(out, step, n, stream);
}

extern "C" __global__ void dd_k_random_uniform(float* out, const long long* step, int n, unsigned long long stream,
                                               double low, double high) {
    dd_random_uniform(out, step, n, stream, low, high);
}

// one shard's draws of a data-parallel step (the Java CUDA device: `first`, its first draw, a value of the rank)
extern "C" __global__ void dd_k_dropout_mask_at(float* mask, const long long* step, long long first, int n,
                                                unsigned long long stream, double p, float keep) {
    dd_dropout_mask_at(mask, step, first, n, stream, p, keep);
}

extern "C" __global__ void dd_k_random_normal_at(float* out, const long long* step, long long first, int n,
                                                 unsigned long long stream) {
    dd_random_normal_at(out, step, first, n, stream);
}

extern "C" __global__ void dd_k_random_uniform_at(float* out, const long long* step, long long first, int n,
                                                  unsigned long long stream, double low, double high) {
    dd_random_uniform_at(out, step, first, n, stream, low, high);
}

// data parallelism (the Java CUDA device's pack of a gradient bucket): out = in times the scale, one multiply each
extern "C" __global__ void dd_k_dp_pack(float* out, const float* in, const float* scale, int n) {
    const float s = scale[0];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] * s;
}

// gradient accumulation (the Java CUDA device's --micro-batches): acc = acc + x, one float32 add each, in micro-batch
// order (micro-batch 0 is copied), as the PyCUDA runner's dd_accumulate_N and the NumPy runner do
extern "C" __global__ void dd_k_dp_accumulate(float* acc, const float* x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) acc[i] = acc[i] + x[i];
}
