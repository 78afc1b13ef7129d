/* A stand-in for the NVIDIA driver (libcuda.so.1) that runs a program's kernels on the CPU, so that the Java CUDA
 * device (JCuda's driver API) is tested end to end on machines without a GPU.
 *
 * Device memory is host memory (filled with NaN bytes when allocated, as an uninitialised read should show);
 * copies are memcpy. A module is the shared library named by $DEEPDSL_FAKE_CUDA_KERNELS, built by
 * tests/backends/cuda_emulator.py from the same .cu file: cuModuleGetFunction finds its `cu_<kernel>` entry point
 * and cuLaunchKernel calls it with the launch shape and the kernel's parameters. Only the calls the CUDA device
 * makes are here; JCuda's other entry points stay unresolved, and the JVM binds lazily.
 *
 * Streams and graphs: while a stream captures (cuStreamBeginCapture), a launch or device copy on it is recorded
 * (the function, the launch shape, a copy of its parameter values, sized by the `cu_<kernel>_sizes` table the
 * emulated library exports) instead of run; cuGraphInstantiate keeps the list, cuGraphLaunch runs it in order. A
 * synchronous call (a copy to or from the host, an allocation, a synchronisation) during a capture is refused as
 * the driver refuses it. The graph launches and the nodes they ran are written at exit, as "LAUNCHES NODES", to the
 * file $FAKE_CUDA_GRAPH_LAUNCHES names, if set; $FAKE_CUDA_GRAPH_SKIP=K makes each launch skip node K (from the
 * end where negative): a broken replay, for the tests to catch. A stand-in library's call on a capturing stream is
 * recorded too (fake_cuda_capture). Work runs at once, so a stream never waits. Events: a stream that waits on an
 * event recorded in a capture joins that capture until it ends (cuStreamWaitEvent), as the driver's cross-stream
 * capture does.
 *
 * $FAKE_CUDA_LAUNCH_LOG names a file to which each cuLaunchKernel call (run now or recorded into a graph) appends
 * its kernel's name, one a line: what the tests count a step's launches by. $FAKE_CUDA_LAUNCH_GRIDS names one to
 * which each appends "NAME GRID_X BLOCK_X LAST", LAST the kernel's last parameter where it is an int (an element-wise
 * kernel's element count), else "-": what the tests check a launch's grid by. */

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
static struct function {
  void *f;
  const int *sizes;
} functions[4096];
static int nfunctions;

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12060; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  snprintf(name, len, "Emulated GPU");
  return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
  /* COMPUTE_CAPABILITY_MAJOR = 75 (9, or FAKE_CUDA_CAPABILITY's tens: 75 is 7), MINOR = 76 (0, or its units) */
  const char *cc = getenv("FAKE_CUDA_CAPABILITY");
  int capability = cc ? atoi(cc) : 90;
  *v = attribute == 75 ? capability / 10 : attribute == 76 ? capability % 10 : 0;
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { *bytes = CAPACITY; return 0; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = (CUcontext)1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return 0; }
CUresult cuCtxSetCurrent(CUcontext c) { return 0; }
#define CAPTURE_UNSUPPORTED 900 /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */
#define CAPTURE_INVALIDATED 901 /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
static int capturing; /* streams capturing now */
CUresult cuCtxSynchronize(void) { return capturing ? CAPTURE_UNSUPPORTED : 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = "an error in the fake driver"; return 0; }

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
  *free = CAPACITY - used;
  *total = CAPACITY;
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (capturing) return CAPTURE_UNSUPPORTED;
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
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) {
  if (capturing) return CAPTURE_UNSUPPORTED;
  memcpy((void *)d, h, n);
  return 0;
}
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) {
  if (capturing) return CAPTURE_UNSUPPORTED;
  memcpy(h, (void *)d, n);
  return 0;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
  if (capturing) return CAPTURE_UNSUPPORTED;
  memmove((void *)d, (void *)s, n);
  return 0;
}

CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  const char *path = getenv("DEEPDSL_FAKE_CUDA_KERNELS");
  if (!path || strstr((const char *)image, ".entry") == NULL) return 200; /* CUDA_ERROR_INVALID_IMAGE */
  *m = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  return *m ? 0 : 200;
}
CUresult cuModuleUnload(CUmodule m) { return dlclose(m) == 0 ? 0 : 1; }
static struct {
  void *f;
  char name[256];
} names[4096];
static int nnames;

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  char symbol[512];
  snprintf(symbol, sizeof symbol, "cu_%s", name);
  *f = dlsym(m, symbol);
  if (!*f) return 500; /* CUDA_ERROR_NOT_FOUND */
  if (nnames < 4096) {
    names[nnames].f = *f;
    snprintf(names[nnames++].name, sizeof names[0].name, "%s", name);
  }
  strncat(symbol, "_sizes", sizeof symbol - strlen(symbol) - 1);
  const int *sizes = dlsym(m, symbol);
  if (sizes && nfunctions < 4096) functions[nfunctions++] = (struct function){*f, sizes};
  return 0;
}

