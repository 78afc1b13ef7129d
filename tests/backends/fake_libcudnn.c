/* A stand-in for cuDNN 9 (libcudnn.so.9) whose device memory is host memory, so that the GPU runner's convolutions
 * and pooling through cuDNN (deepdsl/backends/cuda/vendor.py) are tested on machines without a GPU. Only the calls the
 * runner makes: the handle; NCHW float tensor, filter, convolution and pooling descriptors; the three convolution
 * algorithm queries (_v7) and the three convolutions as cuDNN defines them (cross-correlation, zero padding, groups,
 * out = alpha op + beta out, out not read when beta is 0); pooling forward and backward (max: padding never the
 * maximum, NaN propagates, the gradient to the first maximum of a window in row-major order; average counting the
 * padding). Each convolution has cuDNN's number of algorithms (forward 8, data 6, filter 7): 0 (IMPLICIT_GEMM,
 * ALGO_0) is direct loops without scratch; every other needs scratch, 1 (PRECOMP_GEMM forward, ALGO_1 backward) one
 * image's im2col matrix, k >= 2 k / 2 of that, and really writes it (the matrix, then the rest filled), so a
 * workspace that overlaps live data shows. The _v7 queries give them all, 1 first, then 0, then the others; data
 * ALGO_0 and filter ALGO_0 and ALGO_3 say they are nondeterministic, as cuDNN's. cudnnFind...AlgorithmEx runs every
 * algorithm whose scratch fits the workspace it is given on the caller's buffers (the scratch written over, the
 * output left with NaN bytes, as cuDNN leaves arbitrary values there) and returns them fastest first by a fake time
 * (`fake_cudnn_time`: a hash of the call, the algorithm and the sizes), the others after them as
 * CUDNN_STATUS_ALLOC_FAILED; it synchronises the handle's stream first (the caller's hook, fake_set_synchronize, or
 * the stand-in driver's cuStreamSynchronize), which a capturing stream refuses: then CUDNN_STATUS_EXECUTION_FAILED.
 * `fake_cudnn_find_calls` counts them. Descriptors that do not fit each other, or a workspace smaller than the
 * algorithm needs, are CUDNN_STATUS_BAD_PARAM.
 * `fake_cudnn_calls` counts the convolutions and poolings. Sums are accumulated in double.
 *
 * For the Java CUDA device it is built as libcudnn_graph.so.9, libcudnn_ops.so.9 and libcudnn_cnn.so.9, each with
 * its calls in the version node JavaCPP's libjnicudnn.so needs (cuda13_stand_ins.py); the copy built with
 * -DFAKE_CUDNN_WRITES_CALLS also writes its count at exit to the file $FAKE_CUDNN_CALLS names, if set. A convolution
 * on a stream that the stand-in driver (fake_libcuda.c, when loaded) is capturing into a CUDA graph is checked at the
 * call, recorded there (its arguments, alpha and beta by value) and computed at each replay, as fake_libcublas.c does
 * with its GEMMs; it is counted when computed. Pooling, softmax, LRN and bias-gradient calls are recorded the same
 * way (the recorder is the Python emulated driver's where it set one, fake_set_capture); the copy
 * built with -DFAKE_CUDNN_WRITES_OPS (libcudnn_ops.so.9) writes at exit, to the file $FAKE_CUDNN_OPS_CALLS names,
 * how many of each of them it computed, a line `NAME COUNT` per call. $FAKE_CUDNN_REFUSE names a call (say
 * cudnnSetLRNDescriptor) that then returns CUDNN_STATUS_NOT_SUPPORTED, as a cuDNN that refuses it would: the Java
 * device's fallback under --kernels auto is tested with it.
 *
 * --precision bf16: tensor and filter descriptors take CUDNN_DATA_BFLOAT16 (9) as well as float. A convolution takes
 * x, w and y all bf16 (cuDNN's PSEUDO_BFLOAT16_CONFIG; the convolution descriptor's compute type float, as always
 * here), else CUDNN_STATUS_NOT_SUPPORTED: it widens its bf16 operands (exact), computes as the float32 one does, and
 * rounds the result to bf16 (nearest even), as the hardware does; `fake_cudnn_bf16_calls` counts these (they are
 * not TF32 calls, whatever the math type). Find fills a bf16 output's two bytes an element. Pooling, softmax, LRN,
 * batch norm and the bias gradient are float32 only: a bf16 descriptor there is CUDNN_STATUS_BAD_PARAM. */

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudnnStatus_t;
enum { OK = 0, NOT_INITIALIZED = 1001, BAD_PARAM = 2000, NOT_SUPPORTED = 3000, ALLOC_FAILED = 4001,
       EXECUTION_FAILED = 5000 };
typedef struct { void *stream; } *cudnnHandle_t;
typedef struct { int n, c, h, w, set, bf16; } *cudnnTensorDescriptor_t;
typedef struct { int k, c, h, w, set, bf16; } *cudnnFilterDescriptor_t;
typedef struct { int ph, pw, sh, sw, dh, dw, mode, groups, math, set; } *cudnnConvolutionDescriptor_t;
typedef struct {
  int algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  int determinism, mathType, reserved[3];
} cudnnConvolutionFwdAlgoPerf_t;

static long long calls;
long long fake_cudnn_calls(void) { return calls; }
/* the convolutions run under a math type that allows TF32 (any but CUDNN_FMA_MATH = 3), computed as the others */
static long long tf32_calls;
long long fake_cudnn_tf32_calls(void) { return tf32_calls; }
/* the convolutions on bf16 tensors (computed in float32 from their widened operands, the result rounded) */
static long long bf16_calls;
static int in_bf16; /* a bf16 convolution's float32 computation is running */
long long fake_cudnn_bf16_calls(void) { return bf16_calls; }

