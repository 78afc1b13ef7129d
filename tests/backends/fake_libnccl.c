/* A test-only stand-in for NCCL (libnccl.so.2) whose device memory is host memory (the stand-in driver,
 * fake_libcuda.c), so that the Java CUDA device's NCCL path (deepdsl/runtime/NcclCollective.java: the presets'
 * bindings, the communicator, the comm stream and its events, the all-reduces inside a captured CUDA graph) runs
 * with several processes on machines without a GPU. Its collectives are MPI's on that memory: ncclAllReduce is
 * MPI_Allreduce, ncclBroadcast MPI_Bcast, over MPI_COMM_WORLD, so the ranks must be an MPI job (mpiexec); it
 * initialises MPI itself where the caller has not. Built against the MPI-5 ABI (mpi_abi.h, libmpi_abi.so.1 of
 * PyPI's mpich) by tests/backends/test_java_nccl.py, with the soname libnccl.so.2 the presets' libjninccl.so needs
 * (its nccl symbols carry no version node).
 *
 * Only the core API NcclCollective calls is here (the presets bind lazily). ncclGetUniqueId makes an id of the
 * process id and the time (of NCCL_COMM_ID where set, as NCCL does); ncclCommInitRank checks that every rank passed the same id (the rendezvous the caller
 * made: equal ids, else ncclInvalidUsage), the rank count and its rank against MPI's. A call on a stream that the
 * stand-in driver is capturing is recorded there (fake_cuda_capture) and made at each replay, as NCCL's kernels
 * are graph nodes. $FAKE_NCCL_VERSION sets what ncclGetVersion says (default 22903, NCCL 2.29.3); the number of
 * all-reduces made is written at exit to the file $FAKE_NCCL_CALLS names, if set; $FAKE_NCCL_ASYNC_ERROR=CODE makes
 * ncclCommGetAsyncError report that error once an all-reduce has run (for the watchdog's test).
 *
 * Built with -DFAKE_NCCL_MPICH against MPICH's own ABI (mpi.h, libmpi.so.12: the library mpi4py's wheel loads) for
 * the PyCUDA runner's ranks (tests/backends/test_gpu_data_parallel.py), whose emulated driver records its calls
 * while capturing through fake_set_capture, as the stand-in cuBLAS and cuDNN do. */

#include <dlfcn.h>
#ifdef FAKE_NCCL_MPICH /* MPICH's own ABI (libmpi.so.12, which mpi4py's wheel loads): the PyCUDA runner's ranks */
#include <mpi.h>
#else
#include <mpi_abi.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5
} ncclResult_t;
enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5, ncclFloat32 = 7 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct comm {
  int rank, nranks, initialised_mpi;
} *ncclComm_t;

static long long allreduces;

__attribute__((destructor)) static void write_calls(void) {
  const char *path = getenv("FAKE_NCCL_CALLS");
  FILE *f = path ? fopen(path, "w") : NULL;
  if (f) {
    fprintf(f, "%lld\n", allreduces);
    fclose(f);
  }
}

ncclResult_t ncclGetVersion(int *version) {
  const char *v = getenv("FAKE_NCCL_VERSION");
  *version = v ? atoi(v) : 22903;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    default: return "internal error - please report this issue to the NCCL developers";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  const char *at = getenv("NCCL_COMM_ID"); /* as NCCL: the id is the address, the same on every rank */
  if (at) {
    memcpy(id->internal, "fake-nccl-at:", 13);
    strncpy(id->internal + 13, at, 100);
    return ncclSuccess;
  }
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  long long v[3] = {getpid(), t.tv_sec, t.tv_nsec};
  memcpy(id->internal, "fake-nccl", 9);
  memcpy(id->internal + 16, v, sizeof v);
  return ncclSuccess;
}

