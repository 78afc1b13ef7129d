package deepdsl.runtime;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.math.BigInteger;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import java.util.zip.GZIPInputStream;
import java.util.zip.ZipException;

/**
 * The file sources of {@link Data}, read as {@code deepdsl/data/{mnist,cifar10,npz}.py} read them;
 * every failure is an {@link IOException} worded as the Python side words it.
 */
final class DataFiles {
  private static final int IMAGE_MAGIC = 2051;
  private static final int LABEL_MAGIC = 2049;
  private static final int CIFAR_RECORD = 1 + 3 * 32 * 32;
  // the most pixels one Java array holds; an IDX header promising more is refused (as mnist.py does)
  private static final long MAX_IDX_BYTES = Integer.MAX_VALUE - 8;
  // the most records whose pixels one Java array holds (699,050; as cifar10.py's MAX_RECORDS)
  private static final long MAX_CIFAR_RECORDS = MAX_IDX_BYTES / (CIFAR_RECORD - 1);

  private DataFiles() {}

  /** What a file source holds: its training samples and its test samples (null when none). */
  record Split(Samples train, Samples test) {}

  /** Samples as read: x float32 row-major {@code [M, sample...]}, y the labels. */
  static final class Samples {
    final float[] x;
    final long[] y;
    final int[] sampleShape;

    Samples(float[] x, long[] y, int[] sampleShape) {
      this.x = x;
      this.y = y;
      this.sampleShape = sampleShape;
    }

    int count() {
      return y.length;
    }

    /** The labels as exact floats ({@link #check} keeps them below the class count). */
    float[] labels() {
      float[] out = new float[y.length];
      for (int k = 0; k < y.length; k++) {
        out[k] = y[k];
      }
      return out;
    }

    /**
     * Check that a network taking {@code xShape} per sample can take these samples (the same shape,
     * or {@code [D]} for samples of D elements) and that every label lies in {@code [0, classes)}.
     */
    void check(int[] xShape, int classes, String where, String what) throws IOException {
      boolean flattens = xShape.length == 1 && Buf.count(sampleShape) == xShape[0];
      if (!Arrays.equals(sampleShape, xShape) && !flattens) {
        throw new IOException(
            String.format(
                "%s has per-sample shape %s, but the network's input takes %s per sample",
                where, Arrays.toString(sampleShape), Arrays.toString(xShape)));
      }
      for (int k = 0; k < y.length; k++) {
        if (y[k] < 0 || y[k] >= classes) {
          throw new IOException(
              String.format(
                  "%s: %s label %d of sample %d is outside [0, %d) (the network has %d classes)",
                  where, what, y[k], k, classes, classes));
        }
      }
    }
  }

  /** Pixels as float32 {@code byte / 255} (a float division, as NumPy's float32 division). */
  private static void pixels(byte[] src, int from, float[] dst, int to, int count) {
    for (int k = 0; k < count; k++) {
      dst[to + k] = (src[from + k] & 0xFF) / 255.0f;
    }
  }

  // ---- mnist ----

  /**
   * {@code mnist("dir")}: {@code train-images-idx3-ubyte}, {@code train-labels-idx1-ubyte} and,
   * optionally (both or neither), the {@code t10k-} pair; each plain or with a {@code .gz} suffix
   * (the plain file wins). Images become {@code [n, 1, rows, cols]}.
   */
  /**
   * What a data error says when the files are not there: the command that gets them (the folder
   * quoted for a POSIX shell where it needs it, as Python's shlex.quote does), or synthetic data.
   */
  static String getIt(String name, String directory) {
    String quoted =
        directory.matches("[A-Za-z0-9@%+=:,./_-]+")
            ? directory
            : "'" + directory.replace("'", "'\"'\"'") + "'";
    return "get them with `deepdsl data "
        + name
        + " "
        + quoted
        + "`, or train on `--data synthetic`";
  }

  static Split mnist(String directory) throws IOException {
    if (!Files.isDirectory(Path.of(directory))) {
      throw new IOException(
          "MNIST directory not found: '" + directory + "'; " + getIt("mnist", directory));
    }
    return new Split(idxPair(directory, "train", true), idxPair(directory, "t10k", false));
  }