enum { DATA_FLOAT = 0, DATA_BFLOAT16 = 9 };
static float from_bf16(unsigned short b) {
  union { unsigned u; float f; } v = {(unsigned)b << 16};
  return v.f;
}
static unsigned short to_bf16(float x) { /* nearest even; a NaN kept, made quiet */
  union { float f; unsigned u; } v = {x};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((v.u >> 16) | 0x40u);
  return (unsigned short)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
/* n bf16 values widened to a new float32 array (zeros where p is not to be read) */
static float *widened(const void *p, long long n, int read) {
  float *f = calloc(n > 0 ? n : 1, sizeof *f);
  for (long long i = 0; read && i < n; i++) f[i] = from_bf16(((const unsigned short *)p)[i]);
  return f;
}
static void narrowed(void *p, float *f, long long n) {
  for (long long i = 0; i < n; i++) ((unsigned short *)p)[i] = to_bf16(f[i]);
  free(f);
}

#ifdef FAKE_CUDNN_WRITES_CALLS /* the one copy of the stand-ins for the Java device that counts (cuda13_stand_ins.py) */
__attribute__((destructor)) static void write_calls(void) {
  const char *path = getenv("FAKE_CUDNN_CALLS");
  FILE *f = path ? fopen(path, "w") : NULL;
  if (f) {
    fprintf(f, "%lld\n", calls);
    fclose(f);
  }
  path = getenv("FAKE_CUDNN_TF32_CALLS"); /* the convolutions whose math type allows TF32 */
  f = path ? fopen(path, "w") : NULL;
  if (f) {
    fprintf(f, "%lld\n", tf32_calls);
    fclose(f);
  }
  path = getenv("FAKE_CUDNN_BF16_CALLS"); /* the convolutions on bf16 tensors */
  f = path ? fopen(path, "w") : NULL;
  if (f) {
    fprintf(f, "%lld\n", bf16_calls);
    fclose(f);
  }
}
#endif

/* the pooling, softmax, LRN and batch-norm calls, each counted when computed */
enum { POOL_FORWARD, POOL_BACKWARD, SOFTMAX_FORWARD, SOFTMAX_BACKWARD, LRN_FORWARD, LRN_BACKWARD, BN_FORWARD,
       BN_BACKWARD, OPS };
enum { BIAS_BACKWARD = OPS }; /* recorded on a capturing stream as the ops above, not counted among them */
static const char *op_names[OPS] = {"cudnnPoolingForward", "cudnnPoolingBackward", "cudnnSoftmaxForward",
                                    "cudnnSoftmaxBackward", "cudnnLRNCrossChannelForward",
                                    "cudnnLRNCrossChannelBackward", "cudnnBatchNormalizationForwardInference",
                                    "cudnnBatchNormalizationBackward"};
static long long op_calls[OPS];
/* the count of one of those calls by its name (-1: not one of them), for the tests that load the stand-in */
long long fake_cudnn_op_calls(const char *name) {
  for (int k = 0; k < OPS; k++)
    if (strcmp(op_names[k], name) == 0) return op_calls[k];
  return -1;
}

#ifdef FAKE_CUDNN_WRITES_OPS /* the copy for the Java device that exports these calls (cuda13_stand_ins.py) */
__attribute__((destructor)) static void write_op_calls(void) {
  const char *path = getenv("FAKE_CUDNN_OPS_CALLS");
  FILE *f = path ? fopen(path, "w") : NULL;
  if (f) {
    for (int k = 0; k < OPS; k++) fprintf(f, "%s %lld\n", op_names[k], op_calls[k]);
    fclose(f);
  }
}
#endif

/* 1 when $FAKE_CUDNN_REFUSE names `call` */
static int refused(const char *call) {
  const char *name = getenv("FAKE_CUDNN_REFUSE");
  return name && strcmp(name, call) == 0;
}

size_t cudnnGetVersion(void) { return 90000; }
const char *cudnnGetErrorString(cudnnStatus_t s) {
  return s == OK                 ? "CUDNN_STATUS_SUCCESS"
         : s == BAD_PARAM        ? "CUDNN_STATUS_BAD_PARAM"
         : s == ALLOC_FAILED     ? "CUDNN_STATUS_ALLOC_FAILED"
         : s == EXECUTION_FAILED ? "CUDNN_STATUS_EXECUTION_FAILED"
                                 : "CUDNN_STATUS_NOT_SUPPORTED";
}
cudnnStatus_t cudnnCreate(cudnnHandle_t *h) { *h = calloc(1, sizeof **h); return *h ? OK : NOT_INITIALIZED; }
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) { free(h); return OK; }
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, void *stream) {
  if (!h) return BAD_PARAM;
  h->stream = stream;
  return OK;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) { *d = calloc(1, sizeof **d); return OK; }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) { free(d); return OK; }
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, int format, int dtype, int n, int c, int h, int w) {
  if (format != 0 || (dtype != DATA_FLOAT && dtype != DATA_BFLOAT16) || n <= 0 || c <= 0 || h <= 0 || w <= 0)
    return BAD_PARAM; /* NCHW float or bf16 only */
  d->n = n, d->c = c, d->h = h, d->w = w, d->set = 1, d->bf16 = dtype == DATA_BFLOAT16;
  return OK;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) { *d = calloc(1, sizeof **d); return OK; }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) { free(d); return OK; }
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, int dtype, int format, int k, int c, int h, int w) {
  if (format != 0 || (dtype != DATA_FLOAT && dtype != DATA_BFLOAT16) || k <= 0 || c <= 0 || h <= 0 || w <= 0)
    return BAD_PARAM;
  d->k = k, d->c = c, d->h = h, d->w = w, d->set = 1, d->bf16 = dtype == DATA_BFLOAT16;
  return OK;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d) {
  *d = calloc(1, sizeof **d);
  (*d)->groups = 1;
  return OK;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) { free(d); return OK; }
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int sh, int sw, int dh,
                                              int dw, int mode, int compute) {
  if (ph < 0 || pw < 0 || sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0 || (mode != 0 && mode != 1) || compute != 0)
    return BAD_PARAM;
  d->ph = ph, d->pw = pw, d->sh = sh, d->sw = sw, d->dh = dh, d->dw = dw, d->mode = mode, d->set = 1;
  return OK;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups) {
  if (groups <= 0) return BAD_PARAM;
  d->groups = groups;
  return OK;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, int math) {
  if (math < 0 || math > 3) return BAD_PARAM;
  d->math = math;
  return OK;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(cudnnConvolutionDescriptor_t d, cudnnTensorDescriptor_t x,
                                                    cudnnFilterDescriptor_t w, int *n, int *c, int *h, int *wd) {
  if (!d->set || !x->set || !w->set || x->c != w->c * d->groups || w->k % d->groups) return BAD_PARAM;
  *n = x->n, *c = w->k;
  *h = (x->h + 2 * d->ph - d->dh * (w->h - 1) - 1) / d->sh + 1;
  *wd = (x->w + 2 * d->pw - d->dw * (w->w - 1) - 1) / d->sw + 1;
  return *h > 0 && *wd > 0 ? OK : BAD_PARAM;
}

static cudnnStatus_t fits(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t d,
                          cudnnTensorDescriptor_t y) {
  int n, c, h, wd;
  cudnnStatus_t s = cudnnGetConvolution2dForwardOutputDim(d, x, w, &n, &c, &h, &wd);
  if (s != OK) return s;
  if (!y->set || y->n != n || y->c != c || y->h != h || y->w != wd) return BAD_PARAM;
  if (x->bf16 != w->bf16 || x->bf16 != y->bf16) return NOT_SUPPORTED; /* bf16 operands and result alike */
  return OK;
}

static size_t precomp_bytes(cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t y) {
  return (size_t)w->c * w->h * w->w * y->h * y->w * sizeof(float); /* one image, one group at a time */
}

/* the algorithms of each call (cudnn_cnn.h's counts: forward 8, backward data 6, backward filter 7), the scratch each
 * needs (0: none, direct loops; 1: one image's im2col matrix; k >= 2: k / 2 of that, of which the im2col path uses
 * the matrix's bytes and fills the rest, so that every byte of a workspace is written), and which are
 * nondeterministic (cuDNN's: backward data ALGO_0, backward filter ALGO_0 and ALGO_3, atomics) */
enum { FORWARD, DATA, FILTER };
static const int algorithm_count[3] = {8, 6, 7};
static size_t algorithm_bytes(int algo, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t y) {
  size_t p = precomp_bytes(w, y);
  return algo <= 1 ? algo * p : p * algo / 2;
}
static int deterministic(int kind, int algo) {
  return !((kind == DATA && algo == 0) || (kind == FILTER && (algo == 0 || algo == 3)));
}
/* NOT_SUPPORTED for an algorithm the call does not have, BAD_PARAM for a workspace smaller than it needs */
static cudnnStatus_t algorithm_ok(int kind, int algo, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t y, void *ws,
                                  size_t ws_bytes) {
  if (algo < 0 || algo >= algorithm_count[kind]) return NOT_SUPPORTED;
  size_t need = algorithm_bytes(algo, w, y);
  return need && (ws_bytes < need || !ws) ? BAD_PARAM : OK;
}
/* the part of an algorithm's workspace beyond the im2col matrix, written over */
static void fill_rest(int algo, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t y, void *ws) {
  size_t from = precomp_bytes(w, y), to = algorithm_bytes(algo, w, y);
  if (to > from) memset((char *)ws + from, 0xFF, to - from);
}

/* the heuristic order of every convolution's algorithms: 1 (an im2col matrix of scratch), 0 (none), then the others
 * in algorithm order (each with the scratch algorithm_bytes says) */
static cudnnStatus_t propose(int kind, cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                             cudnnConvolutionDescriptor_t d, cudnnTensorDescriptor_t y, int requested, int *returned,
                             cudnnConvolutionFwdAlgoPerf_t *perf) {
  cudnnStatus_t s = fits(x, w, d, y);
  if (!h || s != OK) return s == OK ? BAD_PARAM : s;
  if (requested < 1) return BAD_PARAM;
  int n = algorithm_count[kind];
  *returned = requested < n ? requested : n;
  for (int r = 0; r < *returned; r++) {
    int algo = r == 0 ? 1 : r == 1 ? 0 : r;
    cudnnConvolutionFwdAlgoPerf_t p = {algo, OK, 1.0f + r, algorithm_bytes(algo, w, y), deterministic(kind, algo),
                                       d->math, {0}};
    perf[r] = p;
  }
  return OK;
}
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t d,
                                                     cudnnTensorDescriptor_t y, int requested, int *returned,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf) {
  return propose(FORWARD, h, x, w, d, y, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t h, cudnnFilterDescriptor_t w,
                                                          cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t d,
                                                          cudnnTensorDescriptor_t dx, int requested, int *returned,
                                                          cudnnConvolutionFwdAlgoPerf_t *perf) {
  return propose(DATA, h, dx, w, d, dy, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                            cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t d,
                                                            cudnnFilterDescriptor_t dw, int requested, int *returned,
                                                            cudnnConvolutionFwdAlgoPerf_t *perf) {
  return propose(FILTER, h, x, dw, d, dy, requested, returned, perf);
}


/* ---- graph capture: a convolution on a capturing stream of the stand-in driver is recorded, run at each replay ---- */

typedef int (*capture_fn)(void *stream, void (*run)(void *), const void *arg, size_t n);

/* a recorder set by the caller (the Python runner's emulated driver, tests/backends/cuda_emulator.py) */
static capture_fn hooked;
void fake_set_capture(capture_fn f) { hooked = f; }

/* the caller's recorder, else the stand-in driver's where it is loaded (the Java CUDA device); NULL elsewhere */
static capture_fn recorder(void) {
  static int looked;
  static capture_fn f;
  if (hooked) return hooked;
  if (!looked) {
    looked = 1;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    f = cuda ? (capture_fn)dlsym(cuda, "fake_cuda_capture") : NULL;
  }
  return f;
}

typedef struct { /* one convolution's arguments, in the call's order */
  int kind, algo;
  cudnnHandle_t h;
  float alpha, beta;
  void *d1, *d2, *d3;
  const void *p1, *p2;
  cudnnConvolutionDescriptor_t d;
  void *ws, *out;
  size_t ws_bytes;
} conv_call;
static int replaying; /* a recorded call running: compute it, do not record it again */
static void replay(void *arg);

typedef struct { /* a pooling, softmax or LRN call's arguments, in the call's order */
  int kind, algo, mode;
  cudnnHandle_t h;
  void *op; /* the pooling or LRN descriptor */
  float alpha, beta;
  void *d1, *d2, *d3, *d4;
  const void *p1, *p2, *p3;
  void *out;
} op_call;
static void replay_op(void *arg);

/* 1 when the call was recorded into the graph its handle's stream is capturing (and so is not to be run now) */
static int recorded_op(op_call c) {
  capture_fn capture = replaying ? NULL : recorder();
  return capture ? capture(c.h->stream, replay_op, &c, sizeof c) : 0;
}

/* 1 when the call was recorded into the graph its handle's stream is capturing (and so is not to be run now) */
static int recorded(int kind, cudnnHandle_t h, const void *alpha, void *d1, const void *p1, void *d2, const void *p2,
                    cudnnConvolutionDescriptor_t d, int algo, void *ws, size_t ws_bytes, const void *beta, void *d3,
                    void *out) {
  capture_fn capture = replaying ? NULL : recorder();
  if (!capture) return 0;
  conv_call c = {kind, algo, h, *(const float *)alpha, *(const float *)beta, d1, d2, d3, p1, p2, d, ws, out, ws_bytes};
  return capture(h->stream, replay, &c, sizeof c);
}

/* (x, w) at output (ni, f, oi, oj), channels of f's group */
static double dot(const float *x, const float *w, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                  cudnnConvolutionDescriptor_t d, int ni, int f, int oi, int oj) {
  int g = f / (wd->k / d->groups);
  double s = 0.0;
  for (int c = 0; c < wd->c; c++)
    for (int i = 0; i < wd->h; i++)
      for (int j = 0; j < wd->w; j++) {
        int hi = oi * d->sh - d->ph + i * d->dh, wj = oj * d->sw - d->pw + j * d->dw;
        if (hi < 0 || hi >= xd->h || wj < 0 || wj >= xd->w) continue;
        float xv = x[(((long long)ni * xd->c + g * wd->c + c) * xd->h + hi) * xd->w + wj];
        s += (double)xv * w[(((long long)f * wd->c + c) * wd->h + i) * wd->w + j];
      }
  return s;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w, cudnnConvolutionDescriptor_t d,
                                      int algo, void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *y) {
  cudnnStatus_t s = fits(xd, wd, d, yd);
  if (!h || s != OK) return s == OK ? BAD_PARAM : s;
  if ((s = algorithm_ok(FORWARD, algo, wd, yd, ws, ws_bytes)) != OK) return s;
  if (recorded(FORWARD, h, alpha, xd, x, wd, w, d, algo, ws, ws_bytes, beta, yd, y)) return OK;
  if (xd->bf16) { /* computed in float32 from the widened operands, the result rounded */
    __typeof__(*xd) xf = *xd, yf = *yd;
    __typeof__(*wd) wf = *wd;
    xf.bf16 = yf.bf16 = wf.bf16 = 0;
    long long ny = (long long)yd->n * yd->c * yd->h * yd->w;
    float *xw = widened(x, (long long)xd->n * xd->c * xd->h * xd->w, 1);
    float *ww = widened(w, (long long)wd->k * wd->c * wd->h * wd->w, 1);
    float *yw = widened(y, ny, *(const float *)beta != 0.0f);
    in_bf16 = 1;
    s = cudnnConvolutionForward(h, alpha, &xf, xw, &wf, ww, d, algo, ws, ws_bytes, beta, &yf, yw);
    in_bf16 = 0;
    narrowed(y, yw, ny);
    free(xw), free(ww);
    return s;
  }
  tf32_calls += d->math != 3 && !in_bf16;
  bf16_calls += in_bf16;
  float a = *(const float *)alpha, b = *(const float *)beta;
  const float *xs = x, *wt = w;
  float *ys = y, *cols = ws;
  int fg = wd->k / d->groups, kk = wd->c * wd->h * wd->w, pix = yd->h * yd->w;
  for (int ni = 0; ni < xd->n; ni++) {
    for (int g = 0; g < d->groups; g++) {
      if (algo != 0) { /* im2col of image ni, group g, into the workspace: [c/g * kh * kw, oh * ow] */
        for (int c = 0; c < wd->c; c++)
          for (int i = 0; i < wd->h; i++)
            for (int j = 0; j < wd->w; j++)
              for (int oi = 0; oi < yd->h; oi++)
                for (int oj = 0; oj < yd->w; oj++) {
                  int hi = oi * d->sh - d->ph + i * d->dh, wj = oj * d->sw - d->pw + j * d->dw;
                  int inside = hi >= 0 && hi < xd->h && wj >= 0 && wj < xd->w;
                  cols[((long long)(c * wd->h + i) * wd->w + j) * pix + oi * yd->w + oj] =
                      inside ? xs[(((long long)ni * xd->c + g * wd->c + c) * xd->h + hi) * xd->w + wj] : 0.0f;
                }
      }
      for (int f = g * fg; f < (g + 1) * fg; f++)
        for (int oi = 0; oi < yd->h; oi++)
          for (int oj = 0; oj < yd->w; oj++) {
            double acc = 0.0;
            if (algo != 0) {
              for (int q = 0; q < kk; q++) acc += (double)wt[(long long)f * kk + q] * cols[(long long)q * pix + oi * yd->w + oj];
            } else {
              acc = dot(xs, wt, xd, wd, d, ni, f, oi, oj);
            }
            float *out = &ys[(((long long)ni * yd->c + f) * yd->h + oi) * yd->w + oj];
            *out = (float)(a * acc + (b == 0.0f ? 0.0 : (double)b * *out));
          }
    }
  }
  if (algo != 0) fill_rest(algo, wd, yd, ws);
  calls++;
  return OK;
}

/* where the convolution's tap (i, j) of output (oi, oj) reads the input: its row and column, or -1 in the padding */
static long long tap(cudnnTensorDescriptor_t xd, cudnnConvolutionDescriptor_t d, int oi, int oj, int i, int j) {
  int hi = oi * d->sh - d->ph + i * d->dh, wj = oj * d->sw - d->pw + j * d->dw;
  return hi < 0 || hi >= xd->h || wj < 0 || wj >= xd->w ? -1 : (long long)hi * xd->w + wj;
}

static cudnnStatus_t check_call(int kind, cudnnHandle_t h, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                                cudnnConvolutionDescriptor_t d, cudnnTensorDescriptor_t yd, int algo, void *ws,
                                size_t ws_bytes) {
  cudnnStatus_t s = fits(xd, wd, d, yd);
  if (!h || s != OK) return s == OK ? BAD_PARAM : s;
  return algorithm_ok(kind, algo, wd, yd, ws, ws_bytes);
}

/* dx = alpha * (the transposed convolution of dy by w) + beta * dx. ALGO_1 computes one image's and group's column
 * gradient [c/g * kh * kw, oh * ow] = w_g^T dy_g in the workspace, then adds each column onto the input it came from;
 * ALGO_0 adds every product straight onto its input. */
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha, cudnnFilterDescriptor_t wd,
                                           const void *w, cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t d, int algo, void *ws, size_t ws_bytes,
                                           const void *beta, cudnnTensorDescriptor_t dxd, void *dx) {
  cudnnStatus_t s = check_call(DATA, h, dxd, wd, d, dyd, algo, ws, ws_bytes);
  if (s != OK) return s;
  if (recorded(DATA, h, alpha, wd, w, dyd, dy, d, algo, ws, ws_bytes, beta, dxd, dx)) return OK;
  if (dxd->bf16) {
    __typeof__(*dxd) dxf = *dxd, dyf = *dyd;
    __typeof__(*wd) wf = *wd;
    dxf.bf16 = dyf.bf16 = wf.bf16 = 0;
    long long nx = (long long)dxd->n * dxd->c * dxd->h * dxd->w;
    float *ww = widened(w, (long long)wd->k * wd->c * wd->h * wd->w, 1);
    float *gw = widened(dy, (long long)dyd->n * dyd->c * dyd->h * dyd->w, 1);
    float *xw = widened(dx, nx, *(const float *)beta != 0.0f);
    in_bf16 = 1;
    s = cudnnConvolutionBackwardData(h, alpha, &wf, ww, &dyf, gw, d, algo, ws, ws_bytes, beta, &dxf, xw);
    in_bf16 = 0;
    narrowed(dx, xw, nx);
    free(ww), free(gw);
    return s;
  }
  tf32_calls += d->math != 3 && !in_bf16;
  bf16_calls += in_bf16;
  float a = *(const float *)alpha, b = *(const float *)beta;
  const float *wt = w, *g = dy;
  float *out = dx, *cols = ws;
  long long plane = (long long)dxd->h * dxd->w, pix = (long long)dyd->h * dyd->w, size = dxd->n * dxd->c * plane;
  double *acc = calloc(size, sizeof *acc);
  int fg = wd->k / d->groups;
  for (int ni = 0; ni < dxd->n; ni++)
    for (int gr = 0; gr < d->groups; gr++) {
      for (int c = 0; c < wd->c; c++)
        for (int i = 0; i < wd->h; i++)
          for (int j = 0; j < wd->w; j++)
            for (int oi = 0; oi < dyd->h; oi++)
              for (int oj = 0; oj < dyd->w; oj++) {
                double v = 0.0;
                for (int f = gr * fg; f < (gr + 1) * fg; f++)
                  v += (double)wt[(((long long)f * wd->c + c) * wd->h + i) * wd->w + j] *
                       g[(((long long)ni * dyd->c + f) * dyd->h + oi) * dyd->w + oj];
                long long col = ((long long)(c * wd->h + i) * wd->w + j) * pix + oi * dyd->w + oj;
                if (algo != 0) cols[col] = (float)v; /* then read back below */
                long long at = tap(dxd, d, oi, oj, i, j);
                if (at >= 0)
                  acc[((long long)ni * dxd->c + gr * wd->c + c) * plane + at] += algo != 0 ? (double)cols[col] : v;
              }
    }
  for (long long q = 0; q < size; q++) out[q] = (float)(a * acc[q] + (b == 0.0f ? 0.0 : (double)b * out[q]));
  free(acc);
  if (algo != 0) fill_rest(algo, wd, dyd, ws);
  calls++;
  return OK;
}

/* dw = alpha * sum over images and output pixels of dy * the input under the tap + beta * dw. ALGO_1 writes each
 * image's and group's im2col matrix into the workspace and reads the input from there; ALGO_0 reads it directly. */
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd,
                                             const void *x, cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t d, int algo, void *ws, size_t ws_bytes,
                                             const void *beta, cudnnFilterDescriptor_t dwd, void *dw) {
  cudnnStatus_t s = check_call(FILTER, h, xd, dwd, d, dyd, algo, ws, ws_bytes);
  if (s != OK) return s;
  if (recorded(FILTER, h, alpha, xd, x, dyd, dy, d, algo, ws, ws_bytes, beta, dwd, dw)) return OK;
  if (xd->bf16) {
    __typeof__(*xd) xf = *xd, dyf = *dyd;
    __typeof__(*dwd) dwf = *dwd;
    xf.bf16 = dyf.bf16 = dwf.bf16 = 0;
    long long nw = (long long)dwd->k * dwd->c * dwd->h * dwd->w;
    float *xw = widened(x, (long long)xd->n * xd->c * xd->h * xd->w, 1);
    float *gw = widened(dy, (long long)dyd->n * dyd->c * dyd->h * dyd->w, 1);
    float *ww = widened(dw, nw, *(const float *)beta != 0.0f);
    in_bf16 = 1;
    s = cudnnConvolutionBackwardFilter(h, alpha, &xf, xw, &dyf, gw, d, algo, ws, ws_bytes, beta, &dwf, ww);
    in_bf16 = 0;
    narrowed(dw, ww, nw);
    free(xw), free(gw);
    return s;
  }
  tf32_calls += d->math != 3 && !in_bf16;
  bf16_calls += in_bf16;
  float a = *(const float *)alpha, b = *(const float *)beta;
  const float *xs = x, *g = dy;
  float *out = dw, *cols = ws;
  long long plane = (long long)xd->h * xd->w, pix = (long long)dyd->h * dyd->w;
  long long size = (long long)dwd->k * dwd->c * dwd->h * dwd->w;
  double *acc = calloc(size, sizeof *acc);
  int fg = dwd->k / d->groups;
  for (int ni = 0; ni < xd->n; ni++)
    for (int gr = 0; gr < d->groups; gr++)
      for (int c = 0; c < dwd->c; c++)
        for (int i = 0; i < dwd->h; i++)
          for (int j = 0; j < dwd->w; j++)
            for (int oi = 0; oi < dyd->h; oi++)
              for (int oj = 0; oj < dyd->w; oj++) {
                long long at = tap(xd, d, oi, oj, i, j);
                float v = at < 0 ? 0.0f : xs[((long long)ni * xd->c + gr * dwd->c + c) * plane + at];
                long long col = ((long long)(c * dwd->h + i) * dwd->w + j) * pix + oi * dyd->w + oj;
                if (algo != 0) cols[col] = v, v = cols[col];
                for (int f = gr * fg; f < (gr + 1) * fg; f++)
                  acc[(((long long)f * dwd->c + c) * dwd->h + i) * dwd->w + j] +=
                      (double)v * g[(((long long)ni * dyd->c + f) * dyd->h + oi) * dyd->w + oj];
              }
  for (long long q = 0; q < size; q++) out[q] = (float)(a * acc[q] + (b == 0.0f ? 0.0 : (double)b * out[q]));
  free(acc);
  if (algo != 0) fill_rest(algo, dwd, dyd, ws);
  calls++;
  return OK;
}

