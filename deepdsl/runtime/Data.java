package deepdsl.runtime;

import java.io.IOException;
import java.math.BigInteger;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

/**
 * Training and test samples, exactly as {@code deepdsl/data} gives them to the Python trainer.
 *
 * <p>Four sources (docs/formats.md): {@code synthetic[:SEED]} (deterministic, see {@code
 * data/synthetic.py}), {@code mnist:DIR} (IDX files, plain or gzip), {@code cifar10:DIR} (the
 * binary batches) and {@code npz:FILE} (an array named after each input and label, {@code NAME_test}
 * for a test set; {@code x}, {@code y} for the one input and label of {@link #load(Spec, int[], int,
 * long)}). Samples are float32; labels are carried as exact float values. Iteration i with
 * batch size n takes positions {@code [i*n, (i+1)*n)}, each position p being sample {@code p mod M}
 * in file order or, with a shuffle seed, sample {@code perm_e[p mod M]} of epoch {@code e = p div
 * M}'s Fisher-Yates permutation.
 */
public final class Data {
  private static final int BIG_SAMPLE = 65536;
  // the synthetic data set's samples take at most this many bytes, training and test together
  private static final long SYNTHETIC_BYTES = 1L << 29;
  private static final int PERMUTATIONS_KEPT = 4;
  private static final Pattern PYTHON_INT =
      Pattern.compile(
          "[+-]?(0[xX](_?[0-9a-fA-F])+|0[oO](_?[0-7])+|0[bB](_?[01])+|[1-9](_?[0-9])*|0(_?0)*)");

  /**
   * A data source: its kind ({@code synthetic}, {@code mnist}, {@code cifar10} or {@code npz}), the
   * folder or file it reads ({@code null} for synthetic) and, for synthetic, its own seed ({@code
   * null}: the program's).
   */
  public record Spec(String kind, String path, Long seed) {}

  /**
   * One {@code input} (float32, or with {@code classes > 0} token ids in {@code [0, classes)}: an
   * {@code input NAME : [N, T] int vocab V}) or {@code label} (class ids in {@code [0, classes)})
   * of a network, by name, with its shape per sample (without the batch dimension). Integers are
   * carried as exact floats.
   */
  public record Field(String name, boolean label, int classes, int[] shape, long ignore) {
    /** A field whose data holds no ignored value. */
    public Field(String name, boolean label, int classes, int[] shape) {
      this(name, label, classes, shape, Long.MIN_VALUE);
    }

    /** As the Python side's {@code Field.describe}: {@code input t : [N, 4]}. */
    String describe() {
      StringBuilder s = new StringBuilder(label ? "label " : "input ").append(name).append(" : [N");
      for (int d : shape) {
        s.append(", ").append(d);
      }
      String kind = label ? " classes " + classes : tokens() ? " int vocab " + classes : "";
      return s.append("]").append(kind).toString();
    }

    /** An integer input: token ids in {@code [0, classes)}. */
    boolean tokens() {
      return !label && classes > 0;
    }

    /** Whether the field holds integers (a label or token ids). */
    boolean integer() {
      return label || classes > 0;
    }

    int size() {
      return Math.toIntExact(Buf.count(shape));
    }
  }

  private final float[][] train; // per field, row-major [M, sample...]
  private final float[][] test; // null without a test set
  private final int[] sampleSizes;
  private final int trainCount;
  private final int testCount;
  private final Map<Long, int[]> permutations = new LinkedHashMap<>();
  private long permutationSeed;

  private Data(float[][] train, float[][] test, int[] sampleSizes) {
    this.train = train;
    this.test = test;
    this.sampleSizes = sampleSizes;
    this.trainCount = sampleSizes[0] == 0 ? 0 : train[0].length / sampleSizes[0];
    this.testCount = test == null || sampleSizes[0] == 0 ? 0 : test[0].length / sampleSizes[0];
  }

  private static Data pair(float[] xTrain, float[] yTrain, float[] xTest, float[] yTest, int d) {
    return new Data(
        new float[][] {xTrain, yTrain},
        xTest == null ? null : new float[][] {xTest, yTest},
        new int[] {d, 1});
  }

