package deepdsl.runtime;

import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.function.Supplier;

/**
 * What every generated network shares: the training loop, testing, prediction, parameter files and
 * the program's {@code main} ({@link #run}), on the tensors {@link NetworkTensors} holds by name;
 * the flags it reads are {@link CommandLine}'s. A generated class declares its tensors as fields
 * and writes {@link #trainStep} and {@link #inferStep}; the rest is here.
 *
 * <p>The semantics follow the Python trainer (deepdsl/trainer.py): iteration i trains on batch i of
 * the data, dropout masks are drawn for step i, parameter files hold every parameter and model
 * state by name, then the optimizer state ({@code opt/...}) and the step counter {@code
 * opt/iteration} (docs/formats.md).
 */
public abstract class Network extends NetworkTensors {
  private static final String ITERATION = "opt/iteration";
  // far beyond any run, and small enough that iteration x batch (a sample position) fits a long
  private static final long MAX_ITERATION = (1L << 32) - 1;
  private static final int BAR = 24;

  private final List<Float> rates = new ArrayList<>(); // those of this run's steps, for --json
  private final List<Double> stepSeconds = new ArrayList<>(); // each step's wall clock, for --json
  private String saveTo; // where the run saves (--save, else the train block's save), every saveEvery steps
  private boolean replaceReadOnly; // --replace-readonly: a save or prediction may replace a read-only file
  private Data data;
  private Prefetch prefetch; // training batches loaded one ahead (while a train() runs)
  private PrintStream progress;
  private Device device; // the device the steps run on (dev), once one has taken the network

  protected Network(Settings settings) {
    super(settings);
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

  Device device() {
    if (device == null) {
      use(new CpuDevice(workspaceLimit, null));
    }
    return device;
  }

  /** One training step on the batch in the inputs; returns the loss. */
  protected abstract float trainStep();

  /** The names of the loss's terms ({@code loss = rec + 0.5 * kl}: rec, kl); none by default. */
  protected String[] lossTermNames() {
    return new String[0];
  }

  /** The values of the loss's terms at the last training step. */
  protected float[] lossTerms() {
    return new float[0];
  }

  /** Each step's values of the loss's terms (train). */
  final List<float[]> termValues = new ArrayList<>();

  /** The loss on the batch in the inputs in inference semantics (the test phase); no update. */
  protected abstract float evalStep();

  /**
   * The prediction for the batch in the inputs, or null when the network defines no {@code
   * predict}.
   */
  protected abstract Buf inferStep();

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
    Buf[] to = batch.toArray(new Buf[0]);
    if (prefetch != null && !prefetch.serves(shuffleSeed)) {
      prefetch.close();
      prefetch = null;
    }
    if (prefetch == null) {
      prefetch =
          new Prefetch(
              data,
              batchSize(),
              shuffleSeed,
              settings.augment,
              augmentedField(),
              settings.seed,
              to);
    }
    prefetch.fill(iteration, to);
  }

  /** The field the train block's augmentation applies to, or -1. */
  private int augmentedField() {
    return settings.augment == null ? -1 : fieldIndex(settings.augment.input);
  }

  private int fieldIndex(String name) {
    for (int f = 0; f < fields.size(); f++) {
      if (fields.get(f).name().equals(name)) {
        return f;
      }
    }
    return -1;
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
    try {
      trainSteps(iterations, losses, n, unit, shuffle);
    } finally {
      if (prefetch != null) { // the batch loaded ahead of the last step is not used
        prefetch.close();
        prefetch = null;
      }
    }
    return losses;
  }

