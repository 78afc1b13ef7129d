/* A test-only stand-in for NCCL (libnccl.so.2) whose device memory is host memory (the stand-in driver,
 * fake_libcuda.c), so that the Java CUDA device's NCCL path (deepdsl/runtime/NcclCollective.java: the presets'
 * bindings, the communicator, the comm stream and its events, the all-reduces inside a captured CUDA graph) runs
 * with several processes on machines without a GPU. Built against the MPI-5 ABI (mpi_abi.h, libmpi_abi.so.1 of
 * PyPI's mpich) by tests/backends/test_java_nccl.py, with the soname libnccl.so.2 the presets' libjninccl.so needs
 * (its nccl symbols carry no version node).
 *
 * Two transports, chosen at ncclCommInitRank:
 * - MPI, where an MPI launcher started the process (any of PMI_RANK, PMI_SIZE, PMIX_RANK, OMPI_COMM_WORLD_SIZE
 *   set: MPICH's Hydra, Open MPI, srun --mpi=pmi2/pmix): ncclAllReduce is MPI_Allreduce, ncclBroadcast MPI_Bcast,
 *   over MPI_COMM_WORLD (MPI initialised here where the caller has not); the ranks must be MPI's.
 * - TCP sockets otherwise (torchrun, srun without MPI: plain processes), as NCCL's own bootstrap: the id carries
 *   NCCL_COMM_ID's host:port (ncclGetUniqueId), rank 0 listens there and the other ranks connect to it (retrying
 *   until the timeout: rank 0 may start later), each sending its rank, rank count and id; the collectives go
 *   through rank 0 (a star): an all-reduce sums in rank order (((r0 + r1) + r2) ...: what MPI gives two ranks bit
 *   for bit, and what micro-batches accumulate), a broadcast is relayed by rank 0. A rank that cannot connect, or
 *   whose peers do not all come, within the timeout ($FAKE_NCCL_TIMEOUT seconds, default 60) gets ncclSystemError;
 *   a peer that vanishes (its socket closed: a killed process) gives ncclRemoteError, returned by the call and
 *   reported by ncclCommGetAsyncError thereafter (a call replayed in a graph has no status of its own); a peer
 *   that stalls is the caller's watchdog's to find (ncclCommAbort shuts the sockets, so the others see it gone).
 *   One rank needs no peer (rank 0 still listens where the id names an address, as NCCL does).
 * $FAKE_NCCL_TRANSPORT=mpi|tcp chooses either whatever the environment says.
 *
 * Only the core API NcclCollective calls is here (the presets bind lazily). ncclGetUniqueId makes an id of the
 * process id and the time (of NCCL_COMM_ID where set, as NCCL does); ncclCommInitRank checks that every rank passed
 * the same id (the rendezvous the caller made: equal ids, else ncclInvalidUsage), the rank count and its rank
 * against MPI's (over TCP: against rank 0's). A call on a stream that the stand-in driver is capturing is recorded
 * there (fake_cuda_capture) and made at each replay, as NCCL's kernels are graph nodes. $FAKE_NCCL_VERSION sets
 * what ncclGetVersion says (default 22903, NCCL 2.29.3); the number of all-reduces made is written at exit to the
 * file $FAKE_NCCL_CALLS names, if set; $FAKE_NCCL_ASYNC_ERROR=CODE makes ncclCommGetAsyncError report that error
 * once an all-reduce has run (for the watchdog's test). With NCCL_DEBUG=WARN or INFO it writes NCCL's kind of log
 * lines to stderr ("HOST:PID:TID [RANK] NCCL WARN ...": why a rendezvous or a call failed; INFO adds the
 * communicator's "Init COMPLETE", as NCCL's does).
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
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6
} ncclResult_t;
enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5, ncclFloat32 = 7 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct comm {
  int rank, nranks, initialised_mpi;
  int tcp;              /* the socket transport (not an MPI launch) */
  int *fd;              /* over TCP: rank 0's socket of each other rank (fd[r]); another rank's to rank 0 (fd[0]) */
  ncclResult_t error;   /* over TCP: the first failure of a call, reported since by ncclCommGetAsyncError */
  pthread_mutex_t lock; /* one call at a time on the sockets */
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