  /**
   * Parse {@code --data}: {@code synthetic}, {@code synthetic:SEED} (a Python integer literal:
   * decimal, {@code 0x..}, {@code 0o..}, {@code 0b..}, underscores between digits), {@code
   * mnist:DIR}, {@code cifar10:DIR} or {@code npz:FILE}.
   *
   * @throws IllegalArgumentException for an unknown source, a bad seed or a missing folder or file
   *     name
   */
  public static Spec parseFlag(String text) {
    int colon = text.indexOf(':');
    String kind = (colon < 0 ? text : text.substring(0, colon)).strip();
    String value = colon < 0 ? "" : text.substring(colon + 1);
    switch (kind) {
      case "synthetic" -> {
        if (colon < 0) {
          return new Spec(kind, null, null);
        }
        String digits = value.strip();
        if (!PYTHON_INT.matcher(digits).matches()) {
          throw new IllegalArgumentException(
              "--data synthetic:SEED needs an integer seed, got '" + value + "'");
        }
        if (digits.startsWith("-") && parseSeed(digits) != 0) {
          throw new IllegalArgumentException(
              "--data synthetic:SEED needs a seed of at least 0, got '" + value + "'");
        }
        return new Spec(kind, null, parseSeed(digits));
      }
      case "mnist", "cifar10", "npz", "text", "images", "csv" -> {
        String what = List.of("npz", "text", "csv").contains(kind) ? "file" : "dir";
        if (value.isEmpty()) {
          throw new IllegalArgumentException(
              String.format(
                  "--data %s needs a %s: write --data %1$s:%s", kind, what, what.toUpperCase()));
        }
        return new Spec(kind, value, null);
      }
      default ->
          throw new IllegalArgumentException(
              String.format(
                  "unknown data source '%s' in --data '%s' (expected synthetic, mnist:DIR,"
                      + " cifar10:DIR, npz:FILE, text:FILE, images:DIR or csv:FILE)",
                  kind, text));
    }
  }

  /** A Python integer literal (already checked) mod 2^64, as the seed streams take it. */
  private static long parseSeed(String literal) {
    String s = literal.replace("_", "");
    boolean negative = s.startsWith("-");
    if (negative || s.startsWith("+")) {
      s = s.substring(1);
    }
    int radix = 10;
    if (s.length() > 1 && s.charAt(0) == '0' && Character.isLetter(s.charAt(1))) {
      radix = "xX".indexOf(s.charAt(1)) >= 0 ? 16 : "oO".indexOf(s.charAt(1)) >= 0 ? 8 : 2;
      s = s.substring(2);
    }
    BigInteger v = new BigInteger(s, radix);
    return (negative ? v.negate() : v).longValue();
  }

  /**
   * Load (or make) the samples of {@code spec} for a network taking {@code xShape} per sample
   * (without the batch dimension) and {@code classes} classes. Samples of another shape with the
   * same number of elements are flattened when the network takes flat vectors {@code [D]}.
   *
   * @param seed the program's seed, used by synthetic data without a seed of its own
   * @throws IOException for a missing, truncated or malformed file, a shape the network cannot take
   *     or a label outside {@code [0, classes)}; the message names the file and the numbers
   *     involved
   */
  public static Data load(Spec spec, int[] xShape, int classes, long seed) throws IOException {
    if (classes < 1) {
      throw new IllegalArgumentException(
          "the network must have at least one class, got " + classes);
    }
    int d = Math.toIntExact(Buf.count(xShape));
    if (spec.kind().equals("synthetic")) {
      return synthetic(d, classes, spec.seed() != null ? spec.seed() : seed, null);
    }
    if (spec.kind().equals("text")) {
      throw new IOException(
          "text data holds token ids and next-token targets, not images and classes");
    }
    if (spec.kind().equals("npz") || spec.kind().equals("csv")) { // the input and label: x and y
      List<Field> pair =
          List.of(new Field("x", false, 0, xShape), new Field("y", true, classes, new int[0]));
      return spec.kind().equals("npz")
          ? DataFiles.npz(spec.path(), pair, false)
          : CsvData.load(spec.path(), pair);
    }
    if (spec.kind().equals("images")) {
      float[][] s =
          ImageFolder.load(
              spec.path(),
              xShape,
              classes,
              new Field("x", false, 0, xShape).describe(),
              new Field("y", true, classes, new int[0]).describe());
      return pair(s[0], s[1], s[2], s[3], d);
    }
    DataFiles.Split split =
        switch (spec.kind()) {
          case "mnist" -> DataFiles.mnist(spec.path());
          case "cifar10" -> DataFiles.cifar10(spec.path());
          default ->
              throw new IllegalArgumentException(
                  String.format(
                      "unknown data source '%s' (expected synthetic, mnist, cifar10, npz or text)",
                      spec.kind()));
        };
    String where = spec.kind() + " data in '" + spec.path() + "'";
    DataFiles.Samples train = split.train();
    DataFiles.Samples test = split.test();
    train.check(xShape, classes, where, "training");
    if (test != null) {
      test.check(xShape, classes, where + " (test set)", "test");
    }
    if (train.count() == 0) {
      throw new IOException("the training data holds no samples");
    }
    if (test != null && test.labels().length == 0) {
      throw new IOException("the test data holds no samples (leave x_test and y_test out for none)");
    }
    return pair(
        train.x,
        train.labels(),
        test == null ? null : test.x,
        test == null ? null : test.labels(),
        d);
  }

