/* A stand-in for the NVIDIA driver (libcuda.so.1) that runs a program's kernels on the CPU, so that the Java CUDA
 * device (JCuda's driver API) is tested end to end on machines without a GPU.
 *
 * Device memory is host memory (filled with NaN bytes when allocated, as an uninitialised read should show);
 * copies are memcpy. A module is the shared library named by $DEEPDSL_FAKE_CUDA_KERNELS, built by
 * tests/backends/cuda_emulator.py from the same .cu file: cuModuleGetFunction finds its `cu_<kernel>` entry point
 * and cuLaunchKernel calls it with the launch shape and the kernel's parameters. Only the calls the CUDA device
 * makes are here; JCuda's other entry points stay unresolved, and the JVM binds lazily. */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef void (*entry)(int, int, int, int, int, int, void **);

#define CAPACITY (16ULL << 30)
static unsigned long long used;
static struct {
  void *p;
  size_t n;
} blocks[1 << 16];
static int nblocks;

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12060; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  snprintf(name, len, "Emulated GPU");
  return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
  *v = attribute == 75 ? 9 : 0; /* COMPUTE_CAPABILITY_MAJOR = 75, MINOR = 76 */
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { *bytes = CAPACITY; return 0; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = (CUcontext)1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return 0; }
CUresult cuCtxSetCurrent(CUcontext c) { return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = "an error in the fake driver"; return 0; }

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
  *free = CAPACITY - used;
  *total = CAPACITY;
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  void *m = malloc(n);
  if (!m || nblocks == (1 << 16)) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  memset(m, 0xFF, n);
  blocks[nblocks].p = m;
  blocks[nblocks++].n = n;
  used += n;
  *p = (CUdeviceptr)m;
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  for (int i = 0; i < nblocks; i++) {
    if (blocks[i].p == (void *)p) {
      used -= blocks[i].n;
      blocks[i] = blocks[--nblocks];
      free((void *)p);
      return 0;
    }
  }
  return 1; /* CUDA_ERROR_INVALID_VALUE */
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { memcpy((void *)d, h, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { memcpy(h, (void *)d, n); return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { memmove((void *)d, (void *)s, n); return 0; }

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  const char *path = getenv("DEEPDSL_FAKE_CUDA_KERNELS");
  if (!path || strstr((const char *)image, ".entry") == NULL) return 200; /* CUDA_ERROR_INVALID_IMAGE */
  *m = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  return *m ? 0 : 200;
}
CUresult cuModuleUnload(CUmodule m) { return dlclose(m) == 0 ? 0 : 1; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  char symbol[512];
  snprintf(symbol, sizeof symbol, "cu_%s", name);
  *f = dlsym(m, symbol);
  return *f ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream stream, void **params, void **extra) {
  ((entry)f)(gx, gy, gz, bx, by, bz, params);
  return 0;
}