static unsigned long long hash(const ncclUniqueId *id) {
  unsigned long long h = 1469598103934665603ULL; /* FNV-1a 64 */
  for (int i = 0; i < 128; i++) h = (h ^ (unsigned char)id->internal[i]) * 1099511628211ULL;
  return h >> 1; /* 63 bits: a signed MPI sum or max sees it positive */
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  int ready = 0, provided = 0, size = 0, me = 0;
  MPI_Initialized(&ready);
  if (!ready && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return ncclSystemError;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (nranks != size || rank != me || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  long long h = (long long)hash(&id), lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (lo != hi) return ncclInvalidUsage; /* the ranks did not share one id: no communicator */
  *comm = calloc(1, sizeof **comm);
  (*comm)->rank = rank;
  (*comm)->nranks = nranks;
  (*comm)->initialised_mpi = !ready;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
  if (!comm) return ncclInvalidArgument;
  const char *e = getenv("FAKE_NCCL_ASYNC_ERROR"); /* an error NCCL found on its own (a peer gone, say) */
  *error = e && allreduces > 0 ? (ncclResult_t)atoi(e) : ncclSuccess;
  return ncclSuccess;
}

static ncclResult_t finish(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  int done = 0;
  if (comm->initialised_mpi && (MPI_Finalized(&done), !done)) {
    MPI_Barrier(MPI_COMM_WORLD); /* every rank ends together: else mpiexec may lose a rank's last output */
    MPI_Finalize();
  }
  free(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return finish(comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  MPI_Abort(MPI_COMM_WORLD, 1); /* as NCCL's abort leaves the others' collectives to fail */
  return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

static MPI_Datatype mpi_type(int t) {
  switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclFloat32: return MPI_FLOAT;
    default: return MPI_DATATYPE_NULL;
  }
}

typedef struct {
  int collective; /* 0 all-reduce, 1 broadcast */
  const void *send;
  void *recv;
  size_t count;
  int type, op, root;
} call;

static void run(void *arg) {
  const call *c = arg;
  MPI_Datatype t = mpi_type(c->type);
  if (c->collective == 0) {
    MPI_Op op = c->op == ncclSum ? MPI_SUM : c->op == ncclMax ? MPI_MAX : MPI_MIN;
    MPI_Allreduce(c->send == c->recv ? MPI_IN_PLACE : c->send, c->recv, (int)c->count, t, op, MPI_COMM_WORLD);
    allreduces++;
  } else {
    if (c->send != c->recv) memcpy(c->recv, c->send, c->count * (c->type == ncclInt64 ? 8 : c->type == ncclFloat32 ? 4 : 1));
    MPI_Bcast(c->recv, (int)c->count, t, c->root, MPI_COMM_WORLD);
  }
}

typedef int (*capture_fn)(void *stream, void (*run)(void *), const void *arg, size_t n);

/* a recorder set by the caller (the Python runner's emulated driver, tests/backends/cuda_emulator.py) */
static capture_fn hooked;
void fake_set_capture(capture_fn f) { hooked = f; }

/* the caller's recorder, else the stand-in driver's where it is loaded (fake_libcuda.c: the Java CUDA device) */
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

static ncclResult_t enqueue(call c, ncclComm_t comm, void *stream) {
  if (!comm) return ncclInvalidArgument;
  if (mpi_type(c.type) == MPI_DATATYPE_NULL || (c.collective == 0 && c.op != ncclSum && c.op != ncclMax &&
                                                c.op != ncclMin)) /* ncclAvg: not here (nor used) */
    return ncclInvalidArgument;
  if (c.count > 0x7fffffff) return ncclInvalidArgument;
  capture_fn f = recorder();
  if (f && f(stream, run, &c, sizeof c)) return ncclSuccess;
  run(&c);
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, ncclComm_t comm,
                           void *stream) {
  return enqueue((call){0, send, recv, count, type, op, 0}, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, ncclComm_t comm,
                           void *stream) {
  if (comm && (root < 0 || root >= comm->nranks)) return ncclInvalidArgument;
  return enqueue((call){1, send, recv, count, type, ncclSum, root}, comm, stream);
}
