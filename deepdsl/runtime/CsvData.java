package deepdsl.runtime;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * Numeric CSV files ({@code --data csv:FILE}), read as {@code deepdsl/data/table.py} reads them: a
 * header naming the columns, a field of one value per sample taking the column of its name, a
 * field of S values the columns NAME0 .. NAME{S-1}; the test set in FILE's {@code _test} sibling.
 * Values parse as the double the text denotes, rounded to float32, so both runtimes hold the same
 * floats; errors are worded as there.
 */
final class CsvData {
  static final int MAX_BYTES = 1 << 28;
  private static final Pattern NUMBER =
      Pattern.compile("[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?");
  private static final Pattern INTEGER = Pattern.compile("[+-]?[0-9]+");

  private CsvData() {}

  static Data load(String file, List<Data.Field> fields) throws IOException {
    return load(file, fields, false);
  }

  /** The same; with {@code otherColumns}, columns that name no field are ignored (--predict). */
  static Data load(String file, List<Data.Field> fields, boolean otherColumns) throws IOException {
    if (!Files.isRegularFile(Path.of(file))) {
      throw new IOException("csv data file not found: '" + file + "'");
    }
    float[][] train = read(file, fields, otherColumns);
    String test = testFile(file);
    float[][] tested =
        Files.isRegularFile(Path.of(test)) ? read(test, fields, otherColumns) : null;
    int[] sizes = new int[fields.size()];
    for (int f = 0; f < sizes.length; f++) {
      sizes[f] = fields.get(f).size();
    }
    return Data.named(train, tested, sizes);
  }

  /** The test file beside {@code file}: {@code _test} before the extension (as table.py). */
  static String testFile(String file) {
    int slash = file.lastIndexOf('/');
    String head = file.substring(0, slash + 1);
    String tail = file.substring(slash + 1);
    int dot = tail.lastIndexOf('.');
    return dot > 0 ? head + tail.substring(0, dot) + "_test" + tail.substring(dot) : head + tail + "_test";
  }

  private static String strip(String s) {
    int a = 0;
    int b = s.length();
    while (a < b && " \t\r".indexOf(s.charAt(a)) >= 0) {
      a++;
    }
    while (b > a && " \t\r".indexOf(s.charAt(b - 1)) >= 0) {
      b--;
    }
    return s.substring(a, b);
  }

  private static String[] cells(String line) {
    String[] out = line.split(",", -1);
    for (int k = 0; k < out.length; k++) {
      out[k] = strip(out[k]);
    }
    return out;
  }