  private static Samples idxPair(String directory, String prefix, boolean required)
      throws IOException {
    Path imagesName = Path.of(directory, prefix + "-images-idx3-ubyte");
    Path labelsName = Path.of(directory, prefix + "-labels-idx1-ubyte");
    Path images = plainOrGzip(imagesName);
    Path labels = plainOrGzip(labelsName);
    if (!required && images == null && labels == null) {
      return null;
    }
    for (Path[] p : new Path[][] {{imagesName, images}, {labelsName, labels}}) {
      if (p[1] == null) {
        throw new IOException(
            String.format(
                "MNIST file not found: looked for '%s' and '%1$s.gz'; %s",
                p[0], getIt("mnist", directory)));
      }
    }
    int[] h = new int[4];
    byte[] imageBytes =
        readIdx(images, IMAGE_MAGIC, h, "image", c -> c[1] + " images of " + c[2] + "x" + c[3]);
    int n = h[1];
    long size = (long) n * h[2] * h[3];
    int[] hl = new int[2];
    byte[] labelBytes = readIdx(labels, LABEL_MAGIC, hl, "label", c -> c[1] + " labels");
    int nLabels = hl[1];
    if (n != nLabels) {
      throw new IOException(
          String.format(
              "MNIST files disagree: '%s' holds %d images but '%s' holds %d labels",
              images, n, labels, nLabels));
    }
    float[] x = new float[Math.toIntExact(size)];
    pixels(imageBytes, 0, x, 0, x.length);
    long[] y = new long[nLabels];
    for (int k = 0; k < nLabels; k++) {
      y[k] = labelBytes[k] & 0xFF;
    }
    return new Samples(x, y, new int[] {1, h[2], h[3]});
  }

  /** The plain file, else the gzip one, else null. */
  private static Path plainOrGzip(Path plain) {
    Path gz = Path.of(plain + ".gz");
    return Files.isRegularFile(plain) ? plain : Files.isRegularFile(gz) ? gz : null;
  }

  /**
   * The data bytes of an IDX file, its header's int32s (the magic number, then the counts) put in
   * {@code header}. Reading (and decompressing) stops at the size the header promises, so a small
   * gzip file that inflates to gigabytes is refused one byte after that size.
   */
  private static byte[] readIdx(
      Path path, int magic, int[] header, String what, Function<int[], String> describe)
      throws IOException {
    boolean gzip = path.toString().endsWith(".gz");
    try (InputStream in =
        gzip ? new GZIPInputStream(Files.newInputStream(path)) : Files.newInputStream(path)) {
      int words = header.length;
      byte[] head = in.readNBytes(4 * words);
      if (head.length < 4 * words) {
        throw new IOException(
            String.format(
                "MNIST file '%s' is truncated: %d bytes, shorter than its header",
                path, head.length));
      }
      for (int k = 0; k < words; k++) {
        for (int b = 0; b < 4; b++) {
          header[k] = header[k] << 8 | (head[4 * k + b] & 0xFF);
        }
      }
      if (header[0] != magic) {
        throw new IOException(
            String.format(
                "MNIST file '%s' has magic number %s, but an IDX %s file starts with %d",
                path, Integer.toUnsignedString(header[0]), what, magic));
      }
      for (int k = 1; k < words; k++) {
        if (header[k] < 0) {
          throw new IOException(
              String.format(
                  "MNIST file '%s' has an impossible count %s in its header",
                  path, Integer.toUnsignedString(header[k])));
        }
      }
      // three factors below 2^31 may overflow a long: their exact product
      BigInteger product = BigInteger.ONE;
      for (int k = 1; k < words; k++) {
        product = product.multiply(BigInteger.valueOf(header[k]));
      }
      String described = describe.apply(header);
      if (product.compareTo(BigInteger.valueOf(MAX_IDX_BYTES)) > 0) {
        throw new IOException(
            String.format(
                "MNIST file '%s' promises %s (%s bytes), more than deepdsl reads (%d)",
                path, described, product, MAX_IDX_BYTES));
      }
      long size = product.longValue();
      // before reading: a plain file holds what its header promises; a gzip file promises at most
      // what deepdsl inflates from a file of its size (ZipReader.inflateLimit)
      long onDisk = Files.size(path);
      if (gzip && 4L * words + size > ZipReader.inflateLimit(onDisk)) {
        throw new IOException(
            String.format(
                "MNIST file '%s' promises %s (%d bytes), more than deepdsl inflates from a gzip"
                    + " file of %d bytes (16 times its size, at least 64 MiB)",
                path, described, size, onDisk));
      }
      if (!gzip && onDisk - 4L * words < size) {
        throw new IOException(
            String.format(
                "MNIST file '%s' is truncated: its header promises %s (%d bytes of data), but only"
                    + " %d bytes follow the header",
                path, described, size, onDisk - 4L * words));
      }
      byte[] data = in.readNBytes((int) size); // grows with what the file really holds
      if (data.length < size) {
        throw new IOException(
            String.format(
                "MNIST file '%s' is truncated: its header promises %s (%d bytes of data), but only %d"
                    + " bytes follow the header",
                path, described, size, data.length));
      }
      if (in.read() != -1) {
        String amount =
            gzip ? "more data" : (Files.size(path) - 4L * words - size) + " bytes";
        throw new IOException(
            String.format(
                "MNIST file '%s' has %s after the %s its header describes", path, amount, described));
      }
      return data;
    } catch (ZipException | EOFException e) {
      throw new IOException(
          String.format(
              "cannot decompress MNIST file '%s' (damaged or truncated gzip: %s)",
              path, e.getMessage()),
          e);
    }
  }

