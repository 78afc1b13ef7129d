package deepdsl.runtime;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * A network's tensors, as its generated class declares them: parameters, model state, optimizer
 * state, constants, inputs and labels by name, the arena the steps' temporaries live in, the
 * settings its update kernels read at run time, and the device its steps call. {@link Network} adds
 * training, testing, prediction, parameter files and the program's {@code main}; a generated class
 * extends that.
 */
public abstract class NetworkTensors {
  /** What the generated class tells the runtime about its network. */
  public static final class Settings {
    final String name;
    long seed = 1;
    String data = "synthetic";
    boolean shuffle;
    int iterations = 100;
    int testEvery;
    int testIterations = 10;
    long trainArenaBytes;
    long arenaBytes;
    long peakBytes;
    long workspaceLimit;
    // the bytes of the multi-tensor launches' tables (the CUDA device's, beside the arena; memcheck's
    // gpu_table_bytes)
    long tableBytes;
    // the CUDA device's cuDNN convolutions: the heuristic's deterministic algorithms (--deterministic), not the
    // fastest found by timing each at its first call
    boolean deterministic;
    String accuracyLabel;
    List<String> predictInputs; // null: the network defines no predict
    Schedule schedule; // null: the optimizer's constant learning rate, in the step
    String saveFile; // the train block's save: written at the end (and every saveEvery iterations)
    int saveEvery;
    boolean predictIntegers;
    Augment augment; // the train block's augment: null without one
    String regressionTarget; // the input predict is compared with for the test's mean absolute error
    // fp32 or tf32 (deepdsl compile --precision, the train block's precision; --precision overrides
    // it): tf32 runs the CUDA device's cuBLAS GEMMs and cuDNN convolutions in TF32 tensor-op math
    String precision = "fp32";

    public Settings(String name) {
      this.name = name;
    }

    /** The precision compiled in (fp32 unless given): tf32 on the CUDA device's libraries. */
    public Settings precision(String precision) {
      this.precision = precision;
      return this;
    }

    public Settings seed(long seed) {
      this.seed = seed;
      return this;
    }

    /** The train block's data source, as a --data flag. */
    public Settings data(String flag) {
      return data(flag, false);
    }

    public Settings data(String flag, boolean shuffle) {
      this.data = flag;
      this.shuffle = shuffle;
      return this;
    }

    public Settings iterations(int iterations) {
      this.iterations = iterations;
      return this;
    }

    /** Test on {@code batches} test batches every {@code every} iterations (0: only at the end). */
    public Settings testing(int every, int batches) {
      this.testEvery = every;
      this.testIterations = batches;
      return this;
    }

    /**
     * The bytes of the tables the CUDA device writes for the multi-tensor launches (MultiKernel), all
     * of them together: one allocation beside the arena, made at the start.
     */
    public Settings tables(long bytes) {
      this.tableBytes = bytes;
      return this;
    }

    /** The training plan's arena, and the arena both programs fit in. */
    public Settings arena(long trainBytes, long bytes) {
      this.trainArenaBytes = trainBytes;
      this.arenaBytes = bytes;
      return this;
    }

    /**
     * What one training step holds, as {@code deepdsl memcheck} counts it: the parameters, model
     * state, optimizer state, inputs and constants, and the training plan's arena.
     */
    public Settings peak(long bytes) {
      this.peakBytes = bytes;
      return this;
    }

    public Settings workspaceLimit(long bytes) {
      this.workspaceLimit = bytes;
      return this;
    }

    /** cuDNN's heuristic, deterministic convolution algorithms by default (deepdsl compile --deterministic). */
    public Settings deterministic(boolean on) {
      this.deterministic = on;
      return this;
    }

    /** The train block's learning-rate schedule: the step reads its rate from {@link #rate}. */
    public Settings learningRate(Schedule schedule) {
      this.schedule = schedule;
      return this;
    }