/* the byte sizes of f's parameters, 0-terminated (NULL: unknown, so it cannot be captured) */
static const int *sizes_of(void *f) {
  for (int i = 0; i < nfunctions; i++)
    if (functions[i].f == f) return functions[i].sizes;
  return NULL;
}

typedef struct {
  entry f;                /* a kernel launch; else */
  void (*host)(void *); /* a stand-in library's call (fake_cuda_capture), on `values`; else a device copy */
  unsigned grid[3], block[3];
  void *params[64];
  char *values;
  CUdeviceptr to, from;
  size_t bytes;
} node;
typedef struct {
  int n, cap;
  node *nodes;
} graph;
typedef struct {
  graph *capture; /* the graph it records into, while it captures */
  int invalidated; /* a synchronisation was refused during the capture: it ends in CAPTURE_INVALIDATED */
  int joined;     /* it captures because it waited on an event recorded in another stream's capture */
} stream;
static long long launches, replayed;

__attribute__((destructor)) static void write_launches(void) {
  const char *path = getenv("FAKE_CUDA_GRAPH_LAUNCHES");
  FILE *f = path ? fopen(path, "w") : NULL;
  if (f) {
    fprintf(f, "%lld %lld\n", launches, replayed);
    fclose(f);
  }
}

static node *add(graph *g) {
  if (g->n == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 256;
    g->nodes = realloc(g->nodes, g->cap * sizeof *g->nodes);
  }
  node *k = &g->nodes[g->n++];
  memset(k, 0, sizeof *k);
  return k;
}

/* Events and the streams a capture pulls in (the NCCL path's comm stream): an event recorded on a capturing stream
 * names that capture; a stream that waits on it joins the capture (its work is recorded into the same graph, in
 * the order it is issued, which is the order the work runs in here) until the capture ends. Work runs at once, so
 * an event is complete when recorded. */
typedef struct {
  graph *capture; /* the capture it was recorded in, or NULL */
} event;
static stream *joined[64];
static int njoined;

static void unjoin(graph *g) {
  for (int i = 0; i < njoined;) {
    if (joined[i]->capture == g) {
      joined[i]->capture = NULL;
      joined[i]->joined = 0;
      capturing--;
      joined[i] = joined[--njoined];
    } else {
      i++;
    }
  }
}
CUresult cuEventCreate(void **e, unsigned flags) {
  *e = calloc(1, sizeof(event));
  return *e ? 0 : 2;
}
CUresult cuEventDestroy_v2(void *e) {
  free(e);
  return 0;
}
CUresult cuEventRecord(void *e, CUstream s) {
  if (!e) return 400; /* CUDA_ERROR_INVALID_HANDLE */
  ((event *)e)->capture = s ? ((stream *)s)->capture : NULL;
  return 0;
}
CUresult cuEventQuery(void *e) { return e ? 0 : 400; }
CUresult cuEventSynchronize(void *e) { return e && ((event *)e)->capture ? CAPTURE_UNSUPPORTED : 0; }
CUresult cuStreamWaitEvent(CUstream s, void *e, unsigned flags) {
  if (!e) return 400;
  graph *g = ((event *)e)->capture;
  if (!g) return 0;
  if (!s) return CAPTURE_UNSUPPORTED; /* the legacy stream cannot join a capture */
  stream *t = s;
  if (t->capture) return t->capture == g ? 0 : CAPTURE_UNSUPPORTED; /* two captures cannot merge */
  if (njoined == 64) return 1;
  t->capture = g;
  t->joined = 1;
  capturing++;
  joined[njoined++] = t;
  return 0;
}
CUresult cuStreamQuery(CUstream s) { return 0; }