static void replay(void *arg) {
  const conv_call *c = arg;
  replaying = 1;
  if (c->kind == FORWARD)
    cudnnConvolutionForward(c->h, &c->alpha, c->d1, c->p1, c->d2, c->p2, c->d, c->algo, c->ws, c->ws_bytes, &c->beta,
                            c->d3, c->out);
  else if (c->kind == DATA)
    cudnnConvolutionBackwardData(c->h, &c->alpha, c->d1, c->p1, c->d2, c->p2, c->d, c->algo, c->ws, c->ws_bytes,
                                 &c->beta, c->d3, c->out);
  else
    cudnnConvolutionBackwardFilter(c->h, &c->alpha, c->d1, c->p1, c->d2, c->p2, c->d, c->algo, c->ws, c->ws_bytes,
                                   &c->beta, c->d3, c->out);
  replaying = 0;
}

/* ---- cudnnFind...AlgorithmEx: every algorithm of the call run on the caller's buffers, with a fake time ---- */

/* Find synchronises the handle's stream (it times each algorithm with events and waits for them), which the driver
 * refuses while the stream captures: through the caller's hook where it set one (the Python emulated driver,
 * fake_set_synchronize), else the stand-in driver's cuStreamSynchronize where it is loaded (the Java device); a
 * refusal is CUDNN_STATUS_EXECUTION_FAILED, as cuDNN's when its synchronisation fails */