  // ---- cifar10 ----

  /**
   * {@code cifar10("dir")}: DIR (or its {@code cifar-10-batches-bin} folder) holds {@code
   * data_batch_1.bin} .. {@code data_batch_5.bin}, the training set in that order, and optionally
   * {@code test_batch.bin}; 3073-byte records of a label byte and the 3x32x32 pixel bytes.
   */
  static Split cifar10(String directory) throws IOException {
    Path base = Path.of(directory);
    if (!Files.isDirectory(base)) {
      throw new IOException(
          "CIFAR-10 directory not found: '" + directory + "'; " + getIt("cifar10", directory));
    }
    Path nested = base.resolve("cifar-10-batches-bin");
    if (!Files.isRegularFile(base.resolve("data_batch_1.bin")) && Files.isDirectory(nested)) {
      base = nested;
    }
    Path[] paths = new Path[5];
    for (int k = 0; k < 5; k++) {
      paths[k] = base.resolve("data_batch_" + (k + 1) + ".bin");
      if (!Files.isRegularFile(paths[k])) {
        throw new IOException(
            String.format(
                "CIFAR-10 file not found: '%s' (the binary version has data_batch_1.bin,"
                    + " data_batch_2.bin, data_batch_3.bin, data_batch_4.bin, data_batch_5.bin); %s",
                paths[k],
                getIt("cifar10", directory)));
      }
    }
    checkRecords(paths);
    byte[][] batches = new byte[5][];
    for (int k = 0; k < 5; k++) {
      batches[k] = readCifar(paths[k]);
    }
    Path test = base.resolve("test_batch.bin");
    Samples testSet = Files.isRegularFile(test) ? cifarRecords(readCifar(test)) : null;
    return new Split(cifarRecords(batches), testSet);
  }

  /**
   * Before reading: the files hold at most {@link #MAX_CIFAR_RECORDS} records together (their sizes
   * say how many), as cifar10.py checks.
   */
  private static void checkRecords(Path... paths) throws IOException {
    long total = 0;
    for (Path path : paths) {
      total += Files.size(path) / CIFAR_RECORD;
      if (total > MAX_CIFAR_RECORDS) {
        throw new IOException(
            String.format(
                "CIFAR-10 file '%s' brings the data to %d or more records of %d bytes, more than"
                    + " deepdsl reads (%d: %d pixels)",
                path,
                total,
                CIFAR_RECORD,
                MAX_CIFAR_RECORDS,
                MAX_CIFAR_RECORDS * (CIFAR_RECORD - 1)));
      }
    }
  }

  private static byte[] readCifar(Path path) throws IOException {
    checkRecords(path);
    byte[] data = Files.readAllBytes(path);
    if (data.length == 0) {
      throw new IOException("CIFAR-10 file '" + path + "' is empty");
    }
    if (data.length % CIFAR_RECORD != 0) {
      throw new IOException(
          String.format(
              "CIFAR-10 file '%s' is truncated: %d bytes is not a whole number of %d-byte records"
                  + " (%d whole records and %d bytes over)",
              path,
              data.length,
              CIFAR_RECORD,
              data.length / CIFAR_RECORD,
              data.length % CIFAR_RECORD));
    }
    return data;
  }

  /** The records of {@code files}, concatenated, as samples {@code [3, 32, 32]}. */
  private static Samples cifarRecords(byte[]... files) {
    int pixelCount = CIFAR_RECORD - 1;
    long records = 0;
    for (byte[] data : files) {
      records += data.length / CIFAR_RECORD;
    }
    float[] x = new float[Math.toIntExact(records * pixelCount)];
    long[] y = new long[(int) records];
    int j = 0;
    for (byte[] data : files) {
      for (int r = 0; r < data.length / CIFAR_RECORD; r++, j++) {
        y[j] = data[r * CIFAR_RECORD] & 0xFF;
        pixels(data, r * CIFAR_RECORD + 1, x, j * pixelCount, pixelCount);
      }
    }
    return new Samples(x, y, new int[] {3, 32, 32});
  }

  // ---- npz ----

