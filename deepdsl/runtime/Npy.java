package deepdsl.runtime;

import java.io.IOException;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Predicate;

/**
 * One {@code .npy} array (docs/formats.md): reading an archive entry's header and elements
 * (versions 1.0, 2.0 and 3.0, C or Fortran order, either byte order, float16/32/64 given back as
 * float32, integers of 8 to 64 bits given back as int64), and writing the version 1.0 header and
 * little-endian elements {@link Npz#write} stores.
 */
final class Npy {
  private Npy() {}

  static final byte[] MAGIC = {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y'};
  static final int MAX_ELEMENTS = Integer.MAX_VALUE - 8; // the most of one Java array
  static final String[] KEYS = {"descr", "fortran_order", "shape"};


  static Npz.Array read(ZipReader.EntryStream in, long size, String where) throws IOException {
    Header h = readHeader(in, where);
    String header = h.text();
    Object[] fields = parseHeader(header, where);
    Dtype dtype = Dtype.parse((String) fields[0], where);
    boolean columnMajor = (Boolean) fields[1];
    int[] shape = (int[]) fields[2];
    BigInteger elements = BigInteger.ONE;
    for (int d : shape) {
      elements = elements.multiply(BigInteger.valueOf(d));
    }
    if (elements.compareTo(BigInteger.valueOf(MAX_ELEMENTS)) > 0) {
      throw new IOException(
          String.format(
              "%s: shape %s holds %s elements, more than one array may (%d)",
              where, Arrays.toString(shape), elements, MAX_ELEMENTS));
    }
    int count = elements.intValue();
    String what = count + " elements of " + dtype.descr() + " " + Arrays.toString(shape);
    // before allocating: the entry holds exactly what its header promises (a header claiming 1e9
    // elements in a small entry costs nothing)
    long dataBytes = size - h.bytes();
    if (dataBytes < (long) count * dtype.size()) {
      throw new IOException(where + ": truncated (it ends inside " + what + ")");
    }
    if (dataBytes > (long) count * dtype.size()) {
      throw new IOException(where + ": more data than its header's " + what);
    }
    float[] floats = dtype.isFloat() ? new float[count] : null;
    long[] longs = dtype.isFloat() ? null : new long[count];
    int perChunk = ZipReader.CHUNK / dtype.size();
    for (int lo = 0; lo < count; lo += perChunk) {
      int n = Math.min(perChunk, count - lo);
      ByteBuffer data =
          ByteBuffer.wrap(readBytes(in, n * dtype.size(), where, what)).order(dtype.order());
      for (int i = lo; i < lo + n; i++) {
        if (floats != null) {
          floats[i] = dtype.readFloat(data);
        } else {
          longs[i] = dtype.readLong(data, where);
        }
      }
    }
    if (columnMajor && shape.length > 1) { // (one copy beside the array, no index of its size)
      if (floats != null) {
        float[] src = floats.clone();
        float[] dst = floats;
        fromColumnMajor(shape, (i, from) -> dst[i] = src[from]);
      } else {
        long[] src = longs.clone();
        long[] dst = longs;
        fromColumnMajor(shape, (i, from) -> dst[i] = src[from]);
      }
    }
    return new Npz.Array(shape, floats, longs);
  }

  /** The header of a {@code .npy} stream: its text, and its size with the magic bytes. */
  record Header(String text, long bytes) {}

  /** The header of a {@code .npy} stream, which is left at the first data byte. */
  static Header readHeader(ZipReader.EntryStream in, String where) throws IOException {
    byte[] prefix = in.read(8);
    if (prefix.length < 8 || !Arrays.equals(Arrays.copyOf(prefix, 6), MAGIC)) {
      throw new IOException(where + ": not a .npy array (bad magic bytes)");
    }
    int major = prefix[6] & 0xFF;
    if (major < 1 || major > 3) {
      throw new IOException(
          where + ": unsupported .npy format version " + major + "." + (prefix[7] & 0xFF));
    }
    // Version 1.0 has a 2-byte header length, versions 2.0 and 3.0 a 4-byte one; 3.0 is UTF-8.
    int width = major == 1 ? 2 : 4;
    ByteBuffer length =
        ByteBuffer.wrap(readBytes(in, width, where, "its .npy header"))
            .order(ByteOrder.LITTLE_ENDIAN);
    long headerLength = major == 1 ? length.getShort() & 0xFFFF : length.getInt() & 0xFFFFFFFFL;
    if (headerLength > 1 << 20) {
      throw new IOException(where + ": implausible .npy header length " + headerLength);
    }
    byte[] header = readBytes(in, (int) headerLength, where, "its .npy header");
    String text = new String(header, StandardCharsets.ISO_8859_1);
    if (major == 3) {
      try {
        text = StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(header)).toString();
      } catch (CharacterCodingException e) {
        throw new IOException(where + ": its .npy header is not UTF-8", e);
      }
    }
    return new Header(text, 8 + width + headerLength);
  }

