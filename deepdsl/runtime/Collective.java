package deepdsl.runtime;

/**
 * The ranks of a data-parallel run and what they do together: sum each gradient bucket over the
 * ranks in place ({@link #start}, then {@link #await} before the first update that reads it), and
 * check at start that every rank runs the same plan from the same parameters ({@link #agree}).
 * Every rank makes the same calls in the same order.
 *
 * <p>Two engines, no transport of our own: {@link MpiCollective} (the MPI C library through JNA)
 * for the CPU device, {@link NcclCollective} (NCCL through JavaCPP's CUDA presets) for the CUDA
 * device. One process is {@link #SINGLE}: every call does nothing, so the same compiled program runs
 * with any number of ranks, one included.
 */
public interface Collective extends AutoCloseable {
  /** One process: nothing to reduce, nothing to agree on. */
  Collective SINGLE =
      new Collective() {
        @Override
        public Launch launch() {
          return Launch.SINGLE;
        }

        @Override
        public String description() {
          return "one process";
        }

        @Override
        public void start(int bucket, Buf... gradients) {}

        @Override
        public void await(int bucket) {}

        @Override
        public void agree(long checksum, String what) {}

        @Override
        public void close() {}
      };

  /** Seconds a rank waits for the others before it stops the run with an error (the watchdog). */
  String TIMEOUT_PROPERTY = "deepdsl.collective.timeout";

  /** The default of {@link #TIMEOUT_PROPERTY} (and {@code DEEPDSL_DP_TIMEOUT}): 300 s. */
  double DEFAULT_TIMEOUT = 300;

  /** This process's place in the run. */
  Launch launch();

  /** One line for the user: the engine, its library and version, the ranks. */
  String description();

  /**
   * Starts summing {@code gradients} (bucket {@code bucket}'s tensors, in the plan's order) over
   * the ranks, in place. The result may be read only after {@link #await} of the same bucket.
   */
  void start(int bucket, Buf... gradients);

  /** Waits until bucket {@code bucket}'s sum is in its tensors. */
  void await(int bucket);

  /**
   * Checks that every rank has the same {@code checksum} (of {@code what}: the plan and the
   * parameters at start); a rank that differs stops every rank with an error naming it.
   *
   * @throws Device.Unavailable naming the ranks that differ from rank 0
   */
  void agree(long checksum, String what);

  /** A training step begins (the watchdog of an engine whose waits do not block the host starts timing it). */
  default void beginStep() {}

  /**
   * The training step has ended (its loss has been read).
   *
   * @throws Device.Unavailable when the engine found an error while the step ran
   */
  default void endStep() {}

  /** Marks the run failed on this rank: {@link #close} then stops every rank, not only this one. */
  default void fail() {}

  @Override
  void close();

  /**
   * Whether {@code -Ddeepdsl.collective=true} asks for the engine (MPI, NCCL) even for one rank: a
   * one-rank NCCL run, eager and in the CUDA graph, must give the plain run's result (the GPU check).
   */
  static boolean forced() {
    return Boolean.getBoolean("deepdsl.collective");
  }

  /** The watchdog's timeout in seconds: the property, else the environment, else 300. */
  static double timeoutSeconds() {
    String v = System.getProperty(TIMEOUT_PROPERTY);
    if (v == null) {
      v = System.getenv("DEEPDSL_DP_TIMEOUT");
    }
    if (v == null) {
      return DEFAULT_TIMEOUT;
    }
    try {
      double s = Double.parseDouble(v.strip());
      if (s > 0 && Double.isFinite(s)) {
        return s;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    throw new IllegalArgumentException(
        "the collective's timeout (" + TIMEOUT_PROPERTY + ", DEEPDSL_DP_TIMEOUT) is '" + v
            + "', not a number of seconds > 0");
  }

  /**
   * The ranks whose value differs from rank 0's, as the error names them: {@code values[r]} is rank
   * r's; null when all agree.
   */
  static String differing(long[] values, String what) {
    StringBuilder s = new StringBuilder();
    for (int r = 1; r < values.length; r++) {
      if (values[r] != values[0]) {
        s.append(s.length() == 0 ? "" : ", ").append(r);
      }
    }
    if (s.length() == 0) {
      return null;
    }
    return "the ranks do not run the same program: rank " + s + " differ" + (s.indexOf(",") >= 0 ? "" : "s")
        + " from rank 0 in " + what + " (built from another source, seed or parameter file?)";
  }

  /**
   * The collective for {@code device} at {@code launch}: {@link #SINGLE} for one rank, else MPI for
   * the CPU device (JNA named by reflection), NCCL for the CUDA device (the class found by
   * reflection, as it needs JCuda): a one-process run loads neither library.
   *
   * @throws Device.Unavailable naming the library or jar that is missing
   */
  /**
   * Sets {@code name} in this process's C environment, where native libraries read it (NCCL its rendezvous, UCX its
   * signals): libc's setenv through JNA, named by reflection. {@code overwrite} false keeps a value already set.
   *
   * @throws IllegalStateException where JNA or libc cannot be reached, or setenv fails
   */
  static void setenv(String name, String value, boolean overwrite) {
    int rc;
    try {
      Class<?> nativeLibrary = Class.forName("com.sun.jna.NativeLibrary");
      Object c = nativeLibrary.getMethod("getInstance", String.class).invoke(null, "c");
      Object f = nativeLibrary.getMethod("getFunction", String.class).invoke(c, "setenv");
      Object[] args = {name, value, overwrite ? 1 : 0};
      rc = (int) f.getClass().getMethod("invokeInt", Object[].class).invoke(f, (Object) args);
    } catch (ReflectiveOperationException | LinkageError e) {
      throw new IllegalStateException("libc's setenv is not reachable through JNA (" + e + ")");
    }
    if (rc != 0) {
      throw new IllegalStateException("setenv(" + name + ") returned " + rc);
    }
  }

  static Collective open(Launch launch, Device device) {
    if (!launch.distributed() && !forced()) {
      return SINGLE;
    }
    if (!device.name().equals("cuda")) { // named directly: javac -sourcepath compiles it into a CPU build
      return MpiCollective.open(launch, device);
    }
    String engine = "deepdsl.runtime.NcclCollective"; // by name: it needs JCuda and the CUDA presets
    try {
      Class<?> c = Class.forName(engine);
      return (Collective) c.getMethod("open", Launch.class, Device.class).invoke(null, launch, device);
    } catch (java.lang.reflect.InvocationTargetException e) {
      if (e.getCause() instanceof RuntimeException r) {
        throw r;
      }
      throw new Device.Unavailable(engine + " failed to start: " + e.getCause());
    } catch (ReflectiveOperationException | LinkageError e) {
      throw new Device.Unavailable("the runtime's " + engine + " does not load (" + e + ")");
    }
  }
}