    /** The train block's {@code save} (and {@code save_every}, 0 for only at the end). */
    public Settings save(String file, int every) {
      this.saveFile = file;
      this.saveEvery = every;
      return this;
    }

    /**
     * The inputs {@code predict} reads (what --predict takes from the data), and whether it gives
     * integers (an {@code argmax}: written as int64).
     */
    public Settings predicts(boolean integers, String... inputs) {
      this.predictIntegers = integers;
      this.predictInputs = List.of(inputs);
      return this;
    }

    /**
     * The label whose accuracy the test phase reports (the one the loss classifies, with {@code
     * predict} its scores); without one, the test phase reports the test loss only.
     */
    public Settings accuracy(String label) {
      this.accuracyLabel = label;
      return this;
    }

    /**
     * The train block's {@code augment}: every step on training batches, the normalisation on test
     * and prediction batches.
     */
    public Settings augment(Augment augment) {
      this.augment = augment;
      return this;
    }

    /**
     * The input the loss regresses {@code predict} on: the test phase reports the mean absolute
     * error of {@code predict} against it.
     */
    public Settings regression(String target) {
      this.regressionTarget = target;
      return this;
    }
  }

  enum Kind {
    PARAM,
    STATE,
    OPT,
    CONST
  }

  record Tensor(Buf buf, Kind kind) {}

  protected final Settings settings;

  /**
   * The one block every temporary of a step lives in, at the offset the plan gave it; allocated
   * when the CPU device takes the network (on the CUDA device the arena is on the GPU).
   */
  protected float[] arena;
  private boolean onHost; // the arena is the CPU device's (hostScale), not the CUDA device's

  /** The step counter: the number of training steps taken (it seeds the dropout masks). */
  protected long iteration;

  /** The scratch bytes a kernel may take beyond the arena (picks the convolution algorithm). */
  protected long workspaceLimit;

  final Map<String, Tensor> tensors = new LinkedHashMap<>();
  // the network's inputs and labels in declaration order, each filled from the data by name
  final List<Data.Field> fields = new ArrayList<>();
  final List<Buf> batch = new ArrayList<>();
  Buf rate; // the learning rate of the current step, where the train block gives a schedule

  /** The device the steps run on: every operation of a step is a call of it. */
  protected Device dev;

  protected NetworkTensors(Settings settings) {
    this.settings = settings;
    this.schedule = settings.schedule;
    this.workspaceLimit = settings.workspaceLimit;
  }

  /** 2 for a bf16 program (the CPU device, all float32, places each value at twice its offset), else 1. */
  int hostScale() {
    return settings.precision.equals("bf16") ? 2 : 1;
  }

  /** The host arena of the CPU device. */
  void allocateArena() {
    if (arena != null) {
      return;
    }
    if (settings.arenaBytes / 4 * hostScale() > Integer.MAX_VALUE - 8) {
      throw new Device.Unavailable(
          settings.name
              + " needs an arena of "
              + settings.arenaBytes
              + " bytes, more than one Java array holds; run it on a GPU (--device cuda), with a"
              + " smaller batch, or compiled with --remat");
    }
    arena = new float[(int) (settings.arenaBytes / 4 * hostScale())];
    onHost = true;
  }

  /**
   * The arena of a device that keeps it (the CUDA device): the host holds no elements of it, only
   * the array the step's tensors name it by.
   */
  float[] useDeviceArena() {
    onHost = false;
    arena = new float[0];
    return arena;
  }

  // ---- what a device reads of the network ----

  /** Every parameter, state, optimizer state and constant tensor by name, in declaration order. */
  Map<String, Buf> tensorsByName() {
    Map<String, Buf> out = new LinkedHashMap<>();
    tensors.forEach((name, t) -> out.put(name, t.buf));
    return out;
  }

  /** Every input and label buffer by name, in declaration order. */
  Map<String, Buf> batchByName() {
    Map<String, Buf> out = new LinkedHashMap<>();
    for (int f = 0; f < fields.size(); f++) {
      out.put(fields.get(f).name(), batch.get(f));
    }
    return out;
  }

