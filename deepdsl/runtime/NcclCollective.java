package deepdsl.runtime;

import static jcuda.driver.JCudaDriver.cuEventCreate;
import static jcuda.driver.JCudaDriver.cuEventDestroy;
import static jcuda.driver.JCudaDriver.cuEventRecord;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;
import static jcuda.driver.JCudaDriver.cuStreamCreate;
import static jcuda.driver.JCudaDriver.cuStreamDestroy;
import static jcuda.driver.JCudaDriver.cuStreamSynchronize;
import static jcuda.driver.JCudaDriver.cuStreamWaitEvent;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.Field;
import java.util.HashMap;
import java.util.Map;
import jcuda.Pointer;
import jcuda.Sizeof;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUevent;
import jcuda.driver.CUevent_flags;

/**
 * The CUDA device's collective: NCCL through JavaCPP's CUDA presets ({@code
 * org.bytedeco.cuda.global.nccl}, already on the class path for cuBLAS and cuDNN), named by
 * reflection only as {@link CudaBlas} does. It needs {@code libnccl.so.2} (PyPI's {@code
 * nvidia-nccl-cu13}, or PyTorch's copy) at least 2.19: the presets bind lazily, so only the core
 * API is called (GetVersion, GetUniqueId, CommInitRank, AllReduce, Broadcast, CommGetAsyncError,
 * CommAbort, CommDestroy), and the version is checked first.
 *
 * <p>Rendezvous: NCCL's own {@code NCCL_COMM_ID=host:port}, taken from the environment, else set to
 * {@code MASTER_ADDR:(MASTER_PORT+1)} (torchrun's store holds MASTER_PORT), so that every rank makes
 * the same id itself; else (an MPI launch) rank 0 makes the id and {@code MPI_Bcast}s it through
 * {@link MpiCollective}.
 *
 * <p>A bucket's all-reduce runs on a stream of its own: {@link #start} records an event on the
 * compute stream, makes the comm stream wait for it, issues {@code ncclAllReduce} (in place,
 * {@code ncclSum}, never {@code ncclAvg}) there and records a second event; {@link #await} makes the
 * compute stream wait for that one. Nothing blocks the host, and all of it is captured in the train
 * step's CUDA graph (the comm stream joins the capture through the event). The watchdog thread
 * polls {@code ncclCommGetAsyncError} while a step runs; a step that takes longer than the timeout,
 * or an asynchronous error, aborts the communicator ({@code ncclCommAbort}) with an error naming
 * this rank and the cause.
 */
public final class NcclCollective implements Collective {
  /** The oldest NCCL accepted (ncclGetVersion's code). */
  static final int OLDEST = 21900;

  static final String LIBRARY =
      "NCCL 2.19 or later (libnccl.so.2: `pip install nvidia-nccl-cu13==2.29.3`, or PyTorch's copy) on"
          + " LD_LIBRARY_PATH";

  private static final int NCCL_FLOAT32 = 7;
  private static final int NCCL_INT64 = 4;
  private static final int NCCL_SUM = 0;

  private final Launch launch;
  private final CudaDevice device;
  private final MethodHandle allReduce; // ncclAllReduce(Pointer, Pointer, long, int, int, ncclComm, CUstream_st)
  private final MethodHandle broadcast;
  private final MethodHandle asyncError;
  private final MethodHandle abort;
  private final MethodHandle destroy;
  private final Object comm;
  private final Object send; // a JavaCPP Pointer whose address is set per call
  private final Object commStreamObject; // the comm stream as a CUstream_st
  private final Field address;
  private final CudaMemory.Stream commStream = new CudaMemory.Stream();
  private final Map<Integer, CUevent[]> events = new HashMap<>(); // bucket -> {ready, reduced}
  private final String version;
  private final String rendezvous;
  private final MpiCollective mpi; // the id's broadcast (an MPI launch), else null
  private final double timeout;
  private volatile long stepStarted; // System.nanoTime() of the running step, 0 between steps
  private volatile String failure;
  private Thread watchdog;
  private boolean closed;