typedef int (*sync_fn)(void *stream);
static sync_fn sync_hooked;
void fake_set_synchronize(sync_fn f) { sync_hooked = f; }
static int synchronize(void *stream) {
  if (sync_hooked) return sync_hooked(stream);
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  sync_fn f = cuda ? (sync_fn)dlsym(cuda, "cuStreamSynchronize") : NULL;
  return f ? f(stream) : 0;
}

static long long find_calls;
long long fake_cudnn_find_calls(void) { return find_calls; }

/* the fake time of algorithm `algo` of call `kind` on these shapes, in ms: 0.10 to 10.09, a hash of the call, the
 * algorithm and the sizes of x and w (so that which algorithm is fastest differs from shape to shape) */
float fake_cudnn_time(int kind, int algo, int n, int c, int h, int w, int k, int kh, int kw) {
  unsigned long long s = (unsigned long long)n * 1000003ULL + (unsigned long long)c * 10007ULL + h * 101ULL +
                         w * 11ULL + k * 7ULL + kh * 3ULL + (unsigned long long)kw + kind * 1315423911ULL;
  s = (s ^ (s >> 13)) * 0x9E3779B97F4A7C15ULL + (unsigned long long)algo * 2654435761ULL;
  s ^= s >> 29;
  s *= 0xBF58476D1CE4E5B9ULL;
  s ^= s >> 31;
  return 0.1f + (float)(s % 1000) / 100.0f;
}