  /** Whether {@code name} is a label (its buffer holds class ids as exact floats). */
  boolean isLabel(String name) {
    return fields.stream().anyMatch(f -> f.label() && f.name().equals(name));
  }

  // ---- what the generated fields and steps use ----

  /** The input {@code name} of {@code shape} ({@code [N, ...]}), filled from the data by name. */
  protected final Buf input(String name, int... shape) {
    return field(new Data.Field(name, false, 0, Arrays.copyOfRange(shape, 1, shape.length)), shape);
  }

  /**
   * The integer input {@code name}: token ids in {@code [0, vocab)} (as exact floats), filled from
   * the data by name.
   */
  protected final Buf tokens(String name, int vocab, int... shape) {
    return field(new Data.Field(name, false, vocab, Arrays.copyOfRange(shape, 1, shape.length)), shape);
  }

  /** The label {@code name}: class ids in {@code [0, classes)}, filled from the data by name. */
  protected final Buf label(String name, int classes, int... shape) {
    return field(new Data.Field(name, true, classes, Arrays.copyOfRange(shape, 1, shape.length)), shape);
  }

  /** A label whose data may also hold {@code ignore} (a loss's ignore_index), besides its class ids. */
  protected final Buf labelIgnoring(String name, int classes, long ignore, int... shape) {
    int[] sample = Arrays.copyOfRange(shape, 1, shape.length);
    return field(new Data.Field(name, true, classes, sample, ignore), shape);
  }

  private Buf field(Data.Field f, int[] shape) {
    Buf b = Buf.zeros(shape);
    fields.add(f);
    batch.add(b);
    return b;
  }

  /** The learning rate the step reads (one float), set from the schedule before every step. */
  protected final Buf learningRateInput() {
    rate = Buf.zeros();
    return rate;
  }

  /** The learning-rate buffer, or null without a schedule. */
  Buf rateBuffer() {
    return rate;
  }

  /** The learning rate of step {@code iteration} (0, 1, ...) as the step takes it: the schedule's, as a float. */
  public float learningRate(long iteration) {
    return (float) schedule.at(iteration);
  }

  /** N, the samples of one step. */
  int batchSize() {
    return batch.get(0).shape[0];
  }

  /**
   * A trained parameter, initialised as {@code init} says ({@code he(fan_in=25, fan_out=500)},
   * ...).
   */
  protected final Buf param(String name, String init, int... shape) {
    return add(name, Kind.PARAM, initial(name, init, shape), shape);
  }

  /** Model state (batch-norm running statistics), initialised as {@code init} says. */
  protected final Buf state(String name, String init, int... shape) {
    return add(name, Kind.STATE, initial(name, init, shape), shape);
  }

  /** Optimizer state: zero until a parameter file or a step fills it. */
  protected final Buf optimizerState(String name, int... shape) {
    return add(name, Kind.OPT, new float[Math.toIntExact(Buf.count(shape))], shape);
  }

  /**
   * The optimizer state {@code what} of parameter {@code of} ({@code momentum}; Adam's {@code m},
   * {@code v}): named {@code opt/<parameter>/<what>} in parameter files, shaped as the parameter.
   */
  protected final Buf optimizerState(Buf of, String what) {
    for (Map.Entry<String, Tensor> t : tensors.entrySet()) {
      if (t.getValue().buf == of) {
        return optimizerState("opt/" + t.getKey() + "/" + what, of.shape);
      }
    }
    throw new IllegalArgumentException("optimizer state " + what + " of a tensor that is no parameter");
  }

  /**
   * A loop-invariant tensor the optimiser hoisted out of the step: every element {@code value},
   * set once, never saved or loaded.
   */
  protected final Buf constant(String name, float value, int... shape) {
    float[] values = new float[Math.toIntExact(Buf.count(shape))];
    Arrays.fill(values, value);
    return add(name, Kind.CONST, values, shape);
  }

