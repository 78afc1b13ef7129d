package deepdsl.runtime;

import java.lang.reflect.InvocationTargetException;

/**
 * Where a network runs. {@link #open} picks one: the CPU device (plain Java) or the CUDA device
 * (JCuda). The CUDA device is reached only by reflection, so a program run with {@code --device
 * cpu} never loads a JCuda class and needs neither the JCuda jars nor their natives.
 */
public interface Device extends AutoCloseable {
  /** The device's short name, as --json reports it: {@code cpu} or {@code cuda}. */
  String name();

  /** One line for the user: what runs the program, and why when it is not the device asked for. */
  String description();

  @Override
  void close();

  /** The device asked for cannot run this program; the message says why. */
  final class Unavailable extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public Unavailable(String message) {
      super(message);
    }
  }

  /**
   * The device for {@code which} ({@code cpu}, {@code cuda} or {@code auto}) running a program that
   * launches {@code ops} with an arena of {@code arenaBytes}. {@code auto} takes CUDA only when the
   * JCuda classes load, a GPU is there and the CUDA device covers every op; else the CPU.
   *
   * @throws Unavailable for {@code cuda} when the CUDA device cannot run the program
   */
  static Device open(String which, String[] ops, long arenaBytes, long workspaceLimit) {
    switch (which) {
      case "cpu":
        return new CpuDevice(workspaceLimit, null);
      case "cuda":
        return cuda(ops, arenaBytes, workspaceLimit);
      case "auto":
        try {
          return cuda(ops, arenaBytes, workspaceLimit);
        } catch (Unavailable e) {
          return new CpuDevice(workspaceLimit, "CUDA not used: " + e.getMessage());
        }
      default:
        throw new IllegalArgumentException("--device takes cpu, cuda or auto, not '" + which + "'");
    }
  }

  private static Device cuda(String[] ops, long arenaBytes, long workspaceLimit) {
    try {
      return (Device)
          Class.forName("deepdsl.runtime.CudaDevice")
              .getConstructor(String[].class, long.class, long.class)
              .newInstance(ops, arenaBytes, workspaceLimit);
    } catch (ClassNotFoundException | LinkageError e) {
      throw new Unavailable("the JCuda classes are not on the class path (" + e + ")");
    } catch (InvocationTargetException e) {
      Throwable cause = e.getCause();
      if (cause instanceof Unavailable u) {
        throw u;
      }
      if (cause instanceof LinkageError) {
        String text = String.valueOf(cause.getMessage());
        throw new Unavailable(
            text.contains("libcuda.so")
                ? "no NVIDIA driver on this machine (JCuda cannot load libcuda.so.1)"
                : "JCuda cannot load its natives (" + text.lines().findFirst().orElse(text) + ")");
      }
      throw new Unavailable("CUDA failed to start: " + cause);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("the runtime's CudaDevice does not match Device", e);
    }
  }
}