/* every algorithm of call `kind` on x, w, y (forward terms), fastest first: those whose scratch is within `ws_bytes`
 * run (the workspace written over, the output `out` left with NaN bytes: cuDNN leaves arbitrary values there), each
 * with its fake time; the others CUDNN_STATUS_ALLOC_FAILED, after them, time -1 */
static cudnnStatus_t find(int kind, cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                          cudnnConvolutionDescriptor_t d, cudnnTensorDescriptor_t y, const void *a, const void *b,
                          void *out, size_t out_bytes, int requested, int *returned,
                          cudnnConvolutionFwdAlgoPerf_t *perf, void *ws, size_t ws_bytes) {
  cudnnStatus_t s = fits(x, w, d, y);
  if (!h || s != OK) return s == OK ? BAD_PARAM : s;
  if (requested < 1 || !returned || !perf || !a || !b || !out || (ws_bytes && !ws)) return BAD_PARAM;
  if (synchronize(h->stream) != 0) return EXECUTION_FAILED;
  cudnnConvolutionFwdAlgoPerf_t all[8];
  int n = algorithm_count[kind];
  for (int algo = 0; algo < n; algo++) {
    size_t need = algorithm_bytes(algo, w, y);
    int fits_ws = need <= ws_bytes;
    cudnnConvolutionFwdAlgoPerf_t p = {algo, fits_ws ? OK : ALLOC_FAILED,
                                       fits_ws ? fake_cudnn_time(kind, algo, x->n, x->c, x->h, x->w, w->k, w->h, w->w)
                                               : -1.0f,
                                       need, deterministic(kind, algo), d->math, {0}};
    if (fits_ws && need) memset(ws, 0xFF, need);
    all[algo] = p;
  }
  memset(out, 0xFF, out_bytes);
  for (int i = 1; i < n; i++) /* insertion sort: those that ran by time, then the others in algorithm order */
    for (int j = i; j > 0; j--) {
      cudnnConvolutionFwdAlgoPerf_t *p = &all[j - 1], *q = &all[j];
      int later = p->status != OK && q->status == OK;
      if (p->status == OK && q->status == OK && q->time < p->time) later = 1;
      if (!later) break;
      cudnnConvolutionFwdAlgoPerf_t t = *p;
      *p = *q, *q = t;
    }
  *returned = requested < n ? requested : n;
  memcpy(perf, all, *returned * sizeof *perf);
  find_calls++;
  return OK;
}
static size_t floats(long long n) { return (size_t)n * sizeof(float); }
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x,
                                                     cudnnFilterDescriptor_t wd, const void *w,
                                                     cudnnConvolutionDescriptor_t d, cudnnTensorDescriptor_t yd,
                                                     void *y, int requested, int *returned,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf, void *ws, size_t ws_bytes) {
  size_t out = floats((long long)yd->n * yd->c * yd->h * yd->w) / (yd->bf16 ? 2 : 1);
  return find(FORWARD, h, xd, wd, d, yd, x, w, y, out, requested, returned, perf, ws, ws_bytes);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t h, cudnnFilterDescriptor_t wd, const void *w,
                                                          cudnnTensorDescriptor_t dyd, const void *dy,
                                                          cudnnConvolutionDescriptor_t d, cudnnTensorDescriptor_t dxd,
                                                          void *dx, int requested, int *returned,
                                                          cudnnConvolutionFwdAlgoPerf_t *perf, void *ws,
                                                          size_t ws_bytes) {
  size_t out = floats((long long)dxd->n * dxd->c * dxd->h * dxd->w) / (dxd->bf16 ? 2 : 1);
  return find(DATA, h, dxd, wd, d, dyd, w, dy, dx, out, requested, returned, perf, ws, ws_bytes);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x,
                                                            cudnnTensorDescriptor_t dyd, const void *dy,
                                                            cudnnConvolutionDescriptor_t d, cudnnFilterDescriptor_t dwd,
                                                            void *dw, int requested, int *returned,
                                                            cudnnConvolutionFwdAlgoPerf_t *perf, void *ws,
                                                            size_t ws_bytes) {
  size_t out = floats((long long)dwd->k * dwd->c * dwd->h * dwd->w) / (dwd->bf16 ? 2 : 1);
  return find(FILTER, h, xd, dwd, d, dyd, x, dy, dw, out, requested, returned, perf, ws, ws_bytes);
}

/* ---- pooling: modes MAX (0), AVERAGE_COUNT_INCLUDE_PADDING (1), MAX_DETERMINISTIC (3) ---- */

typedef struct { int mode, nan, kh, kw, ph, pw, sh, sw, set; } *cudnnPoolingDescriptor_t;

cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *d) { *d = calloc(1, sizeof **d); return OK; }
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t d) { free(d); return OK; }
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d, int mode, int nan, int kh, int kw, int ph, int pw,
                                          int sh, int sw) {
  if (refused("cudnnSetPooling2dDescriptor")) return NOT_SUPPORTED;
  if ((mode != 0 && mode != 1 && mode != 3) || (nan != 0 && nan != 1) || kh <= 0 || kw <= 0 || ph < 0 || pw < 0 ||
      sh <= 0 || sw <= 0)
    return mode == 2 ? NOT_SUPPORTED : BAD_PARAM; /* this stand-in has no AVERAGE_COUNT_EXCLUDE_PADDING */
  d->mode = mode, d->nan = nan, d->kh = kh, d->kw = kw, d->ph = ph, d->pw = pw, d->sh = sh, d->sw = sw, d->set = 1;
  return OK;
}
cudnnStatus_t cudnnGetPooling2dForwardOutputDim(cudnnPoolingDescriptor_t d, cudnnTensorDescriptor_t x, int *n, int *c,
                                                int *h, int *w) {
  if (!d->set || !x->set) return BAD_PARAM;
  *n = x->n, *c = x->c;
  *h = (x->h + 2 * d->ph - d->kh) / d->sh + 1; /* floor */
  *w = (x->w + 2 * d->pw - d->kw) / d->sw + 1;
  return *h > 0 && *w > 0 ? OK : BAD_PARAM;
}
static cudnnStatus_t pool_fits(cudnnPoolingDescriptor_t d, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y) {
  int n, c, h, w;
  if (cudnnGetPooling2dForwardOutputDim(d, x, &n, &c, &h, &w) != OK || x->bf16 || y->bf16) return BAD_PARAM;
  return y->set && y->n == n && y->c == c && y->h == h && y->w == w ? OK : BAD_PARAM;
}