  static byte[] readBytes(ZipReader.EntryStream in, int n, String where, String what)
      throws IOException {
    byte[] b = in.read(n);
    if (b.length < n) {
      throw new IOException(where + ": truncated (it ends inside " + what + ")");
    }
    return b;
  }

  static String shown(String text) {
    String s = text.strip();
    return s.length() <= 200 ? s : s.substring(0, 200) + "...";
  }

  /**
   * The tokens of a {@code .npy} header, as npzfile/npy.py's _TOKEN takes them: quoted strings
   * (no backslash inside), True/False, decimal integers without leading zeros, and {@code {}():,};
   * each a pair {kind, text}.
   */
  static List<String[]> tokens(String text, String where) throws IOException {
    List<String[]> out = new ArrayList<>();
    int pos = 0;
    int len = text.length();
    while (true) {
      while (pos < len && " \t\r\n".indexOf(text.charAt(pos)) >= 0) {
        pos++;
      }
      if (pos == len) {
        return out;
      }
      char c = text.charAt(pos);
      if (c == '\'' || c == '"') {
        int close = pos + 1;
        while (close < len && text.charAt(close) != c && text.charAt(close) != '\\') {
          close++;
        }
        if (close == len || text.charAt(close) != c) {
          break;
        }
        out.add(new String[] {"str", text.substring(pos + 1, close)});
        pos = close + 1;
      } else if (text.startsWith("True", pos) || text.startsWith("False", pos)) {
        String word = text.startsWith("True", pos) ? "True" : "False";
        out.add(new String[] {"bool", word});
        pos += word.length();
      } else if (c >= '0' && c <= '9') {
        int stop = pos + 1;
        while (c != '0' && stop < len && text.charAt(stop) >= '0' && text.charAt(stop) <= '9') {
          stop++;
        }
        out.add(new String[] {"int", text.substring(pos, stop)});
        pos = stop;
      } else if ("{}():,".indexOf(c) >= 0) {
        out.add(new String[] {String.valueOf(c), String.valueOf(c)});
        pos++;
      } else {
        break;
      }
    }
    throw new IOException(where + ": unreadable .npy header " + shown(text));
  }