CUresult cuStreamCreate(CUstream *s, unsigned flags) {
  *s = calloc(1, sizeof(stream));
  return 0;
}
CUresult cuStreamDestroy_v2(CUstream s) {
  if (s && ((stream *)s)->capture) return 1;
  free(s);
  return 0;
}
CUresult cuStreamSynchronize(CUstream s) { /* the stand-in cuDNN's Find calls it too (fake_libcudnn.c) */
  if (!s || !((stream *)s)->capture) return 0;
  ((stream *)s)->invalidated = 1;
  return CAPTURE_UNSUPPORTED;
}
CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
  if (!s || ((stream *)s)->capture) return 1; /* the legacy stream cannot capture */
  ((stream *)s)->capture = calloc(1, sizeof(graph));
  capturing++;
  return 0;
}
CUresult cuStreamEndCapture(CUstream s, void **g) {
  if (!s || !((stream *)s)->capture || ((stream *)s)->joined) return 1;
  unjoin(((stream *)s)->capture);
  *g = ((stream *)s)->capture;
  ((stream *)s)->capture = NULL;
  capturing--;
  if (((stream *)s)->invalidated) { /* as the driver: no graph from a broken capture */
    ((stream *)s)->invalidated = 0;
    free(((graph *)*g)->nodes);
    free(*g);
    *g = NULL;
    return CAPTURE_INVALIDATED;
  }
  return 0;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *g, unsigned long long flags) {
  *exec = g; /* the list is the executable graph; the graph outlives it (cuGraphDestroy frees it) */
  return 0;
}
CUresult cuGraphExecDestroy(void *exec) { return 0; }
CUresult cuGraphDestroy(void *g) {
  graph *p = g;
  for (int i = 0; i < p->n; i++) free(p->nodes[i].values);
  free(p->nodes);
  free(p);
  return 0;
}
CUresult cuGraphLaunch(void *exec, CUstream s) {
  graph *g = exec;
  const char *skip = getenv("FAKE_CUDA_GRAPH_SKIP");
  int omit = skip ? atoi(skip) : g->n;
  if (omit < 0) omit += g->n;
  for (int i = 0; i < g->n; i++) {
    node *k = &g->nodes[i];
    if (i == omit) continue;
    if (k->f)
      k->f(k->grid[0], k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2], k->params);
    else if (k->host)
      k->host(k->values);
    else
      memmove((void *)k->to, (void *)k->from, k->bytes);
    replayed++;
  }
  launches++;
  return 0;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream s, void **params, void **extra) {
  const char *log = getenv("FAKE_CUDA_LAUNCH_LOG");
  FILE *out = log ? fopen(log, "a") : NULL;
  if (out) {
    const char *name = "?";
    for (int i = 0; i < nnames; i++)
      if (names[i].f == (void *)f) name = names[i].name;
    fprintf(out, "%s\n", name);
    fclose(out);
  }
  const char *grids = getenv("FAKE_CUDA_LAUNCH_GRIDS");
  FILE *g = grids ? fopen(grids, "a") : NULL;
  if (g) {
    const char *name = "?";
    for (int i = 0; i < nnames; i++)
      if (names[i].f == (void *)f) name = names[i].name;
    const int *sizes = sizes_of(f);
    int count = 0;
    while (sizes && sizes[count]) count++;
    if (count && sizes[count - 1] == 4 && sizes[0] == 8) /* pointers first, an int last */
      fprintf(g, "%s %u %u %d\n", name, gx, bx, *(int *)params[count - 1]);
    else
      fprintf(g, "%s %u %u -\n", name, gx, bx);
    fclose(g);
  }
  if (s && ((stream *)s)->capture) {
    const int *sizes = sizes_of(f);
    if (!sizes) return 801; /* CUDA_ERROR_NOT_SUPPORTED */
    node *k = add(((stream *)s)->capture);
    k->f = (entry)f;
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    memcpy(k->grid, grid, sizeof grid);
    memcpy(k->block, block, sizeof block);
    int count = 0;
    while (sizes[count]) count++;
    k->values = calloc(count + 1, 8);
    if (count > 64) return 1; /* CUDA_ERROR_INVALID_VALUE */
    for (int p = 0; p < count; p++) { /* each value in an 8-byte slot of its own, copied now */
      k->params[p] = k->values + 8 * p;
      memcpy(k->params[p], params[p], sizes[p]);
    }
    return 0;
  }
  ((entry)f)(gx, gy, gz, bx, by, bz, params);
  return 0;
}
/* For the stand-in libraries (fake_libcublas.c): when `s` captures, records `run` on a copy of the `n` bytes at
 * `arg` and returns 1 (the call is then made at each replay); else returns 0 (the caller runs it now). */
int fake_cuda_capture(CUstream s, void (*run)(void *), const void *arg, size_t n) {
  if (!s || !((stream *)s)->capture) return 0;
  node *k = add(((stream *)s)->capture);
  k->host = run;
  k->values = malloc(n);
  memcpy(k->values, arg, n);
  return 1;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr from, size_t n, CUstream s) {
  if (s && ((stream *)s)->capture) {
    node *k = add(((stream *)s)->capture);
    k->to = d;
    k->from = from;
    k->bytes = n;
    return 0;
  }
  memmove((void *)d, (void *)from, n);
  return 0;
}
