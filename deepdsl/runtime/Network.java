package deepdsl.runtime;

import java.io.IOException;
import java.io.PrintStream;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.function.Supplier;

/**
 * What every generated network shares: its tensors by name, the arena, the training loop, testing,
 * parameter files and the command line. A generated class declares its tensors as fields and writes
 * {@link #trainStep} and {@link #inferStep}; the rest is here.
 *
 * <p>The semantics follow the Python trainer (deepdsl/trainer.py): iteration i trains on batch i of
 * the data, dropout masks are drawn for step i, parameter files hold every parameter and model
 * state by name, then the optimizer state ({@code opt/...}) and the step counter {@code
 * opt/iteration} (docs/formats.md).
 */
public abstract class Network {
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
    String accuracyLabel;
    List<String> predictInputs; // null: the network defines no predict
    Schedule schedule; // null: the optimizer's constant learning rate, in the step
    String saveFile; // the train block's save: written at the end (and every saveEvery iterations)
    int saveEvery;
    boolean predictIntegers;

    public Settings(String name) {
      this.name = name;
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
  }

  private enum Kind {
    PARAM,
    STATE,
    OPT,
    CONST
  }

  private record Tensor(Buf buf, Kind kind) {}

  private static final String ITERATION = "opt/iteration";
  // far beyond any run, and small enough that iteration x batch (a sample position) fits a long
  private static final long MAX_ITERATION = (1L << 32) - 1;
  private static final int BAR = 24;

  protected final Settings settings;

  /**
   * The one block every temporary of a step lives in, at the offset the plan gave it; allocated
   * when the CPU device takes the network (on the CUDA device the arena is on the GPU).
   */
  protected float[] arena;

  /** The step counter: the number of training steps taken (it seeds the dropout masks). */
  protected long iteration;

  /** The scratch bytes a kernel may take beyond the arena (picks the convolution algorithm). */
  protected long workspaceLimit;

  private final Map<String, Tensor> tensors = new LinkedHashMap<>();
  // the network's inputs and labels in declaration order, each filled from the data by name
  private final List<Data.Field> fields = new ArrayList<>();
  private final List<Buf> batch = new ArrayList<>();
  private Buf rate; // the learning rate of the current step, where the train block gives a schedule
  private final List<Float> rates = new ArrayList<>(); // those of this run's steps, for --json
  private final List<Double> stepSeconds = new ArrayList<>(); // each step's wall clock, for --json
  private String saveTo; // where the run saves (--save, else the train block's save), every saveEvery steps
  private boolean replaceReadOnly; // --replace-readonly: a save or prediction may replace a read-only file
  private Data data;
  private PrintStream progress;
  private Device device;

  /** The device the steps run on: every operation of a step is a call of it. */
  protected Device dev;

  protected Network(Settings settings) {
    this.settings = settings;
    this.schedule = settings.schedule;
    this.workspaceLimit = settings.workspaceLimit;
  }

  /** Runs every later step on {@code d}, which takes the network's tensors now. */
  public void use(Device d) {
    d.attach(this);
    device = d;
    dev = d;
    placeTemporaries();
  }

  /**
   * Places the steps' temporaries in the arena of the device that has just taken the network: the
   * generated class makes each step's layout table (its temporaries at their planned offsets) here.
   */
  protected void placeTemporaries() {}

  private Device device() {
    if (device == null) {
      use(new CpuDevice(workspaceLimit, null));
    }
    return device;
  }

  /** The host arena of the CPU device. */
  void allocateArena() {
    if (arena != null) {
      return;
    }
    if (settings.arenaBytes / 4 > Integer.MAX_VALUE - 8) {
      throw new Device.Unavailable(
          settings.name
              + " needs an arena of "
              + settings.arenaBytes
              + " bytes, more than one Java array holds; run it on a GPU (--device cuda), with a"
              + " smaller batch, or compiled with --remat");
    }
    arena = new float[(int) (settings.arenaBytes / 4)];
  }