  /**
   * A {@code .npy} header: a dict of exactly 'descr' (a string), 'fortran_order' (True or False)
   * and 'shape' (a tuple of integers), each once: {descr, fortran order, shape}.
   */
  static Object[] parseHeader(String text, String where) throws IOException {
    IOException bad = new IOException(where + ": unreadable .npy header " + shown(text));
    List<String[]> t = tokens(text, where);
    Map<String, Object[]> fields = new HashMap<>();
    int[] i = {0};
    Predicate<String> at = k -> i[0] < t.size() && t.get(i[0])[0].equals(k);
    if (!at.test("{")) {
      throw bad;
    }
    i[0]++;
    while (!at.test("}")) {
      if (!at.test("str")) {
        throw bad;
      }
      String key = t.get(i[0]++)[1];
      if (!at.test(":")) {
        throw bad;
      }
      i[0]++;
      if (i[0] >= t.size()) {
        throw bad;
      }
      String kind = t.get(i[0])[0];
      Object value;
      if (kind.equals("str") || kind.equals("bool")) {
        String v = t.get(i[0]++)[1];
        value = kind.equals("str") ? v : (Object) v.equals("True");
      } else if (kind.equals("(")) {
        i[0]++;
        List<Integer> dims = new ArrayList<>();
        while (!at.test(")")) {
          if (!at.test("int")) {
            throw bad;
          }
          String digits = t.get(i[0]++)[1];
          if (digits.length() > 10 || Long.parseLong(digits) > MAX_ELEMENTS) {
            throw new IOException(where + ": bad shape in its .npy header " + shown(text));
          }
          dims.add(Integer.parseInt(digits));
          if (at.test(")")) {
            if (dims.size() == 1) {
              throw bad; // (5) is not a tuple
            }
            break;
          }
          if (!at.test(",")) {
            throw bad;
          }
          i[0]++;
        }
        i[0]++; // the ")"
        value = dims.stream().mapToInt(Integer::intValue).toArray();
      } else {
        throw bad;
      }
      if (fields.containsKey(key)) {
        throw new IOException(where + ": its .npy header gives '" + key + "' twice");
      }
      if (!Arrays.asList(KEYS).contains(key)) {
        throw new IOException(
            where + ": its .npy header has a key '" + key + "' other than "
                + String.join(", ", KEYS));
      }
      fields.put(key, new Object[] {kind, value});
      if (at.test("}")) {
        break;
      }
      if (!at.test(",")) {
        throw bad;
      }
      i[0]++;
    }
    i[0]++; // the "}"
    if (i[0] != t.size() || fields.size() != KEYS.length) {
      throw bad;
    }
    String[] kinds = {"str", "bool", "("};
    Object[] out = new Object[3];
    for (int k = 0; k < 3; k++) {
      Object[] f = fields.get(KEYS[k]);
      if (!f[0].equals(kinds[k])) {
        throw bad;
      }
      out[k] = f[1];
    }
    return out;
  }

  /** A move of one element: row-major position {@code i} takes column-major {@code from}. */
  interface Move {
    void at(int i, int from);
  }

  /** For each element in row-major order, its position in column-major order, to {@code move}. */
  static void fromColumnMajor(int[] shape, Move move) {
    int[] strides = new int[shape.length];
    int stride = 1;
    for (int k = 0; k < shape.length; k++) {
      strides[k] = stride;
      stride *= shape[k];
    }
    int[] index = new int[shape.length];
    int pos = 0;
    for (int i = 0; i < stride; i++) {
      move.at(i, pos);
      // Advance the row-major index, last axis fastest, keeping pos the column-major offset.
      for (int k = shape.length - 1; k >= 0; k--) {
        index[k]++;
        pos += strides[k];
        if (index[k] < shape[k]) {
          break;
        }
        pos -= strides[k] * shape[k];
        index[k] = 0;
      }
    }
  }

  /**
   * An element type of a {@code .npy} header ({@code <f4}, {@code >i2}, ...): kind, size, byte
   * order.
   */
  record Dtype(String descr, boolean isFloat, boolean unsigned, int size, ByteOrder order) {
    static Dtype parse(String descr, String where) throws IOException {
      if (descr.length() == 3) {
        char byteOrder = descr.charAt(0);
        char kind = descr.charAt(1);
        int size = descr.charAt(2) - '0';
        ByteOrder order =
            byteOrder == '>'
                ? ByteOrder.BIG_ENDIAN
                : byteOrder == '=' ? ByteOrder.nativeOrder() : ByteOrder.LITTLE_ENDIAN;
        boolean knownOrder = "<>=|".indexOf(byteOrder) >= 0;
        if (knownOrder && kind == 'f' && (size == 2 || size == 4 || size == 8)) {
          return new Dtype(descr, true, false, size, order);
        }
        if (knownOrder
            && (kind == 'i' || kind == 'u')
            && (size == 1 || size == 2 || size == 4 || size == 8)) {
          return new Dtype(descr, false, kind == 'u', size, order);
        }
      }
      throw new IOException(
          where + ": unsupported element type '" + descr + "' (expected floats or integers)");
    }

