package deepdsl.runtime;

/**
 * The CPU device: the generated kernels and {@link CpuOps} in plain Java on {@link Parallel#THREADS}
 * threads (every core of the host unless {@code --threads} says otherwise).
 * It never touches a JCuda class.
 */
public final class CpuDevice implements Device {
  private final long workspaceLimit;
  private final String note;

  /**
   * @param workspaceLimit the scratch bytes a convolution may take
   * @param note why the CPU runs the program when another device was possible (null: it was asked
   *     for)
   */
  public CpuDevice(long workspaceLimit, String note) {
    this.workspaceLimit = workspaceLimit;
    this.note = note;
  }

  @Override
  public String name() {
    return "cpu";
  }

  @Override
  public String description() {
    int threads = Parallel.THREADS;
    return "cpu (Java, "
        + threads
        + (threads == 1 ? " thread" : " threads")
        + ", workspace limit "
        + workspaceLimit
        + " bytes)";
  }

  @Override
  public String note() {
    return note;
  }

  @Override
  public void attach(Network net) {
    net.allocateArena();
  }

  @Override
  public float trainStep(Network net) {
    return net.trainStep();
  }

  @Override
  public float evalStep(Network net) {
    return net.evalStep();
  }

  @Override
  public Buf inferStep(Network net) {
    return net.inferStep();
  }

  @Override
  public void close() {}
}
