package deepdsl.runtime;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * The generated program's command line: the flags of {@code deepdsl run} (and the workspace
 * limit), their usage text and ranges, their parsing into one value of this class, and what the
 * program prints of a run with {@code --json}. {@link Network#run} is the program's {@code main}
 * that uses it. Every bad flag is an {@link IllegalArgumentException} whose message the program
 * prints under the usage text, exiting with 2.
 */
final class CommandLine {
  private CommandLine() {}

  // ---- the flag table ----

  static final String USAGE =
      "usage: java %s [--iters N] [--data SOURCE] [--load FILE.npz] [--save FILE.npz]\n"
          + "           [--device cpu|cuda|auto] [--workspace-limit BYTES] [--threads N]\n"
          + "           [--blas openblas|java|auto] [--kernels vendor|own|auto] [--no-graph] [--json]\n"
          + "           [--deterministic]\n"
          + "           [--precision fp32|tf32|bf16]\n"
          + "           [--lr X] [--momentum X] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X]"
          + " [--clip X] [--alpha X]\n"
          + "       java %1$s --eval --load FILE.npz [--data SOURCE] [--device ...] [--json]\n"
          + "       java %1$s --predict OUT.npz --load FILE.npz --data SOURCE [--split test|train]"
          + " [--device ...]\n"
          + "  --replace-readonly: --save and --predict may replace a read-only file\n"
          + "  data parallel (a program compiled with --data-parallel): [--micro-batches M] [--ranks R]"
          + " [--rank r] [--local-rank l]\n"
          + "    (R, r, l: else from the launcher's environment: torchrun, mpiexec, mpirun, srun)";

  /** The flags that set a setting of the class (those its optimizer has). */
  static final List<String> SETTING_FLAGS =
      List.of(
          "--lr", "--momentum", "--weight-decay", "--beta1", "--beta2", "--eps", "--clip",
          "--alpha");

  /** The most steps one run takes (deepdsl run --iters, the train block's iterations: the same). */
  static final int MAX_ITERS = 10_000_000;

  /** The most threads --threads starts (Parallel's bound). */
  static final int MAX_THREADS = Parallel.MAX_THREADS;

  /** The largest float32: a setting the kernels read as a float must stay finite there. */
  private static final double FLOAT_MAX = Float.MAX_VALUE;

  /**
   * The range of each numeric flag: {@code [low, high]}, or {@code [low, high)} where {@code
   * highOpen}. The same table as deepdsl/run_settings.py's SETTING_RANGES (and the optimizers' arguments
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

  /** A decimal number as the flags take it (no hex, no suffix, no NaN or Infinity): run_settings.py's. */
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
          "--clip", new Range(0, FLOAT_MAX, false, false),
          "--alpha", new Range(0, 1, true, false));

  /** The data-parallel flags' ranges (their own map: Map.of takes ten pairs). */
  private static final Map<String, Range> PARALLEL_RANGES =
      Map.of(
          "--micro-batches", new Range(1, 65536, false, true),
          "--ranks", new Range(1, Launch.MAX_RANKS, false, true),
          "--rank", new Range(0, Launch.MAX_RANKS - 1, false, true),
          "--local-rank", new Range(0, 65535, false, true));

  // ---- the flags, as parsed ----

  Integer iters;
  String data;
  String load;
  String save;
  String device = "auto";
  boolean json;
  boolean replaceReadOnly;
  boolean eval;
  String predict;
  String split; // --split test|train of --predict (null: test where the data has one)
  Long workspaceLimit;
  Integer threads;
  String blas = Blas.defaultChoice();
  String kernels = "auto";
  String precision; // --precision fp32|tf32|bf16 (null: the compiled one, Settings.precision)
  boolean graph = true; // the CUDA device replays the train step as a CUDA graph (--no-graph: not)
  // the CUDA device's cuDNN convolutions are the heuristic's deterministic algorithms, not the fastest found
  boolean deterministic;
  int microBatches = 1; // data parallelism (DataParallel): micro-batches a step, and this process's place
  Integer ranks;
  Integer rank;
  Integer localRank;
  final Map<String, Double> settings = new LinkedHashMap<>();

  static CommandLine parse(String[] args) {
    CommandLine f = new CommandLine();
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
      if (arg.equals("--deterministic")) {
        f.deterministic = true;
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
              "--precision",
              "--predict",
              "--split",
              "--micro-batches",
              "--ranks",
              "--rank",
              "--local-rank")
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
        case "--split" -> {
          if (!List.of("test", "train").contains(value)) {
            throw new IllegalArgumentException("--split takes test or train, not '" + value + "'");
          }
          f.split = value;
        }
        case "--workspace-limit" -> f.workspaceLimit = bytes(arg, value);
        case "--threads" -> f.threads = count(arg, value);
        case "--micro-batches" -> f.microBatches = count(arg, value);
        case "--ranks" -> f.ranks = count(arg, value);
        case "--rank" -> f.rank = count(arg, value);
        case "--local-rank" -> f.localRank = count(arg, value);
        case "--blas" -> f.blas = value;
        case "--kernels" -> {
          if (!List.of("vendor", "own", "auto").contains(value)) {
            throw new IllegalArgumentException(
                "--kernels takes vendor, own or auto, not '" + value + "'");
          }
          f.kernels = value;
        }
        case "--precision" -> {
          if (!List.of("fp32", "tf32", "bf16").contains(value)) {
            throw new IllegalArgumentException(
                "--precision takes fp32, tf32 or bf16, not '" + value + "'");
          }
          f.precision = value;
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
    if (f.split != null && f.predict == null) {
      throw new IllegalArgumentException("--split takes --predict OUT.npz (the split it predicts)");
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
    Range r = RANGES.containsKey(flag) ? RANGES.get(flag) : PARALLEL_RANGES.get(flag);
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

  // ---- what --json prints ----

  /**
   * The data source as the progress header names it: synthetic data with the seed it is made from
   * (its own, {@code --data synthetic:SEED}, or the program's), so that {@code synthetic:5} says
   * what the 5 is.
   */
  static String dataLabel(String source, long seed) {
    Data.Spec spec = Data.parseFlag(source);
    if (!spec.kind().equals("synthetic")) {
      return spec.kind();
    }
    return "synthetic (seed " + (spec.seed() != null ? spec.seed() : seed) + ")";
  }

  /** The progress line's terms of a loss of several: {@code "rec 0.1234  kl 0.0567  "}. */
  static String terms(String[] names, float[] values) {
    StringBuilder s = new StringBuilder();
    for (int t = 0; t < names.length; t++) {
      s.append(String.format(Locale.ROOT, "%s %.4f  ", names[t], values[t]));
    }
    return s.toString();
  }

  /**
   * {@code json}, one of the objects --json prints (it starts with the device), with the precision
   * that ran after the device and, where it is not the one asked for, why (deepdsl run's fields).
   */
  /** The flags that override the compiled settings: --deterministic and --precision. */
  void applyTo(NetworkTensors.Settings s) {
    s.deterministic |= deterministic; // cuDNN's heuristic, deterministic convolution algorithms
    if (precision != null) { // the CUDA device's TF32 math
      s.precision = precision;
    }
  }

  /** {@link #parse}, then the --precision checked against the one {@code compiled} (checkPrecision). */
  static CommandLine parse(String[] args, String compiled) {
    CommandLine f = parse(args);
    f.checkPrecision(compiled);
    return f;
  }

  /**
   * bf16 is fixed when the program is compiled (its plan stores bf16 values in two bytes): --precision
   * may switch between fp32 and tf32 (the same plan), not into or out of bf16.
   */
  void checkPrecision(String compiled) {
    if (precision == null || precision.equals(compiled)) {
      return;
    }
    if (precision.equals("bf16")) {
      throw new IllegalArgumentException(
          "--precision bf16: this program was compiled for " + compiled + "; bf16 mixed precision is"
              + " planned at compile time: `deepdsl compile --precision bf16` writes a program that runs"
              + " it");
    }
    if (compiled.equals("bf16")) {
      throw new IllegalArgumentException(
          "--precision " + precision + ": this program was compiled for bf16 (its plan stores bf16"
              + " values); `deepdsl compile --precision " + precision + "` writes one for " + precision);
    }
  }

  /** deepdsl eval --json's object: the device and the test figures (the loss, and the metrics). */
  static String evalJson(String device, double[] tested) {
    List<String> nonfinite = new ArrayList<>();
    String loss = jsonNumber(tested[0], "test_loss", nonfinite);
    return "{\"device\": \"" + device + "\", \"test_loss\": " + loss + metrics(tested) + nonfinite(nonfinite) + "}";
  }

  static String withPrecision(String json, Device device, String asked) {
    String ran = device.precision(asked);
    String fields = ", \"precision\": \"" + ran + "\"";
    if (!ran.equals(asked)) {
      fields += ", \"precision_note\": \"" + Device.precisionNote(asked) + "\"";
    }
    int end = json.indexOf("\"", "{\"device\": \"".length()) + 1;
    return json.substring(0, end) + fields + json.substring(end);
  }

  static String json(
      String device,
      float[] losses,
      double[] tested,
      long peak,
      long arena,
      long measured,
      double secondsPerIter,
      List<Double> stepSeconds,
      List<Float> rates,
      String[] termNames,
      List<float[]> terms) {
    List<String> bad = new ArrayList<>();
    StringBuilder s =
        new StringBuilder("{\"device\": \"").append(device).append("\", \"losses\": [");
    for (int i = 0; i < losses.length; i++) {
      s.append(i > 0 ? ", " : "").append(jsonNumber(losses[i], "losses", bad));
    }
    s.append("]");
    if (termNames.length > 0) { // the named terms of a loss of several, each step's value
      s.append(", \"loss_terms\": {");
      for (int t = 0; t < termNames.length; t++) {
        s.append(t > 0 ? ", " : "").append('"').append(termNames[t]).append("\": [");
        for (int i = 0; i < terms.size(); i++) {
          s.append(i > 0 ? ", " : "").append(jsonNumber(terms.get(i)[t], "loss_terms", bad));
        }
        s.append("]");
      }
      s.append("}");
    }
    if (rates != null) {
      s.append(", \"learning_rates\": [");
      for (int i = 0; i < rates.size(); i++) {
        s.append(i > 0 ? ", " : "").append(jsonNumber(rates.get(i), "learning_rates", bad));
      }
      s.append("]");
    }
    if (tested != null) {
      s.append(", \"test_loss\": ").append(jsonNumber(tested[0], "test_loss", bad));
      s.append(metrics(tested));
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

  /** The test metrics as the lines the program prints at the end (as deepdsl run). */
  static String metricLines(double[] tested) {
    StringBuilder s = new StringBuilder(String.format(Locale.ROOT, "test loss: %.4f%n", tested[0]));
    if (!Double.isNaN(tested[1])) {
      s.append(String.format(Locale.ROOT, "test accuracy: %.2f%%%n", 100 * tested[1]));
    }
    if (!Double.isNaN(tested[2])) {
      s.append(String.format(Locale.ROOT, "test top-5 accuracy: %.2f%%%n", 100 * tested[2]));
    }
    if (!Double.isNaN(tested[3])) {
      s.append(String.format(Locale.ROOT, "test mean absolute error: %.4f%n", tested[3]));
    }
    return s.toString();
  }

  /**
   * The test metrics after the loss, as JSON fields: {@code test_accuracy}, {@code
   * test_top5_accuracy}, {@code test_mae}, each where reported (not NaN).
   */
  static String metrics(double[] tested) {
    String[] names = {"test_accuracy", "test_top5_accuracy", "test_mae"};
    StringBuilder s = new StringBuilder();
    for (int k = 1; k < tested.length && k <= names.length; k++) {
      if (!Double.isNaN(tested[k])) {
        s.append(", \"").append(names[k - 1]).append("\": ").append(tested[k]);
      }
    }
    return s.toString();
  }

  /**
   * A number as JSON writes it: a NaN or an infinity (which JSON has not) as {@code null}, its
   * field named in {@code nonfinite} (as deepdsl's --json does).
   */
  static String jsonNumber(double x, String field, List<String> nonfinite) {
    if (Double.isFinite(x)) {
      return Double.toString(x);
    }
    if (!nonfinite.contains(field)) {
      nonfinite.add(field);
    }
    return "null";
  }

  /** The {@code "nonfinite"} list of the fields that hold a null for a NaN or infinity, if any. */
  static String nonfinite(List<String> fields) {
    if (fields.isEmpty()) {
      return "";
    }
    return ", \"nonfinite\": [\"" + String.join("\", \"", fields) + "\"]";
  }
}