  private static float[][] read(String file, List<Data.Field> fields, boolean otherColumns)
      throws IOException {
    long size = Files.size(Path.of(file));
    if (size > MAX_BYTES) {
      throw new IOException(
          String.format(
              Locale.ROOT, "csv file '%s' is larger than %d bytes (%,d bytes)", file, MAX_BYTES, size));
    }
    byte[] raw;
    try (InputStream in = Files.newInputStream(Path.of(file))) {
      raw = in.readNBytes(MAX_BYTES + 1);
    }
    String text;
    CharsetDecoder utf8 =
        StandardCharsets.UTF_8
            .newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT);
    try {
      text = utf8.decode(ByteBuffer.wrap(raw)).toString();
    } catch (CharacterCodingException e) {
      throw new IOException("csv file '" + file + "' is not UTF-8 text");
    }
    if (text.startsWith("\ufeff")) {
      text = text.substring(1);
    }
    String[] lines = text.split("\n", -1);
    int headerAt = 0;
    while (headerAt < lines.length && strip(lines[headerAt]).isEmpty()) {
      headerAt++;
    }
    if (headerAt == lines.length) {
      throw new IOException(
          "csv file '" + file + "' holds no header (a first line naming the columns)");
    }
    String[] header = cells(lines[headerAt]);
    Map<String, Integer> where = new HashMap<>();
    for (int k = 0; k < header.length; k++) {
      if (header[k].isEmpty()) {
        throw new IOException(
            String.format("csv file '%s': column %d of the header has no name", file, k + 1));
      }
      if (where.put(header[k], k) != null) {
        throw new IOException(
            String.format("csv file '%s' names the column '%s' twice", file, header[k]));
      }
    }
    int[][] columns = new int[fields.size()][];
    Set<String> taken = new HashSet<>();
    for (int f = 0; f < fields.size(); f++) {
      Data.Field field = fields.get(f);
      int s = field.size();
      columns[f] = new int[s];
      for (int k = 0; k < s; k++) {
        String name = s == 1 ? field.name() : field.name() + k;
        Integer at = where.get(name);
        if (at == null) {
          throw new IOException(
              String.format(
                  "csv file '%s' has no column '%s' for the network's %s",
                  file, name, field.describe()));
        }
        taken.add(name);
        columns[f][k] = at;
      }
    }
    for (String name : header) {
      if (!taken.contains(name) && !otherColumns) {
        List<String> all = new ArrayList<>();
        fields.forEach(f -> all.add(f.describe()));
        throw new IOException(
            String.format(
                "csv file '%s' has a column '%s' that names no input or label of the network (it"
                    + " takes %s)",
                file, name, String.join(", ", all)));
      }
    }
    List<String[]> rows = new ArrayList<>();
    List<Integer> numbers = new ArrayList<>();
    for (int k = headerAt + 1; k < lines.length; k++) {
      if (strip(lines[k]).isEmpty()) {
        continue;
      }
      String[] c = cells(lines[k]);
      if (c.length != header.length) {
        throw new IOException(
            String.format(
                "csv file '%s', line %d: %d values, but the header names %d columns",
                file, k + 1, c.length, header.length));
      }
      rows.add(c);
      numbers.add(k + 1);
    }
    if (rows.isEmpty()) {
      throw new IOException("csv file '" + file + "' holds no rows (only its header)");
    }
    float[][] out = new float[fields.size()][];
    for (int f = 0; f < fields.size(); f++) {
      Data.Field field = fields.get(f);
      int s = columns[f].length;
      out[f] = new float[Math.toIntExact((long) rows.size() * s)];
      for (int r = 0; r < rows.size(); r++) {
        for (int k = 0; k < s; k++) {
          int c = columns[f][k];
          out[f][r * s + k] = value(rows.get(r)[c], field, file, numbers.get(r), header[c]);
        }
      }
    }
    return out;
  }

  private static float value(String cell, Data.Field f, String file, int line, String column)
      throws IOException {
    String here = String.format("csv file '%s', line %d, column '%s'", file, line, column);
    if (f.integer()) {
      if (!INTEGER.matcher(cell).matches()) {
        String what = NUMBER.matcher(cell).matches() ? "an integer" : "a number";
        throw new IOException(String.format("%s: '%s' is not %s", here, cell, what));
      }
      String digits = cell.startsWith("+") ? cell.substring(1) : cell;
      int length = digits.length() - (digits.startsWith("-") ? 1 : 0);
      // more than 18 digits: beyond any class count (and a long), as table.py takes them
      long v = length <= 18 ? Long.parseLong(digits) : -1;
      if (v < 0 || v >= f.classes()) {
        throw new IOException(
            String.format(
                "csv file '%s': label %s on line %d is outside [0, %d) (the network's %s)",
                file, cell, line, f.classes(), f.describe()));
      }
      return v;
    }
    if (!NUMBER.matcher(cell).matches()) {
      throw new IOException(String.format("%s: '%s' is not a number", here, cell));
    }
    double d = Double.parseDouble(cell);
    float x = (float) d;
    if (Double.isInfinite(d) || Float.isInfinite(x)) {
      throw new IOException(String.format("%s: '%s' is too large for a float32", here, cell));
    }
    return x;
  }
}