  /**
   * {@code npz("file")} for a network's fields (as {@code deepdsl/data/named.py}): an array named
   * after each input (floats {@code [M, ...]}) and label (integers in {@code [0, classes)}), each of
   * the field's per-sample shape (an input taking {@code [D]} also takes samples of D elements);
   * for a test set {@code NAME_test} for every one. Any other array is an error, unless {@code
   * otherArrays}.
   */
  static Data npz(String file, List<Data.Field> fields, boolean otherArrays) throws IOException {
    Path path = Path.of(file);
    if (!Files.isRegularFile(path)) {
      throw new IOException("npz data file not found: '" + file + "'");
    }
    Map<String, Npz.Array> arrays = Npz.read(path);
    List<String> names = fields.stream().map(Data.Field::name).toList();
    String expected = String.join(", ", names);
    String tests = String.join(", ", names.stream().map(n -> n + "_test").toList());
    for (String name : arrays.keySet()) {
      boolean known = names.contains(name) || (name.endsWith("_test")
          && names.contains(name.substring(0, name.length() - 5)));
      if (!known && !otherArrays) {
        throw new IOException(
            String.format(
                "npz file '%s' has an array '%s' that names no input or label of the network"
                    + " (it takes %s, and optionally %s)",
                file, name, expected, tests));
      }
    }
    for (Data.Field f : fields) {
      if (!arrays.containsKey(f.name())) {
        throw new IOException(
            String.format(
                "npz file '%s' has no array '%s' for the network's %s", file, f.name(), f.describe()));
      }
    }
    String firstTest = null;
    String missing = null;
    for (String n : names) {
      if (arrays.containsKey(n + "_test")) {
        firstTest = firstTest == null ? n + "_test" : firstTest;
      } else {
        missing = missing == null ? n + "_test" : missing;
      }
    }
    if (firstTest != null && missing != null) {
      throw new IOException(
          String.format(
              "npz file '%s' has '%s' but no '%s' (a test set needs every array)",
              file, firstTest, missing));
    }
    int n = fields.size();
    float[][] train = new float[n][];
    float[][] test = firstTest == null ? null : new float[n][];
    int[] sizes = new int[n];
    long[] counts = new long[2];
    for (int f = 0; f < n; f++) {
      Data.Field field = fields.get(f);
      sizes[f] = field.size();
      train[f] = npzField(arrays.get(field.name()), field, field.name(), file);
      if (test != null) {
        test[f] = npzField(arrays.get(field.name() + "_test"), field, field.name() + "_test", file);
      }
    }
    for (int split = 0; split < (test == null ? 1 : 2); split++) {
      float[][] part = split == 0 ? train : test;
      for (int f = 0; f < n; f++) {
        long count = sizes[f] == 0 ? 0 : part[f].length / sizes[f];
        if (f > 0 && count != counts[split]) {
          StringBuilder listed = new StringBuilder();
          for (int g = 0; g < n; g++) {
            listed
                .append(g > 0 ? ", " : "")
                .append("'")
                .append(fields.get(g).name())
                .append("' ")
                .append(sizes[g] == 0 ? 0 : part[g].length / sizes[g]);
          }
          throw new IOException(
              String.format(
                  "the %s arrays hold different numbers of samples (%s)",
                  split == 0 ? "training" : "test", listed));
        }
        counts[split] = count;
      }
    }
    return Data.named(train, test, sizes);
  }

  private static float[] npzField(Npz.Array a, Data.Field f, String name, String file)
      throws IOException {
    String where = "npz file '" + file + "': '" + name + "'";
    if (a.shape.length < 1) {
      throw new IOException(where + " must have a sample dimension [M, ...], found a scalar");
    }
    int[] sample = Arrays.copyOfRange(a.shape, 1, a.shape.length);
    if (!f.integer()) {
      if (!a.isFloat()) {
        throw new IOException(
            where
                + " must hold floats (float32) for the network's "
                + f.describe()
                + ", found integers");
      }
      boolean flattens = f.shape().length == 1 && Buf.count(sample) == f.shape()[0];
      if (!Arrays.equals(sample, f.shape()) && !flattens) {
        throw new IOException(
            String.format(
                "%s has per-sample shape %s, but the network's input takes %s per sample",
                where, Arrays.toString(sample), Arrays.toString(f.shape())));
      }
      return a.floats;
    }
    if (a.isFloat()) {
      throw new IOException(
          where
              + " must hold integer "
              + (f.tokens() ? "token ids" : "labels")
              + " for the network's "
              + f.describe()
              + ", found floats");
    }
    if (!Arrays.equals(sample, f.shape())) {
      throw new IOException(
          String.format(
              "%s has per-sample shape %s, but the network's %s takes %s per sample",
              where, Arrays.toString(sample), f.describe(), Arrays.toString(f.shape())));
    }
    float[] out = new float[a.longs.length];
    int size = Math.max(1, f.size());
    for (int k = 0; k < out.length; k++) {
      long v = a.longs[k];
      if ((v < 0 || v >= f.classes()) && v != f.ignore()) { // a loss's ignore_index is accepted
        throw new IOException(
            String.format(
                "%s: label %d of sample %d is outside [0, %d) (the network's %s)",
                where, v, k / size, f.classes(), f.describe()));
      }
      out[k] = v;
    }
    return out;
  }
}
