/* A stand-in for cuDNN 9 (libcudnn.so.9) whose device memory is host memory, so that the GPU runner's convolution
 * through cuDNN (deepdsl/backends/cuda/vendor.py) is tested on machines without a GPU. Only the calls the runner
 * makes: the handle, NCHW float tensor / filter / convolution descriptors, the forward algorithm query (_v7) and the
 * forward convolution, as cuDNN defines it (cross-correlation, zero padding, groups, y = alpha conv + beta y, y not
 * read when beta is 0). Two algorithms, in the order the query gives them: IMPLICIT_PRECOMP_GEMM (1), which needs
 * one image's im2col matrix of scratch and really writes it there (so a workspace that overlaps live data shows),
 * then IMPLICIT_GEMM (0), direct loops without scratch. Descriptors that do not fit each other, or a workspace
 * smaller than the algorithm needs, are CUDNN_STATUS_BAD_PARAM. `fake_cudnn_calls` counts the convolutions. */

#include <stdlib.h>
#include <string.h>

typedef int cudnnStatus_t;
enum { OK = 0, NOT_INITIALIZED = 1001, BAD_PARAM = 2000, NOT_SUPPORTED = 3000 };
typedef struct { int stream; } *cudnnHandle_t;
typedef struct { int n, c, h, w, set; } *cudnnTensorDescriptor_t;
typedef struct { int k, c, h, w, set; } *cudnnFilterDescriptor_t;
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

size_t cudnnGetVersion(void) { return 90000; }
const char *cudnnGetErrorString(cudnnStatus_t s) {
  return s == OK ? "CUDNN_STATUS_SUCCESS" : s == BAD_PARAM ? "CUDNN_STATUS_BAD_PARAM" : "CUDNN_STATUS_NOT_SUPPORTED";
}
cudnnStatus_t cudnnCreate(cudnnHandle_t *h) { *h = calloc(1, sizeof **h); return *h ? OK : NOT_INITIALIZED; }
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) { free(h); return OK; }
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, void *stream) { return h ? OK : BAD_PARAM; }

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) { *d = calloc(1, sizeof **d); return OK; }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) { free(d); return OK; }
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, int format, int dtype, int n, int c, int h, int w) {
  if (format != 0 || dtype != 0 || n <= 0 || c <= 0 || h <= 0 || w <= 0) return BAD_PARAM; /* NCHW float only */
  d->n = n, d->c = c, d->h = h, d->w = w, d->set = 1;
  return OK;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) { *d = calloc(1, sizeof **d); return OK; }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) { free(d); return OK; }
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, int dtype, int format, int k, int c, int h, int w) {
  if (format != 0 || dtype != 0 || k <= 0 || c <= 0 || h <= 0 || w <= 0) return BAD_PARAM;
  d->k = k, d->c = c, d->h = h, d->w = w, d->set = 1;
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
  return d->dh == 1 && d->dw == 1 ? OK : NOT_SUPPORTED; /* this stand-in has no dilation */
}

static size_t precomp_bytes(cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t y) {
  return (size_t)w->c * w->h * w->w * y->h * y->w * sizeof(float); /* one image, one group at a time */
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t d,
                                                     cudnnTensorDescriptor_t y, int requested, int *returned,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf) {
  cudnnStatus_t s = fits(x, w, d, y);
  if (!h || s != OK) return s == OK ? BAD_PARAM : s;
  if (requested < 1) return BAD_PARAM;
  cudnnConvolutionFwdAlgoPerf_t all[2] = {{1, OK, 1.0f, precomp_bytes(w, y), 1, d->math, {0}},
                                          {0, OK, 2.0f, 0, 1, d->math, {0}}};
  *returned = requested < 2 ? requested : 2;
  memcpy(perf, all, *returned * sizeof *perf);
  return OK;
}

/* (x, w) at output (ni, f, oi, oj), channels of f's group */
static double dot(const float *x, const float *w, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                  cudnnConvolutionDescriptor_t d, int ni, int f, int oi, int oj) {
  int g = f / (wd->k / d->groups);
  double s = 0.0;
  for (int c = 0; c < wd->c; c++)
    for (int i = 0; i < wd->h; i++)
      for (int j = 0; j < wd->w; j++) {
        int hi = oi * d->sh - d->ph + i, wj = oj * d->sw - d->pw + j;
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
  if (algo != 0 && algo != 1) return NOT_SUPPORTED;
  if (algo == 1 && (ws_bytes < precomp_bytes(wd, yd) || !ws)) return BAD_PARAM;
  float a = *(const float *)alpha, b = *(const float *)beta;
  const float *xs = x, *wt = w;
  float *ys = y, *cols = ws;
  int fg = wd->k / d->groups, kk = wd->c * wd->h * wd->w, pix = yd->h * yd->w;
  for (int ni = 0; ni < xd->n; ni++) {
    for (int g = 0; g < d->groups; g++) {
      if (algo == 1) { /* im2col of image ni, group g, into the workspace: [c/g * kh * kw, oh * ow] */
        for (int c = 0; c < wd->c; c++)
          for (int i = 0; i < wd->h; i++)
            for (int j = 0; j < wd->w; j++)
              for (int oi = 0; oi < yd->h; oi++)
                for (int oj = 0; oj < yd->w; oj++) {
                  int hi = oi * d->sh - d->ph + i, wj = oj * d->sw - d->pw + j;
                  int inside = hi >= 0 && hi < xd->h && wj >= 0 && wj < xd->w;
                  cols[((long long)(c * wd->h + i) * wd->w + j) * pix + oi * yd->w + oj] =
                      inside ? xs[(((long long)ni * xd->c + g * wd->c + c) * xd->h + hi) * xd->w + wj] : 0.0f;
                }
      }
      for (int f = g * fg; f < (g + 1) * fg; f++)
        for (int oi = 0; oi < yd->h; oi++)
          for (int oj = 0; oj < yd->w; oj++) {
            double acc = 0.0;
            if (algo == 1) {
              for (int q = 0; q < kk; q++) acc += (double)wt[(long long)f * kk + q] * cols[(long long)q * pix + oi * yd->w + oj];
            } else {
              acc = dot(xs, wt, xd, wd, d, ni, f, oi, oj);
            }
            float *out = &ys[(((long long)ni * yd->c + f) * yd->h + oi) * yd->w + oj];
            *out = (float)(a * acc + (b == 0.0f ? 0.0 : (double)b * *out));
          }
    }
  }
  calls++;
  return OK;
}