/* NCCL's log line (NCCL_DEBUG=WARN or INFO; INFO lines only under INFO) */
static void say(int rank, const char *level, const char *fmt, ...) {
  const char *debug = getenv("NCCL_DEBUG");
  if (!debug || (strcasecmp(debug, "WARN") && strcasecmp(debug, "INFO") && strcasecmp(debug, "TRACE")) ||
      (!strcmp(level, "INFO") && !strcasecmp(debug, "WARN")))
    return;
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s:%d:%ld [%d] NCCL %s %s\n", host, getpid(), (long)syscall(SYS_gettid), rank, level, line);
  fflush(stderr);
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
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "internal error - please report this issue to the NCCL developers";
  }
}

#define AT "fake-nccl-at:" /* an id of NCCL_COMM_ID: this prefix, then host:port */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  const char *at = getenv("NCCL_COMM_ID"); /* as NCCL: the id is the address, the same on every rank */
  if (at) {
    memcpy(id->internal, AT, strlen(AT));
    strncpy(id->internal + strlen(AT), at, 100);
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

/* ---- the transport's choice ---- */

static int mpi_launch(void) {
  const char *t = getenv("FAKE_NCCL_TRANSPORT");
  if (t && *t) return strcmp(t, "tcp") != 0;
  const char *launchers[] = {"PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"};
  for (size_t i = 0; i < sizeof launchers / sizeof *launchers; i++)
    if (getenv(launchers[i])) return 1;
  return 0;
}

/* ---- TCP: NCCL's bootstrap, in small ---- */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double timeout_s(void) {
  const char *v = getenv("FAKE_NCCL_TIMEOUT");
  double s = v ? atof(v) : 60.0;
  return s > 0 ? s : 60.0;
}

/* host and port of an id made from NCCL_COMM_ID ("host:port", "[v6]:port"); 0 where the id has no address */
static int address(const ncclUniqueId *id, char *host, size_t hn, char *port, size_t pn) {
  char at[101];
  if (strncmp(id->internal, AT, strlen(AT))) return 0;
  memcpy(at, id->internal + strlen(AT), 100);
  at[100] = 0;
  char *colon = strrchr(at, ':');
  if (!colon || !colon[1]) return 0;
  *colon = 0;
  char *h = at;
  if (*h == '[' && colon > h + 1 && colon[-1] == ']') {
    h++;
    colon[-1] = 0;
  }
  snprintf(host, hn, "%s", h);
  snprintf(port, pn, "%s", colon + 1);
  return 1;
}

static int send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL); /* a peer gone: EPIPE, not SIGPIPE */
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

/* n bytes from fd; with a deadline (> 0) it gives up then. -1: the peer closed or failed; -2: out of time */
static int recv_all(int fd, void *p, size_t n, double deadline) {
  char *c = p;
  while (n) {
    if (deadline > 0) {
      double left = deadline - now();
      if (left <= 0) return -2;
      struct pollfd w = {fd, POLLIN, 0};
      int r = poll(&w, 1, (int)(left * 1000) + 1);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return -2;
    }
    ssize_t k = recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    c += k;
    n -= (size_t)k;
  }
  return 0;
}

typedef struct {
  char magic[8];
  int32_t rank, nranks;
  ncclUniqueId id;
} hello;

static const char MAGIC[8] = "fknccl1";

/* rank 0: listen at the id's address, take the other ranks' hellos, answer each with the verdict */
static ncclResult_t rendezvous_root(ncclComm_t comm, const ncclUniqueId *id, const char *host, const char *port) {
  struct addrinfo hints = {0}, *ai = NULL, *a;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(host, port, &hints, &ai);
  if (rc) {
    say(0, "WARN", "Bootstrap : cannot resolve NCCL_COMM_ID %s:%s (%s)", host, port, gai_strerror(rc));
    return ncclSystemError;
  }
  int listener = -1, err = 0;
  for (a = ai; a && listener < 0; a = a->ai_next) {
    listener = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (listener < 0) continue;
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener, a->ai_addr, a->ai_addrlen) || listen(listener, comm->nranks + 16)) {
      err = errno;
      close(listener);
      listener = -1;
    }
  }
  freeaddrinfo(ai);
  if (listener < 0) {
    say(0, "WARN", "Bootstrap : rank 0 cannot listen at NCCL_COMM_ID %s:%s (%s)", host, port, strerror(err));
    return ncclSystemError;
  }
  double deadline = now() + timeout_s();
  int joined = 0;
  ncclResult_t verdict = ncclSuccess;
  while (joined < comm->nranks - 1) {
    double left = deadline - now();
    struct pollfd w = {listener, POLLIN, 0};
    int r = left > 0 ? poll(&w, 1, (int)(left * 1000) + 1) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      say(0, "WARN", "Bootstrap : rank 0 waited %g s at NCCL_COMM_ID %s:%s for %d of its %d peer ranks, which did "
                     "not come (FAKE_NCCL_TIMEOUT)", timeout_s(), host, port, comm->nranks - 1 - joined,
          comm->nranks - 1);
      verdict = ncclSystemError;
      break;
    }
    int fd = accept(listener, NULL, NULL);
    if (fd < 0) continue;
    hello h;
    if (recv_all(fd, &h, sizeof h, now() + 10) || memcmp(h.magic, MAGIC, sizeof MAGIC)) {
      close(fd); /* not one of ours */
      continue;
    }
    if (h.rank <= 0 || h.rank >= comm->nranks || comm->fd[h.rank] >= 0 || h.nranks != comm->nranks) {
      say(0, "WARN", "Bootstrap : a rank %d of %d joined rank 0 of %d ranks (a rank twice, or other counts)",
          h.rank, h.nranks, comm->nranks);
      verdict = ncclInvalidArgument;
      close(fd);
      break;
    }
    if (memcmp(&h.id, id, sizeof *id)) {
      say(0, "WARN", "Bootstrap : rank %d passed another id than rank 0's", h.rank);
      verdict = ncclInvalidUsage;
    }
    comm->fd[h.rank] = fd;
    joined++;
  }
  close(listener);
  int32_t v = verdict;
  for (int r = 1; r < comm->nranks; r++)
    if (comm->fd[r] >= 0) send_all(comm->fd[r], &v, sizeof v);
  return verdict;
}

