package deepdsl.runtime;

/**
 * Which SGEMM the CPU device's matrix products (im2col convolutions, linear layers, matmuls) run on:
 * OpenBLAS ({@link OpenBlasGemm}) where its jars and natives load, else the Java SGEMM of {@link
 * CpuGemm}, so that plain {@code java} without natives still runs. The program's {@code --blas
 * openblas|java|auto} (or the property {@code -Ddeepdsl.blas=...}) chooses; {@code auto}, the
 * default, takes OpenBLAS when it loads. Until {@link #use} is called the Java SGEMM runs.
 */
public final class Blas {
  private Blas() {}

  /** The system property that sets the default of {@code --blas}. */
  public static final String PROPERTY = "deepdsl.blas";

  /** What to put on the class path for OpenBLAS, for the error that says it is missing. */
  static final String JARS =
      "the jars of org.bytedeco:openblas:0.3.31-1.5.13 and org.bytedeco:javacpp:1.5.13, each with"
          + " its linux-x86_64 natives jar (`deepdsl compile --maven` writes a pom that brings them)";

  /** A native SGEMM: C = A B (or C += A B) as {@link CpuGemm#gemm} computes it. */
  interface Gemm {
    /** Computes the product and returns true, or returns false for a layout it does not take. */
    boolean gemm(
        int m, int n, int k, GemmOperands.Mat a, GemmOperands.Right b, GemmOperands.Mat c, boolean accumulate);

    /** The library and its version, for the device line. */
    String description();

    /**
     * A direct buffer of at least {@code floats} floats, the calling thread's own, that {@link
     * #gemm} reads in place as a {@link GemmOperands.Direct} operand; null where it reads only arrays.
     */
    default java.nio.FloatBuffer columns(int floats) {
      return null;
    }
  }

  /** The native SGEMM in use; null: the Java SGEMM. */
  private static volatile Gemm gemm;

  private static volatile String description = "Java SGEMM";

  /** The native SGEMM in use, or null for the Java one. */
  static Gemm gemm() {
    return gemm;
  }

  /** The SGEMM in use, as the device line says it. */
  public static String description() {
    return description;
  }

  /** The choice of {@code --blas} when the flag is not given: the property, else {@code auto}. */
  public static String defaultChoice() {
    return System.getProperty(PROPERTY, "auto");
  }

  /**
   * Makes {@code choice} ({@code openblas}, {@code java} or {@code auto}) the SGEMM of every product
   * from now on; returns its description.
   *
   * @throws Device.Unavailable for {@code openblas} when OpenBLAS does not load: what is missing and
   *     how to get it
   * @throws IllegalArgumentException for any other choice
   */
  public static synchronized String use(String choice) {
    switch (choice) {
      case "java" -> set(null, "Java SGEMM");
      case "openblas" -> {
        Gemm g = load();
        set(g, g.description());
      }
      case "auto" -> {
        try {
          Gemm g = load();
          set(g, g.description());
        } catch (Device.Unavailable e) {
          set(null, "Java SGEMM");
        }
      }
      default ->
          throw new IllegalArgumentException(
              "--blas takes openblas, java or auto, not '" + choice + "'");
    }
    return description;
  }

  private static void set(Gemm g, String text) {
    gemm = g;
    description = text;
  }

  private static Gemm load() {
    try {
      return new OpenBlasGemm();
    } catch (ClassNotFoundException | NoClassDefFoundError e) {
      throw new Device.Unavailable(
          "--blas openblas: the OpenBLAS classes are not on the class path (no "
              + e.getMessage()
              + "): add "
              + JARS);
    } catch (ReflectiveOperationException | LinkageError | RuntimeException e) {
      Throwable cause = e.getCause() != null ? e.getCause() : e;
      throw new Device.Unavailable(
          "--blas openblas: OpenBLAS does not load ("
              + String.valueOf(cause.getMessage()).lines().findFirst().orElse("")
              + "); its natives come with "
              + JARS);
    }
  }
}