  /**
   * Every input and label of a network, by name, from {@code spec} (as {@code
   * deepdsl/data/named.py}'s {@code load_samples}): an npz file holds an array named after each
   * (and {@code NAME_test} for each, for a test set); MNIST and CIFAR-10 fill one input and at most
   * one label; synthetic data makes every field. A field the source cannot fill is an error naming
   * it.
   */
  public static Data load(Spec spec, List<Field> fields, long seed) throws IOException {
    return load(spec, fields, seed, false);
  }

  /** The same; with {@code otherArrays}, an npz file may hold arrays beyond the fields. */
  public static Data load(Spec spec, List<Field> fields, long seed, boolean otherArrays)
      throws IOException {
    List<Field> inputs = fields.stream().filter(f -> !f.label()).toList();
    List<Field> labels = fields.stream().filter(Field::label).toList();
    if (inputs.isEmpty()) {
      throw new IOException("the network declares no `input`, so there is no data to train on");
    }
    int classes = labels.isEmpty() ? 10 : labels.get(0).classes();
    if (spec.kind().equals("npz")) {
      return DataFiles.npz(spec.path(), fields, otherArrays);
    }
    if (spec.kind().equals("text")) {
      return TextData.load(spec.path(), fields);
    }
    if (spec.kind().equals("csv")) {
      return CsvData.load(spec.path(), fields, otherArrays);
    }
    if (spec.kind().equals("synthetic")) {
      int d = inputs.stream().filter(f -> !f.tokens()).findFirst().map(Field::size).orElse(1);
      return synthetic(d, classes, spec.seed() != null ? spec.seed() : seed, fields);
    }
    for (Field f : inputs) {
      if (f.tokens()) {
        throw new IOException(
            spec.kind()
                + " data holds images, so it has nothing for the network's "
                + f.describe()
                + "; give token ids as --data text:FILE or as an array of --data npz:FILE");
      }
    }
    if (inputs.size() > 1 || labels.size() > 1) {
      Field extra = inputs.size() > 1 ? inputs.get(1) : labels.get(1);
      throw new IOException(
          spec.kind()
              + " data holds one input (the images) and one label (the classes), so it has nothing"
              + " for the network's "
              + extra.describe()
              + "; give every input and label as an array of --data npz:FILE");
    }
    Data d;
    if (spec.kind().equals("images")) { // named after the network's own input and label in errors
      Field in = inputs.get(0);
      String label =
          labels.isEmpty() ? "classes (10 without a label)" : labels.get(0).describe();
      float[][] s = ImageFolder.load(spec.path(), in.shape(), classes, in.describe(), label);
      d = pair(s[0], s[1], s[2], s[3], in.size());
    } else {
      d = load(spec, inputs.get(0).shape(), classes, seed);
    }
    if (!labels.isEmpty()) {
      return d;
    }
    return new Data(
        new float[][] {d.train[0]},
        d.test == null ? null : new float[][] {d.test[0]},
        new int[] {d.sampleSizes[0]});
  }

  /** Named arrays, one per field in order, row-aligned (npz data, already checked). */
  static Data named(float[][] train, float[][] test, int[] sampleSizes) throws IOException {
    Data d = new Data(train, test, sampleSizes);
    if (d.trainCount == 0) {
      throw new IOException("the training data holds no samples");
    }
    if (test != null && d.testCount == 0) {
      throw new IOException(
          "the test data holds no samples (leave the _test arrays out for none)");
    }
    return d;
  }

  /** M, the number of training samples. */
  public int size() {
    return trainCount;
  }

  /** Whether the source has test samples. */
  public boolean hasTest() {
    return test != null;
  }

  /** The number of test samples (0 without a test set). */
  public int testSize() {
    return test == null ? 0 : testCount;
  }