  private NcclCollective(Launch launch, CudaDevice device) throws Throwable {
    this.launch = launch;
    this.device = device;
    this.timeout = Collective.timeoutSeconds();
    ClassLoader loader = NcclCollective.class.getClassLoader();
    Class<?> nccl;
    try {
      nccl = Class.forName("org.bytedeco.cuda.global.nccl", true, loader);
    } catch (ClassNotFoundException e) {
      throw new Device.Unavailable(
          "the JavaCPP CUDA classes are not on the class path (no " + e.getMessage() + "): add "
              + CudaBlas.JARS);
    }
    Class<?> commClass = Class.forName("org.bytedeco.cuda.nccl.ncclComm", true, loader);
    Class<?> idClass = Class.forName("org.bytedeco.cuda.nccl.ncclUniqueId", true, loader);
    Class<?> streamClass = Class.forName("org.bytedeco.cuda.cudart.CUstream_st", true, loader);
    Class<?> pointer = Class.forName("org.bytedeco.javacpp.Pointer", true, loader);
    Class<?> bytes = Class.forName("org.bytedeco.javacpp.BytePointer", true, loader);
    MethodHandles.Lookup lookup = MethodHandles.publicLookup();
    Class<?> i = int.class;
    int[] code = {0};
    check("ncclGetVersion", nccl.getMethod("ncclGetVersion", int[].class).invoke(null, (Object) code));
    version = code[0] / 10000 + "." + code[0] / 100 % 100 + "." + code[0] % 100;
    if (code[0] < OLDEST) {
      throw new Device.Unavailable(
          "NCCL " + version + " (libnccl.so.2) is older than 2.19, which the CUDA device's ranks need: "
              + LIBRARY);
    }
    allReduce =
        lookup.findStatic(nccl, "ncclAllReduce",
            MethodType.methodType(i, pointer, pointer, long.class, i, i, commClass, streamClass));
    broadcast =
        lookup.findStatic(nccl, "ncclBroadcast",
            MethodType.methodType(i, pointer, pointer, long.class, i, i, commClass, streamClass));
    asyncError =
        lookup.findStatic(nccl, "ncclCommGetAsyncError", MethodType.methodType(i, commClass, int[].class));
    abort = lookup.findStatic(nccl, "ncclCommAbort", MethodType.methodType(i, commClass));
    destroy = lookup.findStatic(nccl, "ncclCommDestroy", MethodType.methodType(i, commClass));
    address = pointer.getDeclaredField("address");
    address.setAccessible(true);

    // the id: NCCL_COMM_ID (each rank makes it), else rank 0's through MPI
    Map<String, String> env = System.getenv();
    String at = Launch.ncclRendezvous(env);
    Object id = idClass.getConstructor().newInstance();
    if (at != null) {
      if (!at.equals(env.get("NCCL_COMM_ID"))) {
        setenv("NCCL_COMM_ID", at);
      }
      mpi = null;
      rendezvous = "NCCL_COMM_ID=" + at;
      check("ncclGetUniqueId", nccl.getMethod("ncclGetUniqueId", idClass).invoke(null, id));
    } else {
      mpi = MpiCollective.open(launch, device);
      rendezvous = "the id broadcast through MPI";
      byte[] raw = new byte[128];
      if (launch.rank() == 0) {
        check("ncclGetUniqueId", nccl.getMethod("ncclGetUniqueId", idClass).invoke(null, id));
        for (int k = 0; k < 128; k++) {
          raw[k] = (byte) idClass.getMethod("internal", int.class).invoke(id, k);
        }
      }
      mpi.broadcast(raw, 0);
      for (int k = 0; k < 128; k++) {
        idClass.getMethod("internal", int.class, byte.class).invoke(id, k, raw[k]);
      }
    }
    comm = commClass.getConstructor().newInstance();
    // NCCL's rendezvous blocks until every rank is there: a rank that never comes ends the run
    Thread deadline = deadline(launch.rank(), rendezvous, timeout);
    int status;
    try {
      status =
          (Integer)
              nccl.getMethod("ncclCommInitRank", commClass, int.class, idClass, int.class)
                  .invoke(null, comm, launch.size(), id, launch.rank());
    } finally {
      deadline.interrupt();
    }
    if (status != 0) {
      throw new Device.Unavailable(
          "rank " + launch.rank() + ": ncclCommInitRank failed: NCCL error " + status + " (rendezvous "
              + rendezvous + ": did every rank start, and can they reach it?)");
    }
    send = bytes.getConstructor().newInstance();
    cuStreamCreate(commStream, 0);
    commStreamObject = streamClass.getConstructor().newInstance();
    address.setLong(commStreamObject, commStream.address());
  }

