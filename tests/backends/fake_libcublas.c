/* A stand-in for cuBLAS (libcublas.so.12) whose device memory is host memory, so that the GPU runner's vendor path
 * (deepdsl/backends/cuda/vendor.py) is tested on machines without a GPU: the handle calls, and SGEMM as the BLAS
 * reference defines it — column-major, C = alpha op(A) op(B) + beta C, op N or T, leading dimensions checked as
 * cuBLAS checks them (CUBLAS_STATUS_INVALID_VALUE), C not read when beta is 0 — in plain loops, accumulated in
 * double. Only the calls the runner makes are here. `fake_cublas_calls` counts the GEMMs, for the tests.
 *
 * The math mode (cublasSetMathMode) is kept per handle: under CUBLAS_TF32_TENSOR_OP_MATH a GEMM rounds its operands
 * to TF32 (10 mantissa bits, round to nearest even, as the tensor cores read float32) before multiplying, and
 * `fake_cublas_tf32_calls` counts those GEMMs; under the default math they are exact float32.
 *
 * For the Java CUDA device it is built as libcublas.so.13 too (cuda13_stand_ins.py), with -DFAKE_CUBLAS_VERSION=130000
 * and a linker version script giving every symbol the version node `libcublas.so.13`, which JavaCPP's bindings
 * (libjnicublas.so) require; the count is also written at exit to the file $FAKE_CUBLAS_CALLS names, if set.
 *
 * A GEMM on a stream that the stand-in driver (fake_libcuda.c, when loaded) is capturing into a CUDA graph is
 * recorded there (its arguments, alpha and beta by value, as cuBLAS reads host scalars at the call) and computed
 * at each replay; it is counted when computed.
 *
 * cublasGemmEx and cublasGemmStridedBatchedEx (--precision bf16) take A and B as CUDA_R_32F or CUDA_R_16BF (both the
 * same), C as either, and CUBLAS_COMPUTE_32F (alpha and beta float): as the hardware, the products of the bf16
 * operands are accumulated in float (here in double) and C, if bf16, is the result rounded to nearest even; any
 * other type or compute type is CUBLAS_STATUS_NOT_SUPPORTED. `fake_cublas_bf16_calls` counts the GEMMs on bf16
 * operands. */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef FAKE_CUBLAS_VERSION
#define FAKE_CUBLAS_VERSION 120000 /* says 12.0.0 */
#endif

typedef int cublasStatus_t;
typedef struct {
  void *stream;
  int math;
} *cublasHandle_t;

enum { OK = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7, NOT_SUPPORTED = 15 };
enum { CUDA_R_32F = 0, CUDA_R_16BF = 14, CUBLAS_COMPUTE_32F = 68, CUBLAS_GEMM_DEFAULT = -1 };
enum { DEFAULT_MATH = 0, TENSOR_OP_MATH = 1, PEDANTIC_MATH = 2, TF32_TENSOR_OP_MATH = 3 };
static long long calls, tf32_calls, bf16_calls;

long long fake_cublas_calls(void) { return calls; }
long long fake_cublas_bf16_calls(void) { return bf16_calls; }
long long fake_cublas_tf32_calls(void) { return tf32_calls; }

__attribute__((destructor)) static void write_calls(void) {
  const char *path = getenv("FAKE_CUBLAS_CALLS");
  FILE *f = path ? fopen(path, "w") : NULL;
  if (f) {
    fprintf(f, "%lld\n", calls);
    fclose(f);
  }
  path = getenv("FAKE_CUBLAS_TF32_CALLS"); /* the GEMMs run in CUBLAS_TF32_TENSOR_OP_MATH */
  f = path ? fopen(path, "w") : NULL;
  if (f) {
    fprintf(f, "%lld\n", tf32_calls);
    fclose(f);
  }
  path = getenv("FAKE_CUBLAS_BF16_CALLS"); /* the GemmEx calls on bf16 operands */
  f = path ? fopen(path, "w") : NULL;
  if (f) {
    fprintf(f, "%lld\n", bf16_calls);
    fclose(f);
  }
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  *h = calloc(1, sizeof **h);
  return *h ? OK : NOT_INITIALIZED;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  if (!h) return NOT_INITIALIZED;
  free(h);
  return OK;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, void *stream) {
  if (!h) return NOT_INITIALIZED;
  h->stream = stream;
  return OK;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, int mode) {
  if (!h) return NOT_INITIALIZED;
  if (mode < DEFAULT_MATH || mode > TF32_TENSOR_OP_MATH) return INVALID_VALUE;
  h->math = mode;
  return OK;
}
cublasStatus_t cublasGetMathMode(cublasHandle_t h, int *mode) {
  if (!h) return NOT_INITIALIZED;
  *mode = h->math;
  return OK;
}
cublasStatus_t cublasGetVersion_v2(cublasHandle_t h, int *version) {
  if (!h) return NOT_INITIALIZED;
  *version = FAKE_CUBLAS_VERSION;
  return OK;
}

static int max1(int x) { return x > 1 ? x : 1; }