  /**
   * Fill {@code to} (one buffer per field, {@code [n, ...]}, in the fields' order: {@code x} and
   * {@code y} for {@link #load(Spec, int[], int, long)}) with the training samples of iteration
   * {@code i}, as {@code Dataset.batch(i, n, shuffleSeed)} of the Python side.
   *
   * @param shuffleSeed the shuffle seed (the program's seed when the train block shuffles), or null
   *     for file order
   */
  public void batch(long i, int n, Long shuffleSeed, Buf... to) {
    if (i < 0) {
      throw new IllegalArgumentException("the iteration number must not be negative, got " + i);
    }
    checkBatch(n, to);
    int m = size();
    for (int k = 0; k < n; k++) {
      long p = i * n + k;
      int index = (int) (p % m);
      if (shuffleSeed != null) {
        index = permutation(p / m, shuffleSeed)[index];
      }
      copySample(train, index, k, to);
    }
  }

  /**
   * Fill {@code x} and {@code y} with test samples {@code [b*n, (b+1)*n)}, wrapping around the end
   * of the test set (as the Python trainer's {@code test()} takes them).
   *
   * @throws IllegalStateException when the source has no test set
   */
  public void testBatch(long b, int n, Buf... to) {
    if (!hasTest()) {
      throw new IllegalStateException("the data source has no test set");
    }
    checkBatch(n, to);
    for (int k = 0; k < n; k++) {
      copySample(test, (int) Math.floorMod(b * n + k, (long) testCount), k, to);
    }
  }

  /**
   * The sample order of {@code epoch} under shuffling, a Fisher-Yates permutation of {@code
   * 0..m-1}: from the identity, for {@code j = m-1} down to 1, swap {@code perm[j]} and {@code
   * perm[r]}, {@code r} being the next output (unsigned) mod {@code j+1} of the stream {@code
   * streamSeed("shuffle/" + epoch, shuffleSeed)}.
   */
  private static int[] shufflePermutation(int m, long epoch, long shuffleSeed) {
    int[] perm = new int[m];
    Arrays.setAll(perm, k -> k);
    Rng rng = new Rng(Rng.streamSeed("shuffle/" + epoch, shuffleSeed));
    for (int j = m - 1; j >= 1; j--) {
      int r = (int) Long.remainderUnsigned(rng.next(), j + 1);
      int t = perm[j];
      perm[j] = perm[r];
      perm[r] = t;
    }
    return perm;
  }

  private int[] permutation(long epoch, long shuffleSeed) {
    if (shuffleSeed != permutationSeed || permutations.size() >= PERMUTATIONS_KEPT) {
      permutations.clear();
      permutationSeed = shuffleSeed;
    }
    return permutations.computeIfAbsent(epoch, e -> shufflePermutation(size(), e, shuffleSeed));
  }

  private void checkBatch(int n, Buf[] to) {
    if (n <= 0) {
      throw new IllegalArgumentException("the batch size must be positive, got " + n);
    }
    if (to.length != sampleSizes.length) {
      throw new IllegalArgumentException(
          "the data holds " + sampleSizes.length + " arrays, not " + to.length);
    }
    for (int f = 0; f < to.length; f++) {
      if (to[f].numel() != (long) n * sampleSizes[f]) {
        throw new IllegalArgumentException(
            String.format(
                "a batch of %d samples of %d elements does not fit %s",
                n, sampleSizes[f], Arrays.toString(to[f].shape)));
      }
    }
  }

  private void copySample(float[][] from, int index, int k, Buf[] to) {
    for (int f = 0; f < to.length; f++) {
      int size = sampleSizes[f];
      System.arraycopy(from[f], (int) ((long) index * size), to[f].a, to[f].off + k * size, size);
    }
  }

  // ---- synthetic ----