/* the window of output (oi, oj) in plane p of x: its maximum's index (the first, row-major; -1 if all padding) and
 * value, or its sum */
static long long window_max(cudnnPoolingDescriptor_t d, cudnnTensorDescriptor_t xd, const float *p, int oi, int oj,
                            float *value) {
  long long best = -1;
  for (int i = 0; i < d->kh; i++)
    for (int j = 0; j < d->kw; j++) {
      int hi = oi * d->sh - d->ph + i, wj = oj * d->sw - d->pw + j;
      if (hi < 0 || hi >= xd->h || wj < 0 || wj >= xd->w) continue;
      long long at = (long long)hi * xd->w + wj;
      if (best < 0 || p[at] > *value || (d->nan && p[at] != p[at] && *value == *value)) best = at, *value = p[at];
    }
  return best;
}

cudnnStatus_t cudnnPoolingForward(cudnnHandle_t h, cudnnPoolingDescriptor_t d, const void *alpha,
                                  cudnnTensorDescriptor_t xd, const void *x, const void *beta,
                                  cudnnTensorDescriptor_t yd, void *y) {
  if (refused("cudnnPoolingForward")) return NOT_SUPPORTED;
  if (!h || pool_fits(d, xd, yd) != OK) return BAD_PARAM;
  float a = *(const float *)alpha, b = *(const float *)beta;
  if (recorded_op((op_call){POOL_FORWARD, 0, 0, h, d, a, b,
                               xd, yd, NULL, NULL, x, NULL, NULL, y})) return OK;
  const float *xs = x;
  float *ys = y;
  for (long long p = 0; p < (long long)xd->n * xd->c; p++)
    for (int oi = 0; oi < yd->h; oi++)
      for (int oj = 0; oj < yd->w; oj++) {
        const float *plane = xs + p * xd->h * xd->w;
        double v = 0.0;
        if (d->mode == 1) {
          for (int i = 0; i < d->kh; i++)
            for (int j = 0; j < d->kw; j++) {
              int hi = oi * d->sh - d->ph + i, wj = oj * d->sw - d->pw + j;
              if (hi >= 0 && hi < xd->h && wj >= 0 && wj < xd->w) v += plane[(long long)hi * xd->w + wj];
            }
          v /= d->kh * d->kw;
        } else {
          float m = 0.0f;
          window_max(d, xd, plane, oi, oj, &m);
          v = m;
        }
        float *out = &ys[(p * yd->h + oi) * yd->w + oj];
        *out = (float)(a * v + (b == 0.0f ? 0.0 : (double)b * *out));
      }
  calls++;
  op_calls[POOL_FORWARD]++;
  return OK;
}

cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t h, cudnnPoolingDescriptor_t d, const void *alpha,
                                   cudnnTensorDescriptor_t yd, const void *y, cudnnTensorDescriptor_t dyd,
                                   const void *dy, cudnnTensorDescriptor_t xd, const void *x, const void *beta,
                                   cudnnTensorDescriptor_t dxd, void *dx) {
  if (refused("cudnnPoolingBackward")) return NOT_SUPPORTED;
  if (!h || pool_fits(d, xd, yd) != OK || pool_fits(d, dxd, dyd) != OK) return BAD_PARAM;
  float a = *(const float *)alpha, b = *(const float *)beta;
  if (recorded_op((op_call){POOL_BACKWARD, 0, 0, h, d, a, b,
                               yd, dyd, xd, dxd, y, dy, x, dx})) return OK;
  const float *xs = x, *g = dy;
  float *out = dx;
  long long plane = (long long)xd->h * xd->w, size = (long long)xd->n * xd->c * plane;
  double *acc = calloc(size, sizeof *acc);
  (void)y; /* the maximum is found again in x */
  for (long long p = 0; p < (long long)xd->n * xd->c; p++)
    for (int oi = 0; oi < dyd->h; oi++)
      for (int oj = 0; oj < dyd->w; oj++) {
        double gv = g[(p * dyd->h + oi) * dyd->w + oj];
        if (d->mode == 1) {
          for (int i = 0; i < d->kh; i++)
            for (int j = 0; j < d->kw; j++) {
              int hi = oi * d->sh - d->ph + i, wj = oj * d->sw - d->pw + j;
              if (hi >= 0 && hi < xd->h && wj >= 0 && wj < xd->w)
                acc[p * plane + (long long)hi * xd->w + wj] += gv / (d->kh * d->kw);
            }
        } else {
          float m = 0.0f;
          long long at = window_max(d, xd, xs + p * plane, oi, oj, &m);
          if (at >= 0) acc[p * plane + at] += gv;
        }
      }
  for (long long q = 0; q < size; q++) out[q] = (float)(a * acc[q] + (b == 0.0f ? 0.0 : (double)b * out[q]));
  free(acc);
  calls++;
  op_calls[POOL_BACKWARD]++;
  return OK;
}

/* db = alpha * the sum of dy over every axis but the channel + beta * db; db is [1, c, 1, 1] */
cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t dyd,
                                           const void *dy, const void *beta, cudnnTensorDescriptor_t dbd, void *db) {
  if (!h || !dyd->set || !dbd->set || dyd->bf16 || dbd->bf16 || dbd->n != 1 || dbd->c != dyd->c || dbd->h != 1 || dbd->w != 1) return BAD_PARAM;
  float a = *(const float *)alpha, b = *(const float *)beta;
  if (recorded_op((op_call){BIAS_BACKWARD, 0, 0, h, NULL, a, b, dyd, dbd, NULL, NULL, dy, NULL, NULL, db})) return OK;
  const float *g = dy;
  float *out = db;
  long long plane = (long long)dyd->h * dyd->w;
  for (int c = 0; c < dyd->c; c++) {
    double s = 0.0;
    for (int n = 0; n < dyd->n; n++)
      for (long long q = 0; q < plane; q++) s += g[((long long)n * dyd->c + c) * plane + q];
    out[c] = (float)(a * s + (b == 0.0f ? 0.0 : (double)b * out[c]));
  }
  calls++;
  return OK;
}

/* ---- softmax over the channels (mode CHANNEL, 1) of [n, c, h, w]: ACCURATE (1) or LOG (2) ---- */

static cudnnStatus_t softmax_fits(int algo, int mode, cudnnTensorDescriptor_t a, cudnnTensorDescriptor_t b) {
  if (algo != 1 && algo != 2) return algo == 0 ? NOT_SUPPORTED : BAD_PARAM; /* this stand-in has no FAST */
  if (mode != 1) return NOT_SUPPORTED;
  if (a->bf16 || b->bf16) return BAD_PARAM; /* float32 only */
  return a->set && b->set && a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w ? OK : BAD_PARAM;
}

cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t h, int algo, int mode, const void *alpha, cudnnTensorDescriptor_t xd,
                                  const void *x, const void *beta, cudnnTensorDescriptor_t yd, void *y) {
  if (refused("cudnnSoftmaxForward")) return NOT_SUPPORTED;
  cudnnStatus_t s = softmax_fits(algo, mode, xd, yd);
  if (!h || s != OK) return s == OK ? BAD_PARAM : s;
  float a = *(const float *)alpha, b = *(const float *)beta;
  if (recorded_op((op_call){SOFTMAX_FORWARD, algo, mode, h, NULL, a, b,
                               xd, yd, NULL, NULL, x, NULL, NULL, y})) return OK;
  const float *xs = x;
  float *ys = y;
  long long plane = (long long)xd->h * xd->w;
  for (int n = 0; n < xd->n; n++)
    for (long long q = 0; q < plane; q++) {
      const float *row = xs + (long long)n * xd->c * plane + q; /* channel k at row[k * plane] */
      double m = row[0], sum = 0.0;
      for (int k = 1; k < xd->c; k++) m = row[k * plane] > m ? row[k * plane] : m;
      for (int k = 0; k < xd->c; k++) sum += exp(row[k * plane] - m);
      for (int k = 0; k < xd->c; k++) {
        double v = algo == 2 ? row[k * plane] - m - log(sum) : exp(row[k * plane] - m) / sum;
        float *out = &ys[(long long)n * xd->c * plane + k * plane + q];
        *out = (float)(a * v + (b == 0.0f ? 0.0 : (double)b * *out));
      }
    }
  calls++;
  op_calls[SOFTMAX_FORWARD]++;
  return OK;
}

