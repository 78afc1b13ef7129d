package deepdsl.runtime;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;

/**
 * {@code --data text:FILE}: a text file as character tokens with next-token targets, read as
 * {@code deepdsl/data/text.py} reads it. The file is UTF-8 (a leading byte order mark dropped); its
 * vocabulary is its distinct code points, sorted, a character's id its rank there. The first {@code
 * L - L / 10} characters are the training text, the last {@code L / 10} the test text (none when
 * that holds no full sample). With T tokens per sample a text of S characters gives {@code (S - 1)
 * / T} samples: sample j is characters {@code [j*T, j*T + T)} and its target {@code [j*T + 1, j*T +
 * T + 1)}. It fills one token input and one label, both {@code [T]} per sample.
 */
final class TextData {
  // 256 MiB: a larger text file is refused before it is read (as text.py's MAX_BYTES)
  private static final int MAX_BYTES = 1 << 28;

  private TextData() {}

  static Data load(String file, List<Data.Field> fields) throws IOException {
    Data.Field input = null;
    Data.Field target = null;
    Data.Field extra = null;
    int tokens = 0;
    int labels = 0;
    for (Data.Field f : fields) {
      if (f.tokens()) {
        tokens++;
        if (input == null) {
          input = f;
        } else if (extra == null) {
          extra = f;
        }
      } else if (f.label()) {
        labels++;
        if (target == null) {
          target = f;
        } else if (extra == null) {
          extra = f;
        }
      } else if (extra == null) {
        extra = f;
      }
    }
    if (tokens != 1 || labels != 1 || extra != null) {
      throw new IOException(
          "text data fills one token input (`input NAME : [N, T] int vocab V`) and one label of the"
              + " same shape (its next-token targets)"
              + (extra != null ? "; it has nothing for the network's " + extra.describe() : ""));
    }
    if (input.shape().length != 1 || !Arrays.equals(input.shape(), target.shape())) {
      throw new IOException(
          "text data takes [T] tokens per sample for both the "
              + input.describe()
              + " and the "
              + target.describe());
    }
    int t = input.shape()[0];
    int vocab = Math.min(input.classes(), target.classes());
    String describe =
        input.classes() <= target.classes() ? input.describe() : target.describe();
    int[] ids = ids(file);
    int vFile = 0;
    for (int id : ids) {
      vFile = Math.max(vFile, id + 1);
    }
    if (vFile > vocab) {
      throw new IOException(
          String.format(
              "text data file '%s' has %d distinct characters, more than the %d of the network's %s",
              file, vFile, vocab, describe));
    }
    int testLen = ids.length / 10;
    int trainLen = ids.length - testLen;
    if (trainLen < t + 1) {
      throw new IOException(
          String.format(
              "text data file '%s' has %d characters: its training part (%d) is too short for one"
                  + " sample of %d tokens and its target (at least %d characters)",
              file, ids.length, trainLen, t, t + 1));
    }
    float[][] train = windows(ids, 0, trainLen, t);
    float[][] test = testLen >= t + 1 ? windows(ids, trainLen, ids.length, t) : null;
    boolean inputFirst = fields.indexOf(input) < fields.indexOf(target);
    float[][] trainFields = inputFirst ? train : new float[][] {train[1], train[0]};
    float[][] testFields =
        test == null ? null : inputFirst ? test : new float[][] {test[1], test[0]};
    return Data.named(trainFields, testFields, new int[] {t, t});
  }

  /** The file's characters as ids: each code point's rank among the file's distinct ones. */
  private static int[] ids(String file) throws IOException {
    Path path = Path.of(file);
    if (!Files.isRegularFile(path)) {
      throw new IOException("text data file not found: '" + file + "'");
    }
    long size = Files.size(path);
    if (size > MAX_BYTES) {
      throw new IOException(
          String.format(
              "text data file '%s' is %d bytes, more than deepdsl reads (%d)",
              file, size, MAX_BYTES));
    }
    byte[] raw;
    try (InputStream in = Files.newInputStream(path)) {
      raw = in.readNBytes(MAX_BYTES + 1);
    }
    if (raw.length > MAX_BYTES) { // (a file that grew while it was read)
      throw new IOException(
          "text data file '" + file + "' is more than deepdsl reads (" + MAX_BYTES + " bytes)");
    }
    String text;
    try {
      text =
          StandardCharsets.UTF_8
              .newDecoder()
              .onMalformedInput(CodingErrorAction.REPORT)
              .onUnmappableCharacter(CodingErrorAction.REPORT)
              .decode(ByteBuffer.wrap(raw))
              .toString();
    } catch (CharacterCodingException e) {
      throw new IOException("text data file '" + file + "' is not UTF-8 text", e);
    }
    int[] codes = text.codePoints().toArray();
    if (codes.length > 0 && codes[0] == 0xFEFF) {
      codes = Arrays.copyOfRange(codes, 1, codes.length);
    }
    int[] vocab = Arrays.stream(codes).distinct().sorted().toArray();
    int[] ids = new int[codes.length];
    for (int k = 0; k < codes.length; k++) {
      ids[k] = Arrays.binarySearch(vocab, codes[k]);
    }
    return ids;
  }

  /** Inputs and targets of the text {@code ids[from, to)}: {@code (to - from - 1) / t} samples. */
  private static float[][] windows(int[] ids, int from, int to, int t) {
    int m = (to - from - 1) / t;
    float[] x = new float[m * t];
    float[] y = new float[m * t];
    for (int k = 0; k < m * t; k++) {
      x[k] = ids[from + k];
      y[k] = ids[from + k + 1];
    }
    return new float[][] {x, y};
  }
}