  /**
   * The synthetic data set of {@code data/synthetic.py}: label j is draw j (unsigned) mod K of
   * stream {@code synthetic/y}; element t of sample j is {@code ((N >>> 1) + (P >>> 1) - 2^23) * 2^-24},
   * with N the top 24 bits of draw {@code j*D + t} of stream {@code synthetic/x} and P those of
   * draw {@code y_j*D + t} of stream {@code synthetic/prototype}. 1024 training and 256 test
   * samples (256 and 64 when D > 65536); when those take more than 2^29 bytes, M = max(2, 2^29 /
   * (4*D)) samples, M / 5 (at least 1) of them for the test set.
   */
  private static Data synthetic(int d, int classes, long seed, List<Field> fields) {
    int nTrain = d <= BIG_SAMPLE ? 1024 : 256;
    int nTest = d <= BIG_SAMPLE ? 256 : 64;
    long most = Math.max(2, SYNTHETIC_BYTES / (4L * Math.max(d, 1)));
    if (nTrain + nTest > most) {
      nTest = (int) Math.max(1, most / 5);
      nTrain = (int) (most - nTest);
    }
    Rng labels = new Rng(Rng.streamSeed("synthetic/y", seed));
    Rng noise = new Rng(Rng.streamSeed("synthetic/x", seed));
    long prototypeSeed = Rng.streamSeed("synthetic/prototype", seed);
    // The test samples continue the training samples' streams.
    float[] xTrain = new float[Math.toIntExact((long) nTrain * d)];
    float[] yTrain = new float[nTrain];
    float[] xTest = new float[Math.toIntExact((long) nTest * d)];
    float[] yTest = new float[nTest];
    syntheticSamples(xTrain, yTrain, d, classes, labels, noise, prototypeSeed);
    syntheticSamples(xTest, yTest, d, classes, labels, noise, prototypeSeed);
    if (fields == null) {
      return pair(xTrain, yTrain, xTest, yTest, d);
    }
    int n = fields.size();
    int first = 0;
    while (first < n && fields.get(first).integer()) {
      first++;
    }
    float[][] train = new float[n][];
    float[][] test = new float[n][];
    int[] sizes = new int[n];
    for (int f = 0; f < n; f++) {
      Field field = fields.get(f);
      sizes[f] = field.size();
      if (f == first) {
        train[f] = xTrain;
        test[f] = xTest;
      } else if (field.tokens()) {
        train[f] = tokenIds(yTrain, field);
        test[f] = tokenIds(yTest, field);
      } else if (field.label()) {
        train[f] = classIds(yTrain, field);
        test[f] = classIds(yTest, field);
      } else {
        train[f] = target(xTrain, d, field, seed);
        test[f] = target(xTest, d, field, seed);
      }
    }
    return new Data(train, test, sizes);
  }

  /** Synthetic token ids: (y_j + t) mod V at flat position t of sample j (as named.py makes them). */
  private static float[] tokenIds(float[] y, Field field) {
    int size = field.size();
    float[] out = new float[y.length * size];
    for (int j = 0; j < y.length; j++) {
      for (int t = 0; t < size; t++) {
        out[j * size + t] = (float) (((long) y[j] + t) % field.classes());
      }
    }
    return out;
  }

  /** A further label of synthetic data: the sample's class id mod its classes, in every element. */
  private static float[] classIds(float[] y, Field field) {
    int size = field.size();
    float[] out = new float[y.length * size];
    for (int j = 0; j < y.length; j++) {
      Arrays.fill(out, j * size, (j + 1) * size, (float) ((long) y[j] % field.classes()));
    }
    return out;
  }

  /**
   * A regression target of synthetic data, as {@code data/synthetic.py}'s {@code make_target}:
   * target[j, u] = float32((sum_t X[j, t]*S[u, t]) * 2^-(24 + k)), with X the input's exact integers
   * x*2^24, S[u, t] = 1 - 2*(draw u*D + t of stream synthetic/target/NAME >>> 63) and k =
   * bit_length(D) / 2.
   */
  private static float[] target(float[] x, int d, Field field, long seed) {
    int m = x.length / d;
    int u = field.size();
    long stream = Rng.streamSeed("synthetic/target/" + field.name(), seed);
    double scale = Math.scalb(1.0, -(24 + (64 - Long.numberOfLeadingZeros(d)) / 2));
    float[] out = new float[m * u];
    int[] signs = new int[d];
    for (int v = 0; v < u; v++) {
      Rng r = Rng.at(stream, (long) v * d);
      for (int t = 0; t < d; t++) {
        signs[t] = 1 - 2 * (int) (r.next() >>> 63);
      }
      for (int j = 0; j < m; j++) {
        long sum = 0;
        for (int t = 0; t < d; t++) {
          sum += (long) (x[j * d + t] * 0x1.0p24f) * signs[t];
        }
        out[j * u + v] = (float) (sum * scale);
      }
    }
    return out;
  }

  /** The next {@code y.length} synthetic samples, drawing from {@code labels} and {@code noise}. */
  private static void syntheticSamples(
      float[] x, float[] y, int d, int classes, Rng labels, Rng noise, long prototypeSeed) {
    for (int j = 0; j < y.length; j++) {
      int label = (int) Long.remainderUnsigned(labels.next(), classes);
      y[j] = label;
      Rng prototype = Rng.at(prototypeSeed, (long) label * d);
      for (int t = 0; t < d; t++) {
        x[j * d + t] = ((noise.bits24() >>> 1) + (prototype.bits24() >>> 1) - (1 << 23)) * 0x1.0p-24f;
      }
    }
  }
}