  /**
   * The NCCL communicator of {@code launch}'s ranks for the CUDA device {@code device}.
   *
   * @throws Device.Unavailable naming the jar or library that is missing, or NCCL's error
   */
  public static NcclCollective open(Launch launch, Device device) {
    try {
      return new NcclCollective(launch, (CudaDevice) device);
    } catch (Device.Unavailable e) {
      throw e;
    } catch (NoClassDefFoundError | ClassNotFoundException e) {
      throw new Device.Unavailable(
          "the JavaCPP CUDA classes are not on the class path (" + e.getMessage() + "): add " + CudaBlas.JARS);
    } catch (Throwable e) {
      Throwable cause = e instanceof java.lang.reflect.InvocationTargetException t ? t.getCause() : e;
      if (cause instanceof Device.Unavailable u) {
        throw u;
      }
      throw new Device.Unavailable("NCCL does not load (" + CudaBlas.reason(cause) + "): it needs " + LIBRARY);
    }
  }

  /**
   * A watchdog for NCCL's rendezvous, which has no timeout of its own: unless interrupted within
   * {@code seconds}, it says why and ends the process (exit 1).
   */
  private static Thread deadline(int rank, String rendezvous, double seconds) {
    Thread t = new Thread(() -> {
      try {
        Thread.sleep((long) (seconds * 1e3));
      } catch (InterruptedException e) {
        return;
      }
      System.err.println(String.format(
          "error: rank %d: NCCL's rendezvous (%s) did not finish within %.0f s (the timeout is %s or"
              + " DEEPDSL_DP_TIMEOUT): another rank did not start, died or stalled",
          rank, rendezvous, seconds, TIMEOUT_PROPERTY));
      System.err.flush();
      Runtime.getRuntime().halt(1);
    }, "deepdsl-nccl-rendezvous");
    t.setDaemon(true);
    t.start();
    return t;
  }

  /** Sets a variable of this process's environment (NCCL reads NCCL_COMM_ID there). */
  private static void setenv(String name, String value) {
    try {
      Collective.setenv(name, value, true);
    } catch (IllegalStateException e) {
      throw new Device.Unavailable(
          "NCCL's rendezvous needs " + name + "=" + value + " in the environment: set it (or put JNA,"
              + " jna-5.19.1.jar, on the class path so that the program sets it)");
    }
  }

  private static void check(String call, Object status) {
    int s = (Integer) status;
    if (s != 0) {
      throw new Device.Unavailable(call + " failed: NCCL error " + s);
    }
  }

  private void call(String what, MethodHandle h, Object... args) {
    int status;
    try {
      status = (int) h.invokeWithArguments(args);
    } catch (Throwable e) {
      throw new IllegalStateException(what + " failed", e);
    }
    if (status != 0) {
      fail();
      throw new Device.Unavailable("rank " + launch.rank() + ": " + what + " failed: NCCL error " + status);
    }
  }

  private Object at(long deviceAddress) throws IllegalAccessException {
    address.setLong(send, deviceAddress);
    return send;
  }

  @Override
  public Launch launch() {
    return launch;
  }

  @Override
  public String description() {
    return "NCCL " + version + " through JavaCPP" + CudaBlas.loadedFrom("libnccl.so") + ", " + launch.size()
        + " ranks, rendezvous " + rendezvous;
  }

  @Override
  public void start(int bucket, Buf... buffers) {
    CUevent[] e = events.computeIfAbsent(bucket, b -> {
      CUevent ready = new CUevent();
      CUevent reduced = new CUevent();
      cuEventCreate(ready, CUevent_flags.CU_EVENT_DISABLE_TIMING);
      cuEventCreate(reduced, CUevent_flags.CU_EVENT_DISABLE_TIMING);
      return new CUevent[] {ready, reduced};
    });
    cuEventRecord(e[0], device.stream);
    cuStreamWaitEvent(commStream, e[0], 0);
    try {
      for (Buf b : buffers) {
        Object p = at(device.address(b));
        call("ncclAllReduce of bucket " + bucket, allReduce, p, p, (long) b.numel(), NCCL_FLOAT32, NCCL_SUM, comm,
            commStreamObject);
      }
    } catch (IllegalAccessException x) {
      throw new IllegalStateException(x);
    }
    cuEventRecord(e[1], commStream);
  }

  @Override
  public void await(int bucket) {
    CUevent[] e = events.get(bucket);
    if (e == null) {
      throw new IllegalStateException("bucket " + bucket + "'s all-reduce was not started");
    }
    cuStreamWaitEvent(device.stream, e[1], 0);
  }