  private void trainSteps(int iterations, float[] losses, int n, String unit, Long shuffle) {
    for (int k = 0; k < iterations; k++) {
      if (rate != null) {
        rate.a[rate.off] = learningRate(iteration);
        rates.add(rate.a[rate.off]);
      }
      long t0 = System.nanoTime();
      float loss = parallel.trainStep(this, shuffle); // its batch (shard, micro-batches) and step
      double seconds = (System.nanoTime() - t0) / 1e9;
      stepSeconds.add(seconds);
      if (!Float.isFinite(loss)) {
        throw new ArithmeticException(
            "iteration " + (k + 1) + ": the loss is not finite (" + loss + ")");
      }
      losses[k] = loss;
      float[] terms = lossTerms();
      termValues.add(terms);
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
            "[%s%s] iter %" + width + "d/%d  loss %.4f  %s%s %s/s%n",
            "#".repeat(done),
            ".".repeat(BAR - done),
            k + 1,
            iterations,
            loss,
            CommandLine.terms(lossTermNames(), terms),
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
  }

  /**
   * The mean test loss and, where the loss classifies a label ({@code Settings.accuracy}), the
   * accuracy of {@code predict} on the whole test set: {@code {loss, accuracy or NaN}}, or null
   * without test data.
   */
  public double[] test() {
    return test(-1);
  }

  /**
   * The same on the first {@code batches} test batches (all of them when negative), with the top-5
   * accuracy (more than 5 classes) and the mean absolute error of a regression ({@code
   * Settings.regression}): {@code {loss, accuracy, top5, mae}}, NaN where not reported (as the
   * Python trainer's {@code measure}).
   */
  public double[] test(int batches) {
    if (data == null || !data.hasTest()) {
      return null;
    }
    int n = batchSize();
    int count =
        batches < 0 ? data.testSize() / n : Math.min(batches, Math.max(1, data.testSize() / n));
    Metrics metrics = new Metrics();
    Buf[] to = batch.toArray(new Buf[0]);
    int labelAt = settings.accuracyLabel == null ? -1 : fieldIndex(settings.accuracyLabel);
    int targetAt = settings.regressionTarget == null ? -1 : fieldIndex(settings.regressionTarget);
    int augmented = augmentedField();
    for (int b = 0; b < Math.max(1, count); b++) {
      data.testBatch(b, n, to);
      if (augmented >= 0) { // the normalisation only
        settings.augment.apply(to[augmented], 0, settings.seed, false);
      }
      metrics.loss(device().evalStep(this));
      if (labelAt >= 0 || targetAt >= 0) {
        Buf scores = device().inferStep(this);
        if (targetAt >= 0) {
          metrics.regression(scores, to[targetAt]);
        }
        if (labelAt >= 0) {
          metrics.classes(scores, to[labelAt]);
        }
      }
    }
    return metrics.result();
  }

  /**
   * Writes {@code predict} for every sample of one split of {@code flag}'s data to {@code out} as
   * the npz array {@code predict} (as {@code deepdsl predict}: batches of N, the last one filled by
   * wrapping around and cut back; arrays other than the inputs predict reads are ignored); {@code
   * split} is test or train, null the test split where the data has one, else the training split.
   * Returns the number of samples and the split.
   */
  public Object[] predict(String flag, String out, String split) throws IOException {
    return Predictions.write(this, flag, out, split, replaceReadOnly);
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
          if (t.kind() != Kind.CONST) {
            for (int k = t.buf().off; k < t.buf().off + t.buf().numel(); k++) {
              if (!Float.isFinite(t.buf().a[k])) {
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
            if (t.kind() != Kind.CONST && (t.kind() == Kind.OPT) == optimizer) {
              out.put(
                  name,
                  Npz.Array.ofFloats(
                      Arrays.copyOfRange(t.buf().a, t.buf().off, t.buf().off + t.buf().numel()),
                      t.buf().shape));
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
          if (t.kind() != Kind.CONST) {
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
      int[] shape = name.equals(ITERATION) ? new int[0] : tensors.get(name).buf().shape;
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
    Set<String> frozen = statelessParameters(expected);
    for (String name : in.keySet()) {
      if (!expected.contains(name) && !frozen.contains(owner(name))) {
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
        Buf b = tensors.get(name).buf();
        System.arraycopy(a.floats, 0, b.a, b.off, b.numel());
      }
    }
    if (device != null) {
      device.toDevice(this);
    }
  }

  // ---- the program's main ----

  /**
   * The generated program's {@code main}: parses the flags, picks the device, trains, tests and
   * saves, printing progress (or, with --json, one JSON object on stdout). Returns the exit code: 0
   * ok, 1 an error in the input (a file, the data, the device), 2 a usage error, 3 an internal
   * error.
   */
  public static int run(String[] args, Settings settings, Supplier<? extends Network> make) {
    String name = settings.name;
    if (Arrays.asList(args).contains("--help") || Arrays.asList(args).contains("-h")) {
      System.out.println(String.format(CommandLine.USAGE, name));
      return 0;
    }
    CommandLine flags;
    Launch launch; // this process's rank (data parallelism): the launcher's environment, --ranks, --rank
    try {
      flags = CommandLine.parse(args, settings.precision);
      launch = DataParallel.launch(flags);
    } catch (IllegalArgumentException e) {
      System.err.println(String.format(CommandLine.USAGE, name) + "\nerror: " + e.getMessage());
      return 2;
    }
    if (flags.threads != null) { // before the first parallel loop, which reads it
      System.setProperty(Parallel.THREADS_PROPERTY, Integer.toString(flags.threads));
    }
    Network net = make.get(); // after the flags: it allocates every tensor
    try {
      flags.settings.forEach(net::set);
    } catch (IllegalArgumentException e) {
      System.err.println(String.format(CommandLine.USAGE, name) + "\nerror: " + e.getMessage());
      return 2;
    }
    boolean lead = launch.rank() == 0; // rank 0 alone prints, saves and writes --json
    PrintStream info = !lead ? new PrintStream(OutputStream.nullOutputStream()) : flags.json ? System.err : System.out;
    if (flags.workspaceLimit != null) {
      net.workspaceLimit = flags.workspaceLimit;
    }
    flags.applyTo(net.settings); // --deterministic, --precision: the device reads them when it starts
    String asked = net.settings.precision;
    try (Device device =
        Device.open(flags.device, net.settings, net.workspaceLimit, flags.kernels, flags.graph)) {
      // where the run saves: --save, else the train block's save (never under --eval or --predict)
      net.saveTo =
          flags.eval || flags.predict != null
              ? null
              : flags.save != null ? flags.save : net.settings.saveFile;
      net.saveTo = lead ? net.saveTo : null;
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
        Object[] done = net.predict(flags.data, flags.predict, flags.split);
        info.printf("wrote %s: predict for %d samples (the %s split)%n", flags.predict, done[0], done[1]);
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
      net.parallel = DataParallel.open(launch, flags.microBatches, device, net);
      net.parallel.agree(net); // every rank the same program and parameters
      if (device.note() != null) {
        info.println(device.note());
      }
      String ran = device.precision(asked);
      info.printf(
          "device: %s  network %s  batch %d  data %s  precision %s%n",
          device.description(),
          name,
          net.batchSize(),
          net.data == null ? "none (no iterations)" : CommandLine.dataLabel(source, net.settings.seed),
          ran.equals(asked) ? ran : ran + " (" + Device.precisionNote(asked) + ")");
      net.parallel.describe(info);
      net.reportTo(flags.json || !lead ? null : System.out);
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
      if (!lead) {
        return 0;
      } else if (flags.json && flags.eval) { // as deepdsl eval --json
        System.out.println(
            CommandLine.withPrecision(CommandLine.evalJson(device.name(), tested), device, asked));
      } else if (flags.json) {
        String json =
            CommandLine.json(
                device.name(),
                losses,
                tested,
                iterations == 0 ? 0 : net.settings.peakBytes,
                iterations == 0 ? 0 : net.settings.trainArenaBytes,
                device.measuredBytes(),
                secondsPerIter,
                net.stepSeconds,
                net.rate == null ? null : net.rates,
                net.lossTermNames(),
                net.termValues);
        // the device's own fields (the CUDA device: cuDNN's scratch and each convolution's algorithm)
        System.out.println(
            CommandLine.withPrecision(
                json.substring(0, json.length() - 1) + device.jsonFields() + "}", device, asked));
      } else {
        if (tested != null) {
          System.out.print(CommandLine.metricLines(tested));
        }
        if (net.saveTo != null) {
          System.out.println("saved: " + net.saveTo);
        }
      }
      return 0;
    } catch (IOException | Device.Unavailable | ArithmeticException | IllegalArgumentException e) {
      System.err.println("error: " + e.getMessage());
      net.parallel.fail();
      return 1;
    } catch (UncheckedIOException e) {
      System.err.println("error: " + e.getCause().getMessage());
      net.parallel.fail();
      return 1;
    } catch (RuntimeException | Error e) {
      System.err.println("internal error: " + e);
      e.printStackTrace();
      net.parallel.fail();
      return 3;
    } finally {
      net.parallel.close(); // after a failure: stops every rank (MPI_Abort, ncclCommAbort)
    }
  }
}