/* another rank: connect to rank 0 (retrying: it may not listen yet), say who it is, take the verdict */
static ncclResult_t rendezvous_peer(ncclComm_t comm, const ncclUniqueId *id, const char *host, const char *port) {
  double deadline = now() + timeout_s();
  int fd = -1, err = 0;
  while (fd < 0) {
    struct addrinfo hints = {0}, *ai = NULL, *a;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc) {
      say(comm->rank, "WARN", "Bootstrap : cannot resolve NCCL_COMM_ID %s:%s (%s)", host, port, gai_strerror(rc));
      return ncclSystemError;
    }
    for (a = ai; a && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
        err = errno;
        close(fd);
        fd = -1;
      }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
      if (now() > deadline) {
        say(comm->rank, "WARN", "Bootstrap : rank %d could not reach rank 0 at NCCL_COMM_ID %s:%s within %g s (%s; "
                                "FAKE_NCCL_TIMEOUT)", comm->rank, host, port, timeout_s(), strerror(err));
        return ncclSystemError;
      }
      usleep(50000);
    }
  }
  hello h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, MAGIC, sizeof MAGIC);
  h.rank = comm->rank;
  h.nranks = comm->nranks;
  h.id = *id;
  int32_t verdict = ncclSystemError;
  int got = send_all(fd, &h, sizeof h) ? -1 : recv_all(fd, &verdict, sizeof verdict, deadline);
  if (got) {
    say(comm->rank, "WARN", "Bootstrap : rank %d reached NCCL_COMM_ID %s:%s but rank 0 %s", comm->rank, host, port,
        got == -2 ? "did not answer within the timeout (FAKE_NCCL_TIMEOUT): its other peers did not come"
                  : "closed the connection");
    close(fd);
    return got == -2 ? ncclSystemError : ncclRemoteError;
  }
  if (verdict != ncclSuccess) {
    say(comm->rank, "WARN", "Bootstrap : rank 0 refused the communicator (%s)", ncclGetErrorString(verdict));
    close(fd);
    return (ncclResult_t)verdict;
  }
  comm->fd[0] = fd;
  return ncclSuccess;
}

static void shut(ncclComm_t comm) { /* every socket shut: a peer blocked on one sees this rank gone */
  for (int r = 0; r < comm->nranks; r++)
    if (comm->fd[r] >= 0) shutdown(comm->fd[r], SHUT_RDWR);
}