    /** The next element of {@code b} as a float (float64 rounds to nearest, as NumPy's astype). */
    float readFloat(ByteBuffer b) {
      return switch (size) {
        case 2 -> halfToFloat(b.getShort());
        case 4 -> b.getFloat();
        default -> (float) b.getDouble();
      };
    }

    /** The next element of {@code b} as an int64. */
    long readLong(ByteBuffer b, String where) throws IOException {
      long v =
          switch (size) {
            case 1 -> unsigned ? b.get() & 0xFFL : b.get();
            case 2 -> unsigned ? b.getShort() & 0xFFFFL : b.getShort();
            case 4 -> unsigned ? b.getInt() & 0xFFFFFFFFL : b.getInt();
            default -> b.getLong();
          };
      if (unsigned && v < 0) {
        throw new IOException(
            where + ": the value " + Long.toUnsignedString(v) + " does not fit in int64");
      }
      return v;
    }

    /** IEEE half to float (exact: every half is a float). */
    private static float halfToFloat(short h) {
      int sign = (h >>> 15) & 1;
      int exponent = (h >>> 10) & 0x1F;
      int mantissa = h & 0x3FF;
      float magnitude;
      if (exponent == 0x1F) {
        magnitude = mantissa == 0 ? Float.POSITIVE_INFINITY : Float.NaN;
      } else if (exponent == 0) {
        magnitude = mantissa * 0x1.0p-24f;
      } else {
        magnitude = Float.intBitsToFloat((exponent + 112) << 23 | mantissa << 13);
      }
      return sign == 1 ? -magnitude : magnitude;
    }
  }

  // ---- writing ----

  /** A sink for byte ranges: a checksum or a stream. */
  interface ByteSink {
    void write(byte[] b, int off, int len) throws IOException;
  }

  /** Little-endian elements of {@code array}, in chunks of at most {@link ZipReader#CHUNK} bytes. */
  static void writeData(Npz.Array array, ByteSink sink) throws IOException {
    ByteBuffer buf = ByteBuffer.allocate(ZipReader.CHUNK).order(ByteOrder.LITTLE_ENDIAN);
    int n = array.numel();
    int perChunk = ZipReader.CHUNK / (array.isFloat() ? 4 : 8);
    for (int lo = 0; lo < n; lo += perChunk) {
      int hi = Math.min(n, lo + perChunk);
      buf.clear();
      if (array.isFloat()) {
        buf.asFloatBuffer().put(array.floats, lo, hi - lo);
        buf.position((hi - lo) * 4);
      } else {
        buf.asLongBuffer().put(array.longs, lo, hi - lo);
        buf.position((hi - lo) * 8);
      }
      sink.write(buf.array(), 0, buf.position());
    }
  }

  /** A version 1.0 header, padded with spaces so that the data starts at a multiple of 64 bytes. */
  static byte[] header(Npz.Array array) {
    StringBuilder shape = new StringBuilder("(");
    for (int k = 0; k < array.shape.length; k++) {
      shape.append(k == 0 ? "" : ", ").append(array.shape[k]);
    }
    shape.append(array.shape.length == 1 ? ",)" : ")");
    String dict =
        String.format(
            "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
            array.isFloat() ? "<f4" : "<i8", shape);
    int total = MAGIC.length + 4 + dict.length() + 1;
    int padded = (total + 63) / 64 * 64;
    String text = dict + " ".repeat(padded - total) + "\n";
    ByteBuffer b = ByteBuffer.allocate(padded).order(ByteOrder.LITTLE_ENDIAN);
    b.put(MAGIC).put((byte) 1).put((byte) 0).putShort((short) text.length());
    b.put(text.getBytes(StandardCharsets.ISO_8859_1));
    return b.array();
  }
}