  /**
   * The arena of a device that keeps it (the CUDA device): the host holds no elements of it, only
   * the array the step's tensors name it by.
   */
  float[] useDeviceArena() {
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

  /** One training step on the batch in the inputs; returns the loss. */
  protected abstract float trainStep();

  /** The loss on the batch in the inputs in inference semantics (the test phase); no update. */
  protected abstract float evalStep();

  /**
   * The prediction for the batch in the inputs, or null when the network defines no {@code
   * predict}.
   */
  protected abstract Buf inferStep();

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
  private int batchSize() {
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
      for (String flag : SETTING_FLAGS) {
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
    return new Buf(arena, (int) (byteOffset / 4), shape);
  }

  /** The same elements with another shape (a reshape costs nothing). */
  protected static Buf view(Buf b, int... shape) {
    return new Buf(b.a, b.off, shape);
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

  // ---- training, testing, parameter files ----

  /** Use {@code flag} (synthetic, mnist:DIR, cifar10:DIR, npz:FILE) as the data source. */
  public void useData(String flag) throws IOException {
    for (Buf b : batch) {
      if (b.shape[0] != batchSize()) {
        throw new IOException(
            "every input and label holds one row per sample, but their batch sizes differ");
      }
    }
    data = Data.load(Data.parseFlag(flag), fields, settings.seed);
  }

  /**
   * Fills every input and label of the class with training batch {@code iteration} of the data
   * source (shuffled with {@code shuffleSeed}, or in order when null). A class that brings its own
   * data overrides it and fills its input and label fields itself.
   */
  protected void batch(long iteration, Long shuffleSeed) {
    data.batch(iteration, batchSize(), shuffleSeed, batch.toArray(new Buf[0]));
  }

  /**
   * The warnings of a batch larger than the training (or test) set of the data: each batch then
   * repeats samples (as deepdsl run warns).
   */
  List<String> repeats(String kind) {
    List<String> out = new ArrayList<>();
    int n = batchSize();
    int[] sizes = {data.size(), data.hasTest() ? data.testSize() : 0};
    String[] what = {"training", "test"};
    for (int k = 0; k < 2; k++) {
      if (sizes[k] > 0 && sizes[k] < n) {
        out.add(
            "the batch of "
                + n
                + " is larger than the "
                + sizes[k]
                + " "
                + what[k]
                + " samples of the "
                + kind
                + " data: each batch repeats samples");
      }
    }
    return out;
  }

  /** Where progress lines go while training (null: nowhere). */
  public void reportTo(PrintStream out) {
    progress = out;
  }

  /**
   * Trains {@code iterations} steps from the current state and returns their losses.
   *
   * @throws ArithmeticException when a loss is not finite (nothing is kept of that step's batch)
   */
  public float[] train(int iterations) {
    float[] losses = new float[iterations];
    int n = batchSize();
    Buf[] to = batch.toArray(new Buf[0]);
    // what a batch holds, for the progress line: images where the first input is [N, C, H, W]
    String unit = to.length > 0 && to[0].shape.length == 4 ? "images" : "samples";
    Long shuffle = settings.shuffle ? settings.seed : null;
    for (int k = 0; k < iterations; k++) {
      batch(iteration, shuffle);
      if (rate != null) {
        rate.a[rate.off] = learningRate(iteration);
        rates.add(rate.a[rate.off]);
      }
      long t0 = System.nanoTime();
      float loss = device().trainStep(this);
      double seconds = (System.nanoTime() - t0) / 1e9;
      stepSeconds.add(seconds);
      if (!Float.isFinite(loss)) {
        throw new ArithmeticException(
            "iteration " + (k + 1) + ": the loss is not finite (" + loss + ")");
      }
      losses[k] = loss;
      iteration++;
      if (saveTo != null && settings.saveEvery > 0 && (k + 1) % settings.saveEvery == 0) {
        try {
          save(saveTo);
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      }
      if (progress != null) {
        int done = (k + 1) * BAR / Math.max(iterations, 1);
        int width = Integer.toString(iterations).length();
        progress.printf(
            Locale.ROOT,
            "[%s%s] iter %" + width + "d/%d  loss %.4f  %s %s/s%n",
            "#".repeat(done),
            ".".repeat(BAR - done),
            k + 1,
            iterations,
            loss,
            // a decimal below 100 a second, where a whole number would be a coarse step time
            String.format(Locale.ROOT, n / seconds < 100 ? "%.1f" : "%,.0f", n / seconds),
            unit);
        boolean testNow =
            settings.testEvery > 0 && (k + 1) % settings.testEvery == 0 && k + 1 < iterations;
        double[] tested = testNow ? test(settings.testIterations) : null;
        if (tested != null) {
          progress.printf(
              Locale.ROOT,
              "test after %d iterations: %s (%d batches)%n",
              k + 1,
              tested(tested),
              settings.testIterations);
        }
      }
    }
    return losses;
  }

  /**
   * The mean test loss and, where the loss classifies a label ({@code Settings.accuracy}), the
   * accuracy of {@code predict} on the whole test set: {@code {loss, accuracy or NaN}}, or null
   * without test data.
   */
  public double[] test() {
    return test(-1);
  }

  /** The same on the first {@code batches} test batches (all of them when negative). */
  public double[] test(int batches) {
    if (data == null || !data.hasTest()) {
      return null;
    }
    int n = batchSize();
    int count =
        batches < 0 ? data.testSize() / n : Math.min(batches, Math.max(1, data.testSize() / n));
    long correct = 0;
    double lossSum = 0;
    Buf[] to = batch.toArray(new Buf[0]);
    int labelAt = -1;
    for (int f = 0; f < fields.size(); f++) {
      labelAt = fields.get(f).name().equals(settings.accuracyLabel) ? f : labelAt;
    }
    for (int b = 0; b < Math.max(1, count); b++) {
      data.testBatch(b, n, to);
      lossSum += device().evalStep(this);
      if (labelAt < 0) {
        continue;
      }
      Buf scores = device().inferStep(this);
      Buf labels = to[labelAt];
      int k = scores.shape[1];
      for (int i = 0; i < n; i++) {
        int best = 0;
        boolean finite = true; // a NaN or infinite score makes the answer wrong, whatever argmax says
        for (int j = 0; j < k; j++) {
          float score = scores.a[scores.off + i * k + j];
          finite &= Float.isFinite(score);
          if (score > scores.a[scores.off + i * k + best]) {
            best = j;
          }
        }
        correct += finite && best == (int) labels.a[labels.off + i] ? 1 : 0;
      }
    }
    int tested = Math.max(1, count);
    double accuracy = labelAt < 0 ? Double.NaN : (double) correct / ((long) tested * n);
    return new double[] {lossSum / tested, accuracy};
  }

  /**
   * Writes {@code predict} for every training-split sample of {@code flag}'s data to {@code out}
   * as the npz array {@code predict} (as {@code deepdsl predict}: batches of N, the last one filled
   * by wrapping around and cut back; arrays other than the inputs predict reads are ignored);
   * returns the number of samples.
   */
  public int predict(String flag, String out) throws IOException {
    List<Data.Field> wanted = new ArrayList<>();
    List<Buf> to = new ArrayList<>();
    for (int f = 0; f < fields.size(); f++) {
      if (settings.predictInputs.contains(fields.get(f).name())) {
        wanted.add(fields.get(f));
        to.add(batch.get(f));
      }
    }
    Data samples = Data.load(Data.parseFlag(flag), wanted, settings.seed, true);
    int n = batchSize();
    int m = samples.size();
    Buf[] bufs = to.toArray(new Buf[0]);
    float[] values = null;
    int[] shape = null;
    for (int b = 0; (long) b * n < m; b++) {
      samples.batch(b, n, null, bufs);
      Buf scores = device().inferStep(this);
      int row = scores.numel() / n;
      if (values == null) {
        values = new float[Math.toIntExact((long) m * row)];
        shape = scores.shape.clone();
        shape[0] = m;
      }
      int rows = Math.min(n, m - b * n);
      System.arraycopy(scores.a, scores.off, values, b * n * row, rows * row);
    }
    LinkedHashMap<String, Npz.Array> file = new LinkedHashMap<>();
    if (settings.predictIntegers) {
      long[] ints = new long[values.length];
      for (int k = 0; k < ints.length; k++) {
        ints[k] = (long) values[k];
      }
      file.put("predict", Npz.Array.ofLongs(ints, shape));
    } else {
      file.put("predict", Npz.Array.ofFloats(values, shape));
    }
    Npz.write(Path.of(out), file, replaceReadOnly);
    return m;
  }

  /** What a test reports: the loss always, the accuracy where the loss classifies a label. */
  private static String tested(double[] t) {
    String loss = String.format(Locale.ROOT, "loss %.4f", t[0]);
    return Double.isNaN(t[1])
        ? loss
        : loss + String.format(Locale.ROOT, ", accuracy %.2f%%", 100 * t[1]);
  }

  /**
   * Writes every parameter, the model state, the optimizer state and the step counter (atomically).
   */
  public void save(String file) throws IOException {
    device().toHost(this);
    LinkedHashMap<String, Npz.Array> out = new LinkedHashMap<>();
    tensors.forEach( // as the Python trainer: a NaN or an infinity is never saved
        (name, t) -> {
          if (t.kind != Kind.CONST) {
            for (int k = t.buf.off; k < t.buf.off + t.buf.numel(); k++) {
              if (!Float.isFinite(t.buf.a[k])) {
                throw new ArithmeticException(
                    "not saving "
                        + file
                        + ": '"
                        + name
                        + "' holds a NaN or an infinity (the training diverged; a smaller --lr may help)");
              }
            }
          }
        });
    for (boolean optimizer : new boolean[] {false, true}) {
      tensors.forEach(
          (name, t) -> {
            if (t.kind != Kind.CONST && (t.kind == Kind.OPT) == optimizer) {
              out.put(
                  name,
                  Npz.Array.ofFloats(
                      Arrays.copyOfRange(t.buf.a, t.buf.off, t.buf.off + t.buf.numel()),
                      t.buf.shape));
            }
          });
    }
    out.put(ITERATION, Npz.Array.ofLongs(new long[] {iteration}));
    Npz.write(Path.of(file), out, replaceReadOnly);
  }

  /**
   * Reads a parameter file: every parameter and model state must be there with its shape; the
   * optimizer state may be absent as a whole (the optimizer then starts fresh). The first problem
   * is named.
   */
  public void load(String file) throws IOException {
    Map<String, Npz.Array> in = Npz.read(Path.of(file));
    boolean withOptimizer = in.keySet().stream().anyMatch(n -> n.contains("/"));
    List<String> expected = new ArrayList<>();
    tensors.forEach(
        (name, t) -> {
          if (t.kind != Kind.CONST) {
            expected.add(name);
          }
        });
    expected.add(ITERATION);
    for (String name : expected) {
      boolean optimizer = name.contains("/");
      if (optimizer && !withOptimizer) {
        continue;
      }
      Npz.Array a = in.get(name);
      if (a == null) {
        throw new IOException(
            "parameter file '"
                + file
                + "' has no "
                + (optimizer ? "optimizer state" : "array")
                + " '"
                + name
                + "'");
      }
      int[] shape = name.equals(ITERATION) ? new int[0] : tensors.get(name).buf.shape;
      if (!Arrays.equals(a.shape, shape)) {
        throw new IOException(
            "parameter file '"
                + file
                + "': '"
                + name
                + "' has shape "
                + Arrays.toString(a.shape)
                + ", but the network expects "
                + Arrays.toString(shape));
      }
      if (a.isFloat() == name.equals(ITERATION)) {
        throw new IOException(
            "parameter file '"
                + file
                + "': '"
                + name
                + "' holds "
                + (a.isFloat() ? "floats" : "integers")
                + ", but the network expects "
                + (a.isFloat() ? "an integer" : "floats"));
      }
    }
    for (String name : in.keySet()) {
      if (!expected.contains(name)) {
        throw new IOException(
            "parameter file '"
                + file
                + "' has an entry '"
                + name
                + "' that the network does not have"
                + (name.contains("/") ? " (saved with a different optimizer?)" : ""));
      }
    }
    for (String name : expected) {
      Npz.Array a = in.get(name);
      if (a == null || (name.contains("/") && !withOptimizer)) {
        continue;
      }
      if (name.equals(ITERATION)) {
        if (a.longs[0] < 0 || a.longs[0] > MAX_ITERATION) {
          throw new IOException(
              String.format(
                  "parameter file '%s': '%s' is %d, but a step counter lies in [0, %d]",
                  file, ITERATION, a.longs[0], MAX_ITERATION));
        }
        iteration = a.longs[0];
      } else {
        Buf b = tensors.get(name).buf;
        System.arraycopy(a.floats, 0, b.a, b.off, b.numel());
      }
    }
    if (device != null) {
      device.toDevice(this);
    }
  }

  // ---- the command line ----

  private static final String USAGE =
      "usage: java %s [--iters N] [--data SOURCE] [--load FILE.npz] [--save FILE.npz]\n"
          + "           [--device cpu|cuda|auto] [--workspace-limit BYTES] [--threads N]\n"
          + "           [--blas openblas|java|auto] [--kernels vendor|own|auto] [--no-graph] [--json]\n"
          + "           [--lr X] [--momentum X] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X]"
          + " [--clip X]\n"
          + "       java %1$s --eval --load FILE.npz [--data SOURCE] [--device ...] [--json]\n"
          + "       java %1$s --predict OUT.npz --load FILE.npz --data SOURCE [--device ...]\n"
          + "  --replace-readonly: --save and --predict may replace a read-only file";

  /** The flags that set a setting of the class (those its optimizer has). */
  private static final List<String> SETTING_FLAGS =
      List.of(
          "--lr", "--momentum", "--weight-decay", "--beta1", "--beta2", "--eps", "--clip");

  /** The most steps one run takes (deepdsl run --iters, the train block's iterations: the same). */
  static final int MAX_ITERS = 10_000_000;

  /** The most threads --threads starts (Parallel's bound). */
  static final int MAX_THREADS = Parallel.MAX_THREADS;

  /** The largest float32: a setting the kernels read as a float must stay finite there. */
  private static final double FLOAT_MAX = Float.MAX_VALUE;

  /**
   * The range of each numeric flag: {@code [low, high]}, or {@code [low, high)} where {@code
   * highOpen}. The same table as deepdsl/running.py's SETTING_RANGES (and the optimizers' arguments
   * in the language), with the same messages.
   */
  private record Range(double low, double high, boolean highOpen, boolean whole) {
    /** As the message says it: {@code a number in [0, 1)}, {@code a whole number in [1, 1024]}. */
    String describe() {
      return (whole ? "a whole number" : "a number")
          + " in ["
          + fmt(low)
          + ", "
          + fmt(high)
          + (highOpen ? ")" : "]");
    }

    private static String fmt(double x) {
      return x == Math.rint(x) && Math.abs(x) < 1e15
          ? Long.toString((long) x)
          : String.format(Locale.ROOT, "%.2g", x);
    }
  }

  /** A decimal number as the flags take it (no hex, no suffix, no NaN or Infinity): running.py's. */
  private static final String NUMBER = "[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?";

  private static final Map<String, Range> RANGES =
      Map.of(
          "--iters", new Range(0, MAX_ITERS, false, true),
          "--threads", new Range(1, MAX_THREADS, false, true),
          "--lr", new Range(0, FLOAT_MAX, false, false),
          "--momentum", new Range(0, 1, true, false),
          "--weight-decay", new Range(0, FLOAT_MAX, false, false),
          "--beta1", new Range(0, 1, true, false),
          "--beta2", new Range(0, 1, true, false),
          "--eps", new Range(0, FLOAT_MAX, false, false),
          "--clip", new Range(0, FLOAT_MAX, false, false));

  /** The flags of {@code deepdsl run}, plus the workspace limit. */
  private static final class Flags {
    Integer iters;
    String data;
    String load;
    String save;
    String device = "auto";
    boolean json;
    boolean replaceReadOnly;
    boolean eval;
    String predict;
    Long workspaceLimit;
    Integer threads;
    String blas = Blas.defaultChoice();
    String kernels = "auto";
    boolean graph = true; // the CUDA device replays the train step as a CUDA graph (--no-graph: not)
    final Map<String, Double> settings = new LinkedHashMap<>();

    static Flags parse(String[] args) {
      Flags f = new Flags();
      for (int i = 0; i < args.length; i++) {
        String arg = args[i];
        String value = null;
        int eq = arg.indexOf('=');
        if (arg.startsWith("--") && eq > 0) {
          value = arg.substring(eq + 1);
          arg = arg.substring(0, eq);
        }
        if (arg.equals("--json")) {
          f.json = true;
          continue;
        }
        if (arg.equals("--replace-readonly")) { // --save and --predict may replace a read-only file
          f.replaceReadOnly = true;
          continue;
        }
        if (arg.equals("--no-graph")) {
          f.graph = false;
          continue;
        }
        if (SETTING_FLAGS.contains(arg)) { // a setting of the class: checked when the class is made
          if (value == null) {
            if (i + 1 >= args.length) {
              throw new IllegalArgumentException("option " + arg + " needs a value");
            }
            value = args[++i];
          }
          f.settings.put(arg.substring(2).replace('-', '_'), number(arg, value));
          continue;
        }
        if (arg.equals("--eval")) {
          f.eval = true;
          continue;
        }
        if (!List.of(
                "--iters",
                "--data",
                "--load",
                "--save",
                "--device",
                "--workspace-limit",
                "--threads",
                "--blas",
                "--kernels",
                "--predict")
            .contains(arg)) {
          throw new IllegalArgumentException("no such option: " + arg);
        }
        if (value == null) {
          if (i + 1 >= args.length) {
            throw new IllegalArgumentException("option " + arg + " needs a value");
          }
          value = args[++i];
        }
        switch (arg) {
          case "--iters" -> f.iters = count(arg, value);
          case "--data" -> {
            Data.parseFlag(value); // a malformed source is a usage error, before anything is allocated
            f.data = value;
          }
          case "--load" -> f.load = file(arg, value);
          case "--save" -> f.save = file(arg, value);
          case "--predict" -> f.predict = file(arg, value);
          case "--workspace-limit" -> f.workspaceLimit = bytes(arg, value);
          case "--threads" -> f.threads = count(arg, value);
          case "--blas" -> f.blas = value;
          case "--kernels" -> {
            if (!List.of("vendor", "own", "auto").contains(value)) {
              throw new IllegalArgumentException(
                  "--kernels takes vendor, own or auto, not '" + value + "'");
            }
            f.kernels = value;
          }
          default -> {
            if (!List.of("cpu", "cuda", "auto").contains(value)) {
              throw new IllegalArgumentException(
                  "--device takes cpu, cuda or auto, not '" + value + "'");
            }
            f.device = value;
          }
        }
      }
      if (f.eval && (f.load == null || f.iters != null || f.save != null || f.predict != null)) {
        throw new IllegalArgumentException(
            "--eval takes --load FILE.npz, and neither --iters, --save nor --predict");
      }
      if (f.predict != null && (f.load == null || f.data == null || f.iters != null || f.save != null)) {
        throw new IllegalArgumentException(
            "--predict OUT.npz takes --load FILE.npz and --data SOURCE, and neither --iters nor --save");
      }
      if (!List.of("openblas", "java", "auto").contains(f.blas)) {
        throw new IllegalArgumentException("--blas takes openblas, java or auto, not '" + f.blas + "'");
      }
      return f;
    }

    /** A setting's value: a finite number in the flag's range (RANGES), else a usage error. */
    private static double number(String flag, String value) {
      Range r = RANGES.get(flag);
      try {
        double x = value.strip().matches(NUMBER) ? Double.parseDouble(value.strip()) : Double.NaN;
        if (Double.isFinite(x) && x >= r.low() && (r.highOpen() ? x < r.high() : x <= r.high())) {
          return x;
        }
      } catch (NumberFormatException e) {
        // reported below
      }
      throw new IllegalArgumentException(flag + " takes " + r.describe() + ", not '" + value + "'");
    }

    private static String file(String flag, String value) {
      if (value.isBlank()) {
        throw new IllegalArgumentException(flag + " needs a file name");
      }
      return value;
    }

    private static long bytes(String flag, String value) {
      try {
        long n = Long.parseLong(value);
        if (n >= 0) {
          return n;
        }
      } catch (NumberFormatException e) {
        // reported below
      }
      throw new IllegalArgumentException(
          flag + " takes a number of bytes >= 0, not '" + value + "'");
    }

    /** A whole number in the flag's range (RANGES), else a usage error. */
    private static int count(String flag, String value) {
      Range r = RANGES.get(flag);
      try {
        long n = value.strip().matches("[+-]?[0-9]{1,18}") ? Long.parseLong(value.strip()) : -1;
        if (n >= r.low() && n <= r.high()) {
          return (int) n;
        }
      } catch (NumberFormatException e) {
        // reported below
      }
      throw new IllegalArgumentException(flag + " takes " + r.describe() + ", not '" + value + "'");
    }
  }

  /**
   * The generated program's {@code main}: parses the flags, picks the device, trains, tests and
   * saves, printing progress (or, with --json, one JSON object on stdout). Returns the exit code: 0
   * ok, 1 an error in the input (a file, the data, the device), 2 a usage error, 3 an internal
   * error.
   */
  public static int run(String[] args, Settings settings, Supplier<? extends Network> make) {
    String name = settings.name;
    if (Arrays.asList(args).contains("--help") || Arrays.asList(args).contains("-h")) {
      System.out.println(String.format(USAGE, name));
      return 0;
    }
    Flags flags;
    try {
      flags = Flags.parse(args);
    } catch (IllegalArgumentException e) {
      System.err.println(String.format(USAGE, name) + "\nerror: " + e.getMessage());
      return 2;
    }
    if (flags.threads != null) { // before the first parallel loop, which reads it
      System.setProperty(Parallel.THREADS_PROPERTY, Integer.toString(flags.threads));
    }
    Network net = make.get(); // after the flags: it allocates every tensor
    try {
      flags.settings.forEach(net::set);
    } catch (IllegalArgumentException e) {
      System.err.println(String.format(USAGE, name) + "\nerror: " + e.getMessage());
      return 2;
    }
    PrintStream info = flags.json ? System.err : System.out;
    if (flags.workspaceLimit != null) {
      net.workspaceLimit = flags.workspaceLimit;
    }
    try (Device device =
        Device.open(flags.device, net.settings, net.workspaceLimit, flags.kernels, flags.graph)) {
      // where the run saves: --save, else the train block's save (never under --eval or --predict)
      net.saveTo =
          flags.eval || flags.predict != null
              ? null
              : flags.save != null ? flags.save : net.settings.saveFile;
      net.replaceReadOnly = flags.replaceReadOnly;
      for (String out : new String[] {net.saveTo, flags.predict}) {
        if (out != null) {
          Npz.checkWritable(Path.of(out), net.replaceReadOnly); // before training, not after it
        }
      }
      if (device instanceof CpuDevice) { // the products' SGEMM: OpenBLAS or Java (--blas)
        Blas.use(flags.blas);
      }
      net.use(device);
      String source = flags.data != null ? flags.data : net.settings.data;
      if (flags.predict != null) { // the data holds the inputs predict reads, perhaps nothing else
        if (net.settings.predictInputs == null) {
          throw new IOException("the network defines no `predict`, so there is nothing to predict");
        }
        net.load(flags.load);
        int m = net.predict(flags.data, flags.predict);
        info.printf("wrote %s: predict for %d samples%n", flags.predict, m);
        return 0;
      }
      int iterations = flags.eval ? 0 : flags.iters != null ? flags.iters : net.settings.iterations;
      if (iterations > 0 || flags.eval) { // --iters 0 trains and tests nothing: it reads no data
        net.useData(source);
        for (String warning : net.repeats(Data.parseFlag(source).kind())) {
          System.err.println("warning: " + warning);
        }
      }
      if (flags.load != null) {
        net.load(flags.load);
      }
      if (device.note() != null) {
        info.println(device.note());
      }
      info.printf(
          "device: %s  network %s  batch %d  data %s%n",
          device.description(),
          name,
          net.batchSize(),
          net.data == null ? "none (no iterations)" : dataLabel(source, net.settings.seed));
      net.reportTo(flags.json ? null : System.out);
      long t0 = System.nanoTime();
      float[] losses = net.train(iterations);
      double secondsPerIter = iterations == 0 ? 0.0 : (System.nanoTime() - t0) / 1e9 / iterations;
      // nothing trained (--iters 0): nothing to test, unless that is what was asked (--eval)
      double[] tested = iterations == 0 && !flags.eval ? null : net.test();
      if (flags.eval && tested == null) {
        throw new IOException("the data has no test set to evaluate on (an npz file: the NAME_test arrays)");
      }
      if (net.saveTo != null) {
        net.save(net.saveTo);
      }
      if (flags.json && flags.eval) { // as deepdsl eval --json
        List<String> nonfinite = new ArrayList<>();
        String loss = jsonNumber(tested[0], "test_loss", nonfinite);
        System.out.println(
            "{\"device\": \""
                + device.name()
                + "\", \"test_loss\": "
                + loss
                + (Double.isNaN(tested[1]) ? "" : ", \"test_accuracy\": " + tested[1])
                + nonfinite(nonfinite)
                + "}");
      } else if (flags.json) {
        System.out.println(
            json(
                device.name(),
                losses,
                tested,
                iterations == 0 ? 0 : net.settings.peakBytes,
                iterations == 0 ? 0 : net.settings.trainArenaBytes,
                device.measuredBytes(),
                secondsPerIter,
                net.stepSeconds,
                net.rate == null ? null : net.rates));
      } else {
        if (tested != null) {
          System.out.printf(Locale.ROOT, "test loss: %.4f%n", tested[0]);
          if (!Double.isNaN(tested[1])) {
            System.out.printf(Locale.ROOT, "test accuracy: %.2f%%%n", 100 * tested[1]);
          }
        }
        if (net.saveTo != null) {
          System.out.println("saved: " + net.saveTo);
        }
      }
      return 0;
    } catch (IOException | Device.Unavailable | ArithmeticException | IllegalArgumentException e) {
      System.err.println("error: " + e.getMessage());
      return 1;
    } catch (UncheckedIOException e) {
      System.err.println("error: " + e.getCause().getMessage());
      return 1;
    } catch (RuntimeException | Error e) {
      System.err.println("internal error: " + e);
      e.printStackTrace();
      return 3;
    }
  }

  /**
   * The data source as the progress header names it: synthetic data with the seed it is made from
   * (its own, {@code --data synthetic:SEED}, or the program's), so that {@code synthetic:5} says
   * what the 5 is.
   */
  private static String dataLabel(String source, long seed) {
    Data.Spec spec = Data.parseFlag(source);
    if (!spec.kind().equals("synthetic")) {
      return spec.kind();
    }
    return "synthetic (seed " + (spec.seed() != null ? spec.seed() : seed) + ")";
  }

  private static String json(
      String device,
      float[] losses,
      double[] tested,
      long peak,
      long arena,
      long measured,
      double secondsPerIter,
      List<Double> stepSeconds,
      List<Float> rates) {
    List<String> bad = new ArrayList<>();
    StringBuilder s =
        new StringBuilder("{\"device\": \"").append(device).append("\", \"losses\": [");
    for (int i = 0; i < losses.length; i++) {
      s.append(i > 0 ? ", " : "").append(jsonNumber(losses[i], "losses", bad));
    }
    s.append("]");
    if (rates != null) {
      s.append(", \"learning_rates\": [");
      for (int i = 0; i < rates.size(); i++) {
        s.append(i > 0 ? ", " : "").append(jsonNumber(rates.get(i), "learning_rates", bad));
      }
      s.append("]");
    }
    if (tested != null) {
      s.append(", \"test_loss\": ").append(jsonNumber(tested[0], "test_loss", bad));
      if (!Double.isNaN(tested[1])) {
        s.append(", \"test_accuracy\": ").append(tested[1]);
      }
    }
    s.append(", \"peak_bytes\": ").append(peak).append(", \"arena_bytes\": ").append(arena);
    if (measured >= 0) {
      s.append(", \"gpu_memory_bytes\": ").append(measured);
    }
    s.append(", \"seconds_per_iter\": ")
        .append(jsonNumber(secondsPerIter, "seconds_per_iter", bad))
        .append(", \"step_seconds\": [");
    for (int i = 0; i < stepSeconds.size(); i++) {
      s.append(i > 0 ? ", " : "").append(jsonNumber(stepSeconds.get(i), "step_seconds", bad));
    }
    return s.append("]").append(nonfinite(bad)).append("}").toString();
  }

  /**
   * A number as JSON writes it: a NaN or an infinity (which JSON has not) as {@code null}, its
   * field named in {@code nonfinite} (as deepdsl's --json does).
   */
  private static String jsonNumber(double x, String field, List<String> nonfinite) {
    if (Double.isFinite(x)) {
      return Double.toString(x);
    }
    if (!nonfinite.contains(field)) {
      nonfinite.add(field);
    }
    return "null";
  }

  /** The {@code "nonfinite"} list of the fields that hold a null for a NaN or infinity, if any. */
  private static String nonfinite(List<String> fields) {
    if (fields.isEmpty()) {
      return "";
    }
    return ", \"nonfinite\": [\"" + String.join("\", \"", fields) + "\"]";
  }
}