/* bf16 storage: the top 16 bits of a float32 */
static float from_bf16(unsigned short b) {
  union { unsigned u; float f; } v = {(unsigned)b << 16};
  return v.f;
}
/* x rounded to bf16, nearest even (a NaN kept, made quiet) */
static unsigned short to_bf16(float x) {
  union { float f; unsigned u; } v = {x};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((v.u >> 16) | 0x40u);
  return (unsigned short)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* element (i, j) of op(X), X column-major with leading dimension ld, of float32 or (bf16) bf16 storage */
static float at(const void *x, int bf16, int ld, int op, int i, int j) {
  long long e = op ? j + (long long)i * ld : i + (long long)j * ld;
  return bf16 ? from_bf16(((const unsigned short *)x)[e]) : ((const float *)x)[e];
}

/* x rounded to TF32: the 13 low mantissa bits dropped, round to nearest even (finite values) */
static float tf32(float x) {
  union { float f; unsigned u; } v = {x};
  if ((v.u & 0x7f800000u) != 0x7f800000u) v.u = (v.u + 0xfffu + ((v.u >> 13) & 1u)) & ~0x1fffu;
  return v.f;
}

typedef struct {
  int ta, tb, m, n, k, lda, ldb, ldc, batch, tf32;
  float alpha, beta;
  const void *a, *b;
  void *c;
  long long sa, sb, sc;
  int ab16, c16; /* A and B bf16; C bf16 */
} call;

static void run(void *arg) {
  const call *g = arg;
  int ta = g->ta, tb = g->tb, m = g->m, n = g->n, k = g->k, lda = g->lda, ldb = g->ldb, ldc = g->ldc;
  const float *alpha = &g->alpha, *beta = &g->beta;
  long long sa = g->sa, sb = g->sb, sc = g->sc;
  size_t ab = g->ab16 ? 2 : 4, cb = g->c16 ? 2 : 4; /* bytes of an element */
  for (int p = 0; p < g->batch; p++) {
    const char *ap = (const char *)g->a + p * sa * ab, *bp = (const char *)g->b + p * sb * ab;
    char *cp = (char *)g->c + p * sc * cb;
    for (int j = 0; j < n; j++) {
      for (int i = 0; i < m; i++) {
        double s = 0.0;
        for (int q = 0; q < k; q++) {
          float x = at(ap, g->ab16, lda, ta, i, q), y = at(bp, g->ab16, ldb, tb, q, j);
          s += g->tf32 && !g->ab16 ? (double)tf32(x) * tf32(y) : (double)x * y;
        }
        long long e = i + (long long)j * ldc;
        double old = *beta == 0.0f ? 0.0 : g->c16 ? from_bf16(((unsigned short *)cp)[e]) : ((float *)cp)[e];
        float r = (float)(*alpha * s + (double)*beta * old);
        if (g->c16) ((unsigned short *)cp)[e] = to_bf16(r);
        else ((float *)cp)[e] = r;
      }
    }
  }
  calls++;
  tf32_calls += g->tf32 && !g->ab16;
  bf16_calls += g->ab16;
}

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

static cublasStatus_t gemm_typed(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha,
                                 const void *a, int lda, long long sa, const void *b, int ldb, long long sb,
                                 const float *beta, void *c, int ldc, long long sc, int batch, int ab16, int c16) {
  if (!h) return NOT_INITIALIZED;
  if ((ta != 0 && ta != 1) || (tb != 0 && tb != 1) || m < 0 || n < 0 || k < 0 || batch < 0) return INVALID_VALUE;
  if (lda < max1(ta ? k : m) || ldb < max1(tb ? n : k) || ldc < max1(m)) return INVALID_VALUE;
  call g = {ta, tb, m, n, k, lda, ldb, ldc, batch, h->math == TF32_TENSOR_OP_MATH, *alpha, *beta, a, b, c, sa, sb, sc,
            ab16, c16};
  capture_fn capture = recorder();
  if (!capture || !capture(h->stream, run, &g, sizeof g)) run(&g);
  return OK;
}

static cublasStatus_t gemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha, const float *a,
                           int lda, long long sa, const float *b, int ldb, long long sb, const float *beta, float *c,
                           int ldc, long long sc, int batch) {
  return gemm_typed(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch, 0, 0);
}

/* the Ex calls' types: A and B alike, float32 or bf16; C either; compute 32F (alpha, beta float) */
static int ex_types(int at, int bt, int ct, int compute, int *ab16, int *c16) {
  if (at != bt || (at != CUDA_R_32F && at != CUDA_R_16BF) || (ct != CUDA_R_32F && ct != CUDA_R_16BF)) return 0;
  if (compute != CUBLAS_COMPUTE_32F) return 0;
  *ab16 = at == CUDA_R_16BF;
  *c16 = ct == CUDA_R_16BF;
  return 1;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a,
                            int atype, int lda, const void *b, int btype, int ldb, const void *beta, void *c,
                            int ctype, int ldc, int compute, int algo) {
  int ab16, c16;
  if (!h) return NOT_INITIALIZED;
  if (!ex_types(atype, btype, ctype, compute, &ab16, &c16)) return NOT_SUPPORTED;
  return gemm_typed(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1, ab16, c16);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, int ta, int tb, int m, int n, int k, const void *alpha,
                                          const void *a, int atype, int lda, long long sa, const void *b, int btype,
                                          int ldb, long long sb, const void *beta, void *c, int ctype, int ldc,
                                          long long sc, int batch, int compute, int algo) {
  int ab16, c16;
  if (!h) return NOT_INITIALIZED;
  if (!ex_types(atype, btype, ctype, compute, &ab16, &c16)) return NOT_SUPPORTED;
  return gemm_typed(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch, ab16, c16);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha,
                              const float *a, int lda, const float *b, int ldb, const float *beta, float *c, int ldc) {
  return gemm(h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha,
                                         const float *a, int lda, long long sa, const float *b, int ldb, long long sb,
                                         const float *beta, float *c, int ldc, long long sc, int batch) {
  return gemm(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
}