/* dx = y (dy - sum(dy y)) per position; LOG: dx = dy - exp(y) sum(dy) */
cudnnStatus_t cudnnSoftmaxBackward(cudnnHandle_t h, int algo, int mode, const void *alpha, cudnnTensorDescriptor_t yd,
                                   const void *y, cudnnTensorDescriptor_t dyd, const void *dy, const void *beta,
                                   cudnnTensorDescriptor_t dxd, void *dx) {
  if (refused("cudnnSoftmaxBackward")) return NOT_SUPPORTED;
  cudnnStatus_t s = softmax_fits(algo, mode, yd, dxd);
  if (s == OK) s = softmax_fits(algo, mode, dyd, dxd);
  if (!h || s != OK) return s == OK ? BAD_PARAM : s;
  float a = *(const float *)alpha, b = *(const float *)beta;
  if (recorded_op((op_call){SOFTMAX_BACKWARD, algo, mode, h, NULL, a, b,
                               yd, dyd, dxd, NULL, y, dy, NULL, dx})) return OK;
  const float *ys = y, *g = dy;
  float *out = dx;
  long long plane = (long long)yd->h * yd->w;
  for (int n = 0; n < yd->n; n++)
    for (long long q = 0; q < plane; q++) {
      long long at = (long long)n * yd->c * plane + q;
      double dot = 0.0;
      for (int k = 0; k < yd->c; k++) dot += algo == 2 ? g[at + k * plane] : (double)g[at + k * plane] * ys[at + k * plane];
      for (int k = 0; k < yd->c; k++) {
        long long e = at + k * plane;
        double v = algo == 2 ? g[e] - exp(ys[e]) * dot : ys[e] * (g[e] - dot);
        out[e] = (float)(a * v + (b == 0.0f ? 0.0 : (double)b * out[e]));
      }
    }
  calls++;
  op_calls[SOFTMAX_BACKWARD]++;
  return OK;
}

/* ---- cross-channel LRN (mode 0): y = x / (k + alpha / n * sum of x^2 over the window)^beta, the window looking
 * (n - 1) / 2 channels behind and n - 1 - (n - 1) / 2 ahead, as cuDNN documents; n in 1..16, k >= 1e-5,
 * beta >= 0.01 ---- */

typedef struct { unsigned n; double alpha, beta, k; int set; } *cudnnLRNDescriptor_t;

cudnnStatus_t cudnnCreateLRNDescriptor(cudnnLRNDescriptor_t *d) { *d = calloc(1, sizeof **d); return OK; }
cudnnStatus_t cudnnDestroyLRNDescriptor(cudnnLRNDescriptor_t d) { free(d); return OK; }
cudnnStatus_t cudnnSetLRNDescriptor(cudnnLRNDescriptor_t d, unsigned n, double alpha, double beta, double k) {
  if (refused("cudnnSetLRNDescriptor")) return NOT_SUPPORTED;
  if (n < 1 || n > 16 || k < 1e-5 || beta < 0.01) return BAD_PARAM;
  d->n = n, d->alpha = alpha, d->beta = beta, d->k = k, d->set = 1;
  return OK;
}

static int same(cudnnTensorDescriptor_t a, cudnnTensorDescriptor_t b) { /* float32 only */
  return a->set && b->set && !a->bf16 && !b->bf16 && a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w;
}

/* k + alpha / n * the window's sum of squares, at channel c of position (image, q) */
static double lrn_scale(cudnnLRNDescriptor_t d, cudnnTensorDescriptor_t xd, const float *x, int image, int c,
                        long long q) {
  long long plane = (long long)xd->h * xd->w;
  int behind = (d->n - 1) / 2, ahead = d->n - 1 - behind;
  double sum = 0.0;
  for (int j = c - behind; j <= c + ahead; j++)
    if (j >= 0 && j < xd->c) {
      double v = x[((long long)image * xd->c + j) * plane + q];
      sum += v * v;
    }
  return d->k + d->alpha / d->n * sum;
}

cudnnStatus_t cudnnLRNCrossChannelForward(cudnnHandle_t h, cudnnLRNDescriptor_t d, int mode, const void *alpha,
                                          cudnnTensorDescriptor_t xd, const void *x, const void *beta,
                                          cudnnTensorDescriptor_t yd, void *y) {
  if (refused("cudnnLRNCrossChannelForward")) return NOT_SUPPORTED;
  if (!h || !d->set || mode != 0 || !same(xd, yd)) return BAD_PARAM;
  float a = *(const float *)alpha, b = *(const float *)beta;
  if (recorded_op((op_call){LRN_FORWARD, 0, mode, h, d, a, b,
                               xd, yd, NULL, NULL, x, NULL, NULL, y})) return OK;
  const float *xs = x;
  float *ys = y;
  long long plane = (long long)xd->h * xd->w;
  for (int n = 0; n < xd->n; n++)
    for (int c = 0; c < xd->c; c++)
      for (long long q = 0; q < plane; q++) {
        long long e = ((long long)n * xd->c + c) * plane + q;
        double v = xs[e] * pow(lrn_scale(d, xd, xs, n, c, q), -d->beta);
        ys[e] = (float)(a * v + (b == 0.0f ? 0.0 : (double)b * ys[e]));
      }
  calls++;
  op_calls[LRN_FORWARD]++;
  return OK;
}

/* dx_j = dy_j s_j^-beta - 2 alpha beta / n * x_j * the sum, over the channels c whose window holds j, of
 * dy_c y_c / s_c */
cudnnStatus_t cudnnLRNCrossChannelBackward(cudnnHandle_t h, cudnnLRNDescriptor_t d, int mode, const void *alpha,
                                           cudnnTensorDescriptor_t yd, const void *y, cudnnTensorDescriptor_t dyd,
                                           const void *dy, cudnnTensorDescriptor_t xd, const void *x,
                                           const void *beta, cudnnTensorDescriptor_t dxd, void *dx) {
  if (refused("cudnnLRNCrossChannelBackward")) return NOT_SUPPORTED;
  if (!h || !d->set || mode != 0 || !same(xd, yd) || !same(xd, dyd) || !same(xd, dxd)) return BAD_PARAM;
  float a = *(const float *)alpha, b = *(const float *)beta;
  if (recorded_op((op_call){LRN_BACKWARD, 0, mode, h, d, a, b,
                               yd, dyd, xd, dxd, y, dy, x, dx})) return OK;
  const float *xs = x, *ys = y, *g = dy;
  float *out = dx;
  long long plane = (long long)xd->h * xd->w;
  int behind = (d->n - 1) / 2, ahead = d->n - 1 - behind;
  for (int n = 0; n < xd->n; n++)
    for (int j = 0; j < xd->c; j++)
      for (long long q = 0; q < plane; q++) {
        long long e = ((long long)n * xd->c + j) * plane + q;
        double back = 0.0;
        for (int c = j - ahead; c <= j + behind; c++) /* c's window [c - behind, c + ahead] holds j */
          if (c >= 0 && c < xd->c) {
            long long f = ((long long)n * xd->c + c) * plane + q;
            back += (double)g[f] * ys[f] / lrn_scale(d, xd, xs, n, c, q);
          }
        double v = g[e] * pow(lrn_scale(d, xd, xs, n, j, q), -d->beta) - 2.0 * d->alpha * d->beta / d->n * xs[e] * back;
        out[e] = (float)(a * v + (b == 0.0f ? 0.0 : (double)b * out[e]));
      }
  calls++;
  op_calls[LRN_BACKWARD]++;
  return OK;
}

/* ---- batch norm, SPATIAL (1): per channel of x [n, c, h, w] over its n h w values, the per-channel tensors
 * [1, c, 1, 1] ---- */

typedef struct { /* a batch-norm call's arguments */
  int backward, mode;
  cudnnHandle_t h;
  float a, b, pa, pb; /* alpha and beta of the data (and of the parameters' gradients, backward) */
  void *xd, *yd, *bnd;
  const void *x, *dy, *scale, *bias, *mean, *var;
  void *out, *dscale, *dbias;
  double eps;
} bn_call;
static void replay_bn(void *arg);