  // ---- settings: the hyperparameters the update kernels read at run time ----

  private static final int MAX_SETTINGS = 16;
  private Schedule schedule; // the train block's (null: none), from the base rate --lr may set
  private final float[] settingValues = new float[MAX_SETTINGS];
  private final Map<String, Buf> settingBufs = new LinkedHashMap<>();

  /**
   * A setting ({@code lr}, {@code momentum}, ...) that the kernels read at each step: {@code value}
   * unless the flag {@code --name} or {@link #set} gives another.
   */
  protected final Buf setting(String name, float value) {
    Buf b = new Buf(settingValues, settingBufs.size(), new int[0]);
    settingValues[b.off] = value;
    settingBufs.put(name, b);
    return b;
  }

  /**
   * Sets a setting for the next steps. With a learning-rate schedule, {@code lr} is the schedule's
   * base rate: the schedule computes each step's rate from it.
   */
  public void set(String name, double value) {
    if (name.equals("lr") && !settingBufs.containsKey(name) && schedule != null) {
      schedule = schedule.withBase(value);
      return;
    }
    Buf b = settingBuf(name);
    b.a[b.off] = (float) value;
  }

  /** The value of a setting. */
  public float get(String name) {
    Buf b = settingBuf(name);
    return b.a[b.off];
  }

  private Buf settingBuf(String name) {
    Buf b = settingBufs.get(name);
    if (b == null) {
      List<String> has = new ArrayList<>(); // in the order of the flags, as deepdsl run lists them
      for (String flag : CommandLine.SETTING_FLAGS) {
        String key = flag.substring(2).replace('-', '_');
        if (settingBufs.containsKey(key) || (key.equals("lr") && schedule != null)) {
          has.add(key);
        }
      }
      throw new IllegalArgumentException(
          settings.name
              + " has no setting '"
              + name
              + "' (it has "
              + String.join(", ", has)
              + ")");
    }
    return b;
  }

  /** Every setting's value, for a device that keeps a copy (index: the order of declaration). */
  float[] settingValues() {
    return settingValues;
  }

  // the library calls' arguments by name: dev.conv2d(out, x, w, groups(1), pad(0, 0), stride(1, 1))

  protected static int groups(int n) {
    return n;
  }

  protected static int[] pad(int... rowsCols) {
    return rowsCols;
  }

  protected static int[] stride(int... rowsCols) {
    return rowsCols;
  }

  protected static int[] dilation(int... rowsCols) {
    return rowsCols;
  }

  protected static int[] kernel(int... rowsCols) {
    return rowsCols;
  }

  protected static int[] inShape(int... shape) {
    return shape;
  }

  protected static int[] wShape(int... shape) {
    return shape;
  }

  protected static boolean transposeA(boolean t) {
    return t;
  }

  protected static boolean transposeB(boolean t) {
    return t;
  }

  /** The arena region at {@code byteOffset} seen as a tensor of {@code shape}. */
  protected final Buf at(long byteOffset, int... shape) {
    return new Buf(arena, (int) (byteOffset / 4 * (onHost ? hostScale() : 1)), shape);
  }

  /** As {@link #at}, a value the plan stores in bf16: 2 bytes an element on the GPU, float32 on the CPU. */
  protected final Buf atBf16(long byteOffset, int... shape) {
    return onHost ? at(byteOffset, shape) : new Buf(arena, (int) (byteOffset / 4), true, shape);
  }

  /** The same elements with another shape (a reshape costs nothing). */
  protected static Buf view(Buf b, int... shape) {
    return new Buf(b.a, b.off, b.bf16, shape);
  }

  private Buf add(String name, Kind kind, float[] values, int[] shape) {
    Buf b = new Buf(values, 0, shape);
    tensors.put(name, new Tensor(b, kind));
    return b;
  }

