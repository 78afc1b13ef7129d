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

  /** One line for the user: what runs the program. */
  String description();

  /**
   * Why the program runs here and not on CUDA, for a line of its own: only under {@code --device
   * auto} when CUDA could not be used; null otherwise.
   */
  /**
   * The precision this device computes in when {@code asked} (fp32, tf32 or bf16) is asked for: the
   * CPU has no TF32 math and runs tf32 as fp32, and runs a bf16 program in float32 (every value
   * float32, its casts copies), and says so ({@link #precisionNote}).
   */
  default String precision(String asked) {
    return "fp32";
  }

  /** Why {@code asked} ran as fp32, for the device line and --json. */
  static String precisionNote(String asked) {
    if (asked.equals("bf16")) {
      return "bf16 asked: the CPU device runs the bf16 program in fp32; bf16 runs on the CUDA device";
    }
    return asked + " asked: the CPU device has no TF32 math and runs it as fp32";
  }

  default String note() {
    return null;
  }

  /** Takes the network's tensors before its first step (the CUDA device copies them over). */
  void attach(Network net);

  /** One training step on the batch in the network's inputs; returns the loss. */
  float trainStep(Network net);

  /** The loss on the batch in the network's inputs in inference semantics (the test phase). */
  float evalStep(Network net);

  /** The prediction for the batch in the network's inputs (null without {@code predict}). */
  Buf inferStep(Network net);

  // ---- the operations a step is made of: every device runs the same calls ----

  /** Runs the generated kernel {@code k} over {@code args} (its outputs, then its inputs). */
  void run(Kernel k, Buf... args);

  /**
   * Runs the multi-tensor kernel {@code m} (the optimiser's updates, one launch on the GPU): segment
   * {@code j} is {@code segments[j]} (its outputs, then its inputs) computed by {@code
   * m.kind(kinds[j])}; here each in turn, as {@link #run} would.
   */
  default void runMulti(MultiKernel m, int[] kinds, Buf[][] segments) {
    for (int j = 0; j < segments.length; j++) {
      run(m.kind(kinds[j]), segments[j]);
    }
  }

  /**
   * Runs a reduction pass with its own kernels ({@link ReductionPass}; {@code args}: the results, the partial sums,
   * the inputs, the running statistics) and returns true; false where the device has no such kernels (the CPU),
   * and the caller runs the statements' own calls.
   */
  default boolean pass(ReductionPass p, Buf... args) {
    return false;
  }

  /** Copies a step's result into the tensor it updates. */
  void copy(Buf from, Buf to);

  /** The value of a one-element tensor, on the host. */
  float scalar(Buf b);

  /** The tensor's values on the host (the tensor itself where it lives there). */
  Buf read(Buf b);

  void conv2d(Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride, int[] dilation);

  void conv2dBackwardData(
      Buf out, Buf g, Buf w, int groups, int[] inShape, int[] pad, int[] stride, int[] dilation);

  /**
   * The filter gradient; {@code workspace}: the statement's planned workspace in the arena (null where the plan
   * gave it none), where the CUDA device's own kernel puts its partial sums when they fit.
   */
  void conv2dBackwardFilter(
      Buf out, Buf x, Buf g, int groups, int[] pad, int[] stride, int[] dilation, int[] wShape,
      Buf workspace);

  void linear(Buf out, Buf x, Buf w);

  void matmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB);

  void batchMatmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB);

  void maxPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride);

  void maxPool2dBackward(Buf out, Buf x, Buf y, Buf g, int[] kernel, int[] pad, int[] stride);

  void avgPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride);

  void avgPool2dBackward(Buf out, Buf g, int[] inShape, int[] kernel, int[] pad, int[] stride);

  void softmax(Buf out, Buf x);

  void logSoftmax(Buf out, Buf x);

  void softmaxBackward(Buf out, Buf y, Buf g);

  void logSoftmaxBackward(Buf out, Buf y, Buf g);

  void softmaxCrossEntropy(Buf out, Buf x, Buf labels);

  void softmaxCrossEntropyBackward(Buf out, Buf x, Buf labels, Buf g);

  void crossEntropy(Buf out, Buf p, Buf labels);

  void crossEntropyBackward(Buf out, Buf p, Buf labels, Buf g);

  void argmax(Buf out, Buf x);

  void accuracy(Buf out, Buf x, Buf labels);

  void lrn(Buf out, Buf x, float alpha, float beta, float k, int size);

  /** Each row of x [R, D] normalised to mean 0 and variance 1 (biased, plus eps). */
  void layerNormRows(Buf out, Buf x, float eps);

  /** The gradient of {@link #layerNormRows} given g = dy: x's rows' statistics recomputed. */
  void layerNormRowsBackward(Buf out, Buf x, Buf g, float eps);

  /**
   * Batch norm's apply with a scale and shift: per channel of x [N, C, ...] gamma (x - mean) / sqrt(var
   * + eps) + beta, the statistics given (the running ones, or in training the batch's).
   */
  void bnApply(Buf out, Buf x, Buf mean, Buf var, Buf gamma, Buf beta, float eps);

  /**
   * Batch norm's gradient to x [N, C, ...] given g = dy, x's own channel mean and inverse deviation
   * r = 1 / sqrt(var + eps) (its biased variance's), the scale gamma and its and the shift's
   * gradients sum(g xh) and sum(g): per channel gamma r (g - sum(g) / M - xh sum(g xh) / M), xh = (x
   * - mean) r, M = N H W. The mean and r are the saved statistics cuDNN's backward takes.
   */
  void bnTrainBackward(
      Buf out, Buf x, Buf g, Buf mean, Buf invstd, Buf gamma, Buf gammaGrad, Buf betaGrad, float eps);

  void lrnBackward(Buf out, Buf x, Buf y, Buf g, float alpha, float beta, float k, int size);

  void dropoutMask(Buf out, long step, float p, long seed, String site);

  /** Standard normal draws of call site {@code site} at {@code step} (registry op random_normal). */
  void randomNormal(Buf out, long step, long seed, String site);

  /** Draws uniform in [low, high) of call site {@code site} at {@code step} (registry op random_uniform). */
  void randomUniform(Buf out, long step, float low, float high, long seed, String site);

  /**
   * Data parallelism: {@link #dropoutMask} of the shard whose first sample is sample {@code offset}
   * of the step's global batch (registry op dropout_mask_at).
   */
  void dropoutMaskAt(Buf out, long step, long offset, float p, long seed, String site);

  /** {@link #randomNormal} of a shard (registry op random_normal_at). */
  void randomNormalAt(Buf out, long step, long offset, long seed, String site);

  /** {@link #randomUniform} of a shard (registry op random_uniform_at). */
  void randomUniformAt(Buf out, long step, long offset, float low, float high, long seed, String site);

  /** Attention's softmax with its scale and causal mask (registry op masked_softmax). */
  void maskedSoftmax(Buf out, Buf x, float scale, boolean causal, int period);

  /**
   * Data parallelism: {@code parts} flattened one after the other into {@code out}, each element
   * times the scalar {@code scale} (one float multiply), as a bucket is packed before its sum.
   */
  default void pack(Buf out, Buf scale, Buf... parts) {
    float s = scale.a[scale.off];
    int at = out.off;
    for (Buf p : parts) {
      for (int k = 0; k < p.numel(); k++) {
        out.a[at++] = p.a[p.off + k] * s;
      }
    }
  }

  /** Micro-batches: {@code sum} = {@code x} ({@code first}), else {@code sum} + {@code x}, element by element. */
  default void accumulate(Buf sum, Buf x, boolean first) {
    for (int k = 0; k < x.numel(); k++) {
      sum.a[sum.off + k] = first ? x.a[x.off + k] : sum.a[sum.off + k] + x.a[x.off + k];
    }
  }

  /** Micro-batches: a bucket's accumulator of {@code numel} floats, where {@link #accumulate} works (made once). */
  default Buf accumulator(int numel) {
    return Buf.zeros(numel);
  }

  /** Micro-batches: the run accumulates {@code micro} (over 1) a step (DataParallel, before the first step). */
  default void accumulates(int micro) {}

  /** Micro-batches: the training step's statements before its reductions, on the batch in the inputs. */
  default void microBatchPre(Network net) {
    net.microBatchPre();
  }

  /** Micro-batches: the rest of the step, once after the micro-batches; returns the loss. */
  default float microBatchPost(Network net) {
    return net.microBatchPost();
  }

  /** Brings the network's tensors up to date where the device keeps copies (before a save). */
  default void toHost(Network net) {}

  /** Sends the network's tensors to the device again (after a load). */
  default void toDevice(Network net) {}

  /** The device memory the program took, as measured; -1 where the device does not measure it. */
  default long measuredBytes() {
    return -1;
  }

  /** The device's own fields of the --json object, each after a comma ("" where it has none). */
  default String jsonFields() {
    return "";
  }

  @Override
  void close();

  /** The device asked for cannot run this program; the message says why. */
  class Unavailable extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public Unavailable(String message) {
      super(message);
    }
  }

  /** The JCuda classes are not on the class path: a CPU build, which {@code auto} does not remark on. */
  final class NoJCuda extends Unavailable {
    private static final long serialVersionUID = 1L;

    NoJCuda() {
      super("the JCuda classes are not on the class path");
    }
  }

  /**
   * The device for {@code which} ({@code cpu}, {@code cuda} or {@code auto}) running the network
   * of {@code settings}. {@code auto} takes CUDA only when the JCuda classes load, a GPU is there
   * and the kernels are found; else the CPU, saying why unless the JCuda classes are simply not on
   * the class path (a CPU build: no news on every run; {@code cuda} says why). {@code kernels} ({@code vendor}, {@code
   * own} or {@code auto}) says where the CUDA device's GEMMs run, {@code graph} whether it replays
   * the train step as a CUDA graph: see {@link CudaDevice}.
   *
   * @throws Unavailable for {@code cuda} when the CUDA device cannot run the program
   */
  static Device open(
      String which, Network.Settings settings, long workspaceLimit, String kernels, boolean graph) {
    switch (which) {
      case "cpu":
        return new CpuDevice(workspaceLimit, null);
      case "cuda":
        return cuda(settings, workspaceLimit, kernels, graph);
      case "auto":
        try {
          return cuda(settings, workspaceLimit, kernels, graph);
        } catch (NoJCuda e) {
          return new CpuDevice(workspaceLimit, null);
        } catch (Unavailable e) {
          return new CpuDevice(workspaceLimit, "CUDA not used: " + e.getMessage());
        }
      default:
        throw new IllegalArgumentException("--device takes cpu, cuda or auto, not '" + which + "'");
    }
  }

  private static Device cuda(
      Network.Settings settings, long workspaceLimit, String kernels, boolean graph) {
    try {
      return (Device)
          Class.forName("deepdsl.runtime.CudaDevice")
              .getConstructor(Network.Settings.class, long.class, String.class, boolean.class)
              .newInstance(settings, workspaceLimit, kernels, graph);
    } catch (ClassNotFoundException | NoClassDefFoundError e) { // said briefly: the class is no news
      throw new NoJCuda();
    } catch (LinkageError e) {
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