static int recorded_bn(bn_call c) {
  capture_fn capture = replaying ? NULL : recorder();
  return capture ? capture(c.h->stream, replay_bn, &c, sizeof c) : 0;
}

static cudnnStatus_t bn_fits(int mode, cudnnTensorDescriptor_t xd, cudnnTensorDescriptor_t yd,
                             cudnnTensorDescriptor_t bnd, double eps) {
  if (mode != 1) return NOT_SUPPORTED; /* this stand-in has SPATIAL alone */
  if (!same(xd, yd) || !bnd->set || bnd->n != 1 || bnd->c != xd->c || bnd->h != 1 || bnd->w != 1 || eps < 1e-5)
    return BAD_PARAM;
  return OK;
}

/* y = scale (x - mean) / sqrt(var + eps) + bias with the given mean and variance */
cudnnStatus_t cudnnBatchNormalizationForwardInference(cudnnHandle_t h, int mode, const void *alpha, const void *beta,
                                                      cudnnTensorDescriptor_t xd, const void *x,
                                                      cudnnTensorDescriptor_t yd, void *y,
                                                      cudnnTensorDescriptor_t bnd, const void *scale,
                                                      const void *bias, const void *mean, const void *var,
                                                      double eps) {
  if (refused("cudnnBatchNormalizationForwardInference")) return NOT_SUPPORTED;
  cudnnStatus_t fit = h ? bn_fits(mode, xd, yd, bnd, eps) : BAD_PARAM;
  if (fit != OK) return fit;
  float a = *(const float *)alpha, b = *(const float *)beta;
  if (recorded_bn((bn_call){0, mode, h, a, b, 0, 0, xd, yd, bnd, x, NULL, scale, bias, mean, var, y, NULL, NULL,
                            eps})) return OK;
  const float *xs = x, *g = scale, *s = bias, *m = mean, *v = var;
  float *ys = y;
  long long plane = (long long)xd->h * xd->w;
  for (int n = 0; n < xd->n; n++)
    for (int c = 0; c < xd->c; c++) {
      double r = 1.0 / sqrt((double)v[c] + eps);
      for (long long q = 0; q < plane; q++) {
        long long e = ((long long)n * xd->c + c) * plane + q;
        double out = g[c] * ((double)xs[e] - m[c]) * r + s[c];
        ys[e] = (float)(a * out + (b == 0.0f ? 0.0 : (double)b * ys[e]));
      }
    }
  calls++;
  op_calls[BN_FORWARD]++;
  return OK;
}

/* dx = scale r (dy - mean(dy) - xh mean(dy xh)), dscale = sum(dy xh), dbias = sum(dy), with x's own batch mean and
 * biased variance (r = 1 / sqrt(var + eps), xh = (x - mean) r): recomputed from x where savedMean and
 * savedInvVariance are NULL (both or neither), else taken from them */
cudnnStatus_t cudnnBatchNormalizationBackward(cudnnHandle_t h, int mode, const void *alphaData, const void *betaData,
                                              const void *alphaParam, const void *betaParam,
                                              cudnnTensorDescriptor_t xd, const void *x, cudnnTensorDescriptor_t dyd,
                                              const void *dy, cudnnTensorDescriptor_t dxd, void *dx,
                                              cudnnTensorDescriptor_t bnd, const void *scale, void *dscale,
                                              void *dbias, double eps, const void *savedMean,
                                              const void *savedInvVariance) {
  if (refused("cudnnBatchNormalizationBackward")) return NOT_SUPPORTED;
  if (!h || !same(xd, dyd) || (savedMean == NULL) != (savedInvVariance == NULL)) return BAD_PARAM;
  cudnnStatus_t fit = bn_fits(mode, xd, dxd, bnd, eps);
  if (fit != OK) return fit;
  float a = *(const float *)alphaData, b = *(const float *)betaData;
  float pa = *(const float *)alphaParam, pb = *(const float *)betaParam;
  if (recorded_bn((bn_call){1, mode, h, a, b, pa, pb, xd, dxd, bnd, x, dy, scale, NULL, savedMean, savedInvVariance,
                            dx, dscale, dbias, eps})) return OK;
  const float *xs = x, *g = dy, *gamma = scale;
  float *out = dx, *ds = dscale, *db = dbias;
  long long plane = (long long)xd->h * xd->w, count = (long long)xd->n * plane;
  for (int c = 0; c < xd->c; c++) {
    double mu = 0.0, var = 0.0, sg = 0.0, sgx = 0.0;
    for (int n = 0; n < xd->n; n++)
      for (long long q = 0; q < plane; q++) mu += xs[((long long)n * xd->c + c) * plane + q];
    mu /= count;
    for (int n = 0; n < xd->n; n++)
      for (long long q = 0; q < plane; q++) {
        double d = xs[((long long)n * xd->c + c) * plane + q] - mu;
        var += d * d;
      }
    double r = savedMean ? ((const float *)savedInvVariance)[c] : 1.0 / sqrt(var / count + eps);
    if (savedMean) mu = ((const float *)savedMean)[c];
    for (int n = 0; n < xd->n; n++)
      for (long long q = 0; q < plane; q++) {
        long long e = ((long long)n * xd->c + c) * plane + q;
        sg += g[e];
        sgx += g[e] * (xs[e] - mu) * r;
      }
    for (int n = 0; n < xd->n; n++)
      for (long long q = 0; q < plane; q++) {
        long long e = ((long long)n * xd->c + c) * plane + q;
        double v = gamma[c] * r * (g[e] - sg / count - (xs[e] - mu) * r * sgx / count);
        out[e] = (float)(a * v + (b == 0.0f ? 0.0 : (double)b * out[e]));
      }
    ds[c] = (float)(pa * sgx + (pb == 0.0f ? 0.0 : (double)pb * ds[c]));
    db[c] = (float)(pa * sg + (pb == 0.0f ? 0.0 : (double)pb * db[c]));
  }
  calls++;
  op_calls[BN_BACKWARD]++;
  return OK;
}

static void replay_bn(void *arg) {
  const bn_call *c = arg;
  replaying = 1;
  if (c->backward)
    cudnnBatchNormalizationBackward(c->h, c->mode, &c->a, &c->b, &c->pa, &c->pb, c->xd, c->x, c->xd, c->dy, c->yd,
                                    c->out, c->bnd, c->scale, c->dscale, c->dbias, c->eps, c->mean, c->var);
  else
    cudnnBatchNormalizationForwardInference(c->h, c->mode, &c->a, &c->b, c->xd, c->x, c->yd, c->out, c->bnd,
                                            c->scale, c->bias, c->mean, c->var, c->eps);
  replaying = 0;
}

static void replay_op(void *arg) {
  const op_call *c = arg;
  const float *a = &c->alpha, *b = &c->beta;
  replaying = 1;
  switch (c->kind) {
    case POOL_FORWARD: cudnnPoolingForward(c->h, c->op, a, c->d1, c->p1, b, c->d2, c->out); break;
    case POOL_BACKWARD:
      cudnnPoolingBackward(c->h, c->op, a, c->d1, c->p1, c->d2, c->p2, c->d3, c->p3, b, c->d4, c->out);
      break;
    case SOFTMAX_FORWARD: cudnnSoftmaxForward(c->h, c->algo, c->mode, a, c->d1, c->p1, b, c->d2, c->out); break;
    case SOFTMAX_BACKWARD:
      cudnnSoftmaxBackward(c->h, c->algo, c->mode, a, c->d1, c->p1, c->d2, c->p2, b, c->d3, c->out);
      break;
    case LRN_FORWARD: cudnnLRNCrossChannelForward(c->h, c->op, c->mode, a, c->d1, c->p1, b, c->d2, c->out); break;
    case LRN_BACKWARD:
      cudnnLRNCrossChannelBackward(c->h, c->op, c->mode, a, c->d1, c->p1, c->d2, c->p2, c->d3, c->p3, b, c->d4, c->out);
      break;
    case BIAS_BACKWARD: cudnnConvolutionBackwardBias(c->h, a, c->d1, c->p1, b, c->d2, c->out); break;
  }
  replaying = 0;
}