  @Override
  public void agree(long checksum, String what) {
    int n = launch.size();
    CUdeviceptr buffer = device.alloc((long) (n + 1) * Sizeof.LONG);
    long[] host = new long[n + 1];
    host[0] = checksum; // rank 0's is broadcast into slot 0; slot 1 + r: 1 where rank r differs
    cuMemcpyHtoD(buffer, Pointer.to(host), (long) (n + 1) * Sizeof.LONG);
    try {
      long base = ((CudaMemory.DevicePointer) buffer).address();
      Object p = at(base);
      call("ncclBroadcast", broadcast, p, p, 1L, NCCL_INT64, 0, comm, commStreamObject);
      cuStreamSynchronize(commStream);
      long[] first = new long[1];
      cuMemcpyDtoH(Pointer.to(first), buffer, Sizeof.LONG);
      long[] flags = new long[n];
      flags[launch.rank()] = first[0] != checksum ? 1 : 0;
      cuMemcpyHtoD(buffer.withByteOffset(Sizeof.LONG), Pointer.to(flags), (long) n * Sizeof.LONG);
      Object q = at(base + Sizeof.LONG);
      call("ncclAllReduce of the start-up check", allReduce, q, q, (long) n, NCCL_INT64, NCCL_SUM, comm,
          commStreamObject);
      cuStreamSynchronize(commStream);
      cuMemcpyDtoH(Pointer.to(flags), buffer.withByteOffset(Sizeof.LONG), (long) n * Sizeof.LONG);
      long[] values = new long[n];
      for (int r = 0; r < n; r++) {
        values[r] = flags[r] != 0 ? ~first[0] : first[0];
      }
      String differ = Collective.differing(values, what);
      if (differ != null) {
        if (mpi != null) {
          mpi.stopTogether(); // every rank saw the same flags: they end together
        }
        fail();
        throw new Device.Unavailable("rank " + launch.rank() + ": " + differ);
      }
    } catch (IllegalAccessException x) {
      throw new IllegalStateException(x);
    }
  }

  @Override
  public void beginStep() {
    if (watchdog == null) {
      watchdog = new Thread(this::watch, "deepdsl-nccl-watchdog");
      watchdog.setDaemon(true);
      watchdog.start();
    }
    stepStarted = System.nanoTime();
  }

  @Override
  public void endStep() {
    stepStarted = 0;
    if (failure != null) {
      throw new Device.Unavailable(failure);
    }
  }

  /**
   * The watchdog: while a step runs, NCCL's asynchronous error every 50 ms, and the step's time
   * against the timeout; either aborts the communicator, which ends the collectives the step waits
   * on (and, with them, the step), and the run stops with {@link #failure}.
   */
  private void watch() {
    int[] error = {0};
    while (!closed) {
      long started = stepStarted;
      if (started != 0) {
        String why = null;
        try {
          if ((int) asyncError.invoke(comm, error) == 0 && error[0] != 0) {
            why = "NCCL reported error " + error[0] + " (a rank died or the network failed)";
          }
        } catch (Throwable e) {
          why = "ncclCommGetAsyncError failed (" + e + ")";
        }
        if (why == null && System.nanoTime() - started > (long) (timeout * 1e9)) {
          why = String.format(
              "a step waited %.0f s for the other ranks, which died or stalled (the timeout is %s or"
                  + " DEEPDSL_DP_TIMEOUT)", timeout, TIMEOUT_PROPERTY);
        }
        if (why != null) {
          failure = "rank " + launch.rank() + ": " + why + "; the communicator was aborted";
          System.err.println("error: " + failure);
          System.err.flush();
          try {
            abort.invoke(comm);
          } catch (Throwable e) {
            // the error is said; the process ends below
          }
          Runtime.getRuntime().halt(1); // the step's thread may be blocked in the driver for good
        }
      }
      try {
        Thread.sleep(50);
      } catch (InterruptedException e) {
        return;
      }
    }
  }

  @Override
  public void fail() {
    if (mpi != null) {
      mpi.fail();
    }
    failure = failure == null ? "failed" : failure;
  }

  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    for (CUevent[] e : events.values()) {
      cuEventDestroy(e[0]);
      cuEventDestroy(e[1]);
    }
    cuStreamSynchronize(commStream);
    cuStreamDestroy(commStream);
    try {
      int unused = (int) (failure != null ? abort : destroy).invoke(comm);
    } catch (Throwable e) {
      // ending anyway
    }
    if (mpi != null) {
      mpi.close();
    }
  }
}