  private float[] initial(String name, String init, int[] shape) {
    int open = init.indexOf('(');
    String kind = init.substring(0, open);
    List<Double> args = new ArrayList<>();
    int fanIn = 0;
    int fanOut = 0;
    for (String part : init.substring(open + 1, init.length() - 1).split(",")) {
      String p = part.strip();
      if (p.startsWith("fan_in=")) {
        fanIn = Integer.parseInt(p.substring(7));
      } else if (p.startsWith("fan_out=")) {
        fanOut = Integer.parseInt(p.substring(8));
      } else if (!p.isEmpty()) {
        args.add(Double.parseDouble(p));
      }
    }
    double[] values = args.stream().mapToDouble(Double::doubleValue).toArray();
    return Init.array(name, shape, kind, values, fanIn, fanOut, settings.seed);
  }

  /** The parameter whose optimizer state {@code name} is ({@code opt/cv1.W/m} is cv1.W's), or null. */
  static String owner(String name) {
    int last = name.lastIndexOf('/');
    return name.startsWith("opt/") && last > 3 ? name.substring(4, last) : null;
  }

  /**
   * The parameters this network holds but keeps no optimizer state for while it keeps some for others: the
   * frozen ones. The state a file holds for them is skipped (fine-tuning from a file a full run saved), as
   * deepdsl/checkpoint.py does.
   */
  static Set<String> statelessParameters(List<String> expected) {
    Set<String> owners = new HashSet<>();
    for (String name : expected) {
      String p = owner(name);
      if (p != null) {
        owners.add(p);
      }
    }
    Set<String> out = new HashSet<>();
    if (!owners.isEmpty()) {
      for (String name : expected) {
        if (!name.contains("/") && !owners.contains(name)) {
          out.add(name);
        }
      }
    }
    return out;
  }

  // ---- data parallelism (passes/data_parallel.py; DataParallel, Collective) ----

  /** The setting every bucket is packed times: 1 / (ranks x micro-batches). */
  static final String SCALE = "dp/scale";

  DataParallel parallel = DataParallel.NONE;
  private boolean dataParallel;

  /** The data-parallel pass's input {@code dp/scale}: a setting the run sets (DataParallel). */
  protected final Buf dataParallelScale() {
    dataParallel = true;
    return setting(SCALE, 1f);
  }

  /** The shard's first sample in the step's global batch, where the step's per-sample draws start. */
  protected final long sampleOffset() {
    return parallel.offset(batchSize());
  }

  /** Whether the program was compiled with the data-parallel pass. */
  boolean isDataParallel() {
    return dataParallel;
  }

  /** Elements {@code [offset, offset + numel)} of {@code b} as a tensor of {@code shape} (a bucket's gradient). */
  protected static Buf slice(Buf b, int offset, int... shape) {
    return new Buf(b.a, b.off + offset, shape);
  }

  /** Packs bucket {@code bucket}'s tensors times {@code scale} into {@code out}, then starts its sum over the ranks. */
  protected final void allReduceStart(int bucket, Buf out, Buf scale, Buf... parts) {
    parallel.start(dev, bucket, out, scale, parts);
  }

  /** Waits for bucket {@code bucket}'s sum over the ranks (and micro-batches), in {@code out}. */
  protected final void allReduceWait(int bucket, Buf out) {
    parallel.await(dev, bucket, out);
  }

  /** The training step's statements before its reductions, for one micro-batch (where the plan separates them). */
  protected void microBatchPre() {
    throw new IllegalStateException("this program does not accumulate micro-batches");
  }

  /** The rest of the training step, once after the micro-batches; returns the loss. */
  protected float microBatchPost() {
    throw new IllegalStateException("this program does not accumulate micro-batches");
  }

  /**
   * Whether the step sums each batch norm's statistics over the ranks where they are made (compiled with
   * sync_batch_norm): blocking all-reduces inside the forward and backward pass, which micro-batches cannot take.
   */
  protected boolean syncsBatchNorm() {
    return false;
  }

  /** Whether the class runs a step as {@link #microBatchPre} then {@link #microBatchPost}. */
  protected boolean accumulates() {
    return false;
  }
}