static ncclResult_t init_tcp(ncclComm_t comm, const ncclUniqueId *id) {
  comm->tcp = 1;
  comm->fd = malloc(sizeof(int) * (size_t)comm->nranks);
  for (int r = 0; r < comm->nranks; r++) comm->fd[r] = -1;
  pthread_mutex_init(&comm->lock, NULL);
  char host[101], port[16];
  if (!address(id, host, sizeof host, port, sizeof port)) {
    if (comm->nranks == 1) return ncclSuccess; /* its own id: nobody to meet */
    say(comm->rank, "WARN", "Bootstrap : the id names no address (set NCCL_COMM_ID=host:port on every rank, or "
                            "launch with MPI)");
    return ncclInvalidUsage;
  }
  ncclResult_t r = comm->rank == 0 ? rendezvous_root(comm, id, host, port) : rendezvous_peer(comm, id, host, port);
  if (r == ncclSuccess)
    for (int k = 0; k < comm->nranks; k++) {
      int one = 1;
      if (comm->fd[k] >= 0) setsockopt(comm->fd[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
  return r;
}

static void free_comm(ncclComm_t comm) {
  if (comm->tcp) {
    for (int r = 0; r < comm->nranks; r++)
      if (comm->fd[r] >= 0) close(comm->fd[r]);
    free(comm->fd);
    pthread_mutex_destroy(&comm->lock);
  }
  free(comm);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  ncclComm_t c = calloc(1, sizeof *c);
  c->rank = rank;
  c->nranks = nranks;
  if (!mpi_launch()) {
    ncclResult_t r = init_tcp(c, &id);
    if (r != ncclSuccess) {
      free_comm(c);
      return r;
    }
    say(rank, "INFO", "comm %p rank %d nranks %d cudaDev 0 busId 0 commId 0x%llx (the stand-in, over TCP) - Init "
                      "COMPLETE", (void *)c, rank, nranks, hash(&id));
    *comm = c;
    return ncclSuccess;
  }
  int ready = 0, provided = 0, size = 0, me = 0;
  MPI_Initialized(&ready);
  if (!ready && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    free(c);
    return ncclSystemError;
  }
  c->initialised_mpi = !ready;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (nranks != size || rank != me) {
    free(c);
    return ncclInvalidArgument;
  }
  long long h = (long long)hash(&id), lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (lo != hi) { /* the ranks did not share one id: no communicator */
    free(c);
    return ncclInvalidUsage;
  }
  say(rank, "INFO", "comm %p rank %d nranks %d cudaDev 0 busId 0 commId 0x%llx (the stand-in, over MPI) - Init "
                    "COMPLETE", (void *)c, rank, nranks, hash(&id));
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
  if (!comm) return ncclInvalidArgument;
  const char *e = getenv("FAKE_NCCL_ASYNC_ERROR"); /* an error NCCL found on its own (a peer gone, say) */
  *error = e && allreduces > 0 ? (ncclResult_t)atoi(e) : comm->tcp ? comm->error : ncclSuccess;
  return ncclSuccess;
}

static ncclResult_t finish(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  int done = 0;
  if (comm->initialised_mpi && (MPI_Finalized(&done), !done)) {
    MPI_Barrier(MPI_COMM_WORLD); /* every rank ends together: else mpiexec may lose a rank's last output */
    MPI_Finalize();
  }
  free_comm(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return finish(comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (comm->tcp) { /* the sockets shut, so the peers' calls fail (ncclRemoteError) rather than wait; the rest is
                      left (a call of another thread may still hold it), as the process ends */
    shut(comm);
    return ncclSuccess;
  }
  /* the launcher forwards what this rank wrote (the caller's reason, just before) only while the job lives: MPICH's
     Hydra, ending the job at MPI_Abort, dropped it under load (an empty stderr, seen twice in the slow tier) */
  usleep(500000);
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

static size_t type_bytes(int t) { return t == ncclInt64 ? 8 : t == ncclFloat32 || t == ncclInt32 ? 4 : 1; }

typedef struct {
  int collective; /* 0 all-reduce, 1 broadcast */
  const void *send;
  void *recv;
  size_t count;
  int type, op, root;
  ncclComm_t comm;
} call;

/* ---- the collectives over TCP ---- */

#define REDUCE(T)                                                                                     \
  {                                                                                                   \
    T *x = acc;                                                                                       \
    const T *y = more;                                                                                \
    for (size_t i = 0; i < n; i++)                                                                    \
      x[i] = op == ncclSum ? (T)(x[i] + y[i]) : op == ncclMax ? (x[i] > y[i] ? x[i] : y[i]) : (x[i] < y[i] ? x[i] : y[i]); \
    break;                                                                                            \
  }

static void reduce(void *acc, const void *more, size_t n, int type, int op) { /* acc = acc op more, element-wise */
  switch (type) {
    case ncclInt8: REDUCE(int8_t)
    case ncclUint8: REDUCE(uint8_t)
    case ncclInt32: REDUCE(int32_t)
    case ncclInt64: REDUCE(int64_t)
    case ncclFloat32: REDUCE(float)
  }
}

typedef struct {
  int32_t collective, type, op, root;
  int64_t count;
} header; /* what each rank sends before its data: rank 0 checks the ranks make the same call */

static ncclResult_t failed(ncclComm_t comm, ncclResult_t r, const char *fmt, int peer) {
  if (comm->error == ncclSuccess) {
    comm->error = r;
    say(comm->rank, "WARN", fmt, peer);
  }
  shut(comm); /* the others then see this rank gone, rather than wait for it */
  return r;
}

static ncclResult_t run_tcp(const call *c) {
  ncclComm_t comm = c->comm;
  size_t bytes = c->count * type_bytes(c->type);
  if (c->send != c->recv) memcpy(c->recv, c->send, bytes);
  if (comm->nranks == 1) return ncclSuccess;
  pthread_mutex_lock(&comm->lock);
  ncclResult_t r = comm->error;
  if (r != ncclSuccess) goto out;
  header mine = {c->collective, c->type, c->op, c->root, (int64_t)c->count};
  const char *gone = "rank %d's connection closed during a collective (the process died or aborted)";
  if (comm->rank != 0) {
    int sends = c->collective == 0 || c->root == comm->rank;
    if (send_all(comm->fd[0], &mine, sizeof mine) || (sends && send_all(comm->fd[0], c->recv, bytes))) {
      r = failed(comm, ncclRemoteError, gone, 0);
      goto out;
    }
    if (c->collective == 0 || c->root != comm->rank) {
      if (recv_all(comm->fd[0], c->recv, bytes, 0)) r = failed(comm, ncclRemoteError, gone, 0);
    }
    goto out;
  }
  /* rank 0: every rank's header (and, for an all-reduce, its data, summed in rank order) */
  char *more = c->collective == 0 && bytes ? malloc(bytes) : NULL;
  for (int p = 1; p < comm->nranks && r == ncclSuccess; p++) {
    header theirs;
    if (recv_all(comm->fd[p], &theirs, sizeof theirs, 0)) {
      r = failed(comm, ncclRemoteError, gone, p);
    } else if (memcmp(&theirs, &mine, sizeof mine)) {
      r = failed(comm, ncclInvalidUsage, "rank %d made another call than rank 0 (collective, type, count or root)",
                 p);
    } else if (c->collective == 0 && recv_all(comm->fd[p], more, bytes, 0)) {
      r = failed(comm, ncclRemoteError, gone, p);
    } else if (c->collective == 0) {
      reduce(c->recv, more, c->count, c->type, c->op);
    }
  }
  free(more);
  if (r == ncclSuccess && c->collective == 1 && c->root != 0 && recv_all(comm->fd[c->root], c->recv, bytes, 0))
    r = failed(comm, ncclRemoteError, gone, c->root);
  for (int p = 1; p < comm->nranks && r == ncclSuccess; p++)
    if ((c->collective == 0 || p != c->root) && send_all(comm->fd[p], c->recv, bytes))
      r = failed(comm, ncclRemoteError, gone, p);
out:
  pthread_mutex_unlock(&comm->lock);
  return r;
}

static ncclResult_t run_call(const call *c) {
  if (c->comm->tcp) {
    ncclResult_t r = run_tcp(c);
    if (c->collective == 0 && r == ncclSuccess) allreduces++;
    return r;
  }
  MPI_Datatype t = mpi_type(c->type);
  if (c->collective == 0) {
    MPI_Op op = c->op == ncclSum ? MPI_SUM : c->op == ncclMax ? MPI_MAX : MPI_MIN;
    MPI_Allreduce(c->send == c->recv ? MPI_IN_PLACE : c->send, c->recv, (int)c->count, t, op, MPI_COMM_WORLD);
    allreduces++;
  } else {
    if (c->send != c->recv) memcpy(c->recv, c->send, c->count * type_bytes(c->type));
    MPI_Bcast(c->recv, (int)c->count, t, c->root, MPI_COMM_WORLD);
  }
  return ncclSuccess;
}

static void run(void *arg) { run_call(arg); } /* a replayed call: its failure is the comm's asynchronous error */

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
  c.comm = comm;
  capture_fn f = recorder();
  if (f && f(stream, run, &c, sizeof c)) return ncclSuccess;
  return run_call(&c);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, ncclComm_t comm,
                           void *stream) {
  return enqueue((call){0, send, recv, count, type, op, 0, NULL}, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, ncclComm_t comm,
                           void *stream) {
  if (comm && (root < 0 || root >= comm->nranks)) return ncclInvalidArgument;
  return enqueue((call){1, send, recv, count, type, ncclSum, root, NULL}, comm, stream);
}
