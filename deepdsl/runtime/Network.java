package deepdsl.runtime;

import java.io.IOException;
import java.io.PrintStream;
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
 * opt/iteration} (DESIGN §9).
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
  private Buf x;
  private Buf y;
  private int classes;
  private Data data;
  private PrintStream progress;
  private Device device;

  /** The device the steps run on: every operation of a step is a call of it. */
  protected Device dev;

  protected Network(Settings settings) {
    this.settings = settings;
    this.workspaceLimit = settings.workspaceLimit;
  }

  /** Runs every later step on {@code d}, which takes the network's tensors now. */
  public void use(Device d) {
    d.attach(this);
    device = d;
    dev = d;
  }

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

  Buf inputs() {
    return x;
  }

  Buf labels() {
    return y;
  }

  /** One training step on the batch in the inputs; returns the loss. */
  protected abstract float trainStep();

  /**
   * The prediction for the batch in the inputs, or null when the network defines no {@code
   * predict}.
   */
  protected abstract Buf inferStep();

  // ---- what the generated fields and steps use ----

  protected final Buf input(int... shape) {
    x = Buf.zeros(shape);
    return x;
  }

  protected final Buf label(int classes, int... shape) {
    this.classes = classes;
    y = Buf.zeros(shape);
    return y;
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

  /** Sets a setting for the next steps (a learning-rate schedule calls it before each step). */
  public void set(String name, float value) {
    Buf b = settingBuf(name);
    b.a[b.off] = value;
  }

  /** The value of a setting. */
  public float get(String name) {
    Buf b = settingBuf(name);
    return b.a[b.off];
  }

  private Buf settingBuf(String name) {
    Buf b = settingBufs.get(name);
    if (b == null) {
      throw new IllegalArgumentException(
          settings.name + " has no setting '" + name + "' (it has " + settingBufs.keySet() + ")");
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
    data =
        Data.load(
            Data.parseFlag(flag),
            Arrays.copyOfRange(x.shape, 1, x.shape.length),
            classes,
            settings.seed);
  }

  /**
   * Fills the inputs {@code x} and labels {@code y} with training batch {@code iteration} of the
   * data source (shuffled with {@code shuffleSeed}, or in order when null). A class that brings
   * its own data overrides it.
   */
  protected void batch(long iteration, Long shuffleSeed, Buf x, Buf y) {
    data.batch(iteration, x.shape[0], shuffleSeed, x, y);
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
    int batch = x.shape[0];
    Long shuffle = settings.shuffle ? settings.seed : null;
    for (int k = 0; k < iterations; k++) {
      batch(iteration, shuffle, x, y);
      long t0 = System.nanoTime();
      float loss = device().trainStep(this);
      double seconds = (System.nanoTime() - t0) / 1e9;
      if (!Float.isFinite(loss)) {
        throw new ArithmeticException(
            "iteration " + (k + 1) + ": the loss is not finite (" + loss + ")");
      }
      losses[k] = loss;
      iteration++;
      if (progress != null) {
        int done = (k + 1) * BAR / Math.max(iterations, 1);
        int width = Integer.toString(iterations).length();
        progress.printf(
            Locale.ROOT,
            "[%s%s] iter %" + width + "d/%d  loss %.4f  %,.0f images/s%n",
            "#".repeat(done),
            ".".repeat(BAR - done),
            k + 1,
            iterations,
            loss,
            batch / seconds);
        boolean testNow =
            settings.testEvery > 0 && (k + 1) % settings.testEvery == 0 && k + 1 < iterations;
        Double accuracy = testNow ? test(settings.testIterations) : null;
        if (accuracy != null) {
          progress.printf(
              Locale.ROOT,
              "test accuracy after %d iterations: %.2f%% (%d batches)%n",
              k + 1,
              100 * accuracy,
              settings.testIterations);
        }
      }
    }
    return losses;
  }

  /**
   * Accuracy of {@code predict} on the whole test set, or null without test data or {@code
   * predict}.
   */
  public Double test() {
    return test(-1);
  }

  /** Accuracy on the first {@code batches} test batches (all of them when negative). */
  public Double test(int batches) {
    if (data == null || !data.hasTest()) {
      return null;
    }
    int n = x.shape[0];
    int count =
        batches < 0 ? data.testSize() / n : Math.min(batches, Math.max(1, data.testSize() / n));
    long correct = 0;
    Buf labels = Buf.zeros(n);
    for (int b = 0; b < Math.max(1, count); b++) {
      data.testBatch(b, n, x, labels);
      Buf scores = device().inferStep(this);
      if (scores == null) {
        return null;
      }
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
        correct += finite && best == (int) labels.a[i] ? 1 : 0;
      }
    }
    return (double) correct / ((long) Math.max(1, count) * n);
  }

  /**
   * Writes every parameter, the model state, the optimizer state and the step counter (atomically).
   */
  public void save(String file) throws IOException {
    device().toHost(this);
    LinkedHashMap<String, Npz.Array> out = new LinkedHashMap<>();
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
    Npz.write(Path.of(file), out);
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
          + "           [--device cpu|cuda|auto] [--workspace-limit BYTES] [--threads N] [--json]\n"
          + "           [--lr X] [--momentum X] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X]"
          + " [--clip X]";

  /** The flags that set a setting of the class (those its optimizer has). */
  private static final List<String> SETTING_FLAGS =
      List.of(
          "--lr", "--momentum", "--weight-decay", "--beta1", "--beta2", "--eps", "--clip");

  /** The flags of {@code deepdsl run}, plus the workspace limit. */
  private static final class Flags {
    Integer iters;
    String data;
    String load;
    String save;
    String device = "auto";
    boolean json;
    Long workspaceLimit;
    Integer threads;
    final Map<String, Float> settings = new LinkedHashMap<>();

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
        if (!List.of(
                "--iters", "--data", "--load", "--save", "--device", "--workspace-limit", "--threads")
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
          case "--workspace-limit" -> f.workspaceLimit = bytes(arg, value);
          case "--threads" -> f.threads = count(arg, value, 1);
          default -> {
            if (!List.of("cpu", "cuda", "auto").contains(value)) {
              throw new IllegalArgumentException(
                  "--device takes cpu, cuda or auto, not '" + value + "'");
            }
            f.device = value;
          }
        }
      }
      return f;
    }

    private static float number(String flag, String value) {
      try {
        float x = Float.parseFloat(value);
        if (Float.isFinite(x)) {
          return x;
        }
      } catch (NumberFormatException e) {
        // reported below
      }
      throw new IllegalArgumentException(flag + " takes a number, not '" + value + "'");
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

    private static int count(String flag, String value) {
      return count(flag, value, 0);
    }

    private static int count(String flag, String value, int least) {
      try {
        int n = Integer.parseInt(value);
        if (n >= least) {
          return n;
        }
      } catch (NumberFormatException e) {
        // reported below
      }
      throw new IllegalArgumentException(
          flag + " takes a whole number >= " + least + ", not '" + value + "'");
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
    try (Device device = Device.open(flags.device, net.settings, net.workspaceLimit)) {
      if (flags.save != null) {
        Npz.checkWritable(Path.of(flags.save)); // before training, not after it
      }
      net.use(device);
      String source = flags.data != null ? flags.data : net.settings.data;
      net.useData(source);
      if (flags.load != null) {
        net.load(flags.load);
      }
      int iterations = flags.iters != null ? flags.iters : net.settings.iterations;
      if (device.note() != null) {
        info.println(device.note());
      }
      info.printf(
          "device: %s  network %s  batch %d  data %s%n",
          device.description(), name, net.x.shape[0], dataLabel(source, net.settings.seed));
      net.reportTo(flags.json ? null : System.out);
      long t0 = System.nanoTime();
      float[] losses = net.train(iterations);
      double secondsPerIter = iterations == 0 ? 0.0 : (System.nanoTime() - t0) / 1e9 / iterations;
      Double accuracy = iterations == 0 ? null : net.test(); // nothing trained: nothing to test
      if (flags.save != null) {
        net.save(flags.save);
      }
      if (flags.json) {
        System.out.println(
            json(
                device.name(),
                losses,
                accuracy,
                iterations == 0 ? 0 : net.settings.peakBytes,
                iterations == 0 ? 0 : net.settings.trainArenaBytes,
                device.measuredBytes(),
                secondsPerIter));
      } else {
        if (accuracy != null) {
          System.out.printf(Locale.ROOT, "test accuracy: %.2f%%%n", 100 * accuracy);
        }
        if (flags.save != null) {
          System.out.println("saved: " + flags.save);
        }
      }
      return 0;
    } catch (IOException | Device.Unavailable | ArithmeticException | IllegalArgumentException e) {
      System.err.println("error: " + e.getMessage());
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
      Double accuracy,
      long peak,
      long arena,
      long measured,
      double secondsPerIter) {
    StringBuilder s =
        new StringBuilder("{\"device\": \"").append(device).append("\", \"losses\": [");
    for (int i = 0; i < losses.length; i++) {
      s.append(i > 0 ? ", " : "").append((double) losses[i]);
    }
    s.append("]");
    if (accuracy != null) {
      s.append(", \"test_accuracy\": ").append(accuracy);
    }
    s.append(", \"peak_bytes\": ").append(peak).append(", \"arena_bytes\": ").append(arena);
    if (measured >= 0) {
      s.append(", \"gpu_memory_bytes\": ").append(measured);
    }
    return s
        .append(", \"seconds_per_iter\": ")
        .append(secondsPerIter)
        .append("}")
        .toString();
  }
}
